"""Integer kernels for quantized element-wise ops on int8 / uint8.

- ADD and SUB in XNNPACK's arithmetic as the integer reference in
  :mod:`litegpu.ops.quantized` computes it, from the node's ``attrs["add"]``.
- MUL of 8-bit operands: XNNPACK's float32 requantization of the product of the two
  zero-point-free values.
- Both: operands of the same shape, or one repeating along the leading axes (a bias, a
  squeeze-and-excite scale ``[N, H, W, C] x [1, 1, 1, C]``, a GRU's ``1 - z``), as one
  flat loop; any other broadcast up to rank 4 (a layer norm's per-row statistics) as
  nested loops over broadcast views.
- One-input ops (HARD_SWISH, LOGISTIC, TANH, QUANTIZE, DEQUANTIZE ...): an 8-bit input
  has 256 values, so the op is a table of its own integer reference evaluated on each
  of them at compile time (what XNNPACK does for its lookup-table ops), then one gather.
- CONCATENATION (int16 too) whose inputs may have other scales: copied, or requantized as
  TFLite does.
- QUANTIZE of float32 to int8/uint8 per tensor: ``x * (1 / scale)`` rounded to nearest
  even, as XNNPACK.
"""
from __future__ import annotations

from dataclasses import replace
from functools import partial

import numpy as np
from llvmlite import binding, ir

from litegpu.backend import NodeContext

from ..jit import cgutils, intrinsic, njit, types
from .registry import bindable, in_order, is_quantized_node, kernel, named, one_input_reference
from .tasks import bind_task, int8_pointer, int32_pointer, task_function, uint8_pointer


@intrinsic
def _add_requantize32(typingctx, a, b, am, bm, bias, shift, zp, lo, hi):
    """XNNPACK's ADD of two widened 8-bit values, all in int32 (numba would widen each step
    to int64, and the loop would vectorize in lanes half as wide):
    ``clamp(((bias + a * am + b * bm) >> shift) + zp, lo, hi)``. The sum always fits
    (|bias| < 2^31 - 2^30 and each product < 2^29, as in XNNPACK's own int32)."""
    def codegen(context, builder, signature, args):
        a_, b_, am_, bm_, bias_, shift_, zp_, lo_, hi_ = args
        acc = builder.add(builder.add(bias_, builder.mul(a_, am_)), builder.mul(b_, bm_))
        v = builder.add(builder.ashr(acc, shift_), zp_)
        v = builder.select(builder.icmp_signed(">", v, lo_), v, lo_)
        return builder.select(builder.icmp_signed("<", v, hi_), v, hi_)
    return types.int32(*[types.int32] * 9), codegen


@njit(cache=True, inline="always")
def _add_span(a, b, out, i, j, n, am, bm, bias, shift, zp, lo, hi):   # pragma: no cover - compiled
    """``n`` outputs from ``i`` of XNNPACK's ADD (:func:`_add_requantize32`), ``b`` read
    from ``j``."""
    for k in range(n):
        out[i + k] = _add_requantize32(np.int32(a[i + k]), np.int32(b[j + k]), am, bm, bias, shift, zp, lo, hi)


@njit(cache=True, inline="always")
def _mul_span(a, b, out, i, j, n, za, zb, scale, zp, lo, hi):   # pragma: no cover - compiled
    """``n`` outputs from ``i`` of XNNPACK's MUL, ``b`` read from ``j``: the product of the
    zero-point-free values times the float32 scale, clamped (``lo``/``hi`` less the zero
    point) and rounded to nearest even, plus the zero point. The product is taken in
    float32, where it is exact (|product| <= 255^2 < 2^24) and vectorizes in 32-bit lanes;
    the zero points are float32 too."""
    for k in range(n):
        value = (np.float32(a[i + k]) - za) * (np.float32(b[j + k]) - zb) * scale
        value = value if value > lo else lo
        value = value if value < hi else hi
        out[i + k] = np.int32(np.rint(value) + zp)      # (rounded first: ties go to even)


@njit(cache=True, inline="always")
def _spans(t, ip):   # pragma: no cover - compiled
    """Task ``t``'s share of a flat binary op (``ip``: size, b's period, elements per task):
    its first output, b's index there, its end."""
    size, period, chunk = ip[0], ip[1], ip[2]
    start = t * chunk
    return start, start % period, min(size, start + chunk)


@task_function()
def _add_task(t, ap, bp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of an 8-bit ADD/SUB over flat operands, ``b`` repeating every ``ip[1]``
    elements (``ip``: size, period, chunk, unsigned, a's and b's multipliers, bias,
    shift, zero point, lo, hi)."""
    i, j, end = _spans(t, ip)
    am, bm, bias, shift = np.int32(ip[4]), np.int32(ip[5]), np.int32(ip[6]), np.int32(ip[7])
    zp, lo, hi = np.int32(ip[8]), np.int32(ip[9]), np.int32(ip[10])
    while i < end:
        n = min(ip[1] - j, end - i)
        if ip[3]:
            _add_span(uint8_pointer(ap), uint8_pointer(bp), uint8_pointer(outp), i, j, n, am, bm, bias, shift,
                      zp, lo, hi)
        else:
            _add_span(int8_pointer(ap), int8_pointer(bp), int8_pointer(outp), i, j, n, am, bm, bias, shift,
                      zp, lo, hi)
        i, j = i + n, 0


@task_function()
def _mul_task(t, ap, bp, outp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of an 8-bit MUL over flat operands, ``b`` repeating every ``ip[1]``
    elements (``ip``: size, period, chunk, unsigned, a's and b's zero points, the output's
    zero point; ``fp``: scale, lo and hi less the zero point)."""
    i, j, end = _spans(t, ip)
    za, zb, zp = np.float32(ip[4]), np.float32(ip[5]), np.float32(ip[6])
    scale, lo, hi = fp[0], fp[1], fp[2]
    while i < end:
        n = min(ip[1] - j, end - i)
        if ip[3]:
            _mul_span(uint8_pointer(ap), uint8_pointer(bp), uint8_pointer(outp), i, j, n, za, zb, scale, zp,
                      lo, hi)
        else:
            _mul_span(int8_pointer(ap), int8_pointer(bp), int8_pointer(outp), i, j, n, za, zb, scale, zp,
                      lo, hi)
        i, j = i + n, 0


# Outputs from which a flat binary op is cut into tasks the threads share.
_PARALLEL_SIZE = 1 << 15
_TASKS = 8


@kernel("ADD", "SUB", quantized=True)
def quantized_add(ctx: NodeContext):
    """``out = clamp(((bias + a * ma + b * mb) >> shift) + zp)`` element by element."""
    p = ctx.attrs.get("add")
    if p is None:
        return None
    return _binary(ctx, (p.a_multiplier, p.b_multiplier),
                   (p.bias, p.shift, ctx.attrs["zp"], ctx.attrs["lo"], ctx.attrs["hi"]), (), _add_task,
                   _add_broadcast, "add")


def _binary(ctx: NodeContext, per_operand: tuple, ints: tuple, floats: tuple, task, broadcast, what: str):
    """The kernel of an 8-bit binary node (see the module docstring): ``task`` over flat
    operands when they are the same shape or one repeats along the leading axes, the
    full-shaped operand first, else ``broadcast`` over 4-D views (None past rank 4, and
    for other dtypes: the reference). Both get the operands' own ``per_operand`` values
    (a's, b's) in the order the operands go, then the op's ``ints`` and ``floats``: the
    formulas are symmetric in (operand, value) pairs."""
    dtype = np.dtype(ctx.outputs[0].dtype)
    if dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) or any(np.dtype(s.dtype) != dtype for s in ctx.inputs[:2]):
        return None
    big = _full_operand(ctx)
    if big is None and len(ctx.outputs[0].shape) > 4:
        return None
    first = big or 0
    pair = (per_operand[first], per_operand[1 - first])
    if big is None:
        args = (*(np.int32(v) for v in (*pair, *ints)), *(np.float32(v) for v in floats))
        return named(bindable(lambda inputs, outputs: partial(broadcast, *_views4(inputs[:2], outputs[0]), *args)),
                     f"int8 {what} (broadcast)")
    size = int(np.prod(ctx.outputs[0].shape, dtype=np.int64))
    period = max(1, int(np.prod(ctx.inputs[1 - big].shape, dtype=np.int64)))
    chunk = -(-size // _TASKS) if size >= _PARALLEL_SIZE else max(size, 1)
    params = np.array([size, period, chunk, dtype == np.dtype(np.uint8), *pair, *ints], np.int64)
    fp = np.array(floats or (0,), np.float32)

    def bind(inputs, outputs):
        return bind_task(task, -(-size // chunk), (inputs[big], inputs[1 - big]), (outputs[0],), params, fp,
                         dtypes=(dtype,) * 3)
    return named(bindable(bind), f"int8 {what} task")


def _full_operand(ctx: NodeContext) -> int | None:
    """The operand of the output's shape when the other one repeats along the leading axes
    (a flat loop serves); None for another broadcast."""
    out_shape = tuple(ctx.outputs[0].shape)
    shapes = [tuple(s.shape) for s in ctx.inputs[:2]]
    full = [i for i, shape in enumerate(shapes) if shape == out_shape]
    if not full or not _repeats_along_leading_axes(shapes[1 - full[0]], out_shape):
        return None
    return full[0]


def _views4(inputs: list, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The operands as views broadcast to the output's shape and the output, all with their
    rank padded to 4 (a repeated axis has stride 0: nothing is copied)."""
    shape4 = (1,) * (4 - out.ndim) + out.shape
    views = [np.broadcast_to(x.reshape((1,) * (4 - x.ndim) + x.shape), shape4) for x in inputs]
    return views[0], views[1], out.reshape(shape4)


@njit(cache=True, nogil=True)
def _add_broadcast(a, b, out, am, bm, bias, shift, zp, lo, hi):   # pragma: no cover - compiled
    """:func:`_add_span` over 4-D views of any broadcast (see :func:`_views4`)."""
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            for k in range(out.shape[2]):
                for m in range(out.shape[3]):
                    out[i, j, k, m] = _add_requantize32(np.int32(a[i, j, k, m]), np.int32(b[i, j, k, m]), am, bm,
                                                        bias, shift, zp, lo, hi)


@njit(cache=True, nogil=True)
def _mul_broadcast(a, b, out, za, zb, zp, scale, lo, hi):   # pragma: no cover - compiled
    """:func:`_mul_span` over 4-D views of any broadcast (see :func:`_views4`)."""
    za, zb = np.float32(za), np.float32(zb)      # (int32 - float32 would be float64)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            for k in range(out.shape[2]):
                for m in range(out.shape[3]):
                    value = (np.float32(a[i, j, k, m]) - za) * (np.float32(b[i, j, k, m]) - zb) * scale
                    value = value if value > lo else lo
                    value = value if value < hi else hi
                    out[i, j, k, m] = np.int32(np.rint(value)) + zp


def _repeats_along_leading_axes(small: tuple, full: tuple) -> bool:
    """True when ``small`` broadcast to ``full`` is itself repeated whole: its shape is
    1s and then ``full``'s trailing dims."""
    small = (1,) * (len(full) - len(small)) + tuple(small)
    lead = 0
    while lead < len(full) and small[lead] == 1 and small[lead:] != full[lead:]:
        lead += 1
    return small[lead:] == full[lead:]


@kernel("MUL", quantized=True)
def quantized_mul(ctx: NodeContext):
    """8-bit MUL in XNNPACK's arithmetic (see :func:`_mul_span`); int16 keeps the reference."""
    r = ctx.attrs.get("requant")
    if r is None or "scale" not in r:
        return None
    return _binary(ctx, (r["a_zp"], r["b_zp"]), (r["zp"],), (r["scale"], r["lo"] - r["zp"], r["hi"] - r["zp"]),
                   _mul_task, _mul_broadcast, "mul")


@task_function()
def _quantize_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """float32 ``x`` -> 8-bit ``out`` (int8, or uint8 when ``ip[1]`` is 0), ``ip[0]``
    elements: ``clamp(rint(x * inv)) + zp``, NaN to the zero point as the reference;
    ``ip``: size, signed, zp; ``fp``: inv, lo, hi (the clamp relative to the zero point)."""
    size, signed, zp = ip[0], ip[1], np.int32(ip[2])
    inv, lo, hi = fp[0], fp[1], fp[2]
    signed_out, unsigned_out = int8_pointer(outp), uint8_pointer(outp)
    for i in range(size):
        v = np.rint(xp[i] * inv)
        if v != v:          # NaN: the zero point, as the reference
            v = np.float32(0)
        q = np.int32(min(max(v, lo), hi)) + zp
        if signed:
            signed_out[i] = np.int8(q)
        else:
            unsigned_out[i] = np.uint8(q)


def _quantize_float(ctx: NodeContext):
    """QUANTIZE float32 -> 8-bit per tensor (see the module docstring)."""
    out = ctx.attrs.get("out")
    if out is None or not out.per_tensor or np.dtype(out.dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    zp = int(out.zero_point)
    dtype = np.dtype(out.dtype)
    floats = np.array([np.float32(1.0) / np.float32(out.scale), out.qmin - zp, out.qmax - zp], np.float32)

    def bind(inputs, outputs):
        x, y = inputs[0].reshape(-1), outputs[0].reshape(-1)
        params = np.array([x.size, dtype == np.int8, zp], np.int64)
        return bind_task(_quantize_task, 1, (x,), (y,), params, floats, dtypes=(np.dtype(np.float32), dtype))
    return bindable(bind)


# Quantized ops whose 8-bit output depends on nothing but the input byte.
UNARY_8BIT = ("HARD_SWISH", "LOGISTIC", "TANH", "ELU", "GELU", "LEAKY_RELU", "RELU", "RELU6", "RELU_N1_TO_1",
              "RELU_0_TO_1", "QUANTIZE", "DEQUANTIZE")


@kernel(*UNARY_8BIT, quantized=True)
def quantized_unary_table(ctx: NodeContext):
    """A one-input op on int8/uint8 as a 256-entry table of its own integer reference,
    evaluated once at compile time on every input byte: exact by construction, one
    gather per run. With ``attrs["then"]`` (see :func:`folded_table`) the table holds
    the follower's result instead."""
    x = ctx.inputs[0]
    dtype = np.dtype(x.dtype)
    if ctx.node.op == "QUANTIZE" and dtype == np.dtype(np.float32):
        return _quantize_float(ctx)
    if len(ctx.inputs) != 1 or dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    params = ctx.attrs.get("in")
    if ctx.node.op == "DEQUANTIZE" and (params is None or not params.per_tensor):
        return None   # per-channel: the value depends on the position too
    table = np.ascontiguousarray(one_input_reference(ctx)(np.arange(256, dtype=np.uint8).view(dtype)))
    if table.shape != (256,) or table.dtype != np.dtype(ctx.outputs[0].dtype):
        return None
    size = int(np.prod(x.shape, dtype=np.int64))
    chunk = -(-size // _TASKS) if size >= _PARALLEL_SIZE else max(size, 1)
    params = np.array([size, chunk, table.dtype.itemsize == 4], np.int64)

    def bind(inputs, outputs):
        return bind_task(_LOOKUP, -(-size // chunk), (table, inputs[0]), (outputs[0],), params,
                         dtypes=(table.dtype, dtype, table.dtype))
    return named(bindable(bind), "8-bit lookup table task")


# AVX-512 VBMI: ``vpermi2b`` looks up 64 bytes at once in a 128-byte table.
VBMI = bool(binding.get_host_cpu_features().get("avx512vbmi", False))
_BYTES64 = ir.VectorType(ir.IntType(8), 64)


@intrinsic
def _lookup_bytes64(typingctx, tablep, xp, outp, at):
    """``out[at + i] = table[x[at + i]]`` for 64 bytes, by two ``vpermi2b`` (each the table's
    lower or upper 128 bytes, indexed by the low seven bits) and a select on the top bit:
    XNNPACK's x8 LUT kernel for AVX-512 VBMI. Only compiled where the host has it."""
    def codegen(context, builder, signature, args):
        table, x, out = (builder.bitcast(a, ir.IntType(8).as_pointer()) for a in args[:3])
        at = args[3]

        def block(pointer, offset):
            return builder.bitcast(builder.gep(pointer, [offset]), _BYTES64.as_pointer())

        quarters = [builder.load(block(table, ir.Constant(ir.IntType(64), 64 * k)), align=1) for k in range(4)]
        index = builder.load(block(x, at), align=1)
        permute = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_BYTES64, [_BYTES64] * 3),
                                                 "llvm.x86.avx512.vpermi2var.qi.512")
        low = builder.call(permute, [quarters[0], index, quarters[1]])
        high = builder.call(permute, [quarters[2], index, quarters[3]])
        upper = builder.icmp_signed("<", index, ir.Constant(_BYTES64, None))    # index >= 128
        builder.store(builder.select(upper, high, low), block(out, at), align=1)
        return context.get_dummy_value()
    return types.void(tablep, xp, outp, types.int64), codegen


@njit(cache=True, inline="always")
def _lookup_span(tablep, xp, outp, start, end, wide):   # pragma: no cover - compiled
    """``out[i] = table[x[i] as a byte]`` for ``start <= i < end``: 4-byte values (their bits
    copied, whatever the output dtype) with ``wide``, else bytes."""
    x = uint8_pointer(xp)
    if wide:
        table, out = int32_pointer(tablep), int32_pointer(outp)
        for i in range(start, end):
            out[i] = table[x[i]]
    else:
        narrow, narrow_out = uint8_pointer(tablep), uint8_pointer(outp)
        for i in range(start, end):
            narrow_out[i] = narrow[x[i]]


@task_function()
def _lookup_task(t, tablep, xp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Elements ``t * chunk ..`` of a table lookup (``ip``: size, chunk, whether the values
    are 4 bytes wide rather than 1)."""
    start = t * ip[1]
    _lookup_span(tablep, xp, outp, start, min(ip[0], start + ip[1]), ip[2])


@task_function(requires=("avx512vbmi",))
def _lookup_vbmi_task(t, tablep, xp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """:func:`_lookup_task` with byte values 64 at a time (:func:`_lookup_bytes64`)."""
    start = t * ip[1]
    end = min(ip[0], start + ip[1])
    whole = start + (end - start) // 64 * 64
    if not ip[2]:
        for at in range(start, whole, 64):
            _lookup_bytes64(tablep, xp, outp, at)
        start = whole
    _lookup_span(tablep, xp, outp, start, end, ip[2])


_LOOKUP = _lookup_vbmi_task if VBMI else _lookup_task


def folded_table(producer: NodeContext, follower: NodeContext) -> NodeContext | None:
    """``producer`` (a one-input table op on int8, uint8 or int16) computing ``follower``'s
    output too, when ``follower`` is an ADD, SUB or MUL of the producer's input and output
    of that type, same shapes (swish, ``x * LOGISTIC(x)``, as EfficientNet's int8 and 16x8
    converts write it): the pair's result depends on the input value alone, so it is one
    table (one pass instead of two, and exact: each entry is the two references applied
    in turn, :func:`.registry.one_input_reference`, which the reference kernel runs too).
    None otherwise. The caller checks that nothing else reads the producer's output."""
    node, then = producer.node, follower.node
    if not (is_quantized_node(producer) and is_quantized_node(follower)) or producer.dynamic or follower.dynamic \
            or node.op not in UNARY_8BIT or node.op in ("QUANTIZE", "DEQUANTIZE") or len(node.inputs) != 1 \
            or then.op not in ("ADD", "SUB", "MUL") or sorted(then.inputs) != sorted((node.inputs[0], node.outputs[0])):
        return None
    specs = (producer.inputs[0], producer.outputs[0], *follower.inputs, follower.outputs[0])
    dtypes = {None if s is None else np.dtype(s.dtype) for s in specs}
    if not (dtypes <= {np.dtype(np.int8), np.dtype(np.uint8)} or dtypes == {np.dtype(np.int16)}) \
            or len({tuple(s.shape) for s in specs}) != 1:
        return None
    return replace(producer, node=replace(node, outputs=tuple(then.outputs)),
                   attrs={**producer.attrs, "then": follower}, outputs=list(follower.outputs))


# -- CONCATENATION across scales --------------------------------------------------------------


@njit(cache=True, nogil=True)
def _concat_part(x, out, at, s, b, zp, lo, hi):   # pragma: no cover - compiled
    """``x`` [outer, n] into columns ``at`` .. ``at + n`` of ``out`` [outer, m] as
    ``round(x * s + b) + zp`` in float32, ties away from zero (TFLite's
    ConcatenationWithScaling), clamped."""
    for o in range(x.shape[0]):
        for j in range(x.shape[1]):
            v = np.float32(x[o, j]) * s + b
            q = np.int32(np.trunc(v + (np.float32(0.5) if v >= 0 else np.float32(-0.5)))) + zp
            out[o, at + j] = min(max(q, lo), hi)


@kernel("CONCATENATION", quantized=True)
def quantized_concatenation(ctx: NodeContext):
    """8-bit or int16 CONCATENATION whose inputs may carry other scales than the output (a
    DenseNet's or NASNet's joins), as the integer reference computes it."""
    rescale = ctx.attrs.get("rescale")
    out_spec = ctx.outputs[0]
    dtype, rank = np.dtype(out_spec.dtype), len(out_spec.shape)
    if rescale is None or dtype not in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)) or rank == 0:
        return None
    axis = int(ctx.attrs["axis"]) % rank
    outer = int(np.prod(out_spec.shape[:axis], dtype=np.int64))
    widths = [int(np.prod(s.shape[axis:], dtype=np.int64)) for s in ctx.inputs]
    info = np.iinfo(dtype)
    zp, lo, hi = np.int32(ctx.attrs["zp"]), np.int32(info.min), np.int32(info.max)
    parts = [(int(sum(widths[:k])), np.float32(r[0]) if r else np.float32(1), np.float32(r[1]) if r else np.float32(0),
              r is not None) for k, r in enumerate(rescale)]

    def bind(inputs, outputs):
        out = outputs[0].reshape(outer, -1)
        # A part on the output's quantization is a plain copy (numpy's, the fastest there is).
        calls = [partial(_concat_part, x.reshape(outer, w), out, at, s, b, zp, lo, hi) if scaled
                 else partial(np.copyto, out[:, at:at + w], x.reshape(outer, w))
                 for x, w, (at, s, b, scaled) in zip(inputs, widths, parts)]
        return in_order(calls)
    return named(bindable(bind), "int8 concatenation (requantizing)")
