"""The decoders part of the GPU acceptance run: litegpu's generation against LiteRT-LM's.

What it answers: decode (and prefill) tokens/s of each litegpu backend against LiteRT-LM's
own GPU and CPU backends on the same ``.litertlm`` bundles, at the tiny size and at about
100M parameters, and whether litegpu's greedy tokens and logits there are LiteRT's.

LiteRT-LM's wheel (47 MB) and a 100M bundle (58-104 MB) do not fit beside the models run's
wheels in what the device tool carries (64 MiB), so this part is a second call with its own
wheelhouse (``gpu_acceptance.py --decoders``). The 100M bundles travel *hollow*: the bytes of
their int8/int4 weight codes are zeroed, so the file compresses to a few MB, and are refilled
there from a fixed hash of each byte's position (numpy's integer arithmetic only, so the same
bytes on any machine). Their scales, float tensors, tokenizer and metadata are the exported
ones. LiteRT's answers for the refilled bundle are computed here, where LiteRT is installed,
and travel with it as ``<stem>.reference.npz``.

The worker side (:func:`measure_litegpu`, :func:`measure_litert_lm`) runs in
``gpu_acceptance_worker.py decode``; LiteRT-LM's rows import only ``litert_lm``, so they can
run in another Python (``--litert-lm-python``) where LiteRT-LM is installed and litegpu is not.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HOLLOW_MIN_BYTES = 1 << 16        # weight buffers smaller than this travel as they are
REFERENCE_STEPS = 8               # greedy decode steps whose logits travel as LiteRT's answers,
REFERENCE_LOGITS = 1 << 17        # fewer where the vocabulary is large (4 at 32000: 0.5 MB)
DECODE_TOKENS = 64                # decode steps per timed block (fewer where the cache is shorter)
FLOAT16, INT8, INT4 = 1, 9, 17    # TensorType codes: the weight codes, and blockwise scales
LITERT_LM_RUNTIMES = ("litert-lm-gpu", "litert-lm-cpu")
_CHUNK = 1 << 22


# -- hollow and refill (here and there) --------------------------------------------------------------
def weight_ranges(data: bytes | memoryview) -> list[dict]:
    """Byte ranges of a bundle's int8/int4 weight codes and of the fp16 scales of its
    blockwise int4 weights, each of at least :data:`HOLLOW_MIN_BYTES`: ``{"offset", "bytes",
    "kind"}`` (kind ``int8``, ``int4`` or ``scale16``), offsets from the start of the bundle."""
    from litegpu.lm.bundle import Bundle
    from litegpu.model import schema
    from litegpu.model.flatbuf import Buffer

    blockwise = dict(schema.QUANTIZATION_DETAILS)["BlockwiseQuantization"]
    blockwise_type = [name for name, _ in schema.QUANTIZATION_DETAILS].index("BlockwiseQuantization") + 1

    bundle = Bundle.from_bytes(data)
    ranges = []
    for section in bundle.find("TFLiteModel"):
        view = bundle.data(section)
        base = np.frombuffer(view, np.uint8).ctypes.data
        root = Buffer(view).root(b"TFL3")
        buffers = root.tables(4, "buffers")
        kinds: dict[int, str] = {}
        for subgraph in root.tables(2, "subgraphs"):
            tensors = subgraph.tables(0, "tensors")
            for tensor in tensors:
                code = tensor.scalar(1, "byte", 0, "type")
                if code not in (INT8, INT4):
                    continue
                kinds[tensor.scalar(2, "uint", 0, "buffer")] = "int8" if code == INT8 else "int4"
                q = tensor.table(4, "quantization")
                if q is None or q.scalar(4, "ubyte", 0, "details_type") != blockwise_type:
                    continue
                k = q.table(5, "details").read_fields(blockwise)["scales"]
                if 0 <= k < len(tensors) and tensors[k].scalar(1, "byte", 0, "type") == FLOAT16:
                    kinds[tensors[k].scalar(2, "uint", 0, "buffer")] = "scale16"
        for index, kind in sorted(kinds.items()):
            if not 0 < index < len(buffers):
                continue
            table = buffers[index]
            offset, size = table.scalar(1, "ulong", 0, "offset"), table.scalar(2, "ulong", 0, "size")
            if offset <= 1:
                arr = table.array(0, "[ubyte]", "data")
                offset, size = (0, 0) if arr is None else (arr.ctypes.data - base, arr.size)
            if size >= HOLLOW_MIN_BYTES and not (kind == "scale16" and (offset | size) % 2):
                ranges.append({"offset": section.begin + offset, "bytes": int(size), "kind": kind})
    return ranges


def parameters(data: bytes | memoryview) -> int:
    """Elements of a bundle's constant tensors, each buffer counted once (the prefill and
    decode signatures' subgraphs name the same weights)."""
    from litegpu.lm.bundle import Bundle
    from litegpu.model.flatbuf import Buffer

    bundle = Bundle.from_bytes(data)
    count = 0
    for section in bundle.find("TFLiteModel"):
        root = Buffer(bundle.data(section)).root(b"TFL3")
        buffers = root.tables(4, "buffers")
        sizes: dict[int, int] = {}
        for subgraph in root.tables(2, "subgraphs"):
            for tensor in subgraph.tables(0, "tensors"):
                index = tensor.scalar(2, "uint", 0, "buffer")
                if 0 < index < len(buffers) and (buffers[index].has(0) or buffers[index].scalar(2, "ulong", 0, "size")):
                    shape = tensor.array(0, "[int]", "shape")
                    sizes[index] = int(np.prod(shape)) if shape is not None else 1
        count += sum(sizes.values())
    return count


def _hashes(first: int, count: int) -> np.ndarray:
    """splitmix64 of the positions ``first .. first + count - 1``."""
    x = np.arange(first, first + count, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def fill_codes(kind: str, offset: int, count: int) -> np.ndarray:
    """``count`` bytes for the bytes at ``offset``, from a hash of the position: weight codes
    spread like a trained layer's (triangular about 0: int8 within [-63, 63], each int4 nibble
    within [-7, 7]), or, for ``scale16`` (``offset`` and ``count`` even), float16 block scales
    in [0.006, 0.014], a 768-wide layer's."""
    x = _hashes(offset // 2, count // 2) if kind == "scale16" else _hashes(offset, count)
    byte = [((x >> np.uint64(8 * i)) & np.uint64(0xFF)).astype(np.int16) for i in range(4)]
    if kind == "scale16":
        u = (byte[0] + 256.0 * byte[1]) / 65536.0
        return (0.006 + 0.008 * u).astype(np.float16).view(np.uint8)

    def triangular(a: np.ndarray, b: np.ndarray, step: int) -> np.ndarray:
        d = a - b                                       # -255..255, symmetric about 0
        return np.sign(d) * (np.abs(d) // step)         # rounded toward 0: still symmetric
    if kind == "int8":
        return triangular(byte[0], byte[1], 4).astype(np.int8).view(np.uint8)
    low, high = triangular(byte[0], byte[1], 32) & 0xF, triangular(byte[2], byte[3], 32) & 0xF
    return (low | (high << 4)).astype(np.uint8)


def hollow(src: Path, dest: Path) -> dict:
    """Write ``dest`` (gzip) as ``src`` with its weight codes zeroed; returns the recipe that
    :func:`refill` follows (the ranges and the refilled file's sha256)."""
    data = bytearray(src.read_bytes())
    ranges = weight_ranges(data)
    for r in ranges:
        data[r["offset"]:r["offset"] + r["bytes"]] = bytes(r["bytes"])
    with gzip.open(dest, "wb", compresslevel=6) as f:
        f.write(data)
    _fill(data, ranges)
    return {"source": src.name, "ranges": ranges, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def refill(hollow_gz: Path, recipe: dict, dest: Path) -> Path:
    """The bundle :func:`hollow` emptied, with its weight codes filled; checked by sha256."""
    with gzip.open(hollow_gz, "rb") as f:
        data = bytearray(f.read())
    _fill(data, recipe["ranges"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != recipe["sha256"]:
        raise ValueError(f"{hollow_gz.name}: refilled bytes have sha256 {digest[:12]}, the recipe says "
                         f"{recipe['sha256'][:12]}")
    dest.write_bytes(data)
    return dest


def _fill(data: bytearray, ranges: list[dict]) -> None:
    view = np.frombuffer(data, np.uint8)
    for r in ranges:
        for start in range(r["offset"], r["offset"] + r["bytes"], _CHUNK):
            n = min(_CHUNK, r["offset"] + r["bytes"] - start)
            view[start:start + n] = fill_codes(r["kind"], start, n)


# -- LiteRT's answers (here) and the greedy run that compares with them (there) ------------------------
def prompt_ids(vocab: int, count: int) -> list[int]:
    """A fixed prompt of ``count`` ids in ``[4, vocab)`` (past the special ids)."""
    return [int(i) for i in np.random.default_rng(2026).integers(4, vocab, size=count)]


def greedy(engine: Any, prompt: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """Greedy tokens and each step's logits of a ``litegpu.lm.Engine`` from ``prompt``."""
    session = engine.create_session()
    session.prefill_tokens(prompt)
    tokens, logits = [], []
    for _ in range(steps):
        tokens.append(session.decode_token())
        logits.append(session.logits.copy())
    return tokens, np.array(logits, np.float32)


def write_reference(bundle: Path, dest: Path, threads: int = 2) -> dict:
    """LiteRT's (XNNPACK's) greedy tokens and logits on ``bundle``, in ``dest`` (.npz); returns
    what both runtimes are asked for there (:func:`measure_litegpu`'s ``shape``)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT

    from litegpu.lm import Engine
    with Engine(bundle, num_threads=threads, runtime=LiteRT) as engine:
        prefill, cache = engine.prefills[-1].length, engine.max_num_tokens
        prompt = prompt_ids(engine.vocab_size, prefill + 1)
        steps = max(2, min(REFERENCE_STEPS, REFERENCE_LOGITS // engine.vocab_size))
        tokens, logits = greedy(engine, prompt, steps)
    np.savez(dest, prompt=np.array(prompt, np.int32), tokens=np.array(tokens, np.int32), logits=logits)
    return {**decode_shape(prefill, cache), "params": parameters(bundle.read_bytes())}


def decode_shape(prefill: int, cache: int) -> dict:
    """What a timed block asks of both runtimes: ``prefill`` tokens through the prefill
    signature, then up to :data:`DECODE_TOKENS` decode steps that fit the ``cache``."""
    return {"prefill": prefill, "cache": cache, "decode": max(1, min(DECODE_TOKENS, cache - prefill - 2))}


# -- the worker side ------------------------------------------------------------------------------------
def litegpu_block(engine: Any, shape: dict, prompt: list[int]) -> tuple[float, float]:
    """One timed block of a ``litegpu.lm.Engine``: (prefill, decode) tokens/s of
    ``shape["prefill"]`` tokens through the prefill signature, then ``shape["decode"]``
    decode steps, as LiteRT-LM's benchmark runs them (``prompt``: prefill + 1 ids; the last
    is the first decode step's input)."""
    session = engine.create_session()
    t0 = time.perf_counter()
    session.prefill_tokens(prompt)
    t1 = time.perf_counter()
    for _ in range(shape["decode"]):
        session.decode_token()
    t2 = time.perf_counter()
    return shape["prefill"] / (t1 - t0), shape["decode"] / (t2 - t1)


def litert_lm_block(bundle: Path, runtime: str, shape: dict, threads: int, cache_dir: str) -> tuple[float, dict]:
    """One run of LiteRT-LM's own benchmark (``litert_lm.Benchmark``: a fresh engine, its
    prefill and decode tokens/s): ((prefill, decode) tokens/s, its init seconds)."""
    import litert_lm
    litert_lm.set_min_log_severity(litert_lm.LogSeverity.ERROR)
    backend = litert_lm.Backend.GPU() if runtime == "litert-lm-gpu" else litert_lm.Backend.CPU(thread_count=threads)
    info = litert_lm.Benchmark(model_path=str(bundle), backend=backend, prefill_tokens=shape["prefill"],
                               decode_tokens=shape["decode"], max_num_tokens=shape["cache"], cache_dir=cache_dir).run()
    speeds = (float(info.last_prefill_tokens_per_second), float(info.last_decode_tokens_per_second))
    return speeds, float(info.init_time_in_second)


def measure_litegpu(bundle: Path, backend: str, shape: dict, rounds: int, threads: int,
                    reference: Path | None) -> dict:
    """Greedy agreement with LiteRT's answers, then :func:`litegpu_block`'s tokens/s, the
    best of ``rounds`` after a warm one."""
    from litegpu.lm import Engine
    row: dict = {}
    start = time.perf_counter()
    with Engine(bundle, backend=backend, num_threads=threads) as engine:
        row["create_s"] = time.perf_counter() - start
        if reference is not None:
            want = np.load(reference)
            tokens, logits = greedy(engine, [int(i) for i in want["prompt"]], len(want["tokens"]))
            same = next((i for i, (a, b) in enumerate(zip(want["tokens"], tokens)) if a != b), len(tokens))
            compared = slice(0, min(same + 1, len(tokens)))
            err = float(np.abs(logits[compared] - want["logits"][compared]).max())
            row["accuracy"] = {"agree": same, "steps": len(tokens), "max_abs": err,
                               "max_rel": err / float(np.abs(want["logits"]).max())}
        prompt = prompt_ids(engine.vocab_size, shape["prefill"] + 1)
        blocks = [litegpu_block(engine, shape, prompt) for _ in range(rounds + 1)][1:]   # the first warms
        try:
            row["decode_step"] = decode_step(engine)
        except Exception as exc:  # noqa: BLE001 - a diagnostic must not cost the row its numbers
            row["decode_step"] = {"error": f"{type(exc).__name__}: {exc}"}
    row["prefill_tok_s"], row["decode_tok_s"] = (max(b[i] for b in blocks) for i in range(2))
    return row


def decode_step(engine) -> dict:
    """What a decode step ran on its device programs, after the timed blocks: their
    launches (those a step makes: a cache updated in place skips its copies), whether the
    KV cache was updated in place or alternated between two sets, and the CUDA graphs the
    cuda ones keep (0: launched kernel by kernel)."""
    model = engine.io.model
    programs = [p for p, _, _ in model._compiled[model.get_signature_index(engine.decode.key)].programs]
    made = [p._io.running if hasattr(p, "_io") else getattr(p, "launches", ()) for p in programs]
    step = {"launches": sum(map(len, made)),
            "kv_cache": "in place" if engine.io._in_place else "two sets"}
    graphs = [p._graphs for p in programs if hasattr(p, "_graphs")]
    if graphs:
        step["cuda_graphs"] = sum(len(g) for g in graphs) if all(g.enabled for g in graphs) else "off"
    return step


def measure_litert_lm(bundle: Path, runtime: str, shape: dict, rounds: int, threads: int) -> dict:
    """:func:`litert_lm_block`, the best of ``rounds``."""
    with tempfile.TemporaryDirectory(prefix="litert-lm-cache-") as cache:
        runs = [litert_lm_block(bundle, runtime, shape, threads, cache) for _ in range(rounds)]
    return {"create_s": runs[0][1], "prefill_tok_s": max(r[0][0] for r in runs),
            "decode_tok_s": max(r[0][1] for r in runs)}


# -- carrying (here) ---------------------------------------------------------------------------------------
@dataclass
class Carried:
    """One bundle as the decoders part runs it: its file (refilled when it travelled hollow),
    LiteRT's answers for it, and ``shape`` (prefill and decode tokens, cache, parameters)."""

    name: str
    path: Path
    reference: Path
    shape: dict


def prepare(folder: Path, bundles: list[tuple[str, Path, bool]]) -> list[str]:
    """Fill ``folder/decoders`` from ``(name, bundle, hollow)``: each bundle as ``<name>``, whole
    or hollow, with ``<name>.json`` (its shape, and the refill recipe) and LiteRT's answers
    (``<name>.reference.npz``). Returns notes for the download summary."""
    out = folder / "decoders"
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    for name, path, hollowed in bundles:
        facts: dict = {"source": str(path)}
        if hollowed:
            gz = out / f"{name}.litertlm.gz"
            facts["hollow"] = recipe = hollow(path, gz)
            with tempfile.TemporaryDirectory() as tmp:
                facts["shape"] = write_reference(refill(gz, recipe, Path(tmp) / path.name),
                                                 out / f"{name}.reference.npz")
            emptied = sum(r["bytes"] for r in recipe["ranges"])
            notes.append(f"{name}: {emptied / 2**20:.0f} of {recipe['bytes'] / 2**20:.0f} MiB (weight codes) "
                         f"hollow, {gz.stat().st_size / 2**20:.1f} MiB carried")
        else:
            shutil.copyfile(path, out / f"{name}.litertlm")
            facts["shape"] = write_reference(path, out / f"{name}.reference.npz")
        (out / f"{name}.json").write_text(json.dumps(facts, indent=1))
    return notes


def find_bundles(folder: Path, workdir: Path) -> tuple[list[Carried], list[tuple[str, str]]]:
    """The carried bundles (hollow ones refilled into ``workdir``), and (name, why) for each
    that cannot run."""
    found, bad = [], []
    for facts_path in sorted((folder / "decoders").glob("*.json")):
        stem = facts_path.stem
        try:
            facts = json.loads(facts_path.read_text())
            reference = folder / "decoders" / f"{stem}.reference.npz"
            if "hollow" in facts:
                workdir.mkdir(parents=True, exist_ok=True)
                path = refill(folder / "decoders" / f"{stem}.litertlm.gz", facts["hollow"],
                              workdir / f"{stem}.litertlm")
            else:
                path = folder / "decoders" / f"{stem}.litertlm"
            if not path.is_file() or not reference.is_file():
                raise FileNotFoundError(f"{path.name} or {reference.name} is missing")
            found.append(Carried(stem, path, reference, facts["shape"]))
        except (OSError, ValueError, KeyError) as exc:
            bad.append((stem, f"{type(exc).__name__}: {exc}"))
    return found, bad
