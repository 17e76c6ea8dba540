"""Time the cpu backend's kernels on the shapes of the shared models.

    python benchmarks/kernels.py [--repeat N] [--threads T] [--filter TEXT]

Each case builds its kernel the way the backend does (a NodeContext with constant
weights), runs it once to compile, then reports the best wall time and the best
process CPU time of ``--repeat`` runs, GFLOP/s from the wall time, and the speedup
over the op's numpy reference. CPU time is the steadier number on a shared machine:
it does not grow while the process waits for a core (it does include the time spin-
waiting threads burn).
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS, reference_kernel
from litegpu_cpu.kernels.threads import configure_threads

RNG = np.random.default_rng(0)


def _conv(h, c, o, k, s, act="RELU6"):
    """CONV_2D on an h x h x c input, o filters of k x k, stride s, SAME."""
    oh = -(-h // s)
    x, w, b = RNG.standard_normal((1, h, h, c), np.float32), RNG.standard_normal((o, k, k, c), np.float32), \
        RNG.standard_normal(o, np.float32)
    attrs = {"padding": "SAME", "stride": (s, s), "dilation": (1, 1), "activation": act}
    return ("CONV_2D", f"{k}x{k}/{s} {h}x{h}x{c}->{o}", attrs, [x, w, b], [(1, oh, oh, o)], (1, 2),
            2 * oh * oh * o * k * k * c)


def _dw(h, c, s, k=3):
    oh = -(-h // s)
    x, w, b = RNG.standard_normal((1, h, h, c), np.float32), RNG.standard_normal((1, k, k, c), np.float32), \
        RNG.standard_normal(c, np.float32)
    attrs = {"padding": "SAME", "stride": (s, s), "dilation": (1, 1), "activation": "RELU6", "depth_multiplier": 1}
    return ("DEPTHWISE_CONV_2D", f"{k}x{k}/{s} {h}x{h}x{c}", attrs, [x, w, b], [(1, oh, oh, c)], (1, 2),
            2 * oh * oh * c * k * k)


def _tconv(h, c, o):
    x, w, b = RNG.standard_normal((1, h, h, c), np.float32), RNG.standard_normal((o, 2, 2, c), np.float32), \
        RNG.standard_normal(o, np.float32)
    shape = np.array([1, 2 * h, 2 * h, o], np.int32)
    attrs = {"padding": "SAME", "stride": (2, 2), "activation": "NONE"}
    return ("TRANSPOSE_CONV", f"2x2/2 {h}x{h}x{c}->{o}", attrs, [shape, w, x, b], [(1, 2 * h, 2 * h, o)], (0, 1, 3),
            2 * h * h * c * o * 4)


def _pool(op, h, c, f, s):
    x = RNG.standard_normal((1, h, h, c), np.float32)
    oh = -(-h // s)
    attrs = {"padding": "SAME", "stride": (s, s), "filter": (f, f), "activation": "NONE"}
    return (op, f"{f}x{f}/{s} {h}x{h}x{c}", attrs, [x], [(1, oh, oh, c)], (), oh * oh * c * f * f)


def _fc(m, k, o):
    x, w, b = RNG.standard_normal((m, k), np.float32), RNG.standard_normal((o, k), np.float32), \
        RNG.standard_normal(o, np.float32)
    return ("FULLY_CONNECTED", f"{m}x{k}->{o}", {"activation": "NONE", "keep_num_dims": False}, [x, w, b],
            [(m, o)], (1, 2), 2 * m * k * o)


def _binary(op, a, b, act="NONE"):
    x, y = RNG.standard_normal(a, np.float32), RNG.standard_normal(b, np.float32)
    out = tuple(np.broadcast_shapes(a, b))
    return (op, f"{list(a)} {list(b)}", {"activation": act}, [x, y], [out], (), int(np.prod(out)))


def _unary(op, shape, attrs=None):
    x = RNG.standard_normal(shape, np.float32)
    return (op, f"{list(shape)}", attrs or {}, [x], [shape], (), int(np.prod(shape)))


def _mean(shape):
    x = RNG.standard_normal(shape, np.float32)
    return ("MEAN", f"{list(shape)} axes 1,2", {"keep_dims": True}, [x, np.array([1, 2], np.int32)],
            [(shape[0], 1, 1, shape[3])], (1,), int(np.prod(shape)))


def _resize(h, c):
    x = RNG.standard_normal((1, h, h, c), np.float32)
    return ("RESIZE_BILINEAR", f"{h}x{h}x{c} x2", {"align_corners": False, "half_pixel_centers": True},
            [x, np.array([2 * h, 2 * h], np.int32)], [(1, 2 * h, 2 * h, c)], (1,), 2 * h * 2 * h * c * 8)


def cases():
    """(op, label, attrs, inputs, output shapes, constant input indices, flops or elements)."""
    return [
        _conv(224, 3, 32, 3, 2), _conv(112, 32, 16, 1, 1), _conv(56, 24, 144, 1, 1), _conv(28, 192, 32, 1, 1),
        _conv(14, 384, 64, 1, 1), _conv(7, 960, 320, 1, 1), _conv(7, 320, 1280, 1, 1),
        _conv(224, 3, 64, 7, 2, "RELU"), _conv(56, 64, 64, 3, 1, "RELU"), _conv(28, 128, 128, 3, 1, "RELU"),
        _conv(14, 256, 256, 3, 1, "RELU"), _conv(7, 512, 512, 3, 1, "RELU"), _conv(56, 64, 128, 1, 2, "NONE"),
        _conv(128, 16, 16, 3, 1, "RELU"), _conv(64, 64, 32, 3, 1, "RELU"),
        _dw(112, 32, 1), _dw(112, 96, 2), _dw(56, 144, 1), _dw(28, 192, 1), _dw(14, 576, 1), _dw(7, 960, 1),
        _dw(56, 144, 2, 5),
        _tconv(16, 128, 64), _tconv(64, 32, 16),
        _pool("MAX_POOL_2D", 112, 64, 3, 2), _pool("MAX_POOL_2D", 128, 16, 2, 2), _pool("AVERAGE_POOL_2D", 7, 1280, 7, 1),
        _fc(1, 1280, 1000), _fc(64, 128, 512),
        _binary("ADD", (1, 56, 56, 24), (1, 56, 56, 24)), _binary("MUL", (1, 112, 112, 96), (1, 1, 1, 96)),
        _unary("LOGISTIC", (1, 112, 112, 96)), _unary("HARD_SWISH", (1, 112, 112, 16)),
        _unary("GELU", (1, 64, 512), {"approximate": False}), _unary("SOFTMAX", (1, 4, 64, 64), {"beta": 1.0}),
        _mean((1, 7, 7, 1280)), _mean((1, 112, 112, 96)), _resize(64, 32),
    ]


def build(op, attrs, inputs, out_shapes, consts):
    specs = [TensorSpec(tuple(a.shape), a.dtype, a if i in consts else None) for i, a in enumerate(inputs)]
    outs = [TensorSpec(tuple(s), np.dtype(np.float32)) for s in out_shapes]
    node = Node(index=0, op=op, opcode=0, version=1, inputs=tuple(range(len(inputs))), outputs=(len(inputs),))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs=attrs, inputs=specs, outputs=outs)
    return KERNELS[op](ctx), reference_kernel(ctx), [np.empty(s, np.float32) for s in out_shapes]


def best(fn, repeat: int) -> tuple[float, float]:
    """Best wall and best CPU seconds of ``repeat`` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - c0)
        walls.append(time.perf_counter() - w0)
    return min(walls), min(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="numba threads (0: numba's default)")
    ap.add_argument("--filter", default="", help="only cases whose op or label contains this")
    args = ap.parse_args()
    configure_threads(args.threads)
    print(f"{'op':18s} {'shape':28s} {'wall ms':>8s} {'cpu ms':>8s} {'GFLOP/s':>8s} {'x ref':>6s}")
    for op, label, attrs, inputs, out_shapes, consts, work in cases():
        if args.filter and args.filter not in op and args.filter not in label:
            continue
        run, ref, outs = build(op, attrs, inputs, out_shapes, consts)
        if run is None:
            print(f"{op:18s} {label:28s} declined")
            continue
        run(inputs, outs)      # compile / warm
        wall, cpu = best(lambda: run(inputs, outs), args.repeat)
        ref_wall, _ = best(lambda: ref(inputs, outs), max(2, args.repeat // 4))
        gemm_like = op in ("CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED", "RESIZE_BILINEAR")
        rate = f"{work / wall / 1e9:8.1f}" if gemm_like else f"{'':8s}"
        print(f"{op:18s} {label:28s} {wall * 1e3:8.3f} {cpu * 1e3:8.3f} {rate} {ref_wall / wall:6.1f}")


if __name__ == "__main__":
    main()
