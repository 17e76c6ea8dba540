"""The child processes of gpu_acceptance.py: everything that loads a driver runs here.

One process per call, so that a crash or a hang inside a driver (a CUDA path never run
on a real GPU, a Vulkan ICD, LiteRT's GPU accelerator) costs one part of the report,
not the report. Each command prints JSON (``models`` writes JSON lines to a file, one
per model, so the parent knows which model a crash hit and goes on from the next)::

    python gpu_acceptance_worker.py probe
    python gpu_acceptance_worker.py build-models DIR [--quick]
    python gpu_acceptance_worker.py models RUNTIME RESULTS NAME=PATH ... [--threads T] [--runs N] ...
    python gpu_acceptance_worker.py create RUNTIME MODEL [--threads T]
    python gpu_acceptance_worker.py decode RUNTIME RESULTS NAME=SPEC ... [--threads T] [--rounds N]

RUNTIME is a litegpu backend name (``cpu``, ``cuda``, ``opencl``, ``webgpu``, ...),
``litert-gpu`` (LiteRT's CompiledModel on its GPU accelerator: WebGPU over Vulkan on
Linux) or, for ``create``, ``litert-cpu``; for ``decode``, ``litert-lm-gpu`` and
``litert-lm-cpu`` are LiteRT-LM's backends (acceptance_decoders.py). Accuracy is always measured against LiteRT's
cpu outputs on the same inputs; timings pair each runtime with LiteRT cpu in the same
process, in alternating blocks (timing.py). One timed call is host to host: set the
inputs, run, read every output, as a user of either runtime does.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import alternate  # noqa: E402  (the shared timer)

LITERT_GPU = "litert-gpu"
LITERT_CPU = "litert-cpu"
BIG_BATCH = 8
PACKAGES = ("numpy", "numba", "pluggy", "pytest", "pytest-xdist", "pytest-timeout", "ai-edge-litert",
            "pyopencl", "wgpu", "cuda-bindings", "nvidia-cuda-nvrtc", "setuptools")


# -- probe -------------------------------------------------------------------------------
def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _backends() -> tuple[dict, dict]:
    """Each litegpu backend: usable here or why not, its device; and plugins that failed to load."""
    from litegpu.plugins import manager
    mgr = manager()
    out = {}
    for name, backend in sorted(mgr.backends.items()):
        try:
            ok, why = backend.available()
            info = backend.device_info() if ok else {}
        except Exception as exc:  # a probe that raises is a finding to report, not a crash
            ok, why, info = False, f"available() raised {type(exc).__name__}: {exc}", {}
        out[name] = {"available": bool(ok), "why": str(why or ""), "is_gpu": bool(getattr(backend, "is_gpu", False)),
                     "device": {k: str(v) for k, v in info.items()}}
    failed = {r.name: str(r.error) for r in mgr.records if r.error}
    return out, failed


def _wgpu_adapter() -> dict:
    """The adapter wgpu-py picks (its backend says whether NVIDIA's Vulkan is what runs)."""
    try:
        import wgpu
    except Exception as exc:
        return {"error": f"wgpu is not importable ({type(exc).__name__}: {exc})"}
    try:
        adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    except Exception as exc:
        return {"error": f"no WebGPU adapter ({type(exc).__name__}: {exc})"}
    if adapter is None:
        return {"error": "no WebGPU adapter"}
    return {k: str(v) for k, v in dict(adapter.info).items()}


def probe() -> dict:
    """What the report's environment section needs, read in a process that may crash."""
    import litegpu
    backends, failed = _backends()
    return {"python": sys.version.split()[0], "litegpu": getattr(litegpu, "__version__", "?"),
            "litegpu_file": litegpu.__file__, "backends": backends, "plugin_errors": failed,
            "packages": {p: _version(p) for p in PACKAGES}, "wgpu_adapter": _wgpu_adapter()}


# -- built models ---------------------------------------------------------------------------
def _convnet() -> bytes:
    """A small mobile-style net with a dynamic batch: CONV (stride 2, RELU6), DEPTHWISE,
    CONV, MEAN over space, FULLY_CONNECTED; on (-1, 32, 32, 3) float32."""
    from litegpu.testing.builder import ModelBuilder
    rng = np.random.default_rng(1234)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)

    b = ModelBuilder()
    x = b.input("x", (1, 32, 32, 3), shape_signature=(-1, 32, 32, 3))
    c1, d1, c2 = b.tensor("c1", (1, 16, 16, 16)), b.tensor("d1", (1, 16, 16, 16)), b.tensor("c2", (1, 16, 16, 32))
    pooled, logits = b.tensor("pooled", (1, 32)), b.tensor("logits", (1, 10))
    bias = lambda name, n: b.const(name, rng.standard_normal(n).astype(np.float32) * 0.1)  # noqa: E731
    b.op("CONV_2D", [x, b.const("w1", weights(16, 3, 3, 3)), bias("b1", 16)], [c1], padding="SAME",
         stride_w=2, stride_h=2, fused_activation_function="RELU6")
    b.op("DEPTHWISE_CONV_2D", [c1, b.const("wd", weights(1, 3, 3, 16)), bias("bd", 16)], [d1], padding="SAME",
         stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="RELU6")
    b.op("CONV_2D", [d1, b.const("w2", weights(32, 1, 1, 16)), bias("b2", 32)], [c2], padding="SAME",
         stride_w=1, stride_h=1, fused_activation_function="RELU")
    b.op("MEAN", [c2, b.const("axes", np.array([1, 2], np.int32))], [pooled], keep_dims=False)
    b.op("FULLY_CONNECTED", [pooled, b.const("wf", weights(10, 32)), bias("bf", 10)], [logits])
    b.output(logits)
    return b.build()


def build_models(folder: Path, quick: bool) -> dict:
    """Write the built models into ``folder``; name -> path."""
    folder.mkdir(parents=True, exist_ok=True)
    from litegpu.testing.builder import two_layer_mlp
    built = {"built_convnet": _convnet} if quick else {"built_convnet": _convnet, "built_mlp": two_layer_mlp}
    paths = {}
    for name, make in built.items():
        path = folder / f"{name}.tflite"
        path.write_bytes(make())
        paths[name] = str(path)
    return paths


# -- accuracy --------------------------------------------------------------------------------
def output_error(got: list[np.ndarray], want: list[np.ndarray]) -> dict:
    """How far ``got`` is from LiteRT's ``want``: the worst float difference relative to
    max|LiteRT| (``rel``), the worst integer difference in quanta (``quanta``), and whether
    ``got`` has a NaN or infinity where LiteRT has none (``nonfinite``)."""
    err: dict = {"rel": None, "quanta": None, "nonfinite": False}
    if len(got) != len(want):
        return {**err, "mismatch": f"{len(got)} outputs, LiteRT has {len(want)}"}
    for g, w in zip(got, want):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            return {**err, "mismatch": f"shape {list(g.shape)}, LiteRT's {list(w.shape)}"}
        if not w.size:
            continue
        if w.dtype.kind in "iub":
            off = int(np.abs(g.astype(np.int64) - w.astype(np.int64)).max())
            err["quanta"] = max(err["quanta"] or 0, off)
            continue
        g64, w64 = g.astype(np.float64), w.astype(np.float64)
        finite = np.isfinite(w64)
        err["nonfinite"] |= bool((~np.isfinite(g64) & finite).any())
        both = finite & np.isfinite(g64)
        scale = max(float(np.abs(w64[finite]).max()) if finite.any() else 0.0, 1e-30)
        diff = float(np.abs(g64[both] - w64[both]).max()) if both.any() else 0.0
        err["rel"] = max(err["rel"] or 0.0, diff / scale)
    return err


# -- runtimes fed and read as host arrays ----------------------------------------------------
def _outputs(interp) -> list[np.ndarray]:
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def _host_to_host(interp, inputs: list[np.ndarray]) -> Callable[[], object]:
    """One timed call of an Interpreter (LiteRT's or litegpu's): set, invoke, read everything."""
    ins = [d["index"] for d in interp.get_input_details()]
    outs = [d["index"] for d in interp.get_output_details()]

    def call() -> None:
        for index, x in zip(ins, inputs):
            interp.set_tensor(index, x)
        interp.invoke()
        for index in outs:
            interp.get_tensor(index)
    return call


def _batched(details: list[dict], batch: int) -> list[dict]:
    """Input details with the leading (dynamic) dimension set to ``batch``."""
    return [{**d, "shape": [batch, *list(d["shape"])[1:]]} for d in details]


def _dynamic_batch(details: list[dict]) -> bool:
    """True when every input's leading dimension is dynamic (shape_signature -1)."""
    sigs = [list(d.get("shape_signature", d["shape"])) for d in details]
    return bool(sigs) and all(s and s[0] == -1 for s in sigs)


class LiteRtCompiled:
    """One signature of a LiteRT CompiledModel, fed and read as host arrays."""

    def __init__(self, path: Path, accelerator: str, threads: int, enforce_f32: bool = True) -> None:
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator as HA
        from ai_edge_litert.options import CpuOptions, GpuOptions, Options
        flags = {"cpu": HA.CPU, "gpu": HA.GPU, "gpu+cpu": HA.GPU | HA.CPU}[accelerator]
        options = Options(flags, cpu_options=CpuOptions(num_threads=threads),
                          gpu_options=GpuOptions(enforce_f32=enforce_f32))
        self.model = CompiledModel.from_file(str(path), options=options)
        self.key = next(iter(self.model.get_signature_list()))
        self._bind()

    def _bind(self) -> None:
        sig = self.model.get_signature_list()[self.key]
        ins, outs = self.model.get_input_tensor_details(self.key), self.model.get_output_tensor_details(self.key)
        self.inputs = [ins[n] for n in sig["inputs"]]
        self.outputs = [outs[n] for n in sig["outputs"]]
        self.in_buffers = self.model.create_input_buffers(0)
        self.out_buffers = self.model.create_output_buffers(0)

    def input_details(self) -> list[dict]:
        """Like an Interpreter's: dtype and shape per input, in signature order."""
        return [{"dtype": np.dtype(d["dtype"]), "shape": list(d["shape"])} for d in self.inputs]

    def resize(self, shapes: list[tuple[int, ...]]) -> None:
        """Resize the inputs (a dynamic batch) and make new buffers for them."""
        for i, shape in enumerate(shapes):
            self.model.resize_input_tensor(i, list(shape), 0)
        self._bind()

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Write ``inputs``, run, read every output."""
        for buffer, x in zip(self.in_buffers, inputs):
            buffer.write(np.ascontiguousarray(x))
        self.model.run_by_index(0, self.in_buffers, self.out_buffers)
        out = []
        for buffer, d in zip(self.out_buffers, self.outputs):
            shape = [int(s) for s in d["shape"]]
            out.append(buffer.read(int(np.prod(shape)), np.dtype(d["dtype"])).reshape(shape))
        return out


# -- one model on one runtime ----------------------------------------------------------------
def _block_runs(timers: dict[str, Callable[[], object]], opts: argparse.Namespace) -> int:
    """Invokes per timed block: ``--runs``, fewer where the slowest runtime would make a
    block longer than ``--block-s`` (a slow cpu must not eat a GPU machine's minutes)."""
    slowest = 0.0
    for call in timers.values():
        call()  # the first call after a resize may compile; not timed
        start = time.perf_counter()
        call()
        slowest = max(slowest, time.perf_counter() - start)
    return int(max(3, min(opts.runs, opts.block_s / max(slowest, 1e-6))))


def _timed(timers: dict[str, Callable[[], object]], opts: argparse.Namespace) -> dict:
    runs = _block_runs(timers, opts)
    best = alternate(timers, runs, opts.rounds, warmup=2)
    return {"runs": runs, "rounds": opts.rounds, "ms": {k: v * 1e3 for k, v in best.items()}}


def _litegpu(path: Path, backend: str, threads: int, f16: bool):
    import litegpu
    delegates = [] if backend == "cpu" else [litegpu.load_delegate(backend, {"precision_loss_allowed": f16})]
    start = time.perf_counter()
    interp = litegpu.Interpreter(model_path=str(path), num_threads=threads, experimental_delegates=delegates)
    interp.allocate_tensors()
    return interp, time.perf_counter() - start


def litegpu_row(path: Path, backend: str, opts: argparse.Namespace) -> dict:
    """litegpu on ``backend`` (F32, and F16 on a GPU backend) against LiteRT cpu: errors,
    placement, creation and paired timings at batch 1 and, where dynamic, batch 8."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from litegpu.cli import random_inputs
    from litegpu.plugins import manager
    from models import prepare  # the shared resize/allocate/set/invoke of the model benchmarks

    base = LiteRT(model_path=str(path), num_threads=opts.threads)
    variants, row = {}, {"create_s": {}, "batches": {}}
    precisions = ["f32", "f16"] if manager().backend(backend).is_gpu and opts.f16 else ["f32"]
    for precision in precisions:
        try:
            variants[precision], row["create_s"][precision] = _litegpu(path, backend, opts.threads, precision == "f16")
        except Exception as exc:
            if precision == "f32":
                raise
            row["f16_error"] = f"{type(exc).__name__}: {exc}"[:300]
    report = variants["f32"].get_delegation_report()
    row["nodes"] = f"{report.nodes_on(backend)}/{len(report.assignments)}"
    row["programs"] = list(report.programs)[:3]
    details = base.get_input_details()
    batches = [1, BIG_BATCH] if opts.batch8 and _dynamic_batch(details) else [1]
    for batch in batches:
        inputs = random_inputs(details if batch == 1 else _batched(details, batch), seed=0)

        def measure() -> dict:
            for interp in (base, *variants.values()):
                prepare(interp, inputs)
            want = _outputs(base)
            cell = {"err": {k: output_error(_outputs(v), want) for k, v in variants.items()}}
            timers = {k: _host_to_host(v, inputs) for k, v in variants.items()}
            timers[LITERT_CPU] = _host_to_host(base, inputs)
            return {**cell, **_timed(timers, opts)}
        row["batches"][str(batch)] = _batch_cell(batch, measure)
    return row


def _batch_cell(batch: int, measure: Callable[[], dict]) -> dict:
    """``measure()``; at batch 8 a failure is that cell's error, so batch 1's results stay."""
    if batch == 1:
        return measure()
    try:
        return measure()
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}


def _litert_gpu_models(path: Path, threads: int) -> tuple[dict, dict]:
    """LiteRT GPU models in F32 (enforce_f32) and F16 (its default), and notes: GPU alone
    where it takes the whole model, else GPU with cpu fallback."""
    models, notes = {}, {}
    for precision, enforce in (("f32", True), ("f16", False)):
        start = time.perf_counter()
        try:
            models[precision] = LiteRtCompiled(path, "gpu", threads, enforce)
            notes[precision] = "GPU"
        except Exception as exc:
            first = f"{type(exc).__name__}: {exc}"[:200]
            models[precision] = LiteRtCompiled(path, "gpu+cpu", threads, enforce)
            notes[precision] = f"GPU with cpu fallback (GPU alone: {first})"
        notes[f"create_s_{precision}"] = time.perf_counter() - start
        notes[f"fully_accelerated_{precision}"] = bool(models[precision].model.is_fully_accelerated())
    return models, notes


def litert_gpu_row(path: Path, opts: argparse.Namespace) -> dict:
    """LiteRT's GPU accelerator (F32 and F16) against LiteRT's cpu CompiledModel, same API."""
    from litegpu.cli import random_inputs
    base = LiteRtCompiled(path, "cpu", opts.threads)
    models, notes = _litert_gpu_models(path, opts.threads)
    row = {"create_s": {k: notes.pop(f"create_s_{k}") for k in models}, "notes": notes, "batches": {}}
    row["nodes"] = "all" if all(notes[f"fully_accelerated_{k}"] for k in models) else "partly cpu"
    details = base.input_details()
    batches = [1, BIG_BATCH] if opts.batch8 and _dynamic_batch(_interpreter_details(path)) else [1]
    for batch in batches:
        inputs = random_inputs(details if batch == 1 else _batched(details, batch), seed=0)

        def measure() -> dict:
            runtimes = {**models, LITERT_CPU: base}
            if batch != 1:
                for m in runtimes.values():
                    m.resize([x.shape for x in inputs])
            want = base.run(inputs)
            cell = {"err": {k: output_error(m.run(inputs), want) for k, m in models.items()}}
            return {**cell, **_timed({k: (lambda m=m: m.run(inputs)) for k, m in runtimes.items()}, opts)}
        row["batches"][str(batch)] = _batch_cell(batch, measure)
    return row


def _interpreter_details(path: Path) -> list[dict]:
    """The input details LiteRT's Interpreter reads (the CompiledModel's lack shape_signature)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    return LiteRT(model_path=str(path)).get_input_details()


def _each_spec(opts: argparse.Namespace, measure: Callable[[str], dict]) -> None:
    """``measure(spec)`` for each ``NAME=SPEC`` in turn, into ``opts.results``: a line before
    (so a crash names its item) and one after; an item's failure is its row, and the next
    item still runs."""
    with open(opts.results, "a", encoding="utf-8") as results:
        for item in opts.specs:
            name, spec = item.split("=", 1)
            results.write(json.dumps({"start": name, "t": time.time()}) + "\n")
            results.flush()
            try:
                row = measure(spec)
            except Exception as exc:
                row = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            results.write(json.dumps({"done": name, "row": row}) + "\n")
            results.flush()


def models_command(opts: argparse.Namespace) -> None:
    """Each model (``NAME=PATH``) on ``opts.runtime``."""
    if opts.runtime == LITERT_GPU:
        _each_spec(opts, lambda path: litert_gpu_row(Path(path), opts))
    else:
        _each_spec(opts, lambda path: litegpu_row(Path(path), opts.runtime, opts))


def decode_command(opts: argparse.Namespace) -> None:
    """Each bundle (``NAME=SPEC``, SPEC a JSON file: path, reference, shape) on ``opts.runtime``."""
    from acceptance_decoders import LITERT_LM_RUNTIMES, measure_litegpu, measure_litert_lm

    def measure(spec: str) -> dict:
        bundle = json.loads(Path(spec).read_text())
        if opts.runtime in LITERT_LM_RUNTIMES:
            return measure_litert_lm(Path(bundle["path"]), opts.runtime, bundle["shape"], opts.rounds, opts.threads)
        return measure_litegpu(Path(bundle["path"]), opts.runtime, bundle["shape"], opts.rounds, opts.threads,
                               Path(bundle["reference"]))
    _each_spec(opts, measure)


# -- creation, cold and warm ---------------------------------------------------------------
def create_litert(runtime: str, model: str, threads: int) -> dict:
    """LiteRT's creation and first result, phase by phase (as startup.child times litegpu)."""
    t0 = time.perf_counter()
    if runtime == LITERT_CPU:
        from ai_edge_litert.interpreter import Interpreter
        t1 = time.perf_counter()
        interp = Interpreter(model_path=model, num_threads=threads)
        interp.allocate_tensors()
        t2 = time.perf_counter()
        call = _host_to_host(interp, [np.zeros(d["shape"], d["dtype"]) for d in interp.get_input_details()])
    else:
        import ai_edge_litert.compiled_model  # noqa: F401  (timed as the import)
        t1 = time.perf_counter()
        try:  # the GPU alone where it takes the whole model (the probe's model it does)
            compiled = LiteRtCompiled(Path(model), "gpu", threads, enforce_f32=False)
        except RuntimeError:
            compiled = LiteRtCompiled(Path(model), "gpu+cpu", threads, enforce_f32=False)
        t2 = time.perf_counter()
        zeros = [np.zeros(d["shape"], d["dtype"]) for d in compiled.input_details()]
        call = lambda: compiled.run(zeros)  # noqa: E731
    call()
    t3 = time.perf_counter()
    call()
    t4 = time.perf_counter()
    return {"import": t1 - t0, "create": t2 - t1, "1st invoke": t3 - t2, "first result": t3 - t0,
            "2nd invoke": t4 - t3}


def create_command(opts: argparse.Namespace) -> dict:
    if opts.runtime in (LITERT_CPU, LITERT_GPU):
        return create_litert(opts.runtime, opts.model, opts.threads)
    from startup import child  # the startup benchmark's own phase timer (num_threads=2)
    return child(opts.model, opts.runtime)


# -- command line ------------------------------------------------------------------------------
def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe")
    build = sub.add_parser("build-models")
    build.add_argument("folder", type=Path)
    build.add_argument("--quick", action="store_true")
    models = sub.add_parser("models")
    models.add_argument("runtime")
    models.add_argument("results")
    models.add_argument("specs", nargs="+", metavar="NAME=PATH")
    models.add_argument("--threads", type=int, default=2)
    models.add_argument("--runs", type=int, default=20, help="most invokes per timed block")
    models.add_argument("--rounds", type=int, default=3)
    models.add_argument("--block-s", type=float, default=0.5, help="longest timed block, seconds")
    models.add_argument("--no-f16", dest="f16", action="store_false")
    models.add_argument("--no-batch8", dest="batch8", action="store_false")
    decode = sub.add_parser("decode")
    decode.add_argument("runtime")
    decode.add_argument("results")
    decode.add_argument("specs", nargs="+", metavar="NAME=SPEC")
    decode.add_argument("--threads", type=int, default=2)
    decode.add_argument("--rounds", type=int, default=3)
    create = sub.add_parser("create")
    create.add_argument("runtime")
    create.add_argument("model")
    create.add_argument("--threads", type=int, default=2)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    if opts.command == "probe":
        print(json.dumps(probe()))
    elif opts.command == "build-models":
        print(json.dumps(build_models(opts.folder, opts.quick)))
    elif opts.command == "models":
        models_command(opts)
    elif opts.command == "decode":
        decode_command(opts)
    else:
        print(json.dumps(create_command(opts)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
