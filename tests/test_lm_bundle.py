"""litegpu.lm's reading of LiteRT-LM ``.litertlm`` bundles, and their tokenizers.

Bundles are written by litegpu's test writer (:mod:`litegpu.testing.lm_bundle`) and read
back; tokenizers are trained here (SentencePiece and a HuggingFace BPE, on the README's
text) and bundled. Damaged files, damaged protobuf and a few hundred random byte flips
must raise only ``ModelFormatError``.

Where LiteRT-LM's own tools are installed (a virtual environment with ``litert-lm-builder``
and ``litert-lm-api``: ``$LITEGPU_EXPORT_VENV``, else ``~/.cache/litegpu/export-venv``),
bundles written by its builder are read here and checked against what went in and what
its own Python reader sees, and bundles written here are read by its Python reader and by
its C++ loader (``litert_lm.ModelInfo``). Elsewhere those tests skip, saying why: the
environment is a developer's tool, never a dependency of litegpu.
"""
from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import sentencepiece       # test dependencies (litegpu's [lm] extra): never skipped
import tokenizers

import litegpu
from litegpu.errors import InvalidArgumentError, ModelFormatError
from litegpu.lm import (BLOCK_SIZE, Bundle, LlmMetadata, LlmModelType, Message, PromptAffixes, PromptTemplates,
                        SamplerParams, TokenizerUnavailableError, TokenUnion, load_tokenizer)
from litegpu.lm.tokenizer import HuggingFaceTokenizer, SentencePieceTokenizer, decompress_hf_tokenizer
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.lm_bundle import BundleWriter, encode_llm_metadata, encode_varint, pb_bytes, pb_varint

REPO = Path(__file__).resolve().parents[1]
SAMPLES = ["Hello, litegpu runs .tflite models on pluggable backends.",
           "  two  spaces,\ttabs and\nnew lines  ",
           "ünïcödé, 漢字 and emoji 🙂 fall back to bytes",
           "<start_of_turn>user\nWhat is a KV cache?<end_of_turn>\n"]

# A full LlmMetadata whose floats are exact in float32, with a negative seed and suppress id.
METADATA = LlmMetadata(
    start_token=TokenUnion(ids=(1,)),
    stop_tokens=(TokenUnion(ids=(2,)), TokenUnion(text="<end_of_turn>")),
    prompt_templates=PromptTemplates(user=PromptAffixes("<start_of_turn>user\n", "<end_of_turn>\n"),
                                     model=PromptAffixes("<start_of_turn>model\n", "")),
    sampler_params=SamplerParams(type="TOP_K", k=40, p=0.75, temperature=0.5, seed=-7),
    max_num_tokens=1280,
    model_type=LlmModelType(field=5, name="qwen3", raw=b"\n\x07```tool"),
    jinja_prompt_template="{% for m in messages %}{{ m.content }}{% endfor %}",
    suppress_tokens=(5, 300, -3),
    supports_thinking=True,
    supports_function_calling=False,
    min_runtime_version="0.11.0",
)


# ---------------------------------------------------------------------------------------------
# Inputs: a tiny .tflite, and tokenizers trained on the README
# ---------------------------------------------------------------------------------------------
def tiny_tflite(n: int = 4, dtype=np.float32) -> bytes:
    """y = x + [0, 1, ..., n-1]: a real model litegpu and LiteRT both read."""
    b = ModelBuilder()
    x, y = b.input("x", (1, n), dtype), b.tensor("y", (1, n), dtype)
    b.op("ADD", [x, b.const("c", np.arange(n, dtype=dtype))], [y])
    b.output(y)
    return b.build()


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    """~12 KB of the README, one non-empty line each."""
    return [line for line in (REPO / "README.md").read_text()[:12000].splitlines() if line.strip()]


@pytest.fixture(scope="module")
def sp_model(corpus) -> bytes:
    """A SentencePiece BPE model (vocab 400; byte fallback, no normalization: every text round-trips)."""
    out = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=out, vocab_size=400, model_type="bpe", num_threads=1,
        minloglevel=2, byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"])
    return out.getvalue()


@pytest.fixture(scope="module")
def hf_json(corpus) -> str:
    """A byte-level BPE ``tokenizer.json`` (vocab 300) from the ``tokenizers`` package."""
    from tokenizers import decoders, models, pre_tokenizers, trainers
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<end_of_turn>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus, trainer)
    return tok.to_str()


def full_bundle(sp_model: bytes, hf_json: str | None = None) -> BundleWriter:
    """A bundle as litert-lm-builder lays one out: metadata, an embedder, the prefill/decode model, tokenizer."""
    w = BundleWriter()
    w.system_metadata("Authors", "litegpu tests").system_metadata("answer", 42)
    w.llm_metadata(METADATA)
    w.model(tiny_tflite(3, np.int32), "embedder")
    w.model(tiny_tflite(), "prefill_decode", backend_constraint="cpu", model_version="1.0.1")
    w.sentencepiece(sp_model)
    if hf_json is not None:
        w.hf_tokenizer(hf_json)
    return w


# ---------------------------------------------------------------------------------------------
# Round trips through the writer
# ---------------------------------------------------------------------------------------------
def test_a_written_bundle_reads_back_exactly(tmp_path, sp_model):
    typed = {"u8": ("UInt8", 255), "i8": ("Int8", -128), "u16": ("UInt16", 65535), "i16": ("Int16", -32768),
             "u32": ("UInt32", 2**32 - 1), "i32": ("Int32", -2**31), "f32": ("Float32", 0.25), "b": ("Bool", True),
             "s": ("StringValue", "wörter"), "u64": ("UInt64", 2**64 - 1), "i64": ("Int64", -2**63),
             "f64": ("Double", 0.1)}
    w = BundleWriter(version=(1, 9, 3))
    for key, value in typed.items():
        w.system_metadata(key, value)
    w.llm_metadata(METADATA)
    w.model(tiny_tflite(3, np.int32), "embedder")
    w.model(tiny_tflite(), None)                 # no model_type item: the prefill/decode model
    w.sentencepiece(sp_model)
    w.section("GenericBinaryData", b"\x00" * BLOCK_SIZE, {"name": "exactly one block"})
    w.section(42, b"a section type newer than litegpu", {"k": 1})
    path = w.write(tmp_path / "b.litertlm")

    bundle = Bundle.open(path)
    assert bundle.version == (1, 9, 3)
    assert bundle.system_metadata == {key: value for key, (_, value) in typed.items()}
    names = [s.type_name for s in bundle.sections]
    assert names == ["LlmMetadataProto", "TFLiteModel", "TFLiteModel", "SP_Tokenizer", "GenericBinaryData",
                     "AnySectionDataType(42)"]
    assert bundle.model_types() == ["embedder", "prefill_decode"]
    # Each section starts on the first 16 KiB boundary after the previous one (after the header first).
    previous_end = bundle.header_end
    for s in bundle.sections:
        assert s.begin % BLOCK_SIZE == 0 and previous_end <= s.begin < previous_end + BLOCK_SIZE
        previous_end = s.end
    assert bundle.nbytes == path.stat().st_size == bundle.sections[-1].end
    assert bundle.sections[1].items == {"model_type": "tf_lite_embedder"} and bundle.sections[2].items == {}
    assert bytes(bundle.model_bytes()) == tiny_tflite()
    assert bytes(bundle.model_bytes("TF_LITE_EMBEDDER")) == tiny_tflite(3, np.int32)
    assert bytes(bundle.data(bundle.sections[3])) == sp_model
    assert bundle.metadata == METADATA
    assert bundle.weights_bytes() is None
    assert "section 5: AnySectionDataType(42)" in bundle.describe()


def test_sections_are_zero_copy_views_of_the_mapped_file(tmp_path, sp_model):
    import mmap
    bundle = Bundle.open(full_bundle(sp_model).write(tmp_path / "b.litertlm"))
    view = bundle.model_bytes()
    assert isinstance(view, memoryview) and view.readonly and isinstance(view.obj, mmap.mmap)
    model = bundle.load_model()
    reference = litegpu.load_model(tiny_tflite())
    assert [n.op for n in model.subgraphs[0].nodes] == [n.op for n in reference.subgraphs[0].nodes] == ["ADD"]
    const = next(t for t in model.subgraphs[0].tensors if t.data is not None)
    np.testing.assert_array_equal(const.data, np.arange(4, dtype=np.float32))
    assert not const.data.flags.writeable and not const.data.flags.owndata


def test_the_last_section_of_a_kind_wins_as_in_litert_lm(sp_model):
    w = BundleWriter().model(tiny_tflite(2), "prefill_decode").model(tiny_tflite(5), "PREFILL_DECODE")
    w.llm_metadata(LlmMetadata(max_num_tokens=1)).llm_metadata(LlmMetadata(max_num_tokens=2))
    bundle = Bundle.from_bytes(w.build())
    assert bytes(bundle.model_bytes()) == tiny_tflite(5)
    assert bundle.metadata.max_num_tokens == 2


def test_llm_metadata_round_trips_and_defaults():
    assert LlmMetadata.from_bytes(encode_llm_metadata(METADATA)) == METADATA
    assert LlmMetadata.from_bytes(b"") == LlmMetadata()
    assert Bundle.from_bytes(BundleWriter().model(tiny_tflite()).build()).metadata is None
    # What the generation loop reads: start/stop ids, defaults, the family.
    md = LlmMetadata.from_bytes(encode_llm_metadata(METADATA))
    assert md.start_token.ids == (1,) and md.sampler_params.seed == -7 and md.model_type.name == "qwen3"
    assert Message.parse(md.model_type.raw, "Qwen3").string(1, "code_fence_start") == "```tool"


def test_the_protobuf_decoder_follows_protobufs_rules():
    # Scalars: the last value wins; a negative int32 is a 10-byte varint.
    msg = Message.parse(pb_varint(5, 7) + pb_varint(5, -3), "M")
    assert msg.int32(5, "f") == -3 and len(encode_varint(-3)) == 10
    # A singular sub-message occurring twice is the merge of both.
    merged = Message.parse(pb_bytes(1, pb_varint(1, 4)) + pb_bytes(1, pb_varint(2, 9)), "M").message(1, "sub")
    assert (merged.int32(1, "a"), merged.int32(2, "b")) == (4, 9)
    # Packed and unpacked repeated int32, mixed.
    packed = pb_bytes(1, encode_varint(1) + encode_varint(-2))
    assert Message.parse(packed + pb_varint(1, 3), "M").repeated_int32(1, "ids") == [1, -2, 3]
    # A oneof is the member seen last.
    token = LlmMetadata.from_bytes(pb_bytes(1, pb_bytes(1, pb_bytes(1, encode_varint(9))) + pb_bytes(2, b"<x>")))
    assert token.start_token == TokenUnion(text="<x>")
    # Unknown fields of every wire type, groups included, are skipped.
    unknown = (pb_varint(100, 1) + encode_varint(101 << 3 | 1) + bytes(8) + pb_bytes(102, b"zz")
               + encode_varint(103 << 3 | 5) + bytes(4)
               + encode_varint(104 << 3 | 3) + pb_varint(1, 5) + encode_varint(104 << 3 | 4))
    assert LlmMetadata.from_bytes(unknown + pb_varint(5, 77)).max_num_tokens == 77


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------
def test_a_bundled_sentencepiece_tokenizer_round_trips(sp_model):
    bundle = Bundle.from_bytes(full_bundle(sp_model).build())
    tok = bundle.tokenizer()
    assert isinstance(tok, SentencePieceTokenizer) and isinstance(tok, litegpu.lm.Tokenizer)
    reference = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
    assert (tok.vocab_size, tok.bos_id, tok.eos_id) == (400, reference.bos_id(), reference.eos_id())
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == reference.encode(text) and tok.decode(ids) == text
    assert tok.piece_to_id("<end_of_turn>") is not None and tok.piece_to_id("no such piece") is None
    assert tok.id_to_piece(tok.piece_to_id("<end_of_turn>")) == "<end_of_turn>"
    # Stop tokens as the generation loop resolves them: ids as given, a string by its piece.
    stops = [t.resolve(tok) for t in bundle.metadata.stop_tokens]
    assert stops == [(2,), (tok.piece_to_id("<end_of_turn>"),)]
    assert tok is bundle.tokenizer()     # made once
    with pytest.raises(InvalidArgumentError, match="token 1 is id 400, outside the vocabulary"):
        tok.decode([5, 400])
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        tok.id_to_piece(-1)


def test_a_bundled_huggingface_tokenizer_round_trips(hf_json):
    w = BundleWriter().model(tiny_tflite()).hf_tokenizer(hf_json)
    bundle = Bundle.from_bytes(w.build())
    section = bundle.find("HF_Tokenizer_Zlib")[0]
    raw = bytes(bundle.data(section))
    assert int.from_bytes(raw[:8], "little") == len(hf_json.encode()) and zlib.decompress(raw[8:]) == hf_json.encode()
    tok = bundle.tokenizer()
    reference = tokenizers.Tokenizer.from_str(hf_json)
    assert isinstance(tok, HuggingFaceTokenizer) and tok.vocab_size == 300 and tok.bos_id is None
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == reference.encode(text, add_special_tokens=False).ids and tok.decode(ids) == text
    end = tok.piece_to_id("<end_of_turn>")
    assert tok.id_to_piece(end) == "<end_of_turn>" and tok.decode([end]) == "<end_of_turn>"
    assert tok.decode([end], skip_special_tokens=True) == ""
    assert TokenUnion(text="<end_of_turn>").resolve(tok) == (end,)
    with pytest.raises(InvalidArgumentError, match="outside the vocabulary"):
        tok.decode([300])


def test_sentencepiece_is_preferred_and_tokenizers_follow_their_model_type(sp_model, hf_json):
    bundle = Bundle.from_bytes(full_bundle(sp_model, hf_json).build())
    assert bundle.tokenizer().kind == "sentencepiece"       # LiteRT-LM's order
    w = BundleWriter().model(tiny_tflite()).hf_tokenizer(hf_json).sentencepiece(sp_model, model_type="tf_lite_embedder")
    bundle = Bundle.from_bytes(w.build())
    assert bundle.tokenizer().kind == "huggingface" and bundle.tokenizer("embedder").kind == "sentencepiece"


def test_importing_litegpu_lm_loads_no_tokenizer_package():
    code = "import sys, litegpu.lm; print(sorted({'sentencepiece', 'tokenizers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


def test_an_unknown_tokenizer_kind_or_a_missing_package_says_what_to_do(monkeypatch, sp_model):
    with pytest.raises(TokenizerUnavailableError, match=r"unknown tokenizer kind 'tiktoken'; litegpu reads "
                                                        r"'sentencepiece' \(SP_Tokenizer sections\)"):
        load_tokenizer("tiktoken", b"")
    bundle = Bundle.from_bytes(full_bundle(sp_model).build())
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(TokenizerUnavailableError, match=r"needs the 'sentencepiece' package.*pip install .*\[lm\]"):
        bundle.tokenizer()
    monkeypatch.setitem(sys.modules, "tokenizers", None)
    with pytest.raises(TokenizerUnavailableError, match=r"needs the 'tokenizers' package.*pip install"):
        HuggingFaceTokenizer("{}")


# ---------------------------------------------------------------------------------------------
# Damaged and hostile files: one ModelFormatError naming what is wrong
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def valid(sp_model) -> bytes:
    return full_bundle(sp_model).build()


def test_wrong_magic_names_what_the_file_is(valid):
    with pytest.raises(ModelFormatError, match=r"not a \.litertlm bundle: starts with b'LITERTXM'"):
        Bundle.from_bytes(b"LITERTXM" + valid[8:])
    with pytest.raises(ModelFormatError, match="this is a .tflite model: read it with litegpu.load_model"):
        Bundle.from_bytes(tiny_tflite())
    with pytest.raises(ModelFormatError, match="zip archive"):
        Bundle.from_bytes(b"PK\x03\x04" + bytes(60))


def test_truncated_files_name_the_truncation(tmp_path, valid):
    header_end = int.from_bytes(valid[24:32], "little")
    (tmp_path / "empty.litertlm").touch()
    with pytest.raises(ModelFormatError, match="file is empty"):
        Bundle.open(tmp_path / "empty.litertlm")
    with pytest.raises(ModelFormatError, match="truncated: 20 bytes"):
        Bundle.from_bytes(valid[:20])
    with pytest.raises(ModelFormatError, match=f"header_end_offset is {header_end}.*truncated"):
        Bundle.from_bytes(valid[:header_end - 1])
    with pytest.raises(ModelFormatError, match=r"SP_Tokenizer section 3: ends at byte \d+, past the end.*truncated"):
        Bundle.from_bytes(valid[:-1])
    for cut in (5, 31, 33, header_end + 1, BLOCK_SIZE + 3, len(valid) // 2):
        with pytest.raises(ModelFormatError):
            Bundle.from_bytes(valid[:cut])
    with pytest.raises(ModelFormatError, match="cannot read .litertlm file"):
        Bundle.open(tmp_path / "missing.litertlm")


def test_an_unsupported_major_version_is_refused(valid):
    with pytest.raises(ModelFormatError, match=r"format version 2\.0\.0; litegpu reads major version 1"):
        Bundle.from_bytes(valid[:8] + (2).to_bytes(4, "little") + bytes(8) + valid[20:])
    assert Bundle.from_bytes(valid[:12] + (99).to_bytes(4, "little") + valid[16:]).version == (1, 99, 0)


@pytest.mark.parametrize("offsets, message", [
    ((BLOCK_SIZE + 10, BLOCK_SIZE), r"begin_offset 16394 is after end_offset 16384"),
    ((BLOCK_SIZE, 1 << 40), r"ends at byte 1099511627776, past the end"),
    ((8, 100), r"begins at byte 8, inside the header"),
])
def test_section_ranges_are_checked_against_the_file(offsets, message):
    data = BundleWriter().model(tiny_tflite()).section("TFLiteModel", offsets=offsets).build()
    with pytest.raises(ModelFormatError, match=f"TFLiteModel section 1: {message}"):
        Bundle.from_bytes(data)


def test_missing_or_empty_sections_are_named(sp_model):
    bundle = Bundle.from_bytes(BundleWriter().llm_metadata(METADATA).sentencepiece(sp_model).build())
    with pytest.raises(ModelFormatError, match=r"no TFLiteModel section of model_type 'prefill_decode'; its "
                                               r"sections: 0: LlmMetadataProto, 1: SP_Tokenizer"):
        bundle.model_bytes()
    with pytest.raises(ModelFormatError, match="no TFLiteModel section of model_type 'embedder'"):
        Bundle.from_bytes(BundleWriter().model(tiny_tflite()).build()).load_model("embedder")
    with pytest.raises(ModelFormatError, match=r"no tokenizer section \(SP_Tokenizer or HF_Tokenizer_Zlib\)"):
        Bundle.from_bytes(BundleWriter().model(tiny_tflite()).build()).tokenizer()
    with pytest.raises(ModelFormatError, match=r"TFLiteModel section 0 \(prefill_decode\) is empty"):
        Bundle.from_bytes(BundleWriter().model(b"").build()).model_bytes()
    with pytest.raises(ModelFormatError, match="TFLiteModel section 0: .*not a .tflite model"):
        Bundle.from_bytes(BundleWriter().model(b"not a flatbuffer at all").build()).load_model()
    with pytest.raises(InvalidArgumentError, match="model_type must be a non-empty string"):
        bundle.model_bytes("")


@pytest.mark.parametrize("data, message", [
    (pb_varint(5, 1)[:-1] + b"\x80", r"max_num_tokens|field 5: varint at byte 1 is cut off"),
    (encode_varint(3 << 3 | 2) + encode_varint(50) + b"short", r"field 3 at byte 0 declares 50 bytes, 5 remain"),
    (encode_varint(5 << 3 | 6), r"field 5 at byte 0 has invalid wire type 6"),
    (encode_varint(5 << 3 | 4), r"unmatched end-group"),
    (encode_varint(0 << 3 | 0) + b"\x01", r"field number 0 at byte 0 is invalid"),
    (pb_bytes(5, b"x"), r"LlmMetadata\.max_num_tokens \(field 5\): wire type length-delimited, expected varint"),
    (pb_bytes(7, b"\xff\xfe"), r"LlmMetadata\.jinja_prompt_template \(field 7\): not valid UTF-8"),
    (pb_varint(5, 1)[:1] + b"\xff" * 10 + b"\x01", r"longer than 10 bytes"),
    (pb_bytes(4, pb_bytes(3, b"\x00")), r"LlmMetadata\.sampler_params\.p \(field 3\): wire type length-delimited"),
    (pb_bytes(2, pb_bytes(1, pb_bytes(1, b"\x80"))), r"LlmMetadata\.stop_tokens\[0\]\.token_ids\.ids \(packed\)"),
    (encode_varint(104 << 3 | 3) + pb_varint(1, 5), r"group of field 104 is not closed"),
])
def test_damaged_protobuf_names_the_field(data, message):
    with pytest.raises(ModelFormatError, match=message):
        LlmMetadata.from_bytes(data)


def test_damaged_metadata_in_a_bundle_names_the_section():
    bundle = Bundle.from_bytes(BundleWriter().llm_metadata(pb_bytes(7, b"\xff")).build(), "x.litertlm")
    with pytest.raises(ModelFormatError, match=r"x\.litertlm: LlmMetadataProto section 0: LlmMetadata\."
                                               r"jinja_prompt_template"):
        bundle.metadata


def test_damaged_tokenizers_raise_model_format_errors(hf_json):
    packed = BundleWriter().hf_tokenizer(hf_json).build()
    bundle = Bundle.from_bytes(packed)
    raw = bytes(bundle.data(bundle.sections[0]))
    cases = {
        "too short": raw[:5],
        "declares a 4096-byte tokenizer.json, more than 2 compressed bytes": (4096).to_bytes(8, "little") + b"xx",
        "over the limit": (1 << 40).to_bytes(8, "little") + raw[8:],
        "zlib stream is damaged": raw[:8] + b"\x00" * 40,
        "ends early": raw[:-10],
        "holds more than": (10).to_bytes(8, "little") + raw[8:],
        "holds 5 bytes, its header says 6": (6).to_bytes(8, "little") + zlib.compress(b"abcde"),
        "tokenizers cannot load tokenizer.json": (5).to_bytes(8, "little") + zlib.compress(b"{nope"),
        "tokenizer.json is not UTF-8": (2).to_bytes(8, "little") + zlib.compress(b"\xff\xfe"),
    }
    for message, data in cases.items():
        with pytest.raises(ModelFormatError, match=message):
            load_tokenizer("HF_Tokenizer_Zlib", data)
    with pytest.raises(ModelFormatError, match="SentencePiece cannot load it"):
        load_tokenizer("sentencepiece", b"not a sentencepiece model")
    with pytest.raises(ModelFormatError, match=r"SP_Tokenizer section 1: SentencePiece cannot load it"):
        Bundle.from_bytes(BundleWriter().model(tiny_tflite()).sentencepiece(b"\x0a\x03abc").build()).tokenizer()


def _read_everything(data: bytes) -> None:
    bundle = Bundle.from_bytes(data)
    bundle.describe()
    bundle.metadata
    for kind in bundle.model_types():
        bundle.model_bytes(kind)


def test_random_byte_flips_raise_only_model_format_errors(valid, hf_json):
    """Flips in the header and the metadata section (our code), and in a compressed HF
    tokenizer (zlib, then tokenizers' JSON parser). SentencePiece's C++ parser is left to
    its own fuzzing: a flip there would test sentencepiece, not litegpu."""
    rng = random.Random(1234)
    bundle = Bundle.from_bytes(valid)
    meta = bundle.find("LlmMetadataProto")[0]
    targets = list(range(bundle.header_end)) + list(range(meta.begin, meta.end))
    outcomes = {"ok": 0, "error": 0}
    for _ in range(300):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.choice(targets)] ^= 1 << rng.randrange(8)
        try:
            _read_everything(bytes(data))
            outcomes["ok"] += 1
        except ModelFormatError:
            outcomes["error"] += 1
    assert outcomes["ok"] and outcomes["error"], outcomes       # both kinds of flips happened
    for _ in range(200):
        data = bytearray(os.urandom(rng.randint(0, 64)))
        try:
            LlmMetadata.from_bytes(bytes(data))
        except ModelFormatError:
            pass
    hf_bundle = Bundle.from_bytes(BundleWriter().hf_tokenizer(hf_json).build())
    packed = bytes(hf_bundle.data(hf_bundle.sections[0]))
    for _ in range(100):
        data = bytearray(packed)
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        try:
            load_tokenizer("huggingface", bytes(data)).encode(SAMPLES[0])
        except ModelFormatError:
            pass


# ---------------------------------------------------------------------------------------------
# Against LiteRT-LM's own tools, where they are installed
# ---------------------------------------------------------------------------------------------
EXPORT_VENV = Path(os.environ.get("LITEGPU_EXPORT_VENV") or Path.home() / ".cache" / "litegpu" / "export-venv")
# The tools' environment is someone else's: run it without writing bytecode into it.
_TOOL_ENV = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}

# LiteRT-LM's Python reader (litert_lm_builder's peek module, generated flatbuffer schema and
# protobuf classes): prints what it sees in a bundle as JSON.
LITERT_LM_READ = r"""
import io, json, struct, sys
from google.protobuf import json_format
from litert_lm_builder import litertlm_core, litertlm_peek
from litert_lm_builder.runtime.proto import llm_metadata_pb2
path = sys.argv[1]
header = litertlm_peek.read_litertlm_header(path, io.StringIO())
data = open(path, "rb").read()
out = {"version": list(struct.unpack_from("<III", data, 8)), "header_end": struct.unpack_from("<Q", data, 24)[0]}
system = header.SystemMetadata()
out["system"] = {e["key"]: e["value"] for e in (litertlm_peek.kvp_to_dict(system.Entries(i))
                                               for i in range(system.EntriesLength()))}
out["sections"] = []
sections = header.SectionMetadata()
for i in range(sections.ObjectsLength()):
    s = sections.Objects(i)
    kind = litertlm_core.any_section_data_type_to_string(s.DataType())
    record = {"type": kind, "begin": s.BeginOffset(), "end": s.EndOffset(),
              "items": {e["key"]: e["value"] for e in (litertlm_peek.kvp_to_dict(s.Items(j))
                                                      for j in range(s.ItemsLength()))}}
    if kind == "LlmMetadataProto":
        md = llm_metadata_pb2.LlmMetadata()
        md.ParseFromString(data[s.BeginOffset():s.EndOffset()])
        record["llm_metadata"] = json_format.MessageToDict(md, preserving_proto_field_name=True)
    out["sections"].append(record)
print(json.dumps(out))
"""

# LiteRT-LM's C++ loader, through litert_lm.ModelInfo.
LITERT_LM_MODEL_INFO = r"""
import json, sys
import litert_lm
litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
with litert_lm.ModelInfo(sys.argv[1]) as info:
    sampler = info.llm.default_sampler_params
    print(json.dumps({"llm": info.is_llm_model, "max_context_tokens": info.max_context_tokens,
                      "min_runtime_version": info.min_runtime_version,
                      "supports_thinking": info.llm.supports_thinking(),
                      "supports_function_calling": info.llm.supports_function_calling(),
                      "top_k": sampler.top_k, "top_p": sampler.top_p, "temperature": sampler.temperature,
                      "text_backends": info.supported_backends_for_modality(litert_lm.LiteRtLmModality.TEXT)}))
"""

# METADATA as LiteRT-LM's protobuf classes print it (json_format.MessageToDict).
METADATA_AS_PROTOBUF = {
    "start_token": {"token_ids": {"ids": [1]}},
    "stop_tokens": [{"token_ids": {"ids": [2]}}, {"token_str": "<end_of_turn>"}],
    "prompt_templates": {"user": {"prefix": "<start_of_turn>user\n", "suffix": "<end_of_turn>\n"},
                         "model": {"prefix": "<start_of_turn>model\n"}},
    "sampler_params": {"type": "TOP_K", "k": 40, "p": 0.75, "temperature": 0.5, "seed": -7},
    "max_num_tokens": 1280,
    "llm_model_type": {"qwen3": {"code_fence_start": "```tool"}},
    "jinja_prompt_template": "{% for m in messages %}{{ m.content }}{% endfor %}",
    "suppress_tokens": {"ids": [5, 300, -3]},
    "supports_thinking": True,
    "supports_function_calling": False,
    "min_runtime_version": "0.11.0",
}

# The same metadata as a text proto, for LiteRT-LM's builder to serialize with protobuf itself.
METADATA_TEXTPROTO = r"""
start_token { token_ids { ids: 1 } }
stop_tokens { token_ids { ids: 2 } }
stop_tokens { token_str: "<end_of_turn>" }
prompt_templates {
  user { prefix: "<start_of_turn>user\n" suffix: "<end_of_turn>\n" }
  model { prefix: "<start_of_turn>model\n" }
}
sampler_params { type: TOP_K k: 40 p: 0.75 temperature: 0.5 seed: -7 }
max_num_tokens: 1280
llm_model_type { qwen3 { code_fence_start: "```tool" } }
jinja_prompt_template: "{% for m in messages %}{{ m.content }}{% endfor %}"
suppress_tokens { ids: [5, 300, -3] }
supports_thinking: true
supports_function_calling: false
min_runtime_version: "0.11.0"
"""


@pytest.fixture(scope="module")
def litert_lm_python() -> Path:
    """The Python of the environment with LiteRT-LM's builder; skips, saying why, without it."""
    python = EXPORT_VENV / "bin" / "python"
    if not python.is_file():
        pytest.skip(f"LiteRT-LM's tools are not installed: no {python} (a virtual environment with "
                    "litert-lm-builder and litert-lm-api; set LITEGPU_EXPORT_VENV)")
    probe = subprocess.run([str(python), "-c", "import litert_lm_builder.litertlm_builder_cli, litert_lm"],
                           capture_output=True, text=True, timeout=300, env=_TOOL_ENV)
    if probe.returncode:
        pytest.skip(f"{python} cannot import LiteRT-LM's builder: "
                    f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
    return python


def _run(python: Path, args: list[str], cwd: Path) -> str:
    done = subprocess.run([str(python), *args], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env=_TOOL_ENV)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _litert_lm_view(python: Path, path: Path) -> dict:
    return json.loads(_run(python, ["-c", LITERT_LM_READ, str(path)], path.parent).strip().splitlines()[-1])


def _our_view(bundle: Bundle) -> dict:
    return {"version": list(bundle.version), "header_end": bundle.header_end, "system": bundle.system_metadata,
            "sections": [{"type": s.type_name, "begin": s.begin, "end": s.end, "items": s.items}
                         for s in bundle.sections]}


def _without_metadata(view: dict) -> dict:
    return {**view, "sections": [{k: v for k, v in s.items() if k != "llm_metadata"} for s in view["sections"]]}


def test_bundles_from_litert_lm_builder_read_exactly(litert_lm_python, tmp_path, sp_model, hf_json):
    (tmp_path / "decoder.tflite").write_bytes(tiny_tflite())
    (tmp_path / "embedder.tflite").write_bytes(tiny_tflite(3, np.int32))
    (tmp_path / "sp.model").write_bytes(sp_model)
    (tmp_path / "tokenizer.json").write_text(hf_json)
    (tmp_path / "meta.pbtxt").write_text(METADATA_TEXTPROTO)
    common = ["system_metadata", "--str", "Authors", "litegpu tests", "--int", "answer", "42",
              "llm_metadata", "--path", "meta.pbtxt",
              "tflite_model", "--path", "embedder.tflite", "--model_type", "embedder",
              "tflite_model", "--path", "decoder.tflite", "--model_type", "prefill_decode",
              "--backend_constraint", "cpu", "--str_metadata", "model_version", "1.0.1"]
    cli = ["-m", "litert_lm_builder.litertlm_builder_cli"]
    _run(litert_lm_python, [*cli, *common, "sp_tokenizer", "--path", "sp.model", "output", "--path", "sp.litertlm"],
         tmp_path)
    _run(litert_lm_python, [*cli, *common, "hf_tokenizer", "--path", "tokenizer.json",
                            "output", "--path", "hf.litertlm"], tmp_path)

    for name, tokenizer_type in (("sp", "SP_Tokenizer"), ("hf", "HF_Tokenizer_Zlib")):
        path = tmp_path / f"{name}.litertlm"
        bundle = Bundle.open(path)
        theirs = _litert_lm_view(litert_lm_python, path)
        assert _our_view(bundle) == _without_metadata(theirs)
        assert theirs["sections"][0]["llm_metadata"] == METADATA_AS_PROTOBUF
        # What the builder was given, and how it laid it out.
        assert bundle.version[0] == 1 and bundle.header_end == theirs["header_end"]
        assert {k: bundle.system_metadata[k] for k in ("Authors", "answer")} == {"Authors": "litegpu tests",
                                                                               "answer": 42}
        assert set(bundle.system_metadata) == {"Authors", "answer", "uuid", "creation_timestamp"}
        assert [(s.type_name, s.items) for s in bundle.sections] == [
            ("LlmMetadataProto", {}),
            ("TFLiteModel", {"model_type": "tf_lite_embedder"}),
            ("TFLiteModel", {"model_type": "tf_lite_prefill_decode", "backend_constraint": "cpu",
                             "model_version": "1.0.1"}),
            (tokenizer_type, {})]
        assert all(s.begin % BLOCK_SIZE == 0 for s in bundle.sections) and bundle.nbytes == bundle.sections[-1].end
        assert bundle.metadata == METADATA
        assert bytes(bundle.model_bytes()) == tiny_tflite()
        assert bytes(bundle.model_bytes("embedder")) == tiny_tflite(3, np.int32)
        tok = bundle.tokenizer()
        if name == "sp":
            assert bytes(bundle.data(bundle.sections[3])) == sp_model
            reference = sentencepiece.SentencePieceProcessor(model_proto=sp_model)
            assert all(tok.encode(t) == reference.encode(t) and tok.decode(tok.encode(t)) == t for t in SAMPLES)
        else:
            assert decompress_hf_tokenizer(bundle.data(bundle.sections[3])) == hf_json.encode()
            reference = tokenizers.Tokenizer.from_str(hf_json)
            assert all(tok.encode(t) == reference.encode(t, add_special_tokens=False).ids for t in SAMPLES)
            assert all(tok.decode(tok.encode(t)) == t for t in SAMPLES)


def test_bundles_written_here_read_in_litert_lm(litert_lm_python, tmp_path, sp_model):
    path = full_bundle(sp_model).write(tmp_path / "ours.litertlm")
    theirs = _litert_lm_view(litert_lm_python, path)
    assert _without_metadata(theirs) == _our_view(Bundle.open(path))
    assert theirs["version"] == [1, 7, 0] and theirs["system"] == {"Authors": "litegpu tests", "answer": 42}
    assert theirs["sections"][0]["llm_metadata"] == METADATA_AS_PROTOBUF
    # LiteRT-LM's C++ loader: the metadata's defaults and the model's backend constraint.
    out = _run(litert_lm_python, ["-c", LITERT_LM_MODEL_INFO, str(path)], tmp_path)
    info = json.loads(out.strip().splitlines()[-1])
    assert info == {"llm": True, "max_context_tokens": 1280, "min_runtime_version": "0.11.0",
                    "supports_thinking": True, "supports_function_calling": False,
                    "top_k": 40, "top_p": 0.75, "temperature": 0.5, "text_backends": ["cpu"]}
