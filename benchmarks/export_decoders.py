"""Tiny random-weight decoder LLMs exported with litert-torch: our own generative test models.

usage:
    python benchmarks/export_decoders.py [--out DIR] [--size {tiny,small}] [--family F ...] [--variant V ...]
                                         [--composites {both,on,off}] [--layout L ...]
                                         [--list] [--force] [--no-check] [--no-bundle]

LiteRT-LM users get their ``.tflite`` / ``.litertlm`` decoders from litert-torch's generative
API: a model re-authored from a config (``litert_torch.generative.examples``), converted with
``prefill_N`` and ``decode`` signatures and an external KV cache
(``litert_torch.generative.utilities.converter``), quantized with one of its recipes, and
bundled with a tokenizer. This script goes down that same path with configs shrunk to a toy
size and seeded random weights, so the files have the ops, quantization schemes and
signatures of the real ones at a few hundred kilobytes each and without downloading a
checkpoint. (litert-torch's other route, ``generative/export_hf``, converts Hugging Face
Transformers models instead; it is not used here.)

Setup (never litegpu's environment: litert-torch pins its own numpy, jax and protobuf):

    python -m venv ~/.cache/litegpu/export-venv
    ~/.cache/litegpu/export-venv/bin/pip install torch==2.13.0     # first, exactly: a CPU wheel
    ~/.cache/litegpu/export-venv/bin/pip install litert-torch==0.10.0 litert-lm-api
    ~/.cache/litegpu/export-venv/bin/python benchmarks/export_decoders.py

(installing torch first, pinned, keeps pip from resolving litert-torch's ``torch`` to a
multi-GB CUDA build). The venv is about 2.3 GB; the installs take about 1.5 minutes.

What it writes, in ``--out`` (default ``$LITEGPU_DECODERS_DIR``, else
``~/.cache/litegpu/decoders``; never the repository):

- ``<family>_<variant>_<comp|nocomp>[_legacy].tflite`` for every family, weight variant,
  composite setting and KV layout (``--list`` prints the plan);
- ``<same stem>.litertlm`` for the bundled ones (``BUNDLED``, LiteRT-LM layout only): the
  tflite, a SentencePiece tokenizer and LLM metadata (start/stop tokens, prompt template);
- ``tokenizer.model``: SentencePiece BPE, 512 pieces (the models' vocabulary), trained on the
  repository's README and docs;
- ``<stem>.litert.npz``: LiteRT's answers for the seeded prompt: ``prompt`` (17 ids: prefill
  16, then decode from the 17th), and per op resolver that ran it (``xnnpack``: the default
  delegate; ``builtin``: LiteRT's own kernels) ``<resolver>_generated`` (8 greedy tokens) and
  ``<resolver>_logits`` ([8, 512], one row per decode step);
- ``manifest.json``: per file its family, variant, composites, size, signatures (names,
  shapes, dtypes), operators (composites by name, with their attributes), tensor types, how
  its weights are quantized, and whether LiteRT (and LiteRT-LM, for bundles) ran it.

A file already there is kept (not re-exported) when the manifest says it was made from the
same recipe (``build_key``); ``--force`` re-exports. The checks in LiteRT run again on every
call (seconds), each in a subprocess so that a crash in native code is recorded, not fatal.
Exports are deterministic (byte-identical when redone).

Time on 2 cores: everything (272 tflite, 33 bundles) about 40 minutes, 5-8 s a model; a cached
call about a minute. A CI-sized pair, about 35 s: the Gemma shape has the most ops, int4
blockwise the newest weight format, and the two layouts give both composites and a bundle;
only LOGISTIC (the others' SiLU) and DEQUANTIZE (fp16 and int8 weight-only) are missing:

    python benchmarks/export_decoders.py --family gemma --variant int4_block32 \\
        --composites on --layout lm legacy

Families (shapes from ``TINY``: 2 layers, hidden 128, 4 heads of 32 over 2 KV groups, FFN 256,
vocab 512, KV cache 128, prefill 16):

- ``llama``: Llama 3.2 (``examples/llama``): llama3 RoPE scaling, SiLU-gated FFN, tied head;
- ``gemma``: Gemma 3 (``examples/gemma3``): zero-centred RMS norms before and after attention
  and FFN, query/key norms, GELU-tanh, embedding scale, a sliding-window layer then a global;
- ``qwen``: Qwen 3 (``examples/qwen/qwen3.py``): query/key RMS norms;
- ``qwen2``: Qwen 2.5 (``examples/qwen/qwen.py``): biases on the q/k/v projections;
- ``smollm``: SmolLM2 (``examples/smollm``), a Llama shape with plain RoPE;
- ``gemma2``: Gemma 2 (``examples/gemma/gemma2.py``): attention and final-logit soft-capping
  (``TANH``), a sliding-window layer then a global;
- ``phi2``: Phi-2 (``examples/phi/phi2.py``): LayerNorm (a MEAN over axes [0, 2]), GELU,
  rotary on 40% of each head, attention and FFN in parallel, biases;
- ``openelm``: OpenELM (``examples/openelm``): heads and KV groups that differ from layer to
  layer (2/1, then 4/2), query/key norms.
- ``gemma1``: Gemma 1 (``examples/gemma/gemma1.py``): one KV group for all heads (multi-query);
- ``phi3``: Phi-3.5 mini (``examples/phi/phi3.py``): RoPE frequencies divided by per-pair
  factors and scaled (computed in the graph from the positions), a KV group per head;
- ``phi4``: Phi-4 mini (``examples/phi/phi4.py``): that RoPE on 75% of each head;
- ``falcon``: Falcon (``examples/falcon``): ALiBi position biases instead of RoPE, LayerNorm
  with bias, biases on every projection, GELU; legacy layout only (see ``refused``).

Weight variants are litert-torch 0.10's own recipes (``converter.QuantizationName``): ``f32``,
``fp16``, ``int8_dynamic``, ``int8_weight_only``, ``int4_block32``, ``int4_block128``.
Composites: ``comp`` keeps litert-torch's high-level function boundaries (``enable_hlfb``:
``odml.rms_norm`` and, in the legacy layout only, ``odml.scaled_dot_product_attention`` as
``STABLEHLO_COMPOSITE`` ops, each with its own decomposition subgraph); ``nocomp`` turns them
off, leaving plain builtins. Layouts (``LAYOUTS``): ``lm`` (no suffix) is the KV cache and
mask convention LiteRT-LM runs; ``legacy`` is the default of most example scripts.

Run it with the export venv's python. ``--list`` and ``--help`` work from any python.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger("export_decoders")

REPO = Path(__file__).resolve().parents[1]
SEED = 20261128


@dataclasses.dataclass(frozen=True)
class TinyShape:
    """The toy size every family is shrunk to (one place, so the build key covers it)."""

    num_layers: int = 2
    embedding_dim: int = 128
    num_heads: int = 4
    head_dim: int = 32
    num_query_groups: int = 2
    intermediate_size: int = 256
    vocab_size: int = 512
    kv_cache_max_len: int = 128
    prefill_len: int = 16
    # Gemma 3's local layers: smaller than the prompt, so the window actually masks.
    sliding_window: int = 8


TINY = TinyShape()
# --size: ``tiny`` for the tests; ``small``, about 100M parameters (12 layers, hidden 768, 12
# heads of 64 over 4 KV groups, FFN 2048, vocab 32000), the size of a real small LLM's compute
# per token, for speed (and the larger of the two sizes the GPU acceptance script carries).
SIZES = {
    "tiny": TINY,
    "small": TinyShape(num_layers=12, embedding_dim=768, num_heads=12, head_dim=64, num_query_groups=4,
                       intermediate_size=2048, vocab_size=32000, kv_cache_max_len=512, prefill_len=64,
                       sliding_window=32),
}

# Weight variant -> litert-torch's quantization flag (converter.QuantizationName values).
VARIANTS = {
    "f32": "none",
    "fp16": "fp16",
    "int8_dynamic": "dynamic_int8",
    "int8_weight_only": "weight_only_int8",
    "int4_block32": "dynamic_int4_block32",
    "int4_block128": "dynamic_int4_block128",
}

# KV cache and mask conventions (ExportConfig). "lm" is what LiteRT-LM runs: litert-torch's
# Gemma 2/3 and DeepSeek conversion scripts default to it (--mask_as_input
# --transpose_kv_cache): K cache [1, kv_heads, len, head_dim], V cache [1, kv_heads, head_dim,
# len], causal mask an input. "legacy" is the other scripts' default (Llama, Qwen, SmolLM):
# K and V [1, len, kv_heads, head_dim], mask built inside the model from a cache. LiteRT-LM
# reads the cache length from the transposed layout, so it refuses legacy files ("static
# model supports 2" tokens: the head count).
LAYOUTS = ("lm", "legacy")

# (variant, composites) pairs bundled as .litertlm for every family ("lm" layout only).
# int8 per-channel and int4 blockwise are the weights LiteRT-LM's own models ship with.
BUNDLED = (("f32", True), ("int8_dynamic", True), ("int4_block32", True))

# Tokens of the SentencePiece model; ids fixed so the LLM metadata can name them.
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
TURN_START, TURN_END = "<start_of_turn>", "<end_of_turn>"

DECODE_STEPS = 8
# Pieces BPE learns from the docs for the tiny vocabulary (train_tokenizer).
LEARNED_PIECES = 512


# -- families: litert-torch's example configs, shrunk --------------------------------------------

@dataclasses.dataclass(frozen=True)
class Family:
    """A decoder family: where its config and model class come from in litert-torch."""

    name: str
    summary: str
    build: Callable[[], tuple[Any, type]]   # -> (ModelConfig at TINY size, model class)
    # Weight variants or KV layouts the converter refuses for this shape, and why (not planned).
    refused: dict[str, str] = dataclasses.field(default_factory=dict)


def _shrink(config, local_global: bool = False, heads: tuple[tuple[int, int], ...] = ()):
    """Shrinks an example's ModelConfig to TINY in place (blocks may share sub-configs);
    ``heads``: (query heads, KV groups) per layer where they differ from layer to layer."""
    config.vocab_size = TINY.vocab_size
    config.num_layers = TINY.num_layers
    config.embedding_dim = TINY.embedding_dim
    if config.embedding_scale is not None:
        config.embedding_scale = TINY.embedding_dim ** 0.5
    if isinstance(config.block_configs, (list, tuple)):   # one config per layer
        config.block_configs = list(config.block_configs[: TINY.num_layers])
    for i in range(TINY.num_layers):
        block = config.block_config(i)
        attn = block.attn_config
        attn.num_heads, attn.num_query_groups = heads[i] if heads else (TINY.num_heads, TINY.num_query_groups)
        attn.head_dim = TINY.head_dim
        block.ff_config.intermediate_size = TINY.intermediate_size
        if local_global:
            _make_local_global(attn, is_global=(i == TINY.num_layers - 1))
    return config


def _make_local_global(attn, is_global: bool):
    """Gemma 3 alternates 5 sliding-window layers and 1 global; two layers keep one of each."""
    import litert_torch.generative.layers.model_config as cfg

    attn.attn_type = cfg.AttentionType.GLOBAL if is_global else cfg.AttentionType.LOCAL_SLIDING
    attn.rotary_base = 1_000_000 if is_global else 10_000
    attn.sliding_window_size = TINY.sliding_window


def _llama():
    from litert_torch.generative.examples.llama import llama
    return _shrink(llama.get_1b_model_config()), llama.Llama


def _gemma():
    from litert_torch.generative.examples.gemma3 import decoder
    return _shrink(decoder.get_decoder_config_1b(), local_global=True), decoder.Decoder


def _qwen():
    from litert_torch.generative.examples.qwen import qwen3
    return _shrink(qwen3.get_0_6b_model_config()), qwen3.Qwen3


def _qwen2():
    from litert_torch.generative.examples.qwen import qwen
    return _shrink(qwen.get_0_5b_model_config()), qwen.Qwen


def _gemma2():
    from litert_torch.generative.examples.gemma import gemma2
    return _shrink(gemma2.get_model_config_2b(), local_global=True), gemma2.Gemma2


def _phi2():
    from litert_torch.generative.examples.phi import phi2
    return _shrink(phi2.get_model_config()), phi2.Phi2


def _openelm():
    from litert_torch.generative.examples.openelm import openelm
    config = openelm.get_model_config()
    # Each layer its own config, as OpenELM's (whose head counts grow with depth).
    config.block_configs = [dataclasses.replace(config.block_config(i), attn_config=dataclasses.replace(
        config.block_config(i).attn_config), ff_config=dataclasses.replace(config.block_config(i).ff_config))
        for i in range(TINY.num_layers)]
    return _shrink(config, heads=((2, 1), (4, 2))), openelm.OpenELM


def _smollm():
    from litert_torch.generative.examples.smollm import smollm
    return _shrink(smollm.get_model_config_v2()), smollm.SmolLM2


def _gemma1():
    from litert_torch.generative.examples.gemma import gemma1
    return _shrink(gemma1.get_model_config_2b(), heads=((4, 1),) * TINY.num_layers), gemma1.Gemma1


def _shrunk_rope_factors(config) -> None:
    """Phi-3/4's RoPE divides each rotated pair's frequency by a factor (``theta_factors``,
    one per pair of the full-size head): keep as many as the tiny head rotates."""
    import functools

    rope, attn = config.build_rope, config.block_config(0).attn_config
    pairs = int(attn.head_dim * attn.rotary_percentage) // 2
    config.build_rope = functools.partial(rope.func, *rope.args,
                                          **{**rope.keywords, "theta_factors": rope.keywords["theta_factors"][:pairs]})


def _phi3():
    from litert_torch.generative.examples.phi import phi3
    config = _shrink(phi3.get_model_config(), heads=((4, 4),) * TINY.num_layers)
    _shrunk_rope_factors(config)
    return config, phi3.Phi3_5Mini


def _phi4():
    from litert_torch.generative.examples.phi import phi4
    config = _shrink(phi4.get_model_config())
    _shrunk_rope_factors(config)
    return config, phi4.Phi4Mini


def _falcon():
    from litert_torch.generative.examples.falcon import falcon
    return _shrink(falcon.get_model_config(), heads=((4, 4),) * TINY.num_layers), falcon.Falcon


FAMILIES = {f.name: f for f in (
    Family("llama", "Llama 3.2: llama3 RoPE scaling, SiLU-gated FFN, tied head", _llama),
    Family("gemma", "Gemma 3: zero-centred pre/post norms, q/k norms, GELU-tanh, "
                    "sliding-window + global layer", _gemma),
    Family("qwen", "Qwen 3: q/k RMS norms", _qwen),
    Family("qwen2", "Qwen 2.5: q/k/v projection biases", _qwen2),
    Family("smollm", "SmolLM2: Llama shape, plain RoPE", _smollm),
    Family("gemma2", "Gemma 2: attention and final logit soft-capping (TANH), sliding-window + global layer",
           _gemma2),
    Family("phi2", "Phi-2: LayerNorm, GELU, partial rotary, parallel attention and FFN, biases", _phi2),
    Family("openelm", "OpenELM: head counts that differ from layer to layer, q/k norms", _openelm,
           refused={"int4_block128": "its first layer's attention output has 64 inputs, which the converter "
                                     "cannot cut into blocks of 128"}),
    Family("gemma1", "Gemma 1: one KV group for all heads (multi-query), GELU-tanh gate", _gemma1),
    Family("phi3", "Phi-3.5: RoPE frequencies divided by per-pair factors and scaled, "
                   "multi-head (a KV group per head)", _phi3),
    Family("phi4", "Phi-4 mini: Phi-3's scaled RoPE on 75% of each head", _phi4),
    Family("falcon", "Falcon: ALiBi position biases (no RoPE), LayerNorm with bias, biases everywhere, GELU",
           _falcon, refused={"lm": "litert-torch adds its ALiBi bias [1, heads, 1, cache] to the mask input "
                                   "[1, 1, tokens, cache] with a reshape that only fits one token"}),
)}


@dataclasses.dataclass(frozen=True)
class Job:
    """One .tflite to make: a family, a weight variant, composites on or off, a KV layout."""

    family: str
    variant: str
    composites: bool
    layout: str = "lm"

    @property
    def stem(self) -> str:
        suffix = "" if self.layout == "lm" else f"_{self.layout}"
        return f"{self.family}_{self.variant}_{'comp' if self.composites else 'nocomp'}{suffix}"

    @property
    def bundled(self) -> bool:
        return self.layout == "lm" and (self.variant, self.composites) in BUNDLED

    def build_key(self, versions: dict[str, str]) -> str:
        """Everything that changes the file: the job, sizes, seed, tool versions and the
        source of the functions that build and convert the model."""
        recipe = {"job": dataclasses.asdict(self), "quantize": VARIANTS[self.variant],
                  "tiny": dataclasses.asdict(TINY), "seed": SEED, "versions": versions,
                  "code": _builder_source_hash(self.family)}
        return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


def _builder_source_hash(family: str) -> str:
    """Hash of the code that shapes an exported file of ``family``, so editing it re-exports
    (adding a family re-exports no other)."""
    import inspect

    builders = [_shrink, _make_local_global, _shrunk_rope_factors, FAMILIES[family].build,
                _set_composites, _randomize, build_model, _export_config, export_tflite]
    source = "".join(inspect.getsource(fn) for fn in builders)
    return hashlib.sha256(source.encode()).hexdigest()[:16]


# -- export --------------------------------------------------------------------------------------

def install_tflite_schema_alias() -> None:
    """Lets litert-torch import without TensorFlow.

    ``litert_torch/generative/layers/lora.py`` (imported by the generative converter and
    model builder) does ``from tensorflow.lite.python import schema_py_generated``, but
    litert-torch does not depend on TensorFlow. ai-edge-litert ships the same generated
    schema module (``ai_edge_litert.schema_py_generated``), so we register it under that
    dotted name. Only the two leaf names go in ``sys.modules``, never a ``tensorflow``
    package: ``from a.b.c import d`` finds ``a.b.c`` there without importing its parents,
    while torch, transformers and jax, which probe for ``tensorflow`` to decide what to
    load, still see that it is not installed (a stand-in ``tensorflow`` module breaks
    torch._dynamo's import: its ``__spec__`` is None).
    """
    import importlib.util

    from ai_edge_litert import schema_py_generated

    parent_name = "tensorflow.lite.python"
    if parent_name in sys.modules or importlib.util.find_spec("tensorflow") is not None:
        return   # the real one is there
    parent = types.ModuleType(parent_name)
    parent.schema_py_generated = schema_py_generated
    sys.modules[parent_name] = parent
    sys.modules[f"{parent_name}.schema_py_generated"] = schema_py_generated


def tool_versions() -> dict[str, str]:
    """Versions of the packages that shape the exported files (part of the build key)."""
    from importlib import metadata

    packages = ("torch", "litert-torch", "ai-edge-litert", "ai-edge-quantizer",
                "litert-converter", "litert-lm-builder", "sentencepiece")
    versions = {}
    for name in packages:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def _set_composites(config, enabled: bool) -> None:
    """Turns litert-torch's high-level function boundaries on or off everywhere.

    ``ModelConfig.enable_hlfb`` decides SDPA (``odml.scaled_dot_product_attention``); each
    ``NormalizationConfig.enable_hlfb`` decides its RMS norm (``odml.rms_norm``). Both default
    to True, which is what the shipped conversion scripts export.
    """
    config.enable_hlfb = enabled
    norms = [config.final_norm_config]
    for i in range(config.num_layers):
        block = config.block_config(i)
        attn = block.attn_config
        norms += [block.pre_attention_norm_config, block.post_attention_norm_config,
                  block.ff_config.pre_ff_norm_config, block.ff_config.post_ff_norm_config,
                  attn.query_norm_config, attn.key_norm_config, attn.value_norm_config]
    for norm in norms:
        norm.enable_hlfb = enabled


def _randomize(model, seed: int) -> None:
    """Seeded random weights with a trained network's scale.

    Matrices get N(0, 1/fan_in) so activations keep unit size through the layers; norm
    gains scatter around 1 (their zero-centred form around 0) and biases around 0, so a
    runtime that drops a gain or a bias gives different answers. PyTorch's defaults would
    leave gains at exactly 1 and the embedding's padding row at 0, which makes blockwise
    int4 scales 0 and XNNPACK refuse the model.
    """
    import torch
    from litert_torch.generative.layers import normalization

    gen = torch.Generator().manual_seed(seed)
    norms = {id(m.weight): m for m in model.modules() if isinstance(m, normalization.RMSNorm)}
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            noise = torch.randn(param.shape, generator=gen)
            if id(param) in norms:
                centre = 0.0 if norms[id(param)].zero_centered_gamma else 1.0
                param.copy_(centre + 0.1 * noise)
            elif param.dim() >= 2:
                param.copy_(noise * param.shape[-1] ** -0.5)
            else:
                param.copy_(0.1 * noise)


def build_model(job: Job):
    """The family's litert-torch model at TINY size, composites set, weights seeded."""
    config, model_class = FAMILIES[job.family].build()
    _set_composites(config, job.composites)
    # Without a mask input the model slices its mask from a cache as long as the KV cache,
    # as converter.get_mask_cache_size_from_flags() sets it up.
    mask_cache = 0 if job.layout == "lm" else TINY.kv_cache_max_len
    model = model_class(config, mask_cache_size=mask_cache)
    _randomize(model, SEED)
    return model.eval()


def _export_config(layout: str):
    from litert_torch.generative.layers import kv_cache
    from litert_torch.generative.utilities import export_config

    if layout == "lm":
        return export_config.ExportConfig(kvcache_layout=kv_cache.KV_LAYOUT_TRANSPOSED,
                                          mask_as_input=True)
    return export_config.ExportConfig()


def export_tflite(job: Job, path: Path) -> None:
    """Converts with litert-torch's generative converter, as its example scripts do."""
    from litert_torch.generative.utilities import converter

    model = build_model(job)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        written = converter.convert_to_tflite(
            model,
            output_path=tmp,
            output_name_prefix=job.stem,
            prefill_seq_len=[TINY.prefill_len],
            kv_cache_max_len=TINY.kv_cache_max_len,
            quantize=VARIANTS[job.variant],
            config=model.config,
            export_config=_export_config(job.layout),
        )
        os.replace(written, path)


# -- tokenizer and .litertlm bundles ------------------------------------------------------------

def train_tokenizer(path: Path) -> None:
    """A SentencePiece BPE model with the models' vocabulary size, from the repo's own docs.

    Special ids are fixed (pad 0, eos 1, bos 2, unk 3) and the turn markers of the prompt
    template are single pieces, so the LLM metadata can name them. The docs hold about
    :data:`LEARNED_PIECES` pieces' worth of text; a larger vocabulary (``small``'s 32000) is
    filled with ``<unusedN>`` symbols, as real tokenizers reserve theirs, so every id the
    model can emit decodes.
    """
    import sentencepiece as spm

    sources = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    lines = [line.strip() for src in sources if src.is_file()
             for line in src.read_text(encoding="utf-8").splitlines() if line.strip()]
    unused = [f"<unused{i}>" for i in range(max(0, TINY.vocab_size - LEARNED_PIECES))]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=TINY.vocab_size,
        model_type="bpe", character_coverage=1.0, pad_id=PAD_ID, eos_id=EOS_ID,
        bos_id=BOS_ID, unk_id=UNK_ID, user_defined_symbols=[TURN_START, TURN_END, *unused],
        num_threads=1, minloglevel=2)
    _write_atomic(path, model.getvalue())
    log.info("tokenizer: %d pieces from %d lines of %d files -> %s",
             TINY.vocab_size, len(lines), len(sources), path)


def bundle_litertlm(tflite: Path, tokenizer: Path, path: Path) -> None:
    """Packs tflite + tokenizer + LLM metadata with litert-torch's LiteRT-LM builder."""
    from litert_torch.generative.utilities import litertlm_builder

    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        litertlm_builder.build_litertlm(
            tflite_model_path=str(tflite), workdir=tmp, output_path=tmp,
            context_length=TINY.kv_cache_max_len, tokenizer_model_path=str(tokenizer),
            start_token_id=BOS_ID, stop_token_ids=[EOS_ID], stop_tokens=[TURN_END],
            user_prompt_prefix=f"{TURN_START}user\n", user_prompt_suffix=f"{TURN_END}\n",
            model_prompt_prefix=f"{TURN_START}model\n", model_prompt_suffix=f"{TURN_END}\n",
            llm_model_type="generic")
        os.replace(Path(tmp) / f"{tflite.stem}.litertlm", path)


# -- reading a .tflite ---------------------------------------------------------------------------

def _enum_names(enum_class) -> dict[int, str]:
    return {v: k for k, v in vars(enum_class).items() if not k.startswith("_")}


def _plain(value):
    """JSON-safe copy of a flatbuffer object-API value (numpy arrays, bytes, nested T)."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__dict__"):
        return {k: _plain(v) for k, v in vars(value).items()}
    return value


def _shape(tensor) -> list[int]:
    return [] if tensor.shape is None else [int(d) for d in tensor.shape]


class TfliteReader:
    """Reads what the manifest says about a .tflite from its flatbuffer (ai-edge-litert's
    generated schema, object API)."""

    def __init__(self, path: Path):
        from ai_edge_litert import schema_py_generated as schema

        data = path.read_bytes()
        self.model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
        self.op_names = _enum_names(schema.BuiltinOperator)
        self.type_names = _enum_names(schema.TensorType)
        self.options2_names = _enum_names(schema.BuiltinOptions2)
        self.details_names = _enum_names(schema.QuantizationDetails)

    def op_name(self, op) -> str:
        code = self.model.operatorCodes[op.opcodeIndex]
        # deprecatedBuiltinCode caps at 127; builtinCode holds the real one past that.
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        name = self.op_names.get(builtin, f"BUILTIN_{builtin}")
        if name == "CUSTOM":
            name = f"CUSTOM:{code.customCode.decode()}"
        return name

    def tensor_type(self, tensor) -> str:
        return self.type_names[tensor.type]

    def describe(self) -> dict:
        subgraphs = self.model.subgraphs
        ops_per_subgraph = {}
        for sg in subgraphs:
            counts: dict[str, int] = {}
            for op in sg.operators:
                counts[self.op_name(op)] = counts.get(self.op_name(op), 0) + 1
            ops_per_subgraph[sg.name.decode()] = dict(sorted(counts.items()))
        types_count: dict[str, int] = {}
        for sg in subgraphs:
            for t in sg.tensors:
                types_count[self.tensor_type(t)] = types_count.get(self.tensor_type(t), 0) + 1
        return {
            "signatures": self.signatures(),
            "operators": sorted({n for counts in ops_per_subgraph.values() for n in counts}),
            "operator_codes": [self._code(c) for c in self.model.operatorCodes],
            "ops_per_subgraph": ops_per_subgraph,
            "builtin_options2": self.options2_used(),
            "composite_ops": self.composites(),
            "tensor_types": dict(sorted(types_count.items())),
            "quantization": self.quantization(),
        }

    def _code(self, code) -> dict:
        builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
        entry = {"builtin_code": builtin, "name": self.op_names.get(builtin),
                 "version": code.version}
        if code.customCode:
            entry["custom_code"] = code.customCode.decode()
        return entry

    def signatures(self) -> dict:
        out = {}
        for sig in self.model.signatureDefs:
            sg = self.model.subgraphs[sig.subgraphIndex]

            def tensors(items):
                return [{"name": item.name.decode(), "shape": _shape(sg.tensors[item.tensorIndex]),
                         "dtype": self.tensor_type(sg.tensors[item.tensorIndex])} for item in items]

            out[sig.signatureKey.decode()] = {"subgraph": sig.subgraphIndex,
                                              "inputs": tensors(sig.inputs),
                                              "outputs": tensors(sig.outputs)}
        return out

    def options2_used(self) -> dict[str, list[str]]:
        """Which ops carry a BuiltinOptions2 table (the newer union: StableHLO, composites)."""
        used: dict[str, set[str]] = {}
        for sg in self.model.subgraphs:
            for op in sg.operators:
                if op.builtinOptions2Type:
                    used.setdefault(self.op_name(op), set()).add(
                        self.options2_names[op.builtinOptions2Type])
        return {k: sorted(v) for k, v in sorted(used.items())}

    def composites(self) -> list[dict]:
        """STABLEHLO_COMPOSITE ops: name, version, attributes, where they sit, how many."""
        from flatbuffers import flexbuffers

        found: dict[str, dict] = {}
        for sg in self.model.subgraphs:
            for op in sg.operators:
                if self.op_name(op) != "STABLEHLO_COMPOSITE":
                    continue
                opts = op.builtinOptions2
                attrs = {}
                if opts.compositeAttributes is not None and len(opts.compositeAttributes):
                    attrs = _plain(flexbuffers.Loads(bytes(opts.compositeAttributes)))
                key = json.dumps([opts.name.decode(), opts.version, attrs], sort_keys=True)
                entry = found.setdefault(key, {
                    "name": opts.name.decode(), "version": opts.version, "attributes": attrs,
                    "options": "StableHLOCompositeOptions", "count": 0, "in_subgraphs": [],
                    "decomposition_subgraphs": []})
                entry["count"] += 1
                entry["in_subgraphs"].append(sg.name.decode())
                decomposition = self.model.subgraphs[opts.decompositionSubgraphIndex]
                entry["decomposition_subgraphs"].append(decomposition.name.decode())
        for entry in found.values():
            entry["in_subgraphs"] = sorted(set(entry["in_subgraphs"]))
        return list(found.values())

    def quantization(self) -> list[dict]:
        """Quantized (and fp16) tensors grouped by scheme and consumer ops: what a runtime
        must dequantize, and where.

        Per-tensor and per-channel parameters are QuantizationParameters.scale/zero_point
        (quantized_dimension says which axis). Blockwise int4 uses the `details` union:
        BlockwiseQuantization{scales, zero_points, block_size}, where `scales` (and
        `zero_points`, -1 when absent) are indices of other tensors in the same subgraph.
        """
        groups: dict[str, dict] = {}
        for sg in self.model.subgraphs:
            consumers: dict[int, set[str]] = {}
            for op in sg.operators:
                for i in op.inputs if op.inputs is not None else []:
                    consumers.setdefault(int(i), set()).add(self.op_name(op))
            for index, tensor in enumerate(sg.tensors):
                entry = self._scheme(sg, tensor, index in consumers)
                if entry is None:
                    continue
                entry["consumers"] = sorted(consumers.get(index, ()))
                key = json.dumps({k: v for k, v in entry.items() if k != "example"},
                                 sort_keys=True)
                group = groups.setdefault(key, {**entry, "count": 0})
                group["count"] += 1
        return list(groups.values())

    def _scheme(self, sg, tensor, consumed: bool) -> dict | None:
        q = tensor.quantization
        if self.tensor_type(tensor) == "FLOAT16" and consumed and self._is_constant(tensor):
            # fp16 weights carry no parameters: a DEQUANTIZE op widens them to float32.
            return {"type": "FLOAT16", "constant": True, "scheme": "float16",
                    "example": {"name": tensor.name.decode()[-120:], "shape": _shape(tensor)}}
        if q is None or (q.scale is None and not q.detailsType):
            return None
        entry = {"type": self.tensor_type(tensor), "constant": self._is_constant(tensor),
                 # Names are the module path of the weight; its tail says which.
                 "example": {"name": tensor.name.decode()[-120:], "shape": _shape(tensor)}}
        if q.detailsType:
            details = self.details_names[q.detailsType]
            entry["scheme"] = details
            if details == "BlockwiseQuantization":
                scales = sg.tensors[q.details.scales]
                entry["block_size"] = q.details.blockSize
                entry["scales_tensor"] = {"type": self.tensor_type(scales),
                                          "constant": self._is_constant(scales)}
                entry["example"]["scales_shape"] = _shape(scales)
                entry["zero_points_tensor"] = q.details.zeroPoints
            return entry
        n = len(q.scale)
        entry["scheme"] = "per-tensor" if n == 1 else "per-channel"
        if n > 1:
            entry["quantized_dimension"] = q.quantizedDimension
        entry["zero_point_nonzero"] = bool(q.zeroPoint is not None and any(q.zeroPoint))
        return entry

    def _is_constant(self, tensor) -> bool:
        buffer = self.model.buffers[tensor.buffer]
        return bool((buffer.data is not None and len(buffer.data)) or buffer.size)


# -- checks: LiteRT and LiteRT-LM, each in a subprocess ------------------------------------------

def seeded_prompt() -> list[int]:
    """prefill_len + 1 token ids: prefill the first prefill_len, decode the last (prefill
    signatures output no logits, so generation starts with a decode step, as in LiteRT-LM)."""
    import random

    rng = random.Random(SEED)
    return [rng.randrange(UNK_ID + 1, TINY.vocab_size) for _ in range(TINY.prefill_len + 1)]


def causal_mask(positions):
    """[1, 1, len(positions), kv_len]: 0 where a query may attend, -inf after it (as
    litert-torch's converter builds its sample masks; sliding windows stay in the model)."""
    import numpy as np

    rows = np.array(list(positions))[:, None]
    cols = np.arange(TINY.kv_cache_max_len)[None, :]
    return np.where(cols <= rows, 0.0, -np.inf).astype(np.float32)[None, None]


def _run_interpreter(path: Path, resolver) -> dict:
    """Prefill then DECODE_STEPS greedy decode steps in one LiteRT interpreter."""
    import numpy as np
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path), num_threads=2,
                         experimental_op_resolver_type=resolver)
    prefill = interp.get_signature_runner(f"prefill_{TINY.prefill_len}")
    decode = interp.get_signature_runner("decode")
    cache = {name: np.zeros(d["shape"], d["dtype"])
             for name, d in prefill.get_input_details().items() if name.startswith("kv_cache")}
    prompt = seeded_prompt()
    n = TINY.prefill_len
    masks = "mask" in prefill.get_input_details()
    out = prefill(tokens=np.array([prompt[:n]], np.int32),
                  input_pos=np.arange(n, dtype=np.int32), **cache,
                  **({"mask": causal_mask(range(n))} if masks else {}))
    cache = {name: out[name] for name in cache}
    token, logits, generated = prompt[n], [], []
    for pos in range(n, n + DECODE_STEPS):
        out = decode(tokens=np.array([[token]], np.int32),
                     input_pos=np.array([pos], np.int32), **cache,
                     **({"mask": causal_mask([pos])} if masks else {}))
        cache = {name: out[name] for name in cache}
        logits.append(out["logits"][0, -1])
        token = int(np.argmax(logits[-1]))
        generated.append(token)
    return {"prompt": prompt, "generated": generated, "logits": np.stack(logits)}


def check_tflite_here(path: Path) -> dict:
    """Runs the model with LiteRT's default resolver (XNNPACK delegate) and with the builtin
    kernels alone; writes <stem>.litert.npz with the answers; returns what happened."""
    import numpy as np
    from ai_edge_litert.interpreter import OpResolverType

    results, arrays = {}, {}
    for label, resolver in (("xnnpack", OpResolverType.AUTO),
                            ("builtin", OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)):
        start = time.perf_counter()
        try:
            run = _run_interpreter(path, resolver)
        except Exception as exc:   # LiteRT raises RuntimeError/ValueError with its own log
            results[label] = {"ran": False, "error": f"{type(exc).__name__}: {exc}"[:2000]}
            continue
        results[label] = {"ran": True, "generated": run["generated"],
                          "max_abs_logit": float(np.abs(run["logits"]).max()),
                          "seconds": round(time.perf_counter() - start, 3)}
        arrays["prompt"] = np.array(run["prompt"], np.int32)
        arrays[f"{label}_generated"] = np.array(run["generated"], np.int32)
        arrays[f"{label}_logits"] = run["logits"]
    if arrays:
        npz = path.with_suffix(".litert.npz")
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as f:
            np.savez(f, **arrays)
        _publish(f.name, npz)
    return results


def check_litertlm_here(path: Path) -> dict:
    """Loads a bundle in LiteRT-LM (litert-lm-api, CPU) and generates a few tokens greedily."""
    import litert_lm

    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache_dir:
        engine = litert_lm.Engine(str(path), backend=litert_lm.Backend.CPU(thread_count=2),
                                  max_num_tokens=TINY.kv_cache_max_len, cache_dir=cache_dir)
        try:
            prompt = "Run a real model on your GPU"
            tokens = engine.tokenize(prompt)
            session = engine.create_session(
                sampler_config=litert_lm.SamplerConfig(top_k=1, seed=0),
                max_output_tokens=DECODE_STEPS)
            session.run_prefill([prompt])
            responses = session.run_decode()
            text = responses.texts[0] if responses.texts else ""
            session.close()
            return {"ran": True, "prompt": prompt, "prompt_tokens": tokens,
                    "bos": engine.bos_token_id, "eos": engine.eos_token_ids,
                    "generated_text": text, "seconds": round(time.perf_counter() - start, 3)}
        finally:
            engine.close()


def run_check(kind: str, path: Path, timeout: float = 300) -> dict:
    """Runs one check in a fresh interpreter so a crash in native code is a result, not the
    end of the run; the child prints one JSON line last."""
    cmd = [sys.executable, str(Path(__file__).resolve()), f"--check-{kind}", str(path),
           "--size", next(name for name, shape in SIZES.items() if shape == TINY)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"ran": False, "error": f"timed out after {timeout:.0f} s"}
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        return json.loads(lines[-1])
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    return {"ran": False, "error": f"exit {proc.returncode}: {tail}"}


# -- manifest and main ---------------------------------------------------------------------------

class _OwnOrErrors(logging.Filter):
    """Our records, and others' from ERROR up: litert-torch logs a line per lowered op and
    ai-edge-quantizer warns for every weight that prefill and decode share ("overriding
    previously quantized data in buffer": the same weight, quantized the same way twice)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name.startswith(log.name) or record.levelno >= logging.ERROR


@contextlib.contextmanager
def python_output_to_log(verbose: bool):
    """Holds back what Python code prints while exporting (litert-torch's and
    ai-edge-quantizer's progress bars and size reports, torch's FutureWarnings): at debug
    level it goes to the log, and on an error its tail is logged with it. Native libraries
    write to fd 2 directly and still show."""
    if verbose:
        yield
        return
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            yield
    except BaseException:
        tail = buffer.getvalue().strip().splitlines()[-20:]
        if tail:
            log.error("output before the error:\n%s", "\n".join(tail))
        raise
    finally:
        log.debug("%s", buffer.getvalue())


def default_out_dir(size: str = "tiny") -> Path:
    """``$LITEGPU_DECODERS_DIR`` for the tiny models, else ``~/.cache/litegpu/decoders``
    (``decoders-<size>`` for the others)."""
    if size == "tiny" and "LITEGPU_DECODERS_DIR" in os.environ:
        return Path(os.environ["LITEGPU_DECODERS_DIR"])
    return Path.home() / ".cache" / "litegpu" / ("decoders" if size == "tiny" else f"decoders-{size}")


def _write_atomic(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as f:
        f.write(data)
    _publish(f.name, path)


def _publish(temp_name: str, path: Path) -> None:
    """Moves a finished temp file into place, with the permissions a plain open() would
    have given it (NamedTemporaryFile makes files 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(temp_name, 0o666 & ~umask)
    os.replace(temp_name, path)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Manifest:
    """manifest.json: one entry per file name, rewritten (atomically) after every file so an
    interrupted run keeps what it finished."""

    def __init__(self, out_dir: Path):
        self.path = out_dir / "manifest.json"
        self.data = {"files": {}}
        if self.path.is_file():
            self.data = json.loads(self.path.read_text())

    def entry(self, name: str) -> dict | None:
        return self.data["files"].get(name)

    def put(self, name: str, entry: dict) -> None:
        self.data["files"][name] = entry
        self.data["files"] = dict(sorted(self.data["files"].items()))
        self.save()

    def save(self) -> None:
        self.data["generator"] = "benchmarks/export_decoders.py"
        self.data["tiny"] = dataclasses.asdict(TINY)
        self.data["seed"] = SEED
        _write_atomic(self.path, (json.dumps(self.data, indent=1) + "\n").encode())


def plan(families: list[str], variants: list[str], composites: str,
         layouts: list[str]) -> list[Job]:
    settings = {"both": (True, False), "on": (True,), "off": (False,)}[composites]
    for f in families:
        for what in (*variants, *layouts):
            if what in FAMILIES[f].refused:
                log.info("not planned: %s %s: %s", f, what, FAMILIES[f].refused[what])
    return [Job(f, v, c, lay) for lay in layouts for f in families for v in variants
            for c in settings if v not in FAMILIES[f].refused and lay not in FAMILIES[f].refused]


def make_one(job: Job, out_dir: Path, manifest: Manifest, versions: dict, force: bool,
             check: bool, verbose: bool) -> bool:
    """Exports (unless cached), describes and checks one .tflite; returns False on failure."""
    path = out_dir / f"{job.stem}.tflite"
    key = job.build_key(versions)
    old = manifest.entry(path.name) or {}
    entry = {"kind": "tflite", "family": job.family, "variant": job.variant,
             "quantize_recipe": VARIANTS[job.variant], "composites": job.composites,
             "layout": job.layout, "build_key": key}
    if path.is_file() and old.get("build_key") == key and not force:
        log.info("  cached %s", path.name)
        entry["export_seconds"] = old.get("export_seconds")
    else:
        start = time.perf_counter()
        try:
            with python_output_to_log(verbose):
                export_tflite(job, path)
        except Exception as exc:
            log.error("  export failed: %s: %s", type(exc).__name__, exc)
            log.debug("traceback", exc_info=True)
            manifest.put(path.name, {**entry, "exported": False,
                                     "error": f"{type(exc).__name__}: {exc}"[:2000]})
            return False
        entry["export_seconds"] = round(time.perf_counter() - start, 2)
        log.info("  exported %s in %.1f s", path.name, entry["export_seconds"])
    entry.update(exported=True, size_bytes=path.stat().st_size, sha256=_sha256(path))
    entry.update(TfliteReader(path).describe())
    ok = True
    if check:
        # {resolver: result}, or {"ran": False, "error": ...} when the child itself died.
        litert = entry["litert"] = run_check("tflite", path)
        ran = {"check": False} if "error" in litert else {k: v["ran"] for k, v in litert.items()}
        ok = any(ran.values())
        log.info("  LiteRT: %s", ", ".join(f"{k} {'ran' if v else 'FAILED'}"
                                           for k, v in ran.items()))
    manifest.put(path.name, entry)
    return ok


def make_bundle(job: Job, out_dir: Path, tokenizer: Path, manifest: Manifest, force: bool,
                check: bool, verbose: bool) -> bool:
    """Bundles an exported .tflite as .litertlm (cached on the tflite's and tokenizer's
    hashes) and checks that LiteRT-LM loads it and generates."""
    tflite = out_dir / f"{job.stem}.tflite"
    path = out_dir / f"{job.stem}.litertlm"
    if not (manifest.entry(tflite.name) or {}).get("exported") or not tflite.is_file():
        log.error("  no bundle: %s was not exported", tflite.name)
        return False
    key = hashlib.sha256((_sha256(tflite) + _sha256(tokenizer)).encode()).hexdigest()[:16]
    old = manifest.entry(path.name) or {}
    entry = {"kind": "litertlm", "family": job.family, "variant": job.variant,
             "composites": job.composites, "tflite": tflite.name, "tokenizer": tokenizer.name,
             "llm_metadata": {"start_token_id": BOS_ID, "stop_token_ids": [EOS_ID],
                              "stop_tokens": [TURN_END], "llm_model_type": "generic",
                              "max_num_tokens": TINY.kv_cache_max_len,
                              "user_prompt": [f"{TURN_START}user\n", f"{TURN_END}\n"],
                              "model_prompt": [f"{TURN_START}model\n", f"{TURN_END}\n"]},
             "build_key": key}
    if not (path.is_file() and old.get("build_key") == key and not force):
        try:
            with python_output_to_log(verbose):
                bundle_litertlm(tflite, tokenizer, path)
        except Exception as exc:
            log.error("  bundle failed: %s: %s", type(exc).__name__, exc)
            manifest.put(path.name, {**entry, "exported": False,
                                     "error": f"{type(exc).__name__}: {exc}"[:2000]})
            return False
        log.info("  bundled %s", path.name)
    entry.update(exported=True, size_bytes=path.stat().st_size, sha256=_sha256(path))
    ok = True
    if check:
        entry["litert_lm"] = run_check("litertlm", path)
        ok = bool(entry["litert_lm"].get("ran"))
        log.info("  LiteRT-LM: %s", "ran: %r" % entry["litert_lm"].get("generated_text")
                 if ok else "FAILED: " + entry["litert_lm"]["error"].splitlines()[-1])
    manifest.put(path.name, entry)
    return ok


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Families: " + "; ".join(f"{f.name} ({f.summary})" for f in FAMILIES.values()))
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default $LITEGPU_DECODERS_DIR or "
                             "~/.cache/litegpu/decoders)")
    parser.add_argument("--size", choices=list(SIZES), default="tiny",
                        help="tiny (the tests' models) or small (about 100M parameters, not bundled; "
                             "default --out ~/.cache/litegpu/decoders-small)")
    parser.add_argument("--family", nargs="+", choices=list(FAMILIES), default=list(FAMILIES))
    parser.add_argument("--variant", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--composites", choices=("both", "on", "off"), default="both",
                        help="export with litert-torch's composites, without, or both")
    parser.add_argument("--layout", nargs="+", choices=LAYOUTS, default=list(LAYOUTS),
                        help="KV cache / mask convention: lm (LiteRT-LM's: transposed KV "
                             "cache, mask input) and/or legacy (BTNH cache, mask inside)")
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    parser.add_argument("--force", action="store_true", help="re-export files already there")
    parser.add_argument("--no-check", action="store_true",
                        help="skip running the files in LiteRT / LiteRT-LM")
    parser.add_argument("--no-bundle", action="store_true", help="make no .litertlm bundles")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging and litert-torch's own progress lines")
    parser.add_argument("--check-tflite", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--check-litertlm", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def print_plan(jobs: list[Job], bundles: list[Job], out_dir: Path) -> None:
    """--list: the files this call would make, marking those already there."""
    names = [f"{job.stem}.tflite" for job in jobs] + [f"{job.stem}.litertlm" for job in bundles]
    for name in names:
        print(f"{name}{'  (there)' if (out_dir / name).is_file() else ''}")
    print(f"-> {out_dir}")


def _child_check(args: argparse.Namespace) -> int:
    """The subprocess side of run_check: one JSON line on stdout."""
    if args.check_tflite:
        result = check_tflite_here(args.check_tflite)
    else:
        result = check_litertlm_here(args.check_litertlm)
    sys.stdout.flush()
    print(json.dumps(result))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    log.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    if not args.verbose:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_OwnOrErrors())
    global TINY
    TINY = SIZES[args.size]
    if args.check_tflite or args.check_litertlm:
        return _child_check(args)
    out_dir = (args.out or default_out_dir(args.size)).expanduser()
    jobs = plan(args.family, args.variant, args.composites, args.layout)
    bundles = [] if args.no_bundle else [job for job in jobs if job.bundled]
    if args.list:
        print_plan(jobs, bundles, out_dir)
        return 0

    # litert-torch's own progress tree and C++ logs drown ours; -v brings them back.
    os.environ.setdefault("LITERT_TORCH_SHOW_PROGRESS", "y" if args.verbose else "n")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if args.verbose else "2")
    if not args.verbose:
        logging.getLogger("torchao").setLevel(logging.ERROR)   # its CUDA-only kernels
    try:
        with python_output_to_log(args.verbose):
            install_tflite_schema_alias()
            import litert_torch  # noqa: F401  (fail early, with the setup hint)
    except ImportError as exc:
        log.error("%s: run this with the export venv's python (see the setup in --help)", exc)
        return 2
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = Manifest(out_dir)
    versions = tool_versions()
    manifest.data["versions"] = versions
    log.info("%d models, %d bundles -> %s", len(jobs), len(bundles), out_dir)

    start, failed = time.perf_counter(), []
    for i, job in enumerate(jobs, 1):
        log.info("[%d/%d] %s", i, len(jobs), job.stem)
        if not make_one(job, out_dir, manifest, versions, args.force, not args.no_check,
                        args.verbose):
            failed.append(f"{job.stem}.tflite")
    if bundles:
        tokenizer = out_dir / "tokenizer.model"
        if args.force or not tokenizer.is_file():
            train_tokenizer(tokenizer)
        for i, job in enumerate(bundles, 1):
            log.info("[bundle %d/%d] %s", i, len(bundles), job.stem)
            if not make_bundle(job, out_dir, tokenizer, manifest, args.force,
                               not args.no_check, args.verbose):
                failed.append(f"{job.stem}.litertlm")
    log.info("done in %.0f s; manifest: %s", time.perf_counter() - start, manifest.path)
    if failed:
        log.error("%d failed: %s", len(failed), ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    # Run as a script, benchmarks/ is first on sys.path, and its kernels.py, models.py and
    # timing.py would shadow packages of those names (transformers imports `kernels` when
    # litert-torch loads a Hugging Face model class). This script imports nothing from there.
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    sys.exit(main())
