"""int16 (16x8) TRANSPOSE_CONV with constant weights, as the integer reference
:func:`litegpu.ops.quantized._transpose_conv_q` computes it and LiteRT's builtin reference
kernel does (int64 sums, TFLite's int64 single-rounding requantization), in the two steps
of the int8 kernel (:mod:`.qtransposeconv`) chained into one plan:

1. every input pixel times every tap: x ``[N*H*W, C]`` (int16, zero point 0) times the
   weights as ``[C, KH*KW*O]``, exact int64 sums (:class:`.q16.QuantizedMatmul16` without
   its requantization: int32 sums in blocks that cannot overflow, added in int64); x's
   rows first copied into rows of whole channel pairs when C is odd;
2. col2im: each output pixel sums, in int64, the taps that land on it
   (:func:`.qtransposeconv._gather_row`), plus the bias, requantized per channel and
   clamped (:func:`.q16._requantize_row`).

Both steps' sums are int64: one tap of 32768 x 127 over a few hundred channels is past
int32 already, and col2im adds up to ``ceil(KH/SH) * ceil(KW/SW)`` of them.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from .q16 import I16, QuantizedMatmul16, _columns, _product_constants, _requantize_row
from .qmatmul import _widen_rows_task
from .qtransposeconv import _gather_row, geometry, taps_matrix
from .registry import bindable, kernel, named
from .threads import current as current_threads
from .tasks import bind_task, bound_tasks, in_sequence, int16_pointer, int64_pointer, task_function

I64 = np.dtype(np.int64)


@task_function()
def _col2im16_task(t, sumsp, colsp, accp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """Output rows ``t * chunk ..`` (``ip``: N*OH, chunk, H, W, OH, OW, O, KH, KW, SH, SW,
    PT, PL, the sums' row length, lo, hi), a row at a time in the task's ``[OW, O]`` of
    int64 ``acc``: zeros, plus every tap's sums, then each pixel's channels plus the bias,
    requantized (``cols``: [4][O] int64, see :func:`.q16._columns`)."""
    sums, cols, acc, out = int64_pointer(sumsp), int64_pointer(colsp), int64_pointer(accp), int16_pointer(outp)
    oh_size, ow_size, o_size = ip[4], ip[5], ip[6]
    at = t * ow_size * o_size
    for row in range(t * ip[1], min(ip[0], (t + 1) * ip[1])):
        for i in range(ow_size * o_size):
            acc[at + i] = 0
        _gather_row(sums, acc, at, row // oh_size, row % oh_size, ip[2], ip[3], ow_size, o_size, ip[7], ip[8],
                    ip[9], ip[10], ip[11], ip[12], ip[13])
        for ox in range(ow_size):
            _requantize_row(acc, at + ox * o_size, cols, out, (row * ow_size + ox) * o_size, o_size, ip[14], ip[15])


@kernel("TRANSPOSE_CONV", quantized=True)
def int16_transpose_conv(ctx: NodeContext):
    """int16 TRANSPOSE_CONV with constant int8 weights and bias (see the module
    docstring); weights or a bias computed at run time, and other dtypes, keep the
    reference."""
    found = _product_constants(ctx, x_index=2, bias_index=3)
    if found is None or found[0].ndim != 4 or found[2]["style"] != "tflite16":
        return None
    w, bias, requant = found
    g = geometry(ctx, w.shape)
    if g is None:
        return None
    m, c, taps = g.n * g.h * g.w, g.c, g.kh * g.kw * g.o
    product = QuantizedMatmul16(taps_matrix(w), None, None, current_threads())
    sums = np.empty((m, taps), I64)
    cols = _columns(g.o, bias, requant)[:, :g.o].copy()
    acc = np.empty(g.tasks * g.ow * g.o, I64)
    params = np.array([*g.params(), taps, requant["lo"], requant["hi"]], np.int64)
    # An odd C: x's rows widened (as bytes) to whole channel pairs; the pair's second
    # value meets zero weights.
    padded = None if c % 2 == 0 else np.zeros((m, c + 1), I16)
    widen = np.array([m, 2 * c, 2 * (c + 1)], np.int64)

    def bind(inputs, outputs):
        x = np.ascontiguousarray(inputs[2], I16).reshape(m, c)
        steps = []
        if padded is not None:
            steps.append(bound_tasks(_widen_rows_task, 1, (x, padded), widen))
            x = padded
        col2im = bind_task(_col2im16_task, g.tasks, (sums, cols, acc), (outputs[0],), params,
                           dtypes=(I64, I64, I64, I16))
        return in_sequence([*steps, product.bind(x, sums), col2im])
    return named(bindable(bind), f"int16 transpose conv ({g.kh}x{g.kw}/{g.sh}): packed GEMM + col2im")
