"""Old against new DEPTHWISE_CONV_2D kernels of the cpu backend, in one process.

    python benchmarks/depthwise.py [--rounds R] [--repeat N] [--threads 1,2] [--filter TEXT]

"new" is the factory in ``kernels/depthwise.py``; "old" the general kernel
(``depthwise._any_task``), which runs every depthwise conv the fast paths do not take, or with
``--old rows`` the 3x3 row/block kernels (``_s1_task``, ``_s2_task``) where they apply
(the 3x3 paths before the framed kernels), the general kernel elsewhere.
Each shape is built by both (a NodeContext with constant weights, as the backend does),
checked to agree, then timed alternately, old then new, for ``--rounds`` rounds of
``--repeat`` calls; the best call of each is kept, so load from other processes on a
shared machine hurts both alike. Prints microseconds, GFLOP/s of the new kernel and
the speedup, for each numba thread count.
"""
from __future__ import annotations

import argparse
import time

import numba
import numpy as np

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import depthwise
from litegpu_cpu.kernels.common import F32, clamp_bounds, constant_bias, window_geometry
from litegpu_cpu.kernels.threads import configure_threads

RNG = np.random.default_rng(0)

# (label, N, H, W, C, K, stride, dilation); SAME padding, RELU6.
SHAPES = [
    ("face_landmark", 1, 96, 96, 16, 3, 1, 1),
    ("face_landmark", 1, 48, 48, 32, 3, 1, 1),
    ("mobilenet_v2", 1, 112, 112, 32, 3, 1, 1),
    ("mobilenet_v2", 1, 56, 56, 144, 3, 1, 1),
    ("mobilenet_v2", 1, 28, 28, 192, 3, 1, 1),
    ("mobilenet_v2", 1, 14, 14, 576, 3, 1, 1),
    ("mobilenet_v2", 1, 7, 7, 960, 3, 1, 1),
    ("mobilenet_v2", 1, 112, 112, 96, 3, 2, 1),
    ("mobilenet_v2", 1, 56, 56, 144, 3, 2, 1),
    ("mobilenet_v2", 1, 28, 28, 192, 3, 2, 1),
    ("face_landmark", 1, 96, 96, 16, 3, 2, 1),
    ("dilated", 1, 64, 64, 32, 3, 1, 2),
    ("blazeface", 1, 24, 24, 128, 3, 1, 1),
    ("mobilenet_v3", 1, 14, 14, 240, 5, 1, 1),
    ("mobilenet_v3", 1, 14, 14, 144, 5, 1, 1),
    ("mobilenet_v3", 1, 14, 14, 120, 5, 1, 1),
    ("mobilenet_v3", 1, 7, 7, 576, 5, 1, 1),
    ("mobilenet_v3", 1, 28, 28, 96, 5, 2, 1),
    ("mobilenet_v3", 1, 14, 14, 288, 5, 2, 1),
]


def general(ctx: NodeContext):
    """The general kernel (``depthwise._any_task``) for a multiplier-1 node: the baseline."""
    (n, h, w, c), (_, kh, kw, _) = ctx.inputs[0].shape, ctx.inputs[1].shape
    bias = constant_bias(ctx, 1, 0, 2)
    wt = np.ascontiguousarray(ctx.inputs[1].value.reshape(kh, kw, c), dtype=F32)
    sh, sw, dh, dw, pt, pl = window_geometry(ctx.attrs, h, w, kh, kw)
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    out_shape = tuple(ctx.outputs[0].shape)
    tasks, params = depthwise.any_plan((n, h, w, c), out_shape, kh, kw, sh, sw, dh, dw, pt, pl, 1, wt, bias)
    return depthwise._task_kernel(depthwise._any_task, tasks, params, (wt.reshape(kh * kw, c), bias), lo, hi,
                                  out_shape)


def rows(ctx: NodeContext):
    """The 3x3 row (stride 1) and 2x2 block (stride 2) task kernels where they apply (as
    ``depthwise_conv2d`` chose before the framed kernels), else :func:`general`."""
    (n, h, w, c), (_, kh, kw, _) = ctx.inputs[0].shape, ctx.inputs[1].shape
    sh, sw, dh, dw, pt, pl = window_geometry(ctx.attrs, h, w, kh, kw)
    if (kh, kw, sh, sw) not in ((3, 3, 1, 1), (3, 3, 2, 2)) or (sh == 2 and (dh, dw) != (1, 1)):
        return general(ctx)
    bias = constant_bias(ctx, 1, 0, 2)
    wt = np.ascontiguousarray(ctx.inputs[1].value.reshape(kh, kw, c), dtype=F32)
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    out_shape = tuple(ctx.outputs[0].shape)
    if sh == 1:
        wp = depthwise.repeated_weights(wt, bias)
        tasks, params = depthwise.depthwise3x3_s1((n, h, w, c), out_shape, dh, dw, pt, pl, wp.shape[1])
        consts = (wt, bias, wp, np.zeros(w * c, F32))
        return depthwise._task_kernel(depthwise._s1_task, tasks, params, consts, lo, hi, out_shape)
    tasks, params = depthwise.depthwise3x3_s2((n, h, w, c), out_shape, pt, pl)
    return depthwise._task_kernel(depthwise._s2_task, tasks, params, (wt, bias), lo, hi, out_shape)


OLD = {"general": general, "rows": rows}


def build(factories, n, h, w, c, k, s, d):
    """The kernels ``factories`` make for the shape (random data), their inputs, an output
    array for each and the flops."""
    oh, ow = -(-h // s), -(-w // s)
    x = RNG.standard_normal((n, h, w, c), np.float32)
    f = RNG.standard_normal((1, k, k, c), np.float32)
    b = RNG.standard_normal(c, np.float32)
    attrs = {"padding": "SAME", "stride": (s, s), "dilation": (d, d), "activation": "RELU6",
             "depth_multiplier": 1}
    inputs = [x, f, b]
    specs = [TensorSpec(a.shape, a.dtype, a if i else None) for i, a in enumerate(inputs)]
    node = Node(index=0, op="DEPTHWISE_CONV_2D", opcode=4, version=1, inputs=(0, 1, 2), outputs=(3,))
    ctx = NodeContext(node=node, opdef=get_op("DEPTHWISE_CONV_2D"), attrs=attrs, inputs=specs,
                      outputs=[TensorSpec((n, oh, ow, c), np.dtype(np.float32))])
    return ([factory(ctx) for factory in factories], inputs,
            [[np.empty((n, oh, ow, c), np.float32)] for _ in factories], 2 * n * oh * ow * c * k * k)


def best_of(fn, repeat: int) -> float:
    """Best wall seconds of ``repeat`` calls."""
    t = np.inf
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        t = min(t, time.perf_counter() - t0)
    return t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--threads", default="1,2", help="numba thread counts, comma separated")
    ap.add_argument("--filter", default="", help="only shapes whose label or size contains this")
    ap.add_argument("--old", choices=sorted(OLD), default="general", help="the baseline kernel")
    args = ap.parse_args()
    configure_threads(1)
    print(f"{'shape':34s} {'thr':>3s} {'old us':>8s} {'new us':>8s} {'GFLOP/s':>8s} {'x':>5s}")
    for threads in (int(t) for t in args.threads.split(",")):
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
        for label, n, h, w, c, k, s, d in SHAPES:
            name = f"{label} {n}x{h}x{w}x{c} k{k} s{s} d{d}"
            if args.filter not in name:
                continue
            (old, new), inputs, (out_old, out_new), flops = build(
                (OLD[args.old], depthwise.depthwise_conv2d), n, h, w, c, k, s, d)
            old(inputs, out_old)
            new(inputs, out_new)
            np.testing.assert_allclose(out_new, out_old, rtol=1e-4, atol=1e-4)
            t_old = t_new = np.inf
            for _ in range(args.rounds):
                t_old = min(t_old, best_of(lambda: old(inputs, out_old), args.repeat))
                t_new = min(t_new, best_of(lambda: new(inputs, out_new), args.repeat))
            print(f"{name:34s} {threads:3d} {t_old * 1e6:8.1f} {t_new * 1e6:8.1f} "
                  f"{flops / t_new / 1e9:8.1f} {t_old / t_new:5.2f}", flush=True)


if __name__ == "__main__":
    main()
