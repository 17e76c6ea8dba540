"""Convolutions and matrix products: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
Convolution2DTransposeBias, FULLY_CONNECTED and BATCH_MATMUL.

Every kernel here has the same shape, the *output tile* (:func:`tile_kernel`): the
output is seen as ``[rows, pixels, channels]`` and one work-item computes ``vec``
consecutive output channels (a ``float16``, ``float8`` or ``float4``, see
:func:`channel_vector`) for ``P`` pixels of one row, with the ``P`` accumulators in
registers. Dimension 0 of the launch walks the channel groups (the fastest output
index in NHWC, so neighbouring work-items store neighbouring bytes), dimension 1 the
pixel blocks of a row and dimension 2 the rows.

The weights are repacked at compile time (:func:`pack_oc`) to ``[O/vec][K][vec]``, K
being the reduction (``kh, kw, i`` for a convolution): one vector load then gives the
output channels of a work-item, and the reduction walks the weights contiguously.
Output channels that are not a multiple of 4 take float4 tiles padded with zero
weights; the last tile computes the padding lanes and stores lane by lane, skipping them.

Inner products go through :func:`dot`, which reads the input four reduction steps at
a time (one ``LD4`` per pixel, shared by four weight vectors) when the input is
contiguous along the reduction. Windows that may leave the input (padding) take a
second, masked copy of the loop that only border tiles run (:func:`window_dot`).

Accumulation is in ``float``; outputs go through ``store_output``/``store_output4``
(a float4 at a time), so fused activations and folded elementwise followers apply.
"""
from __future__ import annotations

import numpy as np
from litegpu.ops.nn import conv_output_size, transpose_conv_padding

from ..nodegen import KernelSpec, NodeGen
from . import Decline, generator

_F32 = np.dtype(np.float32)


# -- shared helpers -----------------------------------------------------------------------

_QUARTERS = {4: [""], 8: [".lo", ".hi"], 16: [".s0123", ".s4567", ".s89ab", ".scdef"]}


def channel_vector(channels: int) -> int:
    """Output channels per work-item: 16, 8 or 4, the widest that divides ``channels``
    (4 when none does: the last group is then padded and stored lane by lane).

    Measured on PoCL (AVX-512): a 1x1 conv runs ~90 GFLOP/s with float4 tiles, ~145
    with float8 and ~280 with float16, per two cores' worth of CPU time.
    """
    return next((v for v in (16, 8) if channels % v == 0), 4)


def pack_oc(w: np.ndarray, vec: int) -> np.ndarray:
    """Weights ``[..., O, K]`` repacked to ``[..., ceil(O/vec), K, vec]``.

    Element ``[.., g, k, l]`` is ``w[.., vec*g + l, k]``: one vector load gives the
    ``vec`` output channels of a work-item at reduction step ``k``, and the reduction
    walks memory contiguously. The lanes past ``O`` are zero.
    """
    w = np.asarray(w, np.float32)
    *lead, o, k = w.shape
    groups = -(-o // vec)
    padded = np.zeros((*lead, groups * vec, k), np.float32)
    padded[..., :o, :] = w
    return np.ascontiguousarray(padded.reshape(*lead, groups, vec, k).swapaxes(-1, -2))


def pixels_per_item(pixels: int, most: int = 4) -> int:
    """How many pixels one work-item computes (the ``P`` of the tile), at most ``most``.

    Among ``most`` and the sizes down to half of it, the one wasting the fewest pixels
    at the end of a row is taken (e.g. 7 for rows of 14 with ``most`` 8). Measured on
    PoCL with float16 tiles: 4 pixels suit the reductions (1x1 and KxK convs, matmuls;
    8 is no faster, and slower for KxK), depthwise convs take 8 (see there).
    """
    if pixels <= most:
        return max(pixels, 1)
    candidates = range(most, most // 2, -1)
    return min(candidates, key=lambda p: (-(-pixels // p) * p - pixels, -p))


def _gather(g: NodeGen, ptr: str, indices: list[str]) -> str:
    """A ``float{n}`` of separately indexed elements (the lanes of a strided operand)."""
    return g.vector(f"float{len(indices)}", *(g.loadv(ptr, i, 1) for i in indices))


def _constant(g: NodeGen, pos: int, what: str) -> np.ndarray:
    """The value of constant input ``pos``; Decline when it is computed at run time."""
    spec = g.ctx.inputs[pos]
    if spec.value is None:
        raise Decline(f"{what} must be constant (it is repacked at compile time)")
    return np.asarray(spec.value, np.float32)


def _check_float(g: NodeGen, skip: int | None = None) -> None:
    """Decline unless every tensor of the node (but input ``skip``) is float32."""
    specs = [s for i, s in enumerate(g.ctx.inputs) if i != skip and s is not None] + list(g.ctx.outputs)
    if any(s.dtype != _F32 for s in specs):
        raise Decline(f"{g.ctx.node.op} on non-float32 tensors")


def _bias(g: NodeGen, pos: int, channels: int, vec: int) -> str | None:
    """A ``float{vec}`` expression of the bias of channel group ``oc``, or None without bias."""
    if pos >= len(g.ctx.inputs) or g.ctx.inputs[pos] is None:
        return None
    spec = g.ctx.inputs[pos]
    if spec.value is not None:
        padded = np.zeros(-(-channels // vec) * vec, np.float32)
        padded[:channels] = np.asarray(spec.value, np.float32).reshape(-1)
        return g.loadv(g.const(padded), f"oc * {vec}", vec)
    return _gather(g, g.input(pos), [f"min(oc * {vec} + {lane}, {channels - 1})" for lane in range(vec)])


def _indent(code: str, spaces: int) -> str:
    """``code`` with every non-empty line indented (the generated C stays readable)."""
    return "\n".join(" " * spaces + line if line else line for line in code.split("\n"))


def dot(g: NodeGen, pixels: int, n: int, x: str, xaddr: list[str], wload, vec: int, xstride: int = 1,
        masks: list[str] | None = None) -> str:
    """C statements adding ``sum_k x_p[k] * w[k]`` to ``acc{p}`` for ``p < pixels``.

    ``x_p[k]`` is element ``xaddr[p] + k * xstride`` of ``x``; ``wload(k)`` is the
    ``float{vec}`` of the output channels' weights at reduction step ``k`` (a C
    expression of ``k``); ``masks[p]`` (an int, false where pixel ``p``'s window
    leaves the image) selects 0 for its input there: a select, not a multiply by 0,
    which would turn an infinite neighbour read at the clamped address into NaN. With
    a contiguous input the loop takes four steps at a time: one ``LD4`` per pixel feeds
    four weight vectors.
    """
    lines = []
    step4 = n - n % 4 if xstride == 1 else 0
    if step4:
        lines.append(f"for (int k = 0; k < {step4}; k += 4) {{")
        lines.append(f"  const float{vec} " + ", ".join(f"w{j} = {wload(f'k + {j}')}" for j in range(4)) + ";")
        for p in range(pixels):
            v = g.loadv(x, f"{xaddr[p]} + k", 4)
            if masks:
                zero = g.vector("float4", "0.0f")
                v = f"({masks[p]} ? {v} : {zero})"
            lines.append(f"  {{ const float4 v = {v}; acc{p} += " + " + ".join(f"{g.lane('v', j, 4)} * w{j}" for j in range(4)) + "; }")
        lines.append("}")
    rest = n - step4
    if rest:
        # A short tail is unrolled (k a literal); a strided reduction loops one step at a time.
        ks = [str(step4 + j) for j in range(rest)] if rest <= 4 else ["k"]
        if rest > 4:
            lines.append(f"for (int k = {step4}; k < {n}; ++k) {{")
        for k in ks:
            lines.append(f"  {{ const float{vec} w = {wload(k)};")
            for p in range(pixels):
                xs = f"{k} * {xstride}" if xstride != 1 else k
                v = g.loadv(x, f"{xaddr[p]} + {xs}", 1)
                if masks:
                    v = f"({masks[p]} ? {v} : 0.0f)"
                lines.append(f"    acc{p} += {v} * w;")
            lines.append("  }")
        if rest > 4:
            lines.append("}")
    return "\n".join(lines)


def window_dot(g: NodeGen, pixels: int, n: int, x: str, cols: list[str], width: int, addr,
               wload, vec: int, may_leave: bool) -> str:
    """:func:`dot` over pixels whose input column ``cols[p]`` may lie outside ``[0, width)``.

    ``addr(col)`` is the element index of the window's first input at column ``col``.
    Columns grow with ``p``, so a tile is inside when its first and last are; inside
    tiles (nearly all) run the plain loop, border tiles a copy with clamped addresses
    and masks selecting 0. ``may_leave`` False (checked at compile time) keeps the plain loop only.
    """
    inside = dot(g, pixels, n, x, [addr(c) for c in cols], wload, vec)
    if not may_leave:
        return inside
    clamp = "".join(f"const int q{p} = clamp({c}, 0, {width - 1});\n"
                    f"const int m{p} = {c} == q{p};\n" for p, c in enumerate(cols))
    border = dot(g, pixels, n, x, [addr(f"q{p}") for p in range(pixels)], wload, vec,
                 masks=[f"m{p}" for p in range(pixels)])
    return (f"if ({cols[0]} >= 0 && {cols[-1]} < {width}) {{\n{_indent(inside, 2)}\n}} else {{\n"
            f"{_indent(clamp + border, 2)}\n}}")


def tile_kernel(g: NodeGen, *, rows: int, blocks: int, channels: int, vec: int, pixels: int, setup: str,
                compute: str, pixel: list[str], exists: list[str] | None, bias: str | None) -> KernelSpec:
    """The output-tile kernel every generator here returns (see the module docstring).

    Work-item ``(oc, cb, r)`` owns output channels ``vec*oc .. vec*oc+vec-1`` of
    ``pixels`` pixels: ``setup`` (C statements of ``cb`` and ``r``) names them,
    ``compute`` adds into ``acc0 ..``, ``pixel[p]`` is pixel ``p``'s flat index over the
    output's leading axes and ``exists[p]`` (None: always) whether it is inside the
    output. The bias (a ``float{vec}`` expression of ``oc``) starts the accumulators.
    """
    assert channels % vec == 0 or vec == 4, "only float4 tiles pad their last group"
    if 0 in (rows, blocks, channels):
        return g.kernel("", (0, 0, 0))   # an empty output: never launched (its C might divide by 0)
    init = bias or g.vector(f"float{vec}", "0.0f")
    lines = [f"const int oc = {g.global_id(0)};", f"const int cb = {g.global_id(1)};",
             f"const int r = {g.global_id(2)};", setup]
    if bias and pixels > 1:
        lines.append(f"const float{vec} bias = {bias};")
        init = "bias"
    lines.append(" ".join(f"float{vec} acc{p} = {init};" for p in range(pixels)))
    lines.append(compute)
    for p in range(pixels):
        idx = f"({pixel[p]}) * {channels} + oc * {vec}"
        if channels % 4 == 0:
            # Stored a float4 at a time: that is what the epilogue (followers) is written for.
            store = " ".join(g.store_output4(f"{idx} + {4 * j}" if j else idx, f"TO_REAL4(acc{p}{part})")
                             for j, part in enumerate(_QUARTERS[vec]))
        else:
            # Scalar stores skip the padding lanes of the last channel group.
            lanes = [f"(real){g.lane(f'acc{p}', lane, 4)}" for lane in range(4)]
            store = " ".join([g.store_output(idx, lanes[0])] + [
                f"if (oc * 4 + {lane} < {channels}) {g.store_output(f'{idx} + {lane}', lanes[lane])}"
                for lane in range(1, 4)])
        cond = exists[p] if exists else None
        lines.append(f"if ({cond}) {{ {store} }}" if cond else f"{{ {store} }}")
    return g.kernel(_indent("\n".join(lines), 2), (-(-channels // vec), blocks, rows))


def _blocked(count: int, pixels: int, start: str, name: str) -> tuple[list[str], list[str] | None, str]:
    """The pixels ``start + p`` of a block along an axis of ``count``.

    Returns their index expressions, their existence conditions (None when every block
    is full) and C declaring ``{name}{p}``: the index clamped inside the axis, so the
    missing pixels of the last block read real memory (their results are not stored).
    """
    ragged = count % pixels != 0
    index = [f"{start} + {p}" for p in range(pixels)]
    decl = "\n".join(f"const int {name}{p} = {f'min({i}, {count - 1})' if ragged else i};"
                     for p, i in enumerate(index))
    return index, ([f"{i} < {count}" for i in index] if ragged else None), decl


def _gemm_rows(g: NodeGen, x: str, count: int, stride: int, k: int, channels: int, vec: int, wload,
               bias: str | None, xbase: str = "") -> KernelSpec:
    """``count`` independent rows of ``k`` inputs (row ``m`` of ``x`` starts at
    ``m * stride`` plus ``xbase``), each times the weights: pointwise convolutions and
    FULLY_CONNECTED."""
    pixels = pixels_per_item(count)
    index, exists, decl = _blocked(count, pixels, f"cb * {pixels}", "m")
    compute = dot(g, pixels, k, x, [f"m{p} * {stride}{xbase}" for p in range(pixels)], wload, vec)
    return tile_kernel(g, rows=1, blocks=-(-count // pixels), channels=channels, vec=vec, pixels=pixels,
                       setup=decl, compute=compute, pixel=index, exists=exists, bias=bias)


# -- CONV_2D ------------------------------------------------------------------------------


@generator("CONV_2D", epilogue=True)
def conv2d(g: NodeGen) -> list[KernelSpec]:
    """CONV_2D (strides, dilations, SAME/VALID, groups): a pointwise conv with stride 1
    is a product of the ``[pixels, C]`` input with the weights; other convs walk the
    window's rows and, per row, its ``kw * I`` inputs contiguously (dilation 1) or
    each tap's ``I`` inputs."""
    _check_float(g)
    w = _constant(g, 1, "the filter")
    n, h, wd, c = g.ctx.inputs[0].shape
    o, kh, kw, i = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    (sh, sw), (dh, dw) = g.attrs["stride"], g.attrs["dilation"]
    _, pt = conv_output_size(h, kh, sh, dh, g.attrs["padding"])
    _, pl = conv_output_size(wd, kw, sw, dw, g.attrs["padding"])
    groups = c // i
    per_group = o // groups
    vec = channel_vector(per_group if groups > 1 else o)
    if groups > 1 and per_group % 4:
        # The lanes of a tile would read different groups: run it as a dense conv with
        # zero weights outside each output channel's group (grouped convs are rare).
        dense = np.zeros((o, kh, kw, c), np.float32)
        for grp in range(groups):
            dense[grp * per_group:(grp + 1) * per_group, :, :, grp * i:(grp + 1) * i] = \
                w[grp * per_group:(grp + 1) * per_group]
        w, i, groups, vec = dense, c, 1, channel_vector(o)
    x = g.input(0)
    wp = g.const(pack_oc(w.reshape(o, kh * kw * i), vec))
    bias = _bias(g, 2, o, vec)
    gbase = f" + (oc * {vec} / {per_group}) * {i}" if groups > 1 else ""
    wgroup = kh * kw * i * vec   # packed weights of one channel group

    def wload_at(base: str):
        return lambda k: g.loadv(wp, f"{base} + ({k}) * {vec}", vec)

    if kh == kw == 1 and sh == sw == 1 and (oh, ow) == (h, wd) and pt == pl == 0:
        return [_gemm_rows(g, x, n * h * wd, c, i, o, vec, wload_at(f"oc * {wgroup}"), bias, gbase)]

    pixels = pixels_per_item(ow)
    index, exists, decl = _blocked(ow, pixels, f"cb * {pixels}", "ow")
    setup = (f"const int b = r / {oh}; const int oh = r - b * {oh};\n{decl}\n"
             + "\n".join(f"const int iw{p} = ow{p} * {sw} - {pl};" for p in range(pixels)))
    rows_leave = pt > 0 or (oh - 1) * sh - pt + (kh - 1) * dh >= h
    cols_leave = pl > 0 or (ow - 1) * sw - pl + (kw - 1) * dw >= wd
    per_tap = "\n".join([
        f"for (int kw = 0; kw < {kw}; ++kw) {{",
        f"  const int wk = oc * {wgroup} + (kh * {kw} + kw) * {i * vec};",
        _indent(window_dot(g, pixels, i, x, [f"iw{p} + kw * {dw}" for p in range(pixels)], wd,
                           lambda col: f"(xr + {col}) * {c}{gbase}", wload_at("wk"), vec, cols_leave), 2),
        "}"])
    if dw == 1 and groups == 1 and kw > 1:
        # Dilation 1: the kw * I inputs of a window row are contiguous, one dot covers them.
        whole_row = (f"const int wk = oc * {wgroup} + kh * {kw * i * vec};\n"
                     + dot(g, pixels, kw * i, x, [f"(xr + iw{p}) * {c}" for p in range(pixels)], wload_at("wk"),
                           vec))
        if cols_leave:
            row = (f"if (iw0 >= 0 && iw{pixels - 1} + {kw - 1} < {wd}) {{\n{_indent(whole_row, 2)}\n}} else {{\n"
                   f"{_indent(per_tap, 2)}\n}}")
        else:
            row = whole_row
    else:
        row = per_tap
    body = "\n".join([
        f"for (int kh = 0; kh < {kh}; ++kh) {{",
        f"  const int ih = oh * {sh} - {pt} + kh * {dh};",
        f"  if (ih < 0 || ih >= {h}) continue;" if rows_leave else "",
        f"  const int xr = (b * {h} + ih) * {wd};",
        _indent(row, 2),
        "}"])
    return [tile_kernel(g, rows=n * oh, blocks=-(-ow // pixels), channels=o, vec=vec, pixels=pixels, setup=setup,
                        compute=body, pixel=[f"r * {ow} + {e}" for e in index], exists=exists, bias=bias)]


# -- DEPTHWISE_CONV_2D ----------------------------------------------------------------------


@generator("DEPTHWISE_CONV_2D", epilogue=True)
def depthwise_conv2d(g: NodeGen) -> list[KernelSpec]:
    """DEPTHWISE_CONV_2D with any depth multiplier, stride, dilation and padding.

    Per window row, the input columns the tile's pixels need are loaded once each
    (a stride-1 3x3 tile of 8 pixels loads 10 columns, not 24) and every tap reuses
    them. Output channel ``o`` reads input channel ``o / M``: with ``M = 1`` that is
    one vector load, else the lanes are gathered (float4 tiles).
    """
    _check_float(g)
    w = _constant(g, 1, "the filter")
    n, h, wd, c = g.ctx.inputs[0].shape
    _, kh, kw, o = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    mult = o // c
    (sh, sw), (dh, dw) = g.attrs["stride"], g.attrs["dilation"]
    _, pt = conv_output_size(h, kh, sh, dh, g.attrs["padding"])
    _, pl = conv_output_size(wd, kw, sw, dw, g.attrs["padding"])
    contiguous = mult == 1 and c % 4 == 0
    vec = channel_vector(o) if contiguous else 4
    x = g.input(0)
    wp = g.const(pack_oc(w.reshape(kh * kw, o).T, vec))   # [O/vec][kh*kw][vec]
    bias = _bias(g, 2, o, vec)
    # A tile keeps its row of inputs, (P - 1) * sw + (kw - 1) * dw + 1 vectors, and P
    # accumulators in registers: 8 pixels at stride 1, 4 at stride 2 (measured faster).
    pixels = pixels_per_item(ow, 8 if sw == 1 else 4)
    index, exists, decl = _blocked(ow, pixels, f"cb * {pixels}", "ow")
    lanes = ""
    if contiguous:
        def load(col: str) -> str:
            return g.loadv(x, f"(xr + {col}) * {c} + oc * {vec}", vec)
    else:
        lanes = "".join(f"\nconst int ci{lane} = min(oc * 4 + {lane}, {o - 1}) / {mult};" for lane in range(4))

        def load(col: str) -> str:
            return _gather(g, x, [f"(xr + {col}) * {c} + ci{lane}" for lane in range(4)])
    setup = f"const int b = r / {oh}; const int oh = r - b * {oh};\n{decl}{lanes}\nconst int iw = ow0 * {sw} - {pl};"
    # Input column j (from iw) feeds pixel p through tap t when j = p * sw + t * dw.
    used = sorted({p * sw + t * dw for p in range(pixels) for t in range(kw)})
    rows_leave = pt > 0 or (oh - 1) * sh - pt + (kh - 1) * dh >= h
    cols_leave = pl > 0 or (ow - 1) * sw - pl + (kw - 1) * dw >= wd or ow % pixels != 0

    def taps(masked: bool) -> str:
        out = []
        for j in used:
            if masked:
                out.append(f"const int q{j} = clamp(iw + {j}, 0, {wd - 1});")
                # a select, not a multiply by 0: inf * 0 would be NaN
                zero = g.vector(f"float{vec}", "0.0f")
                out.append(f"const float{vec} x{j} = iw + {j} == q{j} ? {load(f'q{j}')} : {zero};")
            else:
                out.append(f"const float{vec} x{j} = {load(f'iw + {j}')};")
        for p in range(pixels):
            out.append(f"acc{p} += " + " + ".join(f"x{p * sw + t * dw} * w{t}" for t in range(kw)) + ";")
        return _indent("\n".join(out), 4)

    body = [f"for (int kh = 0; kh < {kh}; ++kh) {{", f"  const int ih = oh * {sh} - {pt} + kh * {dh};"]
    if rows_leave:
        body.append(f"  if (ih < 0 || ih >= {h}) continue;")
    body.append(f"  const int xr = (b * {h} + ih) * {wd};")
    body.append(f"  const float{vec} " + ", ".join(
        f"w{t} = {g.loadv(wp, f'(oc * {kh * kw} + kh * {kw} + {t}) * {vec}', vec)}" for t in range(kw)) + ";")
    if cols_leave:
        body += [f"  if (iw >= 0 && iw + {used[-1]} < {wd}) {{", taps(False), "  } else {", taps(True), "  }"]
    else:
        body.append(taps(False))
    body.append("}")
    return [tile_kernel(g, rows=n * oh, blocks=-(-ow // pixels), channels=o, vec=vec, pixels=pixels, setup=setup,
                        compute="\n".join(body), pixel=[f"r * {ow} + {e}" for e in index], exists=exists,
                        bias=bias)]


# -- TRANSPOSE_CONV and Convolution2DTransposeBias ------------------------------------------


def _transpose_conv(g: NodeGen, x_pos: int, w_pos: int, bias_pos: int) -> list[KernelSpec]:
    """Transpose convolution as a gather: output pixel ``(oh, ow)`` sums, over the taps
    ``(kh, kw)`` with ``oh + top - kh`` and ``ow + left - kw`` divisible by the stride,
    input pixel ``((oh + top - kh) / sh, (ow + left - kw) / sw)`` times tap ``(kh, kw)``.

    A tile's pixels are ``sw`` apart (``ow = phase + sw * j``), so every pixel of a tile
    takes the same taps and the divisibility test is one branch per tap.
    """
    _check_float(g, skip=0 if x_pos == 2 else None)   # TRANSPOSE_CONV's output_shape is int32
    w = _constant(g, w_pos, "the weights")
    n, h, wd, c = g.ctx.inputs[x_pos].shape
    o, kh, kw, _ = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    sh, sw = g.attrs["stride"]
    pt = transpose_conv_padding(oh, kh, sh, g.attrs["padding"])
    pl = transpose_conv_padding(ow, kw, sw, g.attrs["padding"])
    vec = channel_vector(o)
    x = g.input(x_pos)
    wp = g.const(pack_oc(w.reshape(o, kh * kw * c), vec))
    bias = _bias(g, bias_pos, o, vec)
    per_phase = -(-ow // sw)
    pixels = pixels_per_item(per_phase)
    blocks = -(-per_phase // pixels)
    setup = (f"const int b = r / {oh}; const int oh = r - b * {oh};\n"
             f"const int phase = cb % {sw}; const int j0 = (cb / {sw}) * {pixels};")
    index = [f"phase + {sw} * (j0 + {p})" for p in range(pixels)]
    exists = [f"{e} < {ow}" for e in index]
    taps = window_dot(g, pixels, c, x, [f"tw / {sw} + j0 + {p}" for p in range(pixels)], wd,
                      lambda col: f"(xr + {col}) * {c}", lambda k: g.loadv(wp, f"wk + ({k}) * {vec}", vec), vec, True)
    body = "\n".join([
        f"for (int kh = 0; kh < {kh}; ++kh) {{",
        f"  const int th = oh + {pt} - kh;",
        f"  if (th < 0 || th % {sh} != 0 || th >= {h * sh}) continue;",
        f"  const int xr = (b * {h} + th / {sh}) * {wd};",
        f"  for (int kw = 0; kw < {kw}; ++kw) {{",
        f"    const int tw = phase + {pl} - kw;",
        # The remainder of a negative tw is negative or 0, so this tests divisibility for any sign.
        f"    if (tw % {sw} != 0) continue;",
        f"    const int wk = oc * {kh * kw * c * vec} + (kh * {kw} + kw) * {c * vec};",
        _indent(taps, 4),
        "  }", "}"])
    return [tile_kernel(g, rows=n * oh, blocks=blocks * sw, channels=o, vec=vec, pixels=pixels, setup=setup,
                        compute=body, pixel=[f"r * {ow} + {e}" for e in index], exists=exists, bias=bias)]


@generator("TRANSPOSE_CONV", epilogue=True)
def transpose_conv(g: NodeGen) -> list[KernelSpec]:
    """TRANSPOSE_CONV: inputs (output_shape, weights [O, KH, KW, I], input, bias?)."""
    return _transpose_conv(g, x_pos=2, w_pos=1, bias_pos=3)


@generator("Convolution2DTransposeBias", epilogue=True)
def transpose_conv_bias(g: NodeGen) -> list[KernelSpec]:
    """MediaPipe's Convolution2DTransposeBias: inputs (input, weights [O, KH, KW, I], bias)."""
    return _transpose_conv(g, x_pos=0, w_pos=1, bias_pos=2)


# -- FULLY_CONNECTED and BATCH_MATMUL -------------------------------------------------------


@generator("FULLY_CONNECTED", epilogue=True)
def fully_connected(g: NodeGen) -> list[KernelSpec]:
    """FULLY_CONNECTED: the input flattened to rows of K times ``weights^T`` (+ bias).

    ``keep_num_dims`` only changes the output's shape, not its row-major layout.
    Constant weights are repacked; weights computed at run time are read in place,
    four rows of ``[O, K]`` gathered per step.
    """
    _check_float(g)
    o, k = g.ctx.inputs[1].shape
    count = int(np.prod(g.ctx.inputs[0].shape, dtype=np.int64)) // k
    x = g.input(0)
    if g.ctx.inputs[1].value is not None:
        vec = channel_vector(o)
        wp = g.const(pack_oc(np.asarray(g.ctx.inputs[1].value, np.float32), vec))

        def wload(step: str) -> str:
            return g.loadv(wp, f"oc * {k * vec} + ({step}) * {vec}", vec)
    else:
        vec, w = 4, g.input(1)

        def wload(step: str) -> str:
            return _gather(g, w, [f"min(oc * 4 + {lane}, {o - 1}) * {k} + {step}" for lane in range(4)])
    return [_gemm_rows(g, x, count, k, k, o, vec, wload, _bias(g, 2, o, vec))]


def _batch_index(out_batch: tuple[int, ...], batch: tuple[int, ...], row: str) -> str:
    """Index of the matrix of an operand with batch shape ``batch`` that output matrix
    ``row`` (over ``out_batch``) reads, under broadcasting."""
    full = (1,) * (len(out_batch) - len(batch)) + tuple(batch)
    terms, out_stride, in_stride = [], 1, 1
    for d, od in zip(reversed(full), reversed(out_batch)):
        if d != 1:
            coord = f"({row} / {out_stride} % {od})" if out_stride > 1 else f"({row} % {od})"
            terms.append(f"{coord} * {in_stride}" if in_stride > 1 else coord)
        out_stride *= od
        in_stride *= d
    return " + ".join(terms) or "0"


@generator("BATCH_MATMUL", epilogue=True)
def batch_matmul(g: NodeGen) -> list[KernelSpec]:
    """BATCH_MATMUL with adj_x / adj_y and broadcast batch axes.

    The tile's pixels are rows of the lhs, its channels columns of the rhs. A constant
    rhs is repacked per matrix to ``[N/vec][K][vec]``; a rhs computed at run time is
    read in place (one vector load per step when its rows are contiguous and
    ``N % 4 == 0``, else four lanes gathered).
    """
    _check_float(g)
    a_shape, b_shape = tuple(g.ctx.inputs[0].shape), tuple(g.ctx.inputs[1].shape)
    out_shape = tuple(g.ctx.outputs[0].shape)
    adj_x, adj_y = g.attrs["adj_x"], g.attrs["adj_y"]
    m, n = out_shape[-2], out_shape[-1]
    k = a_shape[-2] if adj_x else a_shape[-1]
    out_batch = out_shape[:-2]
    a = g.input(0)
    if g.ctx.inputs[1].value is not None:
        vec = channel_vector(n)
        value = np.asarray(g.ctx.inputs[1].value, np.float32).reshape(-1, *b_shape[-2:])
        bp = g.const(pack_oc(value if adj_y else value.swapaxes(-1, -2), vec))   # [batch][N/vec][K][vec]

        def wload(step: str) -> str:
            return g.loadv(bp, f"((bb * {-(-n // vec)} + oc) * {k} + {step}) * {vec}", vec)
    elif not adj_y and n % 4 == 0:
        vec, b = channel_vector(n), g.input(1)

        def wload(step: str) -> str:
            return g.loadv(b, f"bb * {k * n} + ({step}) * {n} + oc * {vec}", vec)
    else:
        vec, b = 4, g.input(1)
        lane = [f"min(oc * 4 + {j}, {n - 1})" for j in range(4)]

        def wload(step: str) -> str:
            return _gather(g, b, [f"bb * {k * n} + {lane[j]} * {k} + {step}" if adj_y
                                  else f"bb * {k * n} + ({step}) * {n} + {lane[j]}" for j in range(4)])
    pixels = pixels_per_item(m)
    index, exists, decl = _blocked(m, pixels, f"cb * {pixels}", "m")
    setup = (f"const int ab = {_batch_index(out_batch, a_shape[:-2], 'r')};\n"
             f"const int bb = {_batch_index(out_batch, b_shape[:-2], 'r')};\n{decl}")
    xaddr = [f"ab * {m * k} + m{p}" + ("" if adj_x else f" * {k}") for p in range(pixels)]
    compute = dot(g, pixels, k, a, xaddr, wload, vec, xstride=m if adj_x else 1)
    return [tile_kernel(g, rows=int(np.prod(out_batch, dtype=np.int64)), blocks=-(-m // pixels), channels=n,
                        vec=vec, pixels=pixels, setup=setup, compute=compute,
                        pixel=[f"r * {m} + {e}" for e in index], exists=exists, bias=None)]
