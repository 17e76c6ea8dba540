"""Integer kernels for 16x8 models: int16 activations (zero point 0), int8 weights.

LiteRT runs such models on its builtin kernels (TFLite's integer reference arithmetic,
not XNNPACK), and so do the ops' integer references (:mod:`litegpu.ops.quantized`,
``quantized_act``, ``quantized_math``). These kernels compute the same integers (every
test compares them with LiteRT for exact equality):

- One-input ops whose output depends on the input value alone (LOGISTIC, TANH, RELU,
  QUANTIZE to another scale, ...): an int16 input has 65536 values, so the op is a table
  of its own integer reference evaluated on each of them at compile time, then one
  gather per run; exact by construction. With ``attrs["then"]``
  (:func:`.qelementwise.folded_table`: swish, ``x * LOGISTIC(x)``) the table holds the
  follower's result.
- ADD, SUB and MUL of operands of one shape, or one repeating along the leading axes (a
  squeeze-and-excite scale), as task functions over flat operands: TFLite's int64 fixed
  point (:func:`_multiply`, its ``MultiplyByQuantizedMultiplier``) step by step, and for
  ADD of one shape the arithmetic of LiteRT's vector loop (:func:`_scaled_operand`).
- CONV_2D and FULLY_CONNECTED as a product of int16 rows and packed int8 weights
  (:class:`QuantizedMatmul16`: int32 sums in blocks that cannot overflow, added in int64,
  TFLite's requantization), a conv other than 1x1 after an im2col; DEPTHWISE_CONV_2D as a
  task per output row (:class:`Depthwise16`). TRANSPOSE_CONV takes the same product's
  int64 sums, unrequantized (:mod:`.q16transposeconv`).
- MEAN over adjacent axes, SOFTMAX and QUANTIZE of float32 (pools: :mod:`.qpool`).

A node they cannot take (weights computed at run time, grouped convs, depth multipliers,
other broadcasts) gets ``None``, and with it the integer reference.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext
from litegpu.ops.quantized import add16_vector_end, tflite_mean16_multiplier
from litegpu.ops.quantized_act import lut16_lookup
from litegpu.ops.reduce import one_run, reduction_axes
from litegpu.quant import multiply_by_quantized_multiplier

from ..jit import intrinsic, njit, types
from .common import optional_input, window_geometry
from .packed import NR, carried_loop, splat_vector
from .qconv import Im2col
from .qelementwise import _PARALLEL_SIZE, _TASKS, UNARY_8BIT, _full_operand, _spans
from .qgemm import _SUMS, _TILE_PANELS, MR, _store_first_bytes, _task_share, split
from .registry import bindable, in_order, kernel, named, one_input_reference
from .threads import current as current_threads
from .tasks import (bind_task, in_sequence, int8_pointer, int16_pointer, int32_pointer, int64_pointer,
                    task_function)

I16 = np.dtype(np.int16)
_I32, _I64 = ir.IntType(32), ir.IntType(64)


def _tasks_for(size: int) -> tuple[int, int]:
    """``(chunk, tasks)``: elements per task and the task count of a flat op on ``size``
    elements, cut as the 8-bit ones are (one task when small: no parallel region)."""
    chunk = -(-size // _TASKS) if size >= _PARALLEL_SIZE else max(size, 1)
    return chunk, -(-size // chunk)


# -- one-input ops as 65536-entry tables ------------------------------------------------------

# Quantized ops whose output depends on nothing but the input value. SQRT and RSQRT are not
# here: their references refuse negative inputs when run, which a table would do at compile
# time for every model.
UNARY_16BIT = (*UNARY_8BIT, "ABS", "NEG")


@kernel(*UNARY_16BIT, quantized=True)
def int16_table(ctx: NodeContext):
    """A one-input op on int16 as a 65536-entry table of its integer reference (see the
    module docstring), gathered by :func:`_gather_task`."""
    x = ctx.inputs[0]
    if len(ctx.inputs) != 1 or np.dtype(x.dtype) != I16:
        return None
    params = ctx.attrs.get("in")
    if ctx.node.op == "DEQUANTIZE" and (params is None or not params.per_tensor):
        return None   # per-channel: the value depends on the position too
    out_dtype = np.dtype(ctx.outputs[0].dtype)
    table = np.ascontiguousarray(one_input_reference(ctx)(np.arange(-32768, 32768, dtype=np.int64).astype(I16)))
    if table.shape != (65536,) or table.dtype != out_dtype or out_dtype.itemsize not in (1, 2, 4):
        return None
    size = int(np.prod(x.shape, dtype=np.int64))
    chunk, tasks = _tasks_for(size)
    params = np.array([size, chunk, out_dtype.itemsize], np.int64)

    def bind(inputs, outputs):
        return bind_task(_gather_task, tasks, (table, inputs[0]), (outputs[0],), params,
                         dtypes=(out_dtype, I16, out_dtype))
    what = ctx.node.op + (f" then {ctx.attrs['then'].node.op}" if "then" in ctx.attrs else "")
    return named(bindable(bind), f"int16 table ({what})")


@task_function()
def _gather_task(t, tablep, xp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[i] = table[x[i] + 32768]`` for elements ``t * chunk ..`` (``ip``: size, chunk,
    the entries' width in bytes: 1, 2 or 4; their bits are copied, whatever their type)."""
    x = int16_pointer(xp)
    start = t * ip[1]
    end = min(ip[0], start + ip[1])
    if ip[2] == 2:
        table, out = int16_pointer(tablep), int16_pointer(outp)
        for i in range(start, end):
            out[i] = table[np.int64(x[i]) + 32768]
    elif ip[2] == 4:
        wide, wide_out = int32_pointer(tablep), int32_pointer(outp)
        for i in range(start, end):
            wide_out[i] = wide[np.int64(x[i]) + 32768]
    else:
        narrow, narrow_out = int8_pointer(tablep), int8_pointer(outp)
        for i in range(start, end):
            narrow_out[i] = narrow[np.int64(x[i]) + 32768]


# -- TFLite's fixed point, in numba ------------------------------------------------------------


@njit(cache=True, inline="always")
def _high_mul(a, b):   # pragma: no cover - compiled
    """gemmlowp's ``SaturatingRoundingDoublingHighMul`` in int64 (``round(a * b / 2^31)``,
    ties away from zero) as :func:`litegpu.quant.saturating_rounding_doubling_high_mul`,
    but for its saturation of ``INT32_MIN * INT32_MIN``: ``b`` is a multiplier of
    ``QuantizeMultiplier``, never negative."""
    ab = a * b
    total = ab + (np.int64(1 << 30) if ab >= 0 else np.int64(1 - (1 << 30)))
    return total >> 31 if total >= 0 else -((-total) >> 31)


@njit(cache=True, inline="always")
def _divide_pot(x, exponent):   # pragma: no cover - compiled
    """gemmlowp's ``RoundingDivideByPOT`` (:func:`litegpu.quant.rounding_divide_by_pot`):
    ``x / 2^exponent`` rounded to nearest, ties away from zero."""
    mask = (np.int64(1) << exponent) - 1
    threshold = (mask >> 1) + (np.int64(1) if x < 0 else np.int64(0))
    return (x >> exponent) + (np.int64(1) if (x & mask) > threshold else np.int64(0))


@njit(cache=True, inline="always")
def _multiply(x, multiplier, shift):   # pragma: no cover - compiled
    """TFLite's ``MultiplyByQuantizedMultiplier`` (double rounding) as
    :func:`litegpu.quant.multiply_by_quantized_multiplier`: ``x * multiplier * 2^(shift -
    31)``, all int64."""
    left = shift if shift > 0 else np.int64(0)
    right = -shift if shift < 0 else np.int64(0)
    return _divide_pot(_high_mul(x << left, multiplier), right)


@njit(cache=True, inline="always")
def _clamp(v, lo, hi):   # pragma: no cover - compiled
    """``v`` clamped to ``lo .. hi``: the fused activation's range, or the type's."""
    return min(max(v, lo), hi)


# -- ADD, SUB, MUL --------------------------------------------------------------------------------

# ip layout of the binary task functions: size, b's period, elements per task (as
# :func:`.qelementwise._spans` reads them), then the operands' own values (a's from ``_A``,
# b's from ``_B``), then the output's (from ``_OUT``).
_A, _B, _OUT = 3, 7, 11


@njit(cache=True, inline="always")
def _scaled_operand(x, zp, multiplier, shift, vector):   # pragma: no cover - compiled
    """One operand of TFLite's general int16 ADD/SUB on its way to the sum: less its zero
    point, shifted left by 15, times its multiplier (``shift`` <= 0). Its scalar code
    (``vector`` false: :func:`litegpu.ops.quantized._add_q`) rounds twice, after the
    multiply and after the right shift; the vector loop of LiteRT's same-shape ADD
    (``optimized_integer_ops::AddElementwiseInt16``, NEON on x86 through NEON_2_SSE) folds
    the right shift into the left one, ``15 + shift``, and rounds once (measured: it
    agrees with LiteRT on every element where the scalar code differs in about 1 of
    5000)."""
    x = np.int64(x) - zp
    if not vector:
        return _multiply(x << 15, multiplier, shift)
    left = 15 + shift
    return _high_mul(x << left if left >= 0 else x >> -left, multiplier)


@njit(cache=True, inline="always")
def _add_general_span(a, b, out, i, j, n, ip):   # pragma: no cover - compiled
    """``n`` outputs from ``i`` of TFLite's general int16 ADD/SUB, ``b`` read from ``j``:
    the operands scaled by :func:`_scaled_operand`, signed, summed, times the output's
    multiplier (``ip``: per operand zero point, multiplier, shift, sign; then the
    output's multiplier, shift, zero point, lo, hi, and where LiteRT's vector loop ends:
    the outputs before it take its arithmetic)."""
    za, ma, sa, ga = ip[_A], ip[_A + 1], ip[_A + 2], ip[_A + 3]
    zb, mb, sb, gb = ip[_B], ip[_B + 1], ip[_B + 2], ip[_B + 3]
    mo, so, zo, lo, hi, vector_end = ip[_OUT], ip[_OUT + 1], ip[_OUT + 2], ip[_OUT + 3], ip[_OUT + 4], ip[_OUT + 5]
    for k in range(n):
        vector = i + k < vector_end
        total = ga * _scaled_operand(a[i + k], za, ma, sa, vector) + gb * _scaled_operand(b[j + k], zb, mb, sb, vector)
        out[i + k] = _clamp(_multiply(total, mo, so) + zo, lo, hi)


@njit(cache=True, inline="always")
def _add_pot_span(a, b, out, i, j, n, ip):   # pragma: no cover - compiled
    """``n`` outputs from ``i`` of TFLite's power-of-two int16 ADD/SUB (``ip``: per operand
    a right shift, rounded with ties away from zero, and a sign; then lo, hi)."""
    sa, ga, sb, gb = ip[_A], ip[_A + 1], ip[_B], ip[_B + 1]
    lo, hi = ip[_OUT], ip[_OUT + 1]
    for k in range(n):
        total = ga * _divide_pot(np.int64(a[i + k]), sa) + gb * _divide_pot(np.int64(b[j + k]), sb)
        out[i + k] = _clamp(total, lo, hi)


@njit(cache=True, inline="always")
def _mul_span(a, b, out, i, j, n, ip):   # pragma: no cover - compiled
    """``n`` outputs from ``i`` of TFLite's int16 MUL: the product of the zero-point-free
    operands times the output multiplier (``ip``: per operand its zero point; then the
    multiplier, shift, zero point, lo, hi)."""
    za, zb = ip[_A], ip[_B]
    m, s, zo, lo, hi = ip[_OUT], ip[_OUT + 1], ip[_OUT + 2], ip[_OUT + 3], ip[_OUT + 4]
    for k in range(n):
        product = (np.int64(a[i + k]) - za) * (np.int64(b[j + k]) - zb)
        out[i + k] = _clamp(_multiply(product, m, s) + zo, lo, hi)


@njit(cache=True, inline="always")
def _walk(t, ap, bp, outp, ip, span):   # pragma: no cover - compiled
    """Task ``t``'s share of a binary op over flat int16 operands by ``span`` (one of the
    ``_*_span`` functions), ``b`` repeating every ``ip[1]`` elements: one span per period
    of ``b`` (its index wraps at each)."""
    i, j, end = _spans(t, ip)
    a, b, out = int16_pointer(ap), int16_pointer(bp), int16_pointer(outp)
    while i < end:
        n = min(ip[1] - j, end - i)
        span(a, b, out, i, j, n, ip)
        i, j = i + n, 0


# One task function per op, each compiled the first time a model uses it.
@task_function()
def _add_task(t, ap, bp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of TFLite's general int16 ADD/SUB (:func:`_add_general_span`)."""
    _walk(t, ap, bp, outp, ip, _add_general_span)


@task_function()
def _add_pot_task(t, ap, bp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of TFLite's power-of-two int16 ADD/SUB (:func:`_add_pot_span`)."""
    _walk(t, ap, bp, outp, ip, _add_pot_span)


@task_function()
def _mul_task(t, ap, bp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of TFLite's int16 MUL (:func:`_mul_span`)."""
    _walk(t, ap, bp, outp, ip, _mul_span)


@kernel("ADD", "SUB", quantized=True)
def int16_add(ctx: NodeContext):
    """int16 ADD/SUB, TFLite's general kernel or its power-of-two one, whichever the node's
    attrs hold."""
    attrs = ctx.attrs
    bounds = (attrs.get("lo"), attrs.get("hi"))
    if "add16" in attrs:
        p = attrs["add16"]
        shifts = (p["a"][2], p["b"][2], p["out"][1])
        if max(shifts) > 0:
            return None      # multipliers above one: LiteRT's kernel assumes none
        operands = ((*p["a"], 1), (*p["b"], p["sign"]))
        vector_end = add16_vector_end(ctx.node.op, ctx.inputs[0].shape, ctx.inputs[1].shape)
        return _binary(ctx, _add_task, operands, (*p["out"], attrs["zp"], *bounds, vector_end), "add")
    if "add16_pot" in attrs:
        (sa, sb), sign = attrs["add16_pot"], attrs["sign"]
        return _binary(ctx, _add_pot_task, ((sa, 1), (sb, sign)), bounds, "power-of-two add")
    return None


@kernel("MUL", quantized=True)
def int16_mul(ctx: NodeContext):
    """int16 MUL with TFLite's fixed-point multiplier."""
    r = ctx.attrs.get("requant")
    if r is None or "multiplier" not in r:
        return None
    return _binary(ctx, _mul_task, ((r["a_zp"],), (r["b_zp"],)), (*r["multiplier"], r["zp"], r["lo"], r["hi"]), "mul")


def _binary(ctx: NodeContext, task, operands: tuple, out_values: tuple, name: str):
    """The kernel of an int16 binary node: ``task`` when the operands are the same shape or
    one repeats along the leading axes (the full one first, each with its own
    ``operands`` values: the formulas are symmetric in (operand, values) pairs); None (the
    reference) for other broadcasts and dtypes."""
    if any(np.dtype(s.dtype) != I16 for s in (*ctx.inputs[:2], ctx.outputs[0])):
        return None
    big = _full_operand(ctx)
    if big is None:
        return None
    size = int(np.prod(ctx.outputs[0].shape, dtype=np.int64))
    period = max(1, int(np.prod(ctx.inputs[1 - big].shape, dtype=np.int64)))
    chunk, tasks = _tasks_for(size)
    per_operand = [[int(v) for v in values] + [0] * (_B - _A - len(values))
                   for values in (operands[big], operands[1 - big])]
    params = np.array([size, period, chunk, *per_operand[0], *per_operand[1], *(int(v) for v in out_values)],
                      np.int64)

    def bind(inputs, outputs):
        return bind_task(task, tasks, (inputs[big], inputs[1 - big]), (outputs[0],), params,
                         dtypes=(I16,) * 3)
    return named(bindable(bind), f"int16 {name} task")


# -- products: int16 x int8 sums (CONV_2D, FULLY_CONNECTED) -------------------------------------------
#
# W [K, N] is widened to int16 and packed once into panels of 16 output columns,
# ``[N/16][K/2][16][2]``: one 64-byte vector holds two K steps of sixteen columns. A tile
# keeps MR rows x two panels of int32 sums in registers over a block of K (the products of
# each lane's two int16 pairs summed, which LLVM makes one ``vpdpwssd`` where the host has
# AVX-512 VNNI: as fast as the intrinsic, measured, so there is no second variant as in
# :mod:`.qgemm`), then adds them, widened, to the int64 sums of the blocks before (in a
# small scratch of the task's) or, after the last block, requantizes and stores them. Each
# block is short enough that its int32 sums cannot overflow, whatever the int16 inputs:
# 32768 times the sum of |w| over the block stays below 2^31 in every column
# (:func:`_block_pairs`); most layers are one block. The sums are the reference's exactly:
# integers, added in another order. Measured on one Zen 4 core: 3136x576x64 in 1.06 ms
# (~110 G int16 multiply-adds/s), 6400x16x96 in 0.28 ms; efficientnet_b0 16x8's 65 convs
# went from 32 ms (the reference's float64 BLAS) to 4.4 ms on 2 threads.


def _dot2(builder, acc, xs, w):
    """``acc + `` the sums of the two products of each lane's two int16 values of ``xs``
    and ``w`` (all ``<16 x i32>``)."""
    halves, wide = ir.VectorType(ir.IntType(16), 2 * NR), ir.VectorType(_I32, 2 * NR)
    products = builder.mul(builder.sext(builder.bitcast(xs, halves), wide),
                           builder.sext(builder.bitcast(w, halves), wide))
    for j in range(2):
        part = builder.shuffle_vector(products, ir.Constant(wide, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, NR), list(range(j, 2 * NR, 2))))
        acc = builder.add(acc, part)
    return acc


def _pair_sums(builder, rows: int, panels: int, x_ptr, w_ptr, row_of, panel_of, stride_, pairs_, g0_, g1_):
    """Emit the K loop of a tile: the int32 sums over K pairs ``g0 .. g1`` of ``rows`` rows
    (``row_of``: their indices; x's rows ``stride`` bytes apart) x ``panels`` panels
    (``panel_of``; W ``pairs`` K pairs long per panel), by row then panel."""
    byte_ptr = ir.IntType(8).as_pointer()
    x_bytes, w_bytes = builder.bitcast(x_ptr, byte_ptr), builder.bitcast(w_ptr, byte_ptr)
    x_rows = [builder.mul(row, stride_) for row in row_of]
    w_panels = [builder.mul(p, builder.mul(pairs_, ir.Constant(_I64, 4 * NR))) for p in panel_of]

    def step(g, sums):
        """One K pair: each panel's 64 bytes of W, each row's two int16 of x."""
        pair = builder.add(g, g0_)
        at = builder.mul(pair, ir.Constant(_I64, 4 * NR))
        ws = [builder.load(builder.bitcast(builder.gep(w_bytes, [builder.add(wp, at)]), _SUMS.as_pointer()), align=1)
              for wp in w_panels]
        k_at = builder.mul(pair, ir.Constant(_I64, 4))
        out = []
        for r, x_row in enumerate(x_rows):
            two = builder.load(builder.bitcast(builder.gep(x_bytes, [builder.add(x_row, k_at)]), _I32.as_pointer()),
                               align=1)
            xs = splat_vector(builder, two, _SUMS)
            out += [_dot2(builder, a, xs, w) for a, w in zip(sums[r * panels:(r + 1) * panels], ws)]
        return out

    zeros = [ir.Constant(_SUMS, [0] * NR)] * (rows * panels)
    flat = carried_loop(builder, builder.sub(g1_, g0_), zeros, step, "q16.k")
    return [flat[r * panels:(r + 1) * panels] for r in range(rows)]


def _requantize16(builder, acc, mult, rnd, shift, lo, hi):
    """TFLite's int64 single-rounding requantization of 16 int64 sums (all ``<16 x i64>``:
    the column's reduced multiplier, rounding term and right shift, see
    :func:`litegpu.quant.multiply_by_quantized_multiplier_64`), clamped, as ``<16 x i16>``."""
    y = builder.ashr(builder.add(builder.mul(acc, mult), rnd), shift)
    y = builder.select(builder.icmp_signed("<", y, lo), lo, y)
    y = builder.select(builder.icmp_signed(">", y, hi), hi, y)
    return builder.trunc(y, ir.VectorType(ir.IntType(16), NR))


def _tile16_codegen(rows: int, panels: int):
    """The IR of a tile: :func:`_pair_sums` over one block of K, added (widened) to the
    column's bias (the first block) or to the int64 sums at ``scratch[at:]``
    [rows][panels][16]; then stored back there, or (``finish``) requantized by the
    per-column ``cols`` [4][N rounded up to panels] int64 (bias, reduced multiplier,
    rounding term, right shift: :func:`_columns`) and stored as int16. Rows past ``last``
    and panels past ``plast`` are computed as the last ones (the same values again)."""
    def codegen(context, builder, signature, args):
        (x_ptr, w_ptr, cols_ptr, scratch_ptr, out_ptr, at_, r_, last_, stride_, pairs_, g0_, g1_, n_, p_, plast_,
         first_, finish_, lo_, hi_) = args

        def clamped(first, i, last):
            at = builder.add(first, ir.Constant(_I64, i))
            return builder.select(builder.icmp_signed("<", at, last), at, last)

        row_of = [clamped(r_, i, last_) for i in range(rows)]
        panel_of = [clamped(p_, j, plast_) for j in range(panels)]
        sums = _pair_sums(builder, rows, panels, x_ptr, w_ptr, row_of, panel_of, stride_, pairs_, g0_, g1_)
        wide = ir.VectorType(_I64, NR)
        cols = builder.bitcast(cols_ptr, _I64.as_pointer())
        scratch = builder.bitcast(scratch_ptr, _I64.as_pointer())
        out = builder.bitcast(out_ptr, ir.IntType(16).as_pointer())
        n_pad = builder.and_(builder.add(n_, ir.Constant(_I64, NR - 1)), ir.Constant(_I64, -NR))
        lo, hi = splat_vector(builder, lo_, wide), splat_vector(builder, hi_, wide)
        first = builder.icmp_signed("!=", first_, ir.Constant(_I64, 0))
        finish = builder.icmp_signed("!=", finish_, ir.Constant(_I64, 0))

        def column_vector(row, jb):
            at = builder.add(builder.mul(n_pad, ir.Constant(_I64, row)), jb)
            return builder.load(builder.bitcast(builder.gep(cols, [at]), wide.as_pointer()), align=8)

        for j, p in enumerate(panel_of):
            jb = builder.mul(p, ir.Constant(_I64, NR))
            bias = column_vector(0, jb)
            for i, r in enumerate(row_of):
                slot = builder.gep(scratch, [builder.add(at_, ir.Constant(_I64, (i * panels + j) * NR))])
                slot = builder.bitcast(slot, wide.as_pointer())
                start = builder.select(first, bias, builder.load(slot, align=8))
                acc = builder.add(start, builder.sext(sums[i][j], wide))
                with builder.if_else(finish) as (done, carry):
                    with done:
                        y = _requantize16(builder, acc, column_vector(1, jb), column_vector(2, jb),
                                          column_vector(3, jb), lo, hi)
                        _store_row(builder, y, builder.gep(out, [builder.add(builder.mul(r, n_), jb)]),
                                   builder.sub(n_, jb))
                    with carry:
                        builder.store(acc, slot, align=8)
        return context.get_dummy_value()
    return codegen


def _store_row(builder, value, pointer, left):
    """Store the 16 int16 of ``value`` at ``pointer``, or only the first ``left`` of them
    (the last, partial panel of a row)."""
    with builder.if_else(builder.icmp_signed(">=", left, ir.Constant(_I64, NR))) as (full, part):
        with full:
            builder.store(value, builder.bitcast(pointer, value.type.as_pointer()), align=2)
        with part:
            _store_first_bytes(builder, value, pointer, left)     # (element by element)


def _make_tile16(rows: int, panels: int):
    """The tile of ``rows`` x ``panels`` as a numba intrinsic (its IR inlined where called)."""
    @intrinsic
    def tile(typingctx, xp, wp, colsp, scratchp, outp, at, r, last, stride, pairs, g0, g1, n, p, plast, first,
             finish, lo, hi):
        """``rows`` rows from ``r`` x ``panels`` panels from ``p`` of the int16 product over K
        pairs ``g0 .. g1``, its int64 sums at ``scratch[at:]`` (see :func:`_tile16_codegen`)."""
        return types.void(xp, wp, colsp, scratchp, outp, *[types.int64] * 14), _tile16_codegen(rows, panels)
    return tile


# Tiles as in :mod:`.qgemm`: MR rows x two panels, and a last few rows one at a time x four.
_ROW_PANELS = 4
_tile16, _row16 = _make_tile16(MR, _TILE_PANELS), _make_tile16(1, _ROW_PANELS)
# Int64 sums a task's scratch holds: the larger tile's.
_SCRATCH = max(MR * _TILE_PANELS, _ROW_PANELS) * NR

# ip layout of :func:`_gemm16_task` (the first eight as :func:`.qgemm._task_share` reads them).
_M, _PAIRS, _N, _STRIDE = 0, 1, 2, 3
_LO, _HI, _BLOCK, _MODE = 8, 9, 10, 11
# What becomes of a tile's int64 sums (``ip[_MODE]``): the tiles requantize them by TFLite's
# single rounding ("tflite16") and store int16; or they leave them in the task's scratch,
# whence :func:`_from_scratch` requantizes them by the double rounding ("tflite") or
# stores them as they are (no requantization: TRANSPOSE_CONV sums them further).
_DOUBLE, _SINGLE, _RAW = 0, 1, 2


@njit(cache=True, inline="always")
def _from_scratch(scratch, at, cols, outp, r, rows, last, p, panels, plast, n, lo, hi, raw):   # pragma: no cover
    """A tile's int64 sums left at ``scratch[at:]`` ([rows][panels][16]), rows ``r ..`` up
    to ``last`` and panels ``p ..`` up to ``plast``, stored in ``out``'s rows of ``n``: as
    they are when ``raw`` (``out`` int64), else requantized by TFLite's double-rounding
    multiply (:func:`_multiply`; ``cols`` rows 1 and 3: each column's multiplier and
    shift) and clamped (``out`` int16)."""
    n_pad = (n + NR - 1) // NR * NR
    out, sums = int16_pointer(outp), int64_pointer(outp)
    for i in range(min(rows, last - r + 1)):
        for j in range(min(panels, plast - p + 1)):
            jb = (p + j) * NR
            for lane in range(min(NR, n - jb)):
                acc = scratch[at + (i * panels + j) * NR + lane]
                col = jb + lane
                if raw:
                    sums[(r + i) * n + col] = acc
                else:
                    value = _multiply(acc, cols[n_pad + col], cols[3 * n_pad + col])
                    out[(r + i) * n + col] = _clamp(value, lo, hi)


@task_function()
def _gemm16_task(t, xp, wp, colsp, outp, scratchp, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of the int16 product (``ip``: M, K/2, N, x's row stride in bytes,
    row_chunk, row_tasks, panel_chunk, panel_tasks, lo, hi, K pairs per block, the mode:
    the tiles requantize, or :func:`_from_scratch` requantizes or stores the sums from the
    task's part of ``scratch``)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    whole = r0 + (r1 - r0) // MR * MR
    pairs, block = ip[_PAIRS], ip[_BLOCK]
    blocks = (pairs + block - 1) // block
    at = t * _SCRATCH
    scratch, cols = int64_pointer(scratchp), int64_pointer(colsp)
    single, raw = ip[_MODE] == _SINGLE, ip[_MODE] == _RAW
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            for b in range(blocks):
                _tile16(xp, wp, colsp, scratchp, outp, at, r, r1 - 1, ip[_STRIDE], pairs, b * block,
                        min(pairs, (b + 1) * block), ip[_N], p, p1 - 1, np.int64(b == 0),
                        np.int64(single and b == blocks - 1), ip[_LO], ip[_HI])
            if not single:
                _from_scratch(scratch, at, cols, outp, r, MR, r1 - 1, p, _TILE_PANELS, p1 - 1, ip[_N], ip[_LO],
                              ip[_HI], raw)
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            for b in range(blocks):
                _row16(xp, wp, colsp, scratchp, outp, at, r, r, ip[_STRIDE], pairs, b * block,
                       min(pairs, (b + 1) * block), ip[_N], p, p1 - 1, np.int64(b == 0),
                       np.int64(single and b == blocks - 1), ip[_LO], ip[_HI])
            if not single:
                _from_scratch(scratch, at, cols, outp, r, 1, r, p, _ROW_PANELS, p1 - 1, ip[_N], ip[_LO], ip[_HI], raw)


def pack16(w_kn: np.ndarray) -> np.ndarray:
    """int8 W [K, N] as int16 ``[ceil(N/16), ceil(K/2), 16, 2]``, zeros past K and N."""
    k, n = w_kn.shape
    k2, n16 = -(-k // 2) * 2, -(-n // NR) * NR
    padded = np.zeros((k2, n16), np.int16)
    padded[:k, :n] = w_kn
    return np.ascontiguousarray(padded.reshape(k2 // 2, 2, n16 // NR, NR).transpose(2, 0, 3, 1))


def _block_pairs(w_kn: np.ndarray) -> int:
    """The most K pairs a block may have: any run of that many pairs has, in every column,
    ``32768 * sum |w| < 2^31``, so that no int32 sum of int16 x int8 products over it
    overflows (at least 255 pairs, whatever the weights; usually all of K)."""
    k, n = w_kn.shape
    magnitude = np.zeros((-(-k // 2) * 2, n), np.int64)
    magnitude[:k] = np.abs(w_kn.astype(np.int64))
    prefix = np.concatenate([np.zeros((1, n), np.int64), np.cumsum(magnitude[0::2] + magnitude[1::2], axis=0)])

    def safe(length: int) -> bool:
        return int((prefix[length:] - prefix[:-length]).max(initial=0)) * 32768 < 1 << 31

    lo, hi = 1, prefix.shape[0] - 1          # safe(1) always: 2 * 128 * 32768 < 2^31
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if safe(mid) else (lo, mid - 1)
    return lo


class QuantizedMatmul16:
    """``bind(x [M, K2 * 2] int16, out [M, N]) -> call`` computing ``x @ w_kn + bias`` for
    the constant int8 ``w_kn`` [K, N] (K2: K rounded up to pairs; x's values past K meet
    zero weights) and int64 ``bias`` (or None), packed once, then the node's int16
    requantization ``requant`` (``style`` "tflite16": the single-rounding multiply the
    tiles apply; "tflite": the double-rounding one, applied after them; ``out`` int16)
    or, ``requant`` None, none: ``out`` (int64) holds the exact sums (TRANSPOSE_CONV's
    products, :mod:`.q16transposeconv`). ``threads``: the threads the tasks are cut
    for."""

    def __init__(self, w_kn: np.ndarray, bias: np.ndarray | None, requant: dict | None, threads: int) -> None:
        k, n = w_kn.shape
        if w_kn.dtype != np.int8 or k == 0 or n == 0:
            raise ValueError(f"int16 product takes a non-empty int8 weight, not {w_kn.dtype} {w_kn.shape}")
        self.k, self.n, self.threads = k, n, threads
        self.weights = pack16(w_kn)
        self.block = _block_pairs(w_kn)
        self.cols = _columns(n, bias, requant)
        if requant is None:
            self.mode, self.bounds, self.out_dtype = _RAW, (0, 0), np.dtype(np.int64)
        else:
            self.mode = _SINGLE if requant["style"] == "tflite16" else _DOUBLE
            self.bounds, self.out_dtype = (int(requant["lo"]), int(requant["hi"])), I16

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays: ``x`` [M, K rounded up to pairs], ``out`` [M, N] (int16,
        or int64 for the sums)."""
        m, k2 = out.shape[0], self.weights.shape[1] * 2
        if x.dtype != I16 or out.dtype != self.out_dtype or x.shape != (m, k2) or out.shape != (m, self.n):
            raise ValueError(f"int16 product [M, {k2}] -> [M, {self.n}] {self.out_dtype} given {x.shape} {x.dtype} "
                             f"-> {out.shape} {out.dtype}")
        rows = split(m, self.n, self.k, self.threads)
        tasks = rows[1] * rows[3]
        params = np.array([m, k2 // 2, self.n, k2 * 2, *rows, *self.bounds, self.block, self.mode], np.int64)
        scratch = np.empty(tasks * _SCRATCH, np.int64)
        return bind_task(_gemm16_task, tasks, (x, self.weights, self.cols), (out, scratch), params,
                         dtypes=(I16, I16, np.int64, self.out_dtype, np.int64))


def _columns(n: int, bias: np.ndarray | None, requant: dict | None) -> np.ndarray:
    """Each column's int64 bias and requantization, ``[4][N rounded up to panels]``: bias,
    multiplier, rounding term, right shift. "tflite16" (the convs'): the multiplier cut to
    16 bits and ``15 - shift`` (:func:`litegpu.quant.multiply_by_quantized_multiplier_64`);
    "tflite": TFLite's own multiplier and shift (:func:`_multiply`), no rounding term;
    ``requant`` None (raw sums): the bias alone."""
    cols = np.zeros((4, -(-n // NR) * NR), np.int64)
    if bias is not None:
        cols[0, :n] = bias
    if requant is None:
        return cols
    m = np.broadcast_to(np.asarray(requant["multiplier"], np.int64), (n,))
    shift = np.broadcast_to(np.asarray(requant["shift"], np.int64), (n,))
    if requant["style"] == "tflite16":
        total = 15 - shift
        cols[1, :n] = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
        cols[2, :n] = np.int64(1) << (total - 1)
        cols[3, :n] = total
    else:
        cols[1, :n], cols[3, :n] = m, shift
    return cols


def _product_constants(ctx: NodeContext, x_index: int = 0,
                       bias_index: int = 2) -> tuple[np.ndarray, np.ndarray | None, dict] | None:
    """The node's int8 weights (input 1), int64 bias (input ``bias_index``, from int64 or
    int32; None when omitted) and its int16 requantization, or None unless they are
    constants on an int16 input (input ``x_index``) and output."""
    requant = ctx.attrs.get("requant")
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, bias_index)
    if requant is None or requant.get("style") not in ("tflite16", "tflite") or w_spec.value is None \
            or np.dtype(w_spec.dtype) != np.int8 or np.dtype(ctx.inputs[x_index].dtype) != I16 \
            or np.dtype(ctx.outputs[0].dtype) != I16:
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) not in (np.int32, np.int64)):
        return None
    if requant["style"] == "tflite16" and np.any(15 - np.asarray(requant["shift"]) < 1):
        return None     # no rounding bit: LiteRT's kernel has no such multiplier either
    bias = None if bias_spec is None else np.asarray(bias_spec.value, np.int64).reshape(-1)
    return np.asarray(w_spec.value, np.int8), bias, requant


def _product16(w_kn: np.ndarray, bias, requant: dict | None) -> QuantizedMatmul16:
    """The node's product, cut into tasks for the plan's threads."""
    return QuantizedMatmul16(w_kn, bias, requant, current_threads())


@kernel("FULLY_CONNECTED", quantized=True)
def int16_fully_connected(ctx: NodeContext):
    """An int16 FULLY_CONNECTED as one :class:`QuantizedMatmul16` product; x's rows copied
    into rows of whole K pairs first when K is odd."""
    found = _product_constants(ctx)
    if found is None or found[0].ndim != 2:
        return None
    w, bias, requant = found
    o, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    product = _product16(np.ascontiguousarray(w.T), bias, requant)
    padded = None if k % 2 == 0 else np.zeros((m, k + 1), I16)

    def bind(inputs, outputs):
        x2, out2 = inputs[0].reshape(m, k), outputs[0].reshape(m, o)
        if padded is None:
            return product.bind(x2, out2)
        return in_order([partial(np.copyto, padded[:, :k], x2), product.bind(padded, out2)])
    return named(bindable(bind), "int16 packed GEMM")


@kernel("CONV_2D", quantized=True)
def int16_conv(ctx: NodeContext):
    """A 1x1 stride-1 int16 conv over an even number of channels as one product over the
    pixels; any other ungrouped one as an im2col, then the product. The im2col is
    :class:`.qconv.Im2col` on bytes: a pixel's C int16 values are 2C bytes, and padding
    (zero point 0) zero bytes."""
    found = _product_constants(ctx)
    if found is None or found[0].ndim != 4:
        return None
    w, bias, requant = found
    n, h, wd, c = ctx.inputs[0].shape
    o, kh, kw, ci = w.shape
    _, oh, ow, _ = ctx.outputs[0].shape
    if ci != c:
        return None                     # grouped: the reference
    geometry = window_geometry(ctx.attrs, h, wd, kh, kw)
    product = _product16(np.ascontiguousarray(w.reshape(o, kh * kw * c).T), bias, requant)
    m = n * oh * ow
    if (kh, kw, *geometry[:2], *geometry[4:]) == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd) and c % 2 == 0:
        return named(bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, c), outputs[0].reshape(m, o))),
                     "int16 packed GEMM over the pixels (1x1)")
    cols = np.empty((m, -(-kh * kw * c // 2) * 2), I16)
    im2col = Im2col((n, h, wd, 2 * c), (kh, kw), geometry, oh, ow)
    zero = np.array([128], np.int32)       # (Im2col's padding byte is this less 128)

    def bind(inputs, outputs):
        x = np.ascontiguousarray(inputs[0]).view(np.int8).reshape(n, h, wd, 2 * c)
        return in_sequence([im2col.bind(x, zero, 0, cols.view(np.int8)), product.bind(cols, outputs[0].reshape(m, o))])
    return named(bindable(bind), f"int16 im2col ({kh}x{kw}/{geometry[0]}) + packed GEMM")


# -- DEPTHWISE_CONV_2D ------------------------------------------------------------------------------------

# ip layout of :func:`_depthwise16_task`.
_DH_, _DW_, _DC, _DOH, _DOW, _DKH, _DKW, _DSH, _DSW, _DDH, _DDW, _DPT, _DPL, _DLO, _DHI = range(15)


@njit(cache=True, inline="always")
def _requantize_row(acc, acc_at, cols, out, out_at, c, lo, hi):   # pragma: no cover - compiled
    """One pixel's ``c`` int32 sums from ``acc[acc_at]`` plus each channel's bias,
    requantized by TFLite's int64 single rounding (``cols``: [4][C] bias, reduced
    multiplier, rounding term, right shift; see :func:`_columns`), clamped, stored as int16
    from ``out[out_at]``."""
    for ch in range(c):
        v = (np.int64(acc[acc_at + ch]) + cols[ch]) * cols[c + ch] + cols[2 * c + ch]
        out[out_at + ch] = _clamp(v >> cols[3 * c + ch], lo, hi)


@task_function()
def _depthwise16_task(t, xp, wp, colsp, outp, scratchp, _a5, _a6, _a7, ip, fp):
    """Output row ``t`` (image ``t // OH``) of an int16 depthwise conv of multiplier 1: for
    each pixel, the int32 sums over the taps inside the image (padding, zero point 0, adds
    nothing) of ``x * w`` channel by channel (``w``: int32 [KH * KW, C]), then
    :func:`_requantize_row`. ``scratch``: C int32 sums per task. A tap's products fit int32
    by far (KH * KW < 512 taps of at most 2^22)."""
    h, w, c, oh, ow = ip[_DH_], ip[_DW_], ip[_DC], ip[_DOH], ip[_DOW]
    kh, kw, sh, sw, dh, dw, pt, pl = ip[_DKH], ip[_DKW], ip[_DSH], ip[_DSW], ip[_DDH], ip[_DDW], ip[_DPT], ip[_DPL]
    x, wt, out = int16_pointer(xp), int32_pointer(wp), int16_pointer(outp)
    cols, acc = int64_pointer(colsp), int32_pointer(scratchp)
    image, y = t // oh, t % oh
    acc_at = t * c
    for ox in range(ow):
        for ch in range(c):
            acc[acc_at + ch] = 0
        for ky in range(kh):
            iy = y * sh - pt + ky * dh
            if iy < 0 or iy >= h:
                continue
            for kx in range(kw):
                ix = ox * sw - pl + kx * dw
                if ix < 0 or ix >= w:
                    continue
                x_at = ((image * h + iy) * w + ix) * c
                w_at = (ky * kw + kx) * c
                for ch in range(c):
                    acc[acc_at + ch] += np.int32(x[x_at + ch]) * wt[w_at + ch]
        _requantize_row(acc, acc_at, cols, out, ((image * oh + y) * ow + ox) * c, c, ip[_DLO], ip[_DHI])


class Depthwise16:
    """``bind(x [N, H, W, C] int16, out [N, OH, OW, C] int16) -> call`` for a multiplier-1
    int16 depthwise conv with the constant int8 ``w`` [KH, KW, C], int64 ``bias`` (or
    None), the node's "tflite16" ``requant`` and ``geometry`` (sh, sw, dh, dw, pt, pl)."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, requant: dict, geometry: tuple[int, ...]) -> None:
        self.kh, self.kw, self.c = w.shape
        self.weights = np.ascontiguousarray(w.reshape(self.kh * self.kw, self.c), np.int32)
        self.cols = _columns(self.c, bias, requant)[:, :self.c].copy()
        self.geometry = tuple(int(g) for g in geometry)
        self.bounds = (int(requant["lo"]), int(requant["hi"]))

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays (shapes checked: the task trusts them)."""
        n, h, w, c = x.shape
        on, oh, ow, oc = out.shape
        if x.dtype != I16 or out.dtype != I16 or c != self.c or oc != c or on != n:
            raise ValueError(f"int16 depthwise over {self.c} channels given {x.shape} {x.dtype} -> "
                             f"{out.shape} {out.dtype}")
        params = np.array([h, w, c, oh, ow, self.kh, self.kw, *self.geometry, *self.bounds], np.int64)
        scratch = np.empty(n * oh * c, np.int32)
        return bind_task(_depthwise16_task, n * oh, (x, self.weights, self.cols), (out, scratch), params,
                         dtypes=(I16, np.int32, np.int64, I16, np.int32))


@kernel("DEPTHWISE_CONV_2D", quantized=True)
def int16_depthwise(ctx: NodeContext):
    """A depth-multiplier-1 int16 depthwise conv by :class:`Depthwise16`."""
    found = _product_constants(ctx)
    if found is None or found[0].ndim != 4 or found[2]["style"] != "tflite16":
        return None
    w, bias, requant = found
    _, h, wd, c = ctx.inputs[0].shape
    _, kh, kw, o = w.shape
    if o != c or kh * kw >= 512:
        return None                     # a depth multiplier, or sums past int32: the reference
    conv = Depthwise16(w.reshape(kh, kw, c), bias, requant, window_geometry(ctx.attrs, h, wd, kh, kw))
    return named(bindable(lambda inputs, outputs: conv.bind(inputs[0], outputs[0])), f"int16 depthwise {kh}x{kw}")


# -- MEAN ---------------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _mean16_loop(x, out, acc, multiplier, shift, zp, lo, hi):   # pragma: no cover - compiled
    """``x`` [outer, count, inner] -> ``out`` [outer, inner]: int64 sums (``acc``: inner of
    them) times TFLite's double-rounding multiplier, plus the zero point, clamped."""
    for o in range(x.shape[0]):
        acc[:] = 0
        for r in range(x.shape[1]):
            for i in range(x.shape[2]):
                acc[i] += np.int64(x[o, r, i])
        for i in range(x.shape[2]):
            out[o, i] = _clamp(_multiply(acc[i], multiplier, shift) + zp, lo, hi)


@kernel("MEAN", quantized=True)
def int16_mean(ctx: NodeContext):
    """int16 MEAN over constant, adjacent axes (a global average pool) in TFLite's
    arithmetic (:func:`_mean16_loop`); None (the reference) otherwise."""
    m, axes_spec, x = ctx.attrs.get("mean"), ctx.inputs[1], ctx.inputs[0]
    if m is None or "tflite" not in m or axes_spec.value is None or np.dtype(x.dtype) != I16:
        return None
    axes = sorted(set(reduction_axes(np.asarray(axes_spec.value), len(x.shape))))
    if not one_run(axes):
        return None
    shape = tuple(x.shape)
    outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
    count = int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64))
    inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
    if count == 0:
        return None
    args = (*tflite_mean16_multiplier(count, *m["tflite"]), m["zp"], m["qmin"], m["qmax"])
    acc = np.empty(inner, np.int64)

    def bind(inputs, outputs):
        xs, out = inputs[0].reshape(outer, count, inner), outputs[0].reshape(outer, inner)
        return lambda: _mean16_loop(xs, out, acc, *(np.int64(a) for a in args))
    return named(bindable(bind), "int16 mean")


# -- QUANTIZE float32 -> int16, SOFTMAX -----------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _quantize16_loop(x, out, inv, zp, lo, hi):   # pragma: no cover - compiled
    """``x * inv`` rounded to nearest even, converted to int32 and offset by the zero point
    in int32 as TFLite's int16 QUANTIZE does (on x86 a value past int32's range, or NaN,
    converts to INT32_MIN: the kernel then saturates it low, measured), clamped."""
    for i in range(x.size):
        v = np.rint(x[i] * inv)
        q = np.int32(v) if np.float32(-2.0 ** 31) <= v < np.float32(2.0 ** 31) else np.int32(-2 ** 31)
        out[i] = min(max(np.int32(q + zp), lo), hi)     # (the int32 sum wraps, as in C++)


@kernel("QUANTIZE", quantized=True)
def int16_quantize_float(ctx: NodeContext):
    """QUANTIZE of float32 to int16 per tensor (:func:`_quantize16_loop`)."""
    out = ctx.attrs.get("out")
    if np.dtype(ctx.inputs[0].dtype) != np.float32 or out is None or not out.per_tensor or out.dtype != I16:
        return None
    args = (np.float32(1.0) / np.float32(out.scale), np.int32(out.zero_point), np.int32(out.qmin),
            np.int32(out.qmax))

    def bind(inputs, outputs):
        x, y = inputs[0].reshape(-1), outputs[0].reshape(-1)
        return lambda: _quantize16_loop(x, y, *args)
    return named(bindable(bind), "int16 quantize")


def _softmax16_tables(p: dict) -> tuple[np.ndarray, np.ndarray]:
    """The two steps of TFLite's int16 SOFTMAX (:func:`litegpu.ops.quantized_act._softmax16`)
    that depend on one 16-bit value, as 65536-entry tables of the reference's own
    functions: the exp of the distance ``d`` to the row's maximum (0 .. 65535: rescaled by
    the multiplier, looked up in the exp table), and the reciprocal of a normalized sum
    (its 16 bits below the leading one, -32768 .. 32767, looked up in the 1 / (1 + x) one)."""
    distance = -np.arange(65536, dtype=np.int64)
    scaled = multiply_by_quantized_multiplier(distance, p["multiplier"], p["shift"])
    exp = lut16_lookup(np.clip(scaled + 32767, -32768, 32767), p["exp_lut"])
    recip = lut16_lookup(np.arange(-32768, 32768, dtype=np.int64), p["recip_lut"])
    return np.ascontiguousarray(exp, np.int64), np.ascontiguousarray(recip, np.int64)


@njit(cache=True, nogil=True)
def _softmax16_loop(x, out, e, exp, recip):   # pragma: no cover - compiled
    """Rows of ``x`` [rows, n] -> ``out`` as TFLite's ``SoftmaxInt16``: each value's exp
    from its distance to the row's maximum (``exp``), their int64 sum normalized to its
    leading bit (``headroom``), its reciprocal (``recip``), each exp times it, rounded and
    shifted back, clamped to [0, 32767]. ``e``: n int64 of scratch."""
    for r in range(x.shape[0]):
        top = np.int64(x[r, 0])
        for j in range(1, x.shape[1]):
            top = max(top, np.int64(x[r, j]))
        total = np.int64(0)
        for j in range(x.shape[1]):
            e[j] = exp[top - np.int64(x[r, j])]
            total += e[j]
        bits = np.int64(0)
        while (max(total, 1) >> bits) > 1:
            bits += 1
        headroom = 31 - bits            # (32 less the sum's bit length: TFLite's headroom plus one)
        shifted = ((total << (headroom - 1)) + (1 << 13)) >> 14
        factor = recip[min(max(shifted - (1 << 15) - (1 << 16), -32768), 32767) + 32768]
        right = 31 - headroom
        half = (np.int64(1) << (right - 1)) if right > 0 else np.int64(0)
        for j in range(x.shape[1]):
            out[r, j] = _clamp((e[j] * factor + half) >> right, 0, 32767)


@kernel("SOFTMAX", quantized=True)
def int16_softmax(ctx: NodeContext):
    """int16 SOFTMAX over the last axis (:func:`_softmax16_loop`), rows shorter than 65536
    (the int32 sums of TFLite's kernel)."""
    p = ctx.attrs.get("softmax16")
    x = ctx.inputs[0]
    if p is None or np.dtype(x.dtype) != I16 or not 0 < x.shape[-1] < 1 << 16:
        return None
    n = int(x.shape[-1])
    rows = int(np.prod(x.shape, dtype=np.int64)) // n
    exp, recip = _softmax16_tables(p)
    e = np.empty(n, np.int64)

    def bind(inputs, outputs):
        xs, ys = inputs[0].reshape(rows, n), outputs[0].reshape(rows, n)
        return lambda: _softmax16_loop(xs, ys, e, exp, recip)
    return named(bindable(bind), "int16 softmax")
