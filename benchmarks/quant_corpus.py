"""A corpus of quantized models litegpu has never seen, made with TensorFlow's converter; litegpu against LiteRT on it.

usage:
    python benchmarks/quant_corpus.py make [--models NAME ...] [--kinds KIND ...]
    python benchmarks/quant_corpus.py measure [NAME ...] [--runs 10] [--rounds 3] [--threads 2]
    python benchmarks/quant_corpus.py gpu [NAME ...] [--backend opencl] [--precision F32]
    python benchmarks/quant_corpus.py sensitivity [NAME ...] [--trials 3]

``make`` needs TensorFlow (tensorflow-cpu; never a dependency of litegpu: run it from any
environment that has it, e.g. ``python -m venv tf && tf/bin/pip install tensorflow-cpu
&& tf/bin/python benchmarks/quant_corpus.py make``). It builds each architecture with
random weights (Keras' initializers, batch norms with moving statistics drawn like a
trained network's, so activations keep a realistic spread), calibrates on seeded random
inputs, and converts it into every kind TensorFlow's converter makes:

- ``int8``: full-integer int8, float input and output (QUANTIZE/DEQUANTIZE at the edges);
- ``int8io`` / ``uint8io``: full-integer with int8 / uint8 input and output;
- ``pertensor``: int8 with one scale per weight tensor instead of per output channel;
- ``16x8``: int16 activations, int8 weights;
- ``dynamic``: dynamic-range (int8 weights, float activations: hybrid kernels).

Files are cached in ``$LITEGPU_CORPUS_DIR`` (default ``~/.cache/litegpu/corpus``), as
``<model>.<kind>.tflite``, never in the repository; an architecture or kind the
converter refuses is reported and skipped.

``measure`` (litegpu's environment, with ai-edge-litert) runs every cached file on
litegpu's cpu backend and on LiteRT (XNNPACK) with the same seeded input, 2 threads,
timed in alternating blocks (benchmarks/timing.py), and prints a markdown table: the max
error (integer outputs in quanta; float outputs relative to max |LiteRT|), litegpu ms,
LiteRT ms, their ratio, the nodes a numpy reference runs, then the geometric mean of the
ratio per kind.

``gpu`` runs each file's GPU float view (``--backend``, ``--precision``) and prints the
nodes on the GPU and the error against LiteRT in output quanta. ``sensitivity`` prints how
far LiteRT's own output moves when its float input moves by one ulp.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
KINDS = ("int8", "int8io", "uint8io", "pertensor", "16x8", "dynamic")


def corpus_dir() -> Path:
    """Where the corpus lives (created on demand)."""
    path = Path(os.environ.get("LITEGPU_CORPUS_DIR", Path.home() / ".cache" / "litegpu" / "corpus"))
    path.mkdir(parents=True, exist_ok=True)
    return path


# -- make (TensorFlow) ---------------------------------------------------------------------------

def _architectures(tf):
    """name -> (builder of a Keras model, input kind): "image" / "audio" float inputs or
    "ids" int32 token ids."""
    keras, layers = tf.keras, tf.keras.layers
    apps = keras.applications

    def ds_cnn():
        # The keyword spotter's shape: a 10x4 stride-2 conv on a 98x40 spectrogram, then
        # depthwise-separable blocks, average pool, dense, softmax.
        x = inp = keras.Input((98, 40, 1))
        x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(64, (10, 4), strides=2, padding="same")(x)))
        for _ in range(4):
            x = layers.ReLU()(layers.BatchNormalization()(layers.DepthwiseConv2D(3, padding="same")(x)))
            x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(64, 1)(x)))
        x = layers.AveragePooling2D(pool_size=(x.shape[1], x.shape[2]))(x)
        x = layers.Softmax()(layers.Dense(12)(layers.Flatten()(x)))
        return keras.Model(inp, x)

    def crnn():
        x = inp = keras.Input((98, 40, 1))
        for filters in (32, 64):
            x = layers.ReLU()(layers.BatchNormalization()(layers.Conv2D(filters, 3, strides=(1, 2), padding="same")(x)))
            x = layers.MaxPooling2D((2, 1))(x)
        x = layers.Reshape((x.shape[1], x.shape[2] * x.shape[3]))(x)
        # A recurrent layer unrolled over its 24 steps: plain FULLY_CONNECTED, LOGISTIC, TANH,
        # MUL and ADD nodes (a rolled one would be a WHILE loop the converter keeps in float).
        x = layers.GRU(48, unroll=True)(x)
        return keras.Model(inp, layers.Softmax()(layers.Dense(12)(x)))

    def transformer():
        ids = keras.Input((32,), dtype="int32")
        x = layers.Embedding(1000, 64)(ids)
        for _ in range(2):
            a = layers.MultiHeadAttention(num_heads=4, key_dim=16)(x, x)
            x = layers.LayerNormalization()(x + a)
            f = layers.Dense(64)(layers.Dense(128, activation="gelu")(x))
            x = layers.LayerNormalization()(x + f)
        return keras.Model(ids, layers.Dense(4)(layers.GlobalAveragePooling1D()(x)))

    def unet():
        x = inp = keras.Input((96, 96, 3))
        skips = []
        for filters in (16, 32, 64):
            x = layers.Conv2D(filters, 3, padding="same", activation="relu")(x)
            skips.append(x)
            x = layers.MaxPooling2D()(x)
        x = layers.Conv2D(128, 3, padding="same", activation="relu")(x)
        for filters, skip in zip((64, 32, 16), reversed(skips)):
            x = layers.Conv2DTranspose(filters, 2, strides=2, padding="same")(x)
            x = layers.Conv2D(filters, 3, padding="same", activation="relu")(layers.Concatenate()([x, skip]))
        return keras.Model(inp, layers.Conv2D(2, 1, activation="sigmoid")(x))

    def app(fn, size, **kw):
        return lambda: fn(weights=None, input_shape=(size, size, 3), **kw)

    return {
        "ds_cnn": (ds_cnn, "audio"),
        "crnn": (crnn, "audio"),
        "transformer": (transformer, "ids"),
        "unet": (unet, "image"),
        "mobilenet_v2": (app(apps.MobileNetV2, 160, alpha=0.5), "image"),
        "mobilenet_v3_large": (app(apps.MobileNetV3Large, 160, minimalistic=False), "image"),
        "efficientnet_b0": (app(apps.EfficientNetB0, 160), "image"),
        "resnet50": (app(apps.ResNet50, 128), "image"),
        "densenet121": (app(apps.DenseNet121, 128), "image"),
        "nasnet_mobile": (app(apps.NASNetMobile, 128), "image"),
    }


def _trained_like(model, rng) -> None:
    """Batch norms with the statistics of a trained network (a moving mean and variance per
    channel, a scale and shift), so the quantized ranges are not those of fresh layers."""
    for layer in model.layers:
        if layer.__class__.__name__ == "BatchNormalization":
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([rng.uniform(0.5, 1.5, gamma.shape).astype(np.float32),
                               rng.normal(0, 0.2, beta.shape).astype(np.float32),
                               rng.normal(0, 0.5, mean.shape).astype(np.float32),
                               rng.uniform(0.5, 2.0, var.shape).astype(np.float32)])


def _samples(model, kind: str, rng, n: int = 16):
    shape = tuple(int(d) for d in model.inputs[0].shape[1:])
    for _ in range(n):
        if kind == "ids":
            yield [rng.integers(0, 1000, (1, *shape)).astype(np.int32)]
        else:
            yield [rng.uniform(-1, 1, (1, *shape)).astype(np.float32)]


def _convert(tf, model, input_kind: str, kind: str) -> bytes:
    conv = tf.lite.TFLiteConverter.from_keras_model(model)
    conv.optimizations = [tf.lite.Optimize.DEFAULT]
    if kind != "dynamic":
        conv.representative_dataset = lambda: _samples(model, input_kind, np.random.default_rng(1))
        if kind == "16x8":
            conv.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
        else:
            conv.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if kind in ("int8io", "uint8io") and input_kind != "ids":
            conv.inference_input_type = tf.int8 if kind == "int8io" else tf.uint8
        if kind in ("int8io", "uint8io"):
            conv.inference_output_type = tf.int8 if kind == "int8io" else tf.uint8
        if kind == "pertensor":
            conv._experimental_disable_per_channel = True
    return conv.convert()


def make(models: list[str], kinds: list[str]) -> int:
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    archs = _architectures(tf)
    out = corpus_dir()
    for name in models or list(archs):
        build, input_kind = archs[name]
        tf.keras.utils.set_random_seed(0)
        model = build()
        _trained_like(model, np.random.default_rng(0))
        for kind in kinds or KINDS:
            path = out / f"{name}.{kind}.tflite"
            if path.exists():
                print(f"{path.name}: cached")
                continue
            start = time.perf_counter()
            try:
                path.write_bytes(_convert(tf, model, input_kind, kind))
            except Exception as exc:   # noqa: BLE001 - the converter's refusal is the report
                print(f"{path.name}: the converter refused it: {str(exc).splitlines()[0][:160]}")
                continue
            print(f"{path.name}: {path.stat().st_size / 1e6:.1f} MB in {time.perf_counter() - start:.0f} s")
            sys.stdout.flush()
    return 0


# -- measure (litegpu and LiteRT) ---------------------------------------------------------------------

def _inputs(details, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for d in details:
        shape, dtype = tuple(int(s) for s in d["shape"]), np.dtype(d["dtype"])
        if dtype == np.int32:
            out.append(rng.integers(0, 1000, shape).astype(np.int32))
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            out.append(rng.integers(info.min, info.max + 1, shape).astype(dtype))
        else:
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
    return out


def outputs(interp, values: list[np.ndarray]) -> list[np.ndarray]:
    """``interp``'s outputs (copies) after one invoke on ``values``, its inputs in order."""
    for d, v in zip(interp.get_input_details(), values):
        interp.set_tensor(d["index"], v)
    interp.invoke()
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()]


def _error(got: np.ndarray, want: np.ndarray) -> str:
    if want.dtype.kind in "iu":
        return f"{int(np.abs(got.astype(np.int64) - want.astype(np.int64)).max())} q"
    scale = max(float(np.abs(want).max()), 1e-30)
    return f"{float(np.abs(got.astype(np.float64) - want).max()) / scale:.1e}"


def measure(names: list[str], runs: int, rounds: int, threads: int) -> int:
    sys.path.insert(0, str(HERE))
    from timing import alternate, geometric_mean

    import litegpu
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    files = _corpus_files(names)
    if not files:
        print(f"no corpus in {corpus_dir()}: run `quant_corpus.py make` first (it needs tensorflow)")
        return 1
    print("| model | kind | max error vs LiteRT | litegpu ms | LiteRT ms | ratio | reference nodes |")
    print("|---|---|---|---|---|---|---|")
    ratios: dict[str, list[float]] = {}
    for path in files:
        model, kind = path.name.split(".")[:2]
        theirs = LiteRT(model_path=str(path), num_threads=threads)
        theirs.allocate_tensors()
        try:
            ours = litegpu.Interpreter(model_path=str(path), num_threads=threads)
            ours.allocate_tensors()
        except litegpu.LiteGpuError as exc:
            print(f"| {model} | {kind} | not run: {str(exc)[:80]} | | | | |")
            continue
        x = _inputs(theirs.get_input_details(), 7)
        error = ", ".join(_error(g, w) for g, w in zip(outputs(ours, x), outputs(theirs, x)))
        best = alternate({"ours": ours.invoke, "litert": theirs.invoke}, runs, rounds)
        ratio = best["ours"] / best["litert"]
        ratios.setdefault(kind, []).append(ratio)
        slow = ours.get_delegation_report().reference_nodes()
        ops = sorted({op for _, op, _, _ in slow})
        print(f"| {model} | {kind} | {error} | {best['ours'] * 1e3:.2f} | {best['litert'] * 1e3:.2f} | {ratio:.2f} "
              f"| {len(slow)}{' (' + ', '.join(ops) + ')' if ops else ''} |")
        sys.stdout.flush()
        del ours, theirs   # one pair of thread pools alive at a time
    print()
    for kind, values in ratios.items():
        print(f"- {kind}: geomean litegpu / LiteRT {geometric_mean(values):.2f} over {len(values)} models, "
              f"worst {max(values):.2f}")
    return 0


def _corpus_files(names: list[str]) -> list[Path]:
    files = sorted(corpus_dir().glob("*.tflite"))
    return [f for f in files if not names or f.name.split(".")[0] in names or f.stem in names]


def _quantum(path: Path) -> float:
    """The quantum of the model's first output in its own units: 1 for an integer output,
    for a float one the scale of the integer tensor its DEQUANTIZE reads (0 when there is
    none: a dynamic-range model's float output has no quantum)."""
    import litegpu
    sg = litegpu.load_model(str(path)).subgraphs[0]
    if sg.tensors[sg.outputs[0]].dtype != np.float32:
        return 1.0
    producers = [n for n in sg.nodes if sg.outputs[0] in n.outputs and n.op == "DEQUANTIZE"]
    return float(sg.tensors[producers[0].inputs[0]].quantization.scales[0]) if producers else 0.0


def gpu(names: list[str], backend: str, precision: str) -> int:
    """The GPU float view of every corpus file (quantized nodes computed in float with
    quantization simulation) against LiteRT's integers: nodes on the GPU, error in output
    quanta (max and 99.9th percentile; relative to max |LiteRT| for a dynamic-range
    model's float output), the same top-1 for classifiers."""
    import litegpu
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    from litegpu.testing.conformance import PRECISION_OPTIONS
    print(f"GPU float view on {backend} ({precision}) against LiteRT\n")
    print("| model | kind | nodes on the GPU | max error | 99.9% within | top-1 |\n|---|---|---|---|---|---|")
    for path in _corpus_files(names):
        model, kind = path.name.split(".")[:2]
        theirs = LiteRT(model_path=str(path), num_threads=2)
        theirs.allocate_tensors()
        try:
            ours = litegpu.Interpreter(model_path=str(path), experimental_delegates=[
                litegpu.load_delegate(backend, PRECISION_OPTIONS[precision])])
            ours.allocate_tensors()
        except litegpu.LiteGpuError as exc:
            print(f"| {model} | {kind} | not run: {str(exc)[:80]} | | | |")
            continue
        x = _inputs(theirs.get_input_details(), 7)
        got, want = (outputs(interp, x)[0].astype(np.float64) for interp in (ours, theirs))
        quantum = _quantum(path)
        unit = "q" if quantum else "rel"
        err = np.abs(got - want) / (quantum or max(float(np.abs(want).max()), 1e-30))
        assignments = ours.get_delegation_report().assignments
        on_gpu = sum(a.backend == backend for a in assignments)
        top1 = ("same" if int(got.argmax()) == int(want.argmax()) else "DIFFERS") if want.size in (1000, 12) else ""
        print(f"| {model} | {kind} | {on_gpu} of {len(assignments)} | {err.max():.3g} {unit} "
              f"| {np.quantile(err, 0.999):.3g} {unit} | {top1} |")
        sys.stdout.flush()
        del ours, theirs
    return 0


def sensitivity(names: list[str], trials: int) -> int:
    """How far LiteRT's own output moves when each float input value moves by one ulp (up or
    down at random): the scale on which a float-input model's error against LiteRT can be
    read. A dynamic-range model quantizes its activations at run time, so a last-bit
    difference anywhere (a sigmoid, a float mean) can move a value across a rounding
    boundary and the output by a whole input quantum."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    print("| model | kind | LiteRT vs LiteRT on the input moved by 1 ulp (max relative change, per trial) |\n|---|---|---|")
    for path in _corpus_files(names):
        model, kind = path.name.split(".")[:2]
        interp = LiteRT(model_path=str(path), num_threads=2)
        interp.allocate_tensors()
        x = _inputs(interp.get_input_details(), 7)
        if not any(v.dtype == np.float32 for v in x):
            continue

        def run(values):
            return outputs(interp, values)[0].astype(np.float64)
        want = run(x)
        rng = np.random.default_rng(0)
        changes = []
        for _ in range(trials):
            moved = [np.nextafter(v, np.where(rng.random(v.shape) < 0.5, np.inf, -np.inf).astype(np.float32))
                     if v.dtype == np.float32 else v for v in x]
            changes.append(float(np.abs(run(moved) - want).max()) / max(float(np.abs(want).max()), 1e-30))
        print(f"| {model} | {kind} | {', '.join(f'{c:.1e}' for c in changes)} |")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="convert the architectures into every kind (needs tensorflow)")
    m.add_argument("--models", nargs="*", default=[])
    m.add_argument("--kinds", nargs="*", default=[], choices=KINDS)
    r = sub.add_parser("measure", help="litegpu cpu against LiteRT on every cached corpus file")
    r.add_argument("names", nargs="*", help="model names or <model>.<kind> (default: all)")
    r.add_argument("--runs", type=int, default=10)
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--threads", type=int, default=2)
    g = sub.add_parser("gpu", help="the GPU float view of every cached corpus file against LiteRT")
    g.add_argument("names", nargs="*", help="model names or <model>.<kind> (default: all)")
    g.add_argument("--backend", default="opencl")
    g.add_argument("--precision", default="F32", choices=["F32", "F32_F16", "F16"])
    v = sub.add_parser("sensitivity", help="LiteRT against itself on float inputs moved by one ulp")
    v.add_argument("names", nargs="*", help="model names or <model>.<kind> (default: all)")
    v.add_argument("--trials", type=int, default=3)
    args = parser.parse_args()
    if args.command == "sensitivity":
        return sensitivity(args.names, args.trials)
    if args.command == "make":
        return make(args.models, args.kinds)
    if args.command == "gpu":
        return gpu(args.names, args.backend, args.precision)
    return measure(args.names, args.runs, args.rounds, args.threads)


if __name__ == "__main__":
    sys.exit(main())
