"""int8 TRANSPOSE_CONV with constant weights, as the integer reference
:func:`litegpu.ops.quantized._transpose_conv_q` computes it, in two steps chained into
one plan:

1. every input pixel times every tap: x ``[N*H*W, C]`` times the weights as ``[C,
   KH*KW*O]``, exact int32 sums ``sum (x - zx) w`` (:class:`.qmatmul.Int32Product`: the
   tiles of :mod:`.qgemm`, stored without requantizing);
2. col2im: each output pixel sums the taps that land on it (stride 2, 3x3: one to four)
   plus the bias, requantized per channel as the node's ``attrs["requant"]`` says:
   XNNPACK's float32 scale (``"xnnpack"``, what LiteRT delegates) or TFLite's builtin
   fixed point (``"tflite_neon"``, a node XNNPACK refuses: groups of eight channels
   rounding ties up, the rest away from zero, :mod:`.qfixed`).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from litegpu.backend import NodeContext

from ..jit import njit
from .common import optional_input, transpose_pad_before
from .qfixed import multiply_by_quantized_multiplier, multiply_by_quantized_multiplier_half_up
from .qmatmul import Int32Product
from .registry import bindable, kernel, named
from .tasks import bind_task, chained, int8_pointer, int32_pointer, row_tasks, task_function

I8 = np.dtype(np.int8)
# Outputs from which col2im is cut into tasks (blocks of rows) the threads share, and the
# tasks.
_PARALLEL_SIZE = 1 << 15
_TASKS = 8
_STYLES = {"xnnpack": 0, "tflite_neon": 1}


# -- col2im and requantization ----------------------------------------------------------------------


@njit(cache=True, inline="always")
def _gather_row(sums, acc, at, n, oh, h, w, ow_size, o_size, kh_size, kw_size, sh, sw, pt, pl,
                npad):   # pragma: no cover - compiled
    """``acc[at ..]`` (one output row, ``[OW, O]``, holding the bias) plus every tap's sums
    that land on output row ``oh`` of image ``n``: each input row ``ih`` with a tap ``kh``
    on it scatters its pixels' taps along the row, ``O`` contiguous sums at a time."""
    for kh in range(kh_size):
        y = oh + pt - kh
        if y < 0 or y % sh != 0 or y // sh >= h:
            continue
        for iw in range(w):
            src = ((n * h + y // sh) * w + iw) * npad + kh * kw_size * o_size
            for kw in range(kw_size):
                ox = iw * sw - pl + kw
                if 0 <= ox < ow_size:
                    dst, tap = at + ox * o_size, src + kw * o_size
                    for o in range(o_size):
                        acc[dst + o] += sums[tap + o]


@task_function()
def _col2im_task(t, sumsp, biasp, multp, shiftp, scalep, accp, outp, _a7, ip, fp):
    """Output rows ``t * chunk ..`` (``ip``: N*OH, chunk, H, W, OH, OW, O, KH, KW, SH, SW,
    PT, PL, the sums' row length, the output zero point, lo, hi, the style (0: XNNPACK's
    float32 scale, 1: TFLite's fixed point), the channels of TFLite's vector loop; ``fp``:
    lo and hi less the zero point), a row at a time in the task's ``[OW, O]`` of ``acc``."""
    sums, bias, acc, out = int32_pointer(sumsp), int32_pointer(biasp), int32_pointer(accp), int8_pointer(outp)
    mult, shift = int32_pointer(multp), int32_pointer(shiftp)
    oh_size, ow_size, o_size = ip[4], ip[5], ip[6]
    zp, lo, hi, vector = ip[14], ip[15], ip[16], ip[18]
    at = t * ow_size * o_size
    for row in range(t * ip[1], min(ip[0], (t + 1) * ip[1])):
        for ox in range(ow_size):
            for o in range(o_size):
                acc[at + ox * o_size + o] = bias[o]
        _gather_row(sums, acc, at, row // oh_size, row % oh_size, ip[2], ip[3], ow_size, o_size, ip[7], ip[8],
                    ip[9], ip[10], ip[11], ip[12], ip[13])
        for ox in range(ow_size):
            src, dst = at + ox * o_size, (row * ow_size + ox) * o_size
            if ip[17] == 0:
                for o in range(o_size):
                    v = min(max(np.float32(acc[src + o]) * scalep[o], fp[0]), fp[1])
                    out[dst + o] = np.int8(np.int32(np.rint(v)) + zp)
            else:
                for o in range(vector):
                    v = multiply_by_quantized_multiplier_half_up(np.int64(acc[src + o]), np.int64(mult[o]),
                                                                 np.int64(shift[o])) + zp
                    out[dst + o] = np.int8(min(max(v, lo), hi))
                for o in range(vector, o_size):
                    v = multiply_by_quantized_multiplier(np.int64(acc[src + o]), np.int64(mult[o]),
                                                         np.int64(shift[o])) + zp
                    out[dst + o] = np.int8(min(max(v, lo), hi))


def _per_channel(values, channels: int, dtype) -> np.ndarray:
    """A per-channel (or one) value as a contiguous array of ``channels``."""
    return np.ascontiguousarray(np.broadcast_to(np.asarray(values if values is not None else 0, dtype),
                                                (channels,)))


def _requantization(requant: dict, channels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(multipliers, shifts, scales)`` per channel: the two the node's style does not
    use are zeros."""
    fixed = requant["style"] == "tflite_neon"
    return (_per_channel(requant["multiplier"] if fixed else None, channels, np.int32),
            _per_channel(requant["shift"] if fixed else None, channels, np.int32),
            _per_channel(None if fixed else requant["scale"], channels, np.float32))


class Geometry(NamedTuple):
    """A TRANSPOSE_CONV's shapes, strides and padding before, and how its col2im is cut
    into tasks (``chunk`` output rows each)."""
    n: int
    h: int
    w: int
    c: int
    o: int
    kh: int
    kw: int
    oh: int
    ow: int
    sh: int
    sw: int
    pt: int
    pl: int
    tasks: int
    chunk: int

    @property
    def rows(self) -> int:
        """Output rows, all images."""
        return self.n * self.oh

    def params(self) -> list[int]:
        """The first 13 of the col2im tasks' int64 parameters: N*OH, chunk, H, W, OH, OW, O,
        KH, KW, SH, SW, PT, PL."""
        return [self.rows, self.chunk, self.h, self.w, self.oh, self.ow, self.o, self.kh, self.kw, self.sh,
                self.sw, self.pt, self.pl]


def geometry(ctx: NodeContext, w_shape: tuple) -> Geometry | None:
    """The node's :class:`Geometry` for weights of ``w_shape`` [O, KH, KW, C]; None unless
    the shapes agree and none is empty."""
    n, h, w, c = ctx.inputs[2].shape
    o, kh, kw, ci = w_shape
    _, oh, ow, oc = ctx.outputs[0].shape
    if ci != c or oc != o or min(n, h, w, c, oh, ow) == 0:
        return None
    sh, sw = ctx.attrs["stride"]
    pt = transpose_pad_before(ctx.attrs["padding"], oh, kh, sh)
    pl = transpose_pad_before(ctx.attrs["padding"], ow, kw, sw)
    tasks, chunk = row_tasks(n * oh, n * oh * ow * o, _PARALLEL_SIZE, _TASKS)
    return Geometry(n, h, w, c, o, kh, kw, oh, ow, sh, sw, pt, pl, tasks, chunk)


def taps_matrix(w: np.ndarray) -> np.ndarray:
    """Weights [O, KH, KW, C] as [C, KH*KW*O]: a pixel's row of products holds its taps one
    after another."""
    o, kh, kw, c = w.shape
    return np.ascontiguousarray(w.transpose(3, 1, 2, 0).reshape(c, kh * kw * o))


@kernel("TRANSPOSE_CONV", quantized=True)
def quantized_transpose_conv(ctx: NodeContext):
    """int8 TRANSPOSE_CONV with constant weights and bias (see the module docstring);
    other dtypes, and weights or a bias computed at run time, keep the reference."""
    r = ctx.attrs.get("requant")
    w_spec, x_spec, bias_spec = ctx.inputs[1], ctx.inputs[2], optional_input(ctx, 3)
    if r is None or r.get("style") not in _STYLES or w_spec.value is None \
            or any(np.dtype(s.dtype) != I8 for s in (w_spec, x_spec, ctx.outputs[0])):
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) != np.int32):
        return None
    g = geometry(ctx, w_spec.shape)
    if g is None:
        return None
    products = Int32Product(taps_matrix(np.asarray(w_spec.value, np.int8)), r["x_zp"], g.n * g.h * g.w)
    bias = _per_channel(None if bias_spec is None else np.asarray(bias_spec.value).reshape(-1), g.o, np.int32)
    mult, shift, scale = _requantization(r, g.o)
    acc = np.empty(g.tasks * g.ow * g.o, np.int32)
    # TFLite's vector loop takes the whole groups of eight channels (see the reference's
    # litegpu.ops.quantized.tflite_quantize).
    params = np.array([*g.params(), products.npad, r["zp"], r["lo"], r["hi"], _STYLES[r["style"]], g.o // 8 * 8],
                      np.int64)
    floats = np.array([r["lo"] - r["zp"], r["hi"] - r["zp"]], np.float32)
    arrays = (products.sums, bias, mult, shift, scale, acc)
    dtypes = (*(a.dtype for a in arrays), I8)

    def bind(inputs, outputs):
        col2im = bind_task(_col2im_task, g.tasks, arrays, (outputs[0],), params, floats, dtypes=dtypes)
        return chained([*products.bind(np.ascontiguousarray(inputs[2])), col2im])
    return named(bindable(bind), f"int8 transpose conv ({g.kh}x{g.kw}/{g.sh}): packed GEMM + col2im")
