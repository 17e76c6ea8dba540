"""Integer kernels for quantized int8 CONV_2D, DEPTHWISE_CONV_2D and FULLY_CONNECTED.

They run LiteRT's XNNPACK arithmetic, the same the ops' integer references compute
(:mod:`litegpu.ops.quantized`): the node's ``attrs["requant"]`` holds the input's zero
point, the float32 scale per output channel and the output's zero point and clamp range.
The products go through :mod:`.qgemm` (a convolution other than 1x1 after an int8 im2col
whose padding holds the input's zero point, so it adds nothing), the depthwise convs
through :mod:`.qdepthwise`. A node they cannot take (weights or bias computed at run
time, grouped convs, depth multipliers, other dtypes) gets ``None``, and with it the
integer reference.
"""
from __future__ import annotations

from functools import partial

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext

from ..jit import intrinsic, njit, types
from .common import optional_input, window_geometry
from .packed import splat_vector
from .qd8gemm import hybrid_fully_connected
from .qdepthwise import QuantizedDepthwise
from .qgemm import QuantizedMatmul
from .registry import bindable, in_order, kernel, named
from .threads import current as current_threads
from .tasks import bind_task, in_sequence, int32_pointer, int8_pointer, task_function

I8 = np.dtype(np.int8)


def _constants(ctx: NodeContext) -> tuple[np.ndarray, np.ndarray | None, dict] | None:
    """The node's int8 weights, int32 bias (None when omitted) and requantization, or None
    when they are not all known constants of those types on an int8 input and output."""
    requant = ctx.attrs.get("requant")
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, 2)
    if requant is None or w_spec.value is None or np.dtype(w_spec.dtype) != I8 \
            or np.dtype(ctx.inputs[0].dtype) != I8 or np.dtype(ctx.outputs[0].dtype) != I8:
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) != np.int32):
        return None
    bias = None if bias_spec is None else np.asarray(bias_spec.value, np.int32).reshape(-1)
    return np.asarray(w_spec.value, np.int8), bias, requant


def _product(w_kn: np.ndarray, bias, requant: dict) -> QuantizedMatmul:
    return QuantizedMatmul(w_kn, bias, requant["x_zp"], requant["scale"], requant["zp"], requant["lo"],
                           requant["hi"], current_threads())


def _rows4(k: int) -> int:
    """K rounded up to the four bytes a ``vpdpbusd`` step reads."""
    return -(-k // 4) * 4


@kernel("FULLY_CONNECTED", quantized=True)
def quantized_fully_connected(ctx: NodeContext):
    """``out = requantize((x - zx) @ W^T + bias)`` by :mod:`.qgemm`; x's rows copied into
    rows of a multiple of four bytes first when K is not one. A hybrid node (float
    activations, int8 weights) goes to :func:`.qd8gemm.hybrid_fully_connected`."""
    if ctx.attrs.get("hybrid"):
        return hybrid_fully_connected(ctx)
    found = _constants(ctx)
    if found is None or found[0].ndim != 2:
        return None
    w, bias, requant = found
    o, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    product = _product(np.ascontiguousarray(w.T), bias, requant)
    k4 = _rows4(k)
    padded = None if k4 == k else np.zeros((m, k4), np.int8)

    def bind(inputs, outputs):
        x2, out2 = inputs[0].reshape(m, k), outputs[0].reshape(m, o)
        if padded is None:
            return product.bind(x2, out2)
        return in_order([partial(np.copyto, padded[:, :k], x2), product.bind(padded, out2)])
    return named(bindable(bind), "int8 packed GEMM" + ("" if padded is None else " (rows padded to 4 bytes)"))


_BYTE = ir.IntType(8)
_I64 = ir.IntType(64)


def _in_moves(builder, count, move) -> None:
    """Emit ``move(offset, width)`` calls covering bytes ``0 .. count`` (an i64): moves of 32
    bytes, the last one ending at ``count`` (it may overlap the one before: the same bytes
    again); fewer than 32 bytes in two moves of the widest power of two that fits (one
    from the start, one ending at ``count``).

    Each offset is the smaller of the next one and the last one, which LLVM cannot reduce
    to a stride: a loop of moves at a constant stride, vector or not, becomes one call of
    memcpy (or memset), which costs more than a short run's few moves."""
    def moves(width: int) -> None:
        last = builder.sub(count, ir.Constant(_I64, width))
        head = builder.block
        loop = builder.append_basic_block(f"run{width}")
        done = builder.append_basic_block(f"run{width}.done")
        builder.branch(loop)
        builder.position_at_end(loop)
        at = builder.phi(_I64)
        at.add_incoming(ir.Constant(_I64, 0), head)
        move(at, width)
        following = builder.add(at, ir.Constant(_I64, width))
        at.add_incoming(builder.select(builder.icmp_signed("<", following, last), following, last), loop)
        builder.cbranch(builder.icmp_signed("<", at, last), loop, done)
        builder.position_at_end(done)

    def pair(width: int) -> None:       # width <= count <= 2 * width: two moves, maybe overlapping
        move(ir.Constant(_I64, 0), width)
        move(builder.sub(count, ir.Constant(_I64, width)), width)

    def by_size(widths: list) -> None:
        width = widths[0]
        if width == 1:
            with builder.if_then(builder.icmp_signed(">", count, ir.Constant(_I64, 0))):
                move(ir.Constant(_I64, 0), 1)
            return
        with builder.if_else(builder.icmp_signed(">=", count, ir.Constant(_I64, width))) as (enough, fewer):
            with enough:
                moves(width) if width == 32 else pair(width)
            with fewer:
                by_size(widths[1:])
    by_size([32, 16, 8, 4, 2, 1])


def _bytes_at(builder, pointer, offset, width: int):
    """``pointer + offset`` as a pointer to ``width`` bytes (one vector, or one byte)."""
    kind = ir.VectorType(_BYTE, width) if width > 1 else _BYTE
    return builder.bitcast(builder.gep(pointer, [offset]), kind.as_pointer())


@intrinsic
def _copy_run(typingctx, dst, dst_at, src, src_at, count):
    """Copy ``count`` bytes from ``src + src_at`` to ``dst + dst_at`` (not overlapping) in
    unaligned vector moves, inline: an im2col's runs are short (a window row of 4 to a few
    hundred bytes), and LLVM makes a byte loop one call of memcpy per run. Measured on
    one Zen 4 core: a 7x7 conv over 134x134x3 (runs of 21 bytes) 73 -> 33 us, DS-CNN's
    10x4 conv over one channel (runs of 4) 30 -> 24 us, a 3x3 conv over 32x32x64 (runs of
    192, as fast as a memcpy of its 590 KB either way) 15 -> 14 us."""
    def codegen(context, builder, signature, args):
        d_, da, s_, sa, n = args
        d, s = builder.gep(d_, [da]), builder.gep(s_, [sa])

        def move(offset, width):
            builder.store(builder.load(_bytes_at(builder, s, offset, width), align=1),
                          _bytes_at(builder, d, offset, width), align=1)
        _in_moves(builder, n, move)
        return context.get_dummy_value()
    return types.void(dst, types.int64, src, types.int64, types.int64), codegen


@intrinsic
def _fill_run(typingctx, dst, dst_at, value, count):
    """Set ``count`` bytes from ``dst + dst_at`` to the int8 ``value``, inline as
    :func:`_copy_run`."""
    def codegen(context, builder, signature, args):
        d_, da, v, n = args
        d = builder.gep(d_, [da])

        def move(offset, width):
            fill = v if width == 1 else splat_vector(builder, v, ir.VectorType(_BYTE, width))
            builder.store(fill, _bytes_at(builder, d, offset, width), align=1)
        _in_moves(builder, n, move)
        return context.get_dummy_value()
    return types.void(dst, types.int64, types.int8, types.int64), codegen


@njit(cache=True, inline="always")
def _window_bytes(x, cols, at, image, iy0, ix0, h, w, c, kh, kw, dh, dw, zx):
    """The KH x KW x C input values of the window with corner (iy0, ix0) from ``cols[at]``
    on, the input's zero point where the window leaves the image."""
    for ky in range(kh):
        iy = iy0 + ky * dh
        for kx in range(kw):
            ix = ix0 + kx * dw
            if 0 <= iy < h and 0 <= ix < w:
                _copy_run(cols, at, x, ((image * h + iy) * w + ix) * c, c)
            else:
                _fill_run(cols, at, zx, c)
            at += c


@task_function()
def _im2col_task(t, xp, padp, colsp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """The im2col rows of output row ``t`` (image ``t // OH``): for each output pixel, the
    KH x KW x C input values under the filter, the image's zero point where the window
    leaves the image, then zeros up to the row length K4. The zero point is read from
    int32 ``pad`` as a product's correction factor ``128 + zp``, at ``pad[image * step]``:
    a hybrid conv quantizes each image with its own zero point and keeps the factor per
    product row (step: OH * OW); an int8 conv passes its one (step 0). ``ip``: H, W, C,
    OH, OW, KH, KW, SH, SW, DH, DW, PT, PL, step, K4."""
    h, w, c, oh, ow, kh, kw = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6]
    sh, sw, dh, dw, pt, pl, step, k4 = ip[7], ip[8], ip[9], ip[10], ip[11], ip[12], ip[13], ip[14]
    image = t // oh
    zx = np.int8(int32_pointer(padp)[image * step] - 128)
    x, cols = int8_pointer(xp), int8_pointer(colsp)
    y = t % oh
    iy0 = y * sh - pt
    for ox in range(ow):
        _fill_run(cols, (t * ow + ox) * k4 + kh * kw * c, np.int8(0), k4 - kh * kw * c)
    # Pixels ox0 .. ox1 of a row whose windows lie inside the image, with undilated
    # columns: each window row is one contiguous run of KW x C bytes (the tight loop).
    ox0, ox1 = ow, ow
    if dw == 1 and iy0 >= 0 and iy0 + (kh - 1) * dh < h:
        ox0 = min(ow, (pl + sw - 1) // sw)
        ox1 = max(ox0, min(ow, (w - kw + pl) // sw + 1))
    run = kw * c
    for ox in range(ox0, ox1):
        at = (t * ow + ox) * k4
        for ky in range(kh):
            _copy_run(cols, at, x, ((image * h + iy0 + ky * dh) * w + ox * sw - pl) * c, run)
            at += run
    for ox in range(ow):
        if ox0 <= ox < ox1:
            continue
        _window_bytes(x, cols, (t * ow + ox) * k4, image, iy0, ox * sw - pl, h, w, c, kh, kw, dh, dw, zx)


class Im2col:
    """``bind(x, pad, step, cols) -> call`` writing the int8 im2col of x [N, H, W, C] for a
    KH x KW filter with ``geometry`` (sh, sw, dh, dw, pt, pl) and output OH x OW into
    ``cols`` [N * OH * OW, K4] (:func:`_im2col_task`: the padding read from ``pad`` every
    ``step`` product rows)."""

    def __init__(self, x_shape: tuple[int, ...], kernel_hw: tuple[int, int], geometry: tuple[int, ...], oh: int,
                 ow: int) -> None:
        self.n, h, w, c = x_shape
        kh, kw = kernel_hw
        self.k4, self.oh = _rows4(kh * kw * c), oh
        self.shape = (self.n * oh * ow, self.k4)
        self.params = [h, w, c, oh, ow, kh, kw, *geometry]

    def bind(self, x: np.ndarray, pad: np.ndarray, step: int, cols: np.ndarray):
        """The call on these arrays (sizes checked: the task trusts them)."""
        elements = self.n * int(np.prod(self.params[:3]))
        if cols.shape != self.shape or x.size != elements or pad.size < (self.n - 1) * step + 1:
            raise ValueError(f"im2col into {self.shape} given {x.shape} (padding {pad.shape}, step {step}) "
                             f"-> {cols.shape}")
        params = np.array([*self.params, step, self.k4], np.int64)
        return bind_task(_im2col_task, self.n * self.oh, (x, pad), (cols,), params, dtypes=(I8, np.int32, I8))


@kernel("CONV_2D", quantized=True)
def quantized_conv(ctx: NodeContext):
    """A 1x1 stride-1 conv as one :mod:`.qgemm` product over the pixels; any other
    ungrouped conv as an int8 im2col, then the product."""
    found = _constants(ctx)
    if found is None or found[0].ndim != 4:
        return None
    w, bias, requant = found
    n, h, wd, c = ctx.inputs[0].shape
    o, kh, kw, ci = w.shape
    _, oh, ow, _ = ctx.outputs[0].shape
    if ci != c:
        return None                     # grouped: the reference
    sh, sw, dh, dw, pt, pl = window_geometry(ctx.attrs, h, wd, kh, kw)
    k = kh * kw * c
    product = _product(np.ascontiguousarray(w.reshape(o, k).T), bias, requant)
    m = n * oh * ow
    pointwise = (kh, kw, sh, sw, pt, pl) == (1, 1, 1, 1, 0, 0) and (oh, ow) == (h, wd) and c % 4 == 0
    if pointwise:
        return named(bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, c), outputs[0].reshape(m, o))),
                     "int8 packed GEMM over the pixels (1x1)")
    cols = np.empty((m, _rows4(k)), np.int8)
    im2col = Im2col((n, h, wd, c), (kh, kw), (sh, sw, dh, dw, pt, pl), oh, ow)
    pad = np.array([128 + requant["x_zp"]], np.int32)

    def bind(inputs, outputs):
        return in_sequence([im2col.bind(inputs[0], pad, 0, cols), product.bind(cols, outputs[0].reshape(m, o))])
    return named(bindable(bind), f"int8 im2col ({kh}x{kw}/{sh}) + packed GEMM")


@kernel("DEPTHWISE_CONV_2D", quantized=True)
def quantized_depthwise(ctx: NodeContext):
    """A depth-multiplier-1 int8 depthwise conv by :mod:`.qdepthwise`."""
    found = _constants(ctx)
    if found is None or found[0].ndim != 4:
        return None
    w, bias, requant = found
    _, h, wd, c = ctx.inputs[0].shape
    _, kh, kw, o = w.shape
    if o != c:
        return None                     # a depth multiplier: the reference
    geometry = window_geometry(ctx.attrs, h, wd, kh, kw)
    conv = QuantizedDepthwise(w.reshape(kh, kw, c), bias, requant["x_zp"], requant["scale"], requant["zp"],
                              requant["lo"], requant["hi"], geometry)
    return named(bindable(lambda inputs, outputs: conv.bind(inputs[0], outputs[0])), f"int8 depthwise {kh}x{kw}")
