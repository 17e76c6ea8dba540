"""Decoder LLMs exported by litert-torch (prefill/decode signatures, external KV cache):
litegpu's greedy tokens and logits against LiteRT's under one generation loop, on cpu and
on a GPU backend; and litegpu.lm's Engine over a .litertlm bundle.

The models are made by ``benchmarks/export_decoders.py`` (litert-torch and torch in their
own virtual environment) into ``$LITEGPU_DECODERS_DIR`` or ``~/.cache/litegpu/decoders``;
``.ci/run`` makes the ones named in :data:`MODELS` before the suite. Without them these
tests skip, saying so (``LITEGPU_TEST_REQUIRE=decoders`` turns the skip into a failure: tests/conftest.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT

from litegpu import load_model
from litegpu.errors import InvalidArgumentError, ModelFormatError, ResourceLimitError
from litegpu.lm import Engine, SamplerConfig
from litegpu.testing.lm_bundle import BundleWriter

# (file, tolerance of the largest logit error relative to LiteRT's largest logit)
MODELS = [("llama_f32_comp", 1e-4), ("llama_int8_dynamic_nocomp", 5e-3), ("llama_int4_block32_comp", 5e-3),
          ("phi2_int8_dynamic_comp", 5e-3), ("gemma2_int8_dynamic_comp", 5e-3)]
PROMPT = [5, 17, 99, 3, 250, 7, 64, 128, 9, 11, 300, 42]


def _greedy(engine: Engine, steps: int) -> tuple[list[int], np.ndarray]:
    session = engine.create_session()
    session.prefill_tokens(PROMPT)
    tokens, logits = [], []
    for _ in range(steps):
        tokens.append(session.decode_token())
        logits.append(session.logits.copy())
    return tokens, np.array(logits)


@pytest.mark.parametrize("name, tol", MODELS, ids=[m for m, _ in MODELS])
def test_greedy_decoding_matches_litert_on_cpu(name, tol, decoder):
    path = decoder(name)
    want_tokens, want = _greedy(Engine(path, runtime=LiteRT), 32)
    got_tokens, got = _greedy(Engine(path), 32)
    assert got_tokens == want_tokens
    assert np.abs(got - want).max() <= tol * np.abs(want).max()


def test_greedy_decoding_matches_litert_on_each_backend(backend, decoder):
    """The float model on each backend the suite tests (PoCL and lavapipe in CI): on a GPU
    API, EMBEDDING_LOOKUP of run-time ids stays on cpu and the rest runs on the device."""
    path = decoder("llama_f32_comp")
    want_tokens, want = _greedy(Engine(path, runtime=LiteRT), 8)
    engine = Engine(path, backend=backend)
    got_tokens, got = _greedy(engine, 8)
    assert got_tokens == want_tokens
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
    report = engine.delegation_report("decode")
    assert report.nodes_on(backend) >= len(report.assignments) - 1
    if backend != "cpu":       # the KV cache lives in device memory, in and out
        session = engine.create_session()
        assert all(buf.is_device for kv in session.state.sets for buf in kv.values())


@pytest.mark.parametrize("name", ["phi2_int8_dynamic_comp", "gemma2_int8_dynamic_comp", "llama_int4_block32_comp",
                                  "phi3_int8_dynamic_comp", "falcon_int8_dynamic_comp_legacy"])
def test_hybrid_decoders_give_litert_s_logits_to_the_bit_on_each_gpu_backend(gpu_name, name, decoder):
    """A hybrid decoder quantizes each product's input row on the fly, where an ulp of float
    arithmetic upstream (Phi-2's GELU and LayerNorm, Gemma 2's soft-capping TANH, RoPE's
    SIN and COS, Phi-3.5's RoPE computed from the positions, Falcon's ALiBi) can become a
    quantum: PoCL and lavapipe (one work-item a row, as a CPU
    device runs) compute XNNPACK's float32 operations, so the logits are LiteRT's bits."""
    path = decoder(name)
    want_tokens, want = _greedy(Engine(path, runtime=LiteRT), 8)
    got_tokens, got = _greedy(Engine(path, backend=gpu_name), 8)
    assert got_tokens == want_tokens
    np.testing.assert_array_equal(got, want)


@pytest.fixture
def bundle(tmp_path_factory, decoder) -> Path:
    """The f32 llama with a SentencePiece tokenizer trained here (the model's vocabulary: 512)
    and metadata: start token, a stop token, a prompt template."""
    import sentencepiece as spm
    path = decoder("llama_f32_comp")
    text = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    sentences = tmp_path_factory.mktemp("spm") / "text.txt"
    sentences.write_text("\n".join(line for line in text.splitlines() if line.strip()), encoding="utf-8")
    prefix = sentences.parent / "tok"
    spm.SentencePieceTrainer.train(input=str(sentences), model_prefix=str(prefix), vocab_size=512,
                                   model_type="bpe", bos_id=1, eos_id=2, pad_id=0, unk_id=3,
                                   minloglevel=2)
    from litegpu.lm import LlmMetadata, PromptAffixes, PromptTemplates, TokenUnion
    writer = BundleWriter()
    writer.model(path.read_bytes())
    writer.sentencepiece((prefix.with_suffix(".model")).read_bytes())
    writer.llm_metadata(LlmMetadata(start_token=TokenUnion(ids=(1,)), stop_tokens=(TokenUnion(ids=(2,)),),
                                    prompt_templates=PromptTemplates(user=PromptAffixes("<u>", "</u>")),
                                    max_num_tokens=96))
    out = tmp_path_factory.mktemp("bundle") / "llama.litertlm"
    writer.write(out)
    return out


def test_an_engine_over_a_bundle_generates_what_litert_generates(bundle):
    runs = []
    for runtime in (LiteRT, None):
        with Engine(bundle, runtime=runtime) as engine:
            assert engine.max_num_tokens == 96
            session = engine.create_session(sampler_config=SamplerConfig(top_k=1))
            text = session.generate("the cpu backend", max_tokens=20)
            runs.append((text, session.position, session.get_benchmark_info()))
    (want, at_want, _), (got, at_got, info) = runs
    assert got == want and at_got == at_want
    assert info.decode_tokens >= 1 and info.decode_tokens_per_second > 0
    # The prompt went in wrapped in the template, after the start token.
    with Engine(bundle) as engine:
        ids = engine.create_session().encode_prompt("hi", first=True)
        tok = engine.tokenizer
        assert ids == [1, *tok.encode("<u>"), *tok.encode("hi"), *tok.encode("</u>")]


def test_sampling_is_seeded_and_stays_within_top_k(bundle):
    with Engine(bundle) as engine:
        draws = []
        for _ in range(2):
            session = engine.create_session(sampler_config=SamplerConfig(top_k=5, temperature=1.0, seed=7))
            session.run_prefill(["sampling"])
            tokens = []
            for _ in range(6):
                tokens.append(session.decode_token())
                assert tokens[-1] in np.argsort(-session.logits)[:5]
            draws.append(tokens)
        assert draws[0] == draws[1]


def test_a_prompt_longer_than_the_cache_is_refused(bundle):
    with Engine(bundle) as engine:
        session = engine.create_session()
        with pytest.raises(ResourceLimitError, match="exceed the model's 96"):
            session.prefill_tokens(list(range(3, 200)))
        assert session.position == 0       # nothing was fed


def test_decoding_before_prefill_and_text_without_a_tokenizer_are_refused(decoder):
    path = decoder("llama_f32_comp")
    session = Engine(path).create_session()
    with pytest.raises(InvalidArgumentError, match="decode before any prefill"):
        session.decode_token()
    with pytest.raises(InvalidArgumentError, match="no tokenizer"):
        session.run_prefill(["hello"])


def test_a_model_that_is_not_a_decoder_is_named_so(tmp_path):
    from litegpu.testing.builder import two_layer_mlp
    path = tmp_path / "mlp.tflite"
    path.write_bytes(two_layer_mlp())
    with pytest.raises(ModelFormatError, match="no 'decode' signature"):
        Engine(path)


def test_the_generate_command_prints_the_text_and_the_speeds(bundle, capsys):
    from litegpu.cli import main
    assert main(["generate", str(bundle), "--prompt", "the cpu backend", "--max-tokens", "6"]) == 0
    out, err = capsys.readouterr()
    with Engine(bundle) as engine:
        session = engine.create_session()
        assert out.strip() == session.generate("the cpu backend", max_tokens=6).strip()
    assert "decode:" in err and "tokens/s" in err


def test_the_generate_command_names_a_damaged_bundle_in_one_line(bundle, tmp_path, capsys):
    from litegpu.cli import main
    damaged = tmp_path / "damaged.litertlm"
    data = bytearray(bundle.read_bytes())
    data[24:32] = (len(data) * 4).to_bytes(8, "little")     # the header would end past the file
    damaged.write_bytes(bytes(data))
    assert main(["generate", str(damaged), "--prompt", "x"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("litegpu: error:") and "damaged.litertlm" in err[0]


LITERT_LM = '''
import sys
import litert_lm
with litert_lm.Engine(sys.argv[1], backend=litert_lm.Backend.CPU) as engine:
    config = litert_lm.SamplerConfig(top_k=1, top_p=1.0, temperature=1.0, seed=0)
    with engine.create_session(sampler_config=config) as session:
        session.run_prefill([sys.argv[2]])
        sys.stdout.write(repr(session.run_decode().texts[0]))
'''


@pytest.mark.parametrize("name", ["llama_f32_comp", "gemma_int4_block32_comp"])
def test_a_bundle_generates_litert_lm_s_text(name, tmp_path, decoder, litert_lm_python):
    """LiteRT-LM itself (litert-lm-api, in the exporter's environment: it is not a
    dependency of litegpu) on the exported bundle: greedy, to the end of the cache."""
    import subprocess
    bundle = decoder(name, ".litertlm")
    python = litert_lm_python
    script = tmp_path / "litert_lm_generate.py"
    script.write_text(LITERT_LM)
    run = subprocess.run([str(python), str(script), str(bundle), "Why is the sky blue?"], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    with Engine(bundle) as engine:
        assert engine.create_session().generate("Why is the sky blue?") == eval(run.stdout)


@pytest.mark.parametrize("name, product", [("llama_int8_dynamic_comp", "DynamicQuantizedMatmul"),
                                           ("llama_int4_block32_comp", "BlockwiseQuantizedMatmul")])
def test_prefill_and_decode_share_their_packed_weights(decoder, monkeypatch, name, product):
    """The prefill and decode signatures name the same weight buffers: each weight is packed
    once (litegpu_cpu.kernels.shared_weights), and the answers stay LiteRT's."""
    from litegpu_cpu.kernels import qb4w, qd8gemm
    cls = getattr(qd8gemm if product == "DynamicQuantizedMatmul" else qb4w, product)
    made = []
    init = cls.__init__
    monkeypatch.setattr(cls, "__init__", lambda self, *a, **k: (init(self, *a, **k), made.append(self))[0])
    path = decoder(name)
    tokens, _ = _greedy(Engine(path), 8)
    model = load_model(str(path))
    weights = [sg.tensors[n.inputs[1]].data for sg in model.subgraphs for n in sg.nodes if n.op == "FULLY_CONNECTED"]
    buffers = {w.__array_interface__["data"][0] for w in weights}
    assert len(made) == len(weights) > len(buffers)       # the prefill's products read the decode's weights
    assert len({id(p.weights) for p in made}) == len(buffers)
    assert tokens == _greedy(Engine(path, runtime=LiteRT), 8)[0]


def test_sessions_of_one_engine_on_two_threads_each_get_their_own_tokens(decoder):
    """Two threads, a session each on one engine: the sessions share the engine's input
    arrays, which a step fills and runs under the engine's lock, and each has its own
    output buffers (a shared logits buffer let one thread sample the other's logits), so
    each thread's tokens are what it gets alone."""
    import threading
    path = decoder("llama_int8_dynamic_comp")
    prompts = [PROMPT, [9, 8, 7, 300, 2, 55, 41, 18, 77, 5, 6, 10]]
    with Engine(path) as engine:
        alone = []
        for prompt in prompts:
            session = engine.create_session()
            session.prefill_tokens(prompt)
            alone.append([session.decode_token() for _ in range(32)])
        together: list = [None, None]

        def run(i: int) -> None:
            session = engine.create_session()
            session.prefill_tokens(prompts[i])
            together[i] = [session.decode_token() for _ in range(32)]
        for _ in range(8):
            threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert together == alone


def test_a_session_s_first_steps_bind_to_its_cache(decoder):
    """The engine tells the model that a session's cache and feeds are run again, so the
    first prefill and the first decode step each bind the model's steps to those arrays
    (where a first run on new arrays takes the copying path), and the tokens and logits
    are LiteRT's."""
    path = decoder("llama_f32_comp")
    with Engine(path) as engine:
        model = engine.io.model
        session = engine.create_session()
        assert not model._host_runs
        session.prefill_tokens(PROMPT)
        used = next(s.key for s in engine.prefills if s.length >= len(PROMPT) - 1)
        assert {ids[0] for ids in model._host_runs} == {used}
        session.decode_token()
        assert engine.decode.key in {ids[0] for ids in model._host_runs}
        del session
        tokens, logits = _greedy(engine, 8)
    want_tokens, want = _greedy(Engine(path, runtime=LiteRT), 8)
    assert tokens == want_tokens
    np.testing.assert_allclose(logits, want, rtol=0, atol=1e-4 * np.abs(want).max())
