"""Conformance cases for the neural-network ops of :mod:`litegpu.ops.nn`.

Each case is a one-op model built with :class:`~litegpu.testing.builder.ModelBuilder`.
Model inputs are plain arrays, constants are wrapped in :class:`Const`, variable
(state) tensors in :class:`Var`, and ``None`` is an omitted optional input. Output
shapes are written out by hand, so a shape-inference mistake shows up as a mismatch
with LiteRT. Random data comes from a generator seeded by the case id: stable runs.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..builder import ModelBuilder
from . import Case

F32 = np.float32


@dataclass
class Const:
    """A constant input tensor (stored in the model)."""

    array: np.ndarray


@dataclass
class Var:
    """A variable tensor (zero-initialized state) of this shape."""

    shape: tuple[int, ...]


def one_op(op: str, args: Sequence, out_shapes: Sequence[tuple[int, ...]], *, custom_options: bytes | None = None,
           version: int = 1, out_dtype=F32, **options) -> tuple[bytes, list[np.ndarray]]:
    """A model running ``op`` once: returns ``(model bytes, model inputs)``."""
    b = ModelBuilder()
    indices, feeds = [], []
    for k, a in enumerate(args):
        if a is None:
            indices.append(-1)
        elif isinstance(a, Const):
            indices.append(b.const(f"const{k}", a.array))
        elif isinstance(a, Var):
            indices.append(b.tensor(f"state{k}", a.shape, F32, is_variable=True))
        else:
            arr = np.asarray(a)
            indices.append(b.input(f"in{k}", arr.shape, arr.dtype))
            feeds.append(arr)
    outs = [b.tensor(f"out{k}", shape, out_dtype) for k, shape in enumerate(out_shapes)]
    if custom_options is not None:
        b.custom_op(op, indices, outs, custom_options=custom_options)
    else:
        b.op(op, indices, outs, version=version, **options)
    b.output(*outs)
    return b.build(), feeds


CASES: list[Case] = []


def case(op: str, variant: str, tol: float = 1e-5):
    """Decorator: register ``make(rng) -> (model bytes, inputs)`` as a case."""
    def wrap(make: Callable[[np.random.Generator], tuple[bytes, list[np.ndarray]]]):
        seed = zlib.crc32(f"{op}-{variant}".encode())
        CASES.append(Case(op, variant, lambda: make(np.random.default_rng(seed)), tol))
        return make
    return wrap


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """Standard-normal float32 data."""
    return (rng.standard_normal(shape) * scale).astype(F32)


# -- CONV_2D ----------------------------------------------------------------------------
# (variant, input shape, filter [O, KH, KW, I], output shape, options, bias?)
_CONV = [
    ("stride1-same", (1, 8, 8, 3), (4, 3, 3, 3), (1, 8, 8, 4), dict(padding="SAME", stride_h=1, stride_w=1), True),
    ("stride2-same-relu6", (1, 9, 9, 4), (6, 3, 3, 4), (1, 5, 5, 6),
     dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU6"), True),
    ("stride2-valid-relu", (1, 9, 10, 3), (5, 3, 3, 3), (1, 4, 4, 5),
     dict(padding="VALID", stride_h=2, stride_w=2, fused_activation_function="RELU"), True),
    ("dilation2-same", (1, 10, 10, 3), (4, 3, 3, 3), (1, 10, 10, 4),
     dict(padding="SAME", stride_h=1, stride_w=1, dilation_h_factor=2, dilation_w_factor=2), True),
    ("dilation2-valid", (1, 11, 11, 2), (3, 3, 3, 2), (1, 7, 7, 3),
     dict(padding="VALID", stride_h=1, stride_w=1, dilation_h_factor=2, dilation_w_factor=2), True),
    ("dilation-h3-w1", (1, 12, 8, 2), (3, 3, 3, 2), (1, 12, 8, 3),
     dict(padding="SAME", stride_h=1, stride_w=1, dilation_h_factor=3, dilation_w_factor=1), True),
    ("batch2-odd-stride1x2", (2, 7, 5, 3), (4, 2, 3, 3), (2, 7, 3, 4),
     dict(padding="SAME", stride_h=1, stride_w=2), True),
    ("pointwise", (1, 6, 6, 8), (16, 1, 1, 8), (1, 6, 6, 16), dict(padding="VALID", stride_h=1, stride_w=1), True),
    ("k1-stride2-valid", (1, 7, 7, 4), (3, 1, 1, 4), (1, 4, 4, 3), dict(padding="VALID", stride_h=2, stride_w=2), True),
    # LiteRT's float conv ignores TANH (no clamp range); the case pins that down.
    ("tanh-ignored", (1, 5, 5, 2), (3, 3, 3, 2), (1, 5, 5, 3),
     dict(padding="SAME", stride_h=1, stride_w=1, fused_activation_function="TANH"), True),
    ("relu-n1-to-1", (1, 5, 5, 2), (3, 3, 3, 2), (1, 5, 5, 3),
     dict(padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU_N1_TO_1"), True),
    ("stride3-same-k5", (1, 13, 11, 3), (4, 5, 5, 3), (1, 5, 4, 4), dict(padding="SAME", stride_h=3, stride_w=3), True),
    ("stride2-dilation2-valid-batch2", (2, 11, 10, 3), (4, 3, 3, 3), (2, 4, 3, 4),
     dict(padding="VALID", stride_h=2, stride_w=2, dilation_h_factor=2, dilation_w_factor=2), True),
    ("grouped2-stride2-relu", (1, 7, 7, 6), (4, 3, 3, 3), (1, 4, 4, 4),
     dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU"), True),
    ("grouped2", (1, 6, 6, 4), (6, 3, 3, 2), (1, 6, 6, 6), dict(padding="SAME", stride_h=1, stride_w=1), True),
]


def _conv_case(variant, x_shape, w_shape, out_shape, options, with_bias):
    @case("CONV_2D", variant)
    def make(rng):
        bias = Const(rand(rng, w_shape[0])) if with_bias else None
        return one_op("CONV_2D", [rand(rng, *x_shape), Const(rand(rng, *w_shape)), bias], [out_shape], **options)


for _c in _CONV:
    _conv_case(*_c)


# -- DEPTHWISE_CONV_2D ------------------------------------------------------------------
# (variant, input shape, filter [1, KH, KW, I*M], output shape, options, bias?)
_DW = [
    ("stride1-same", (1, 8, 8, 4), (1, 3, 3, 4), (1, 8, 8, 4),
     dict(padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1), True),
    ("stride2-valid-relu6", (1, 9, 9, 3), (1, 3, 3, 3), (1, 4, 4, 3),
     dict(padding="VALID", stride_h=2, stride_w=2, depth_multiplier=1, fused_activation_function="RELU6"), True),
    ("stride2-same-relu", (1, 10, 9, 5), (1, 3, 3, 5), (1, 5, 5, 5),
     dict(padding="SAME", stride_h=2, stride_w=2, depth_multiplier=1, fused_activation_function="RELU"), True),
    ("dilation2-same", (1, 9, 9, 3), (1, 3, 3, 3), (1, 9, 9, 3),
     dict(padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1, dilation_h_factor=2, dilation_w_factor=2),
     True),
    ("dilation2-valid", (1, 9, 10, 2), (1, 3, 3, 2), (1, 5, 6, 2),
     dict(padding="VALID", stride_h=1, stride_w=1, depth_multiplier=1, dilation_h_factor=2, dilation_w_factor=2),
     True),
    ("multiplier2", (1, 6, 6, 3), (1, 3, 3, 6), (1, 6, 6, 6),
     dict(padding="SAME", stride_h=1, stride_w=1, depth_multiplier=2), True),
    ("multiplier3-stride2", (1, 7, 7, 2), (1, 3, 3, 6), (1, 4, 4, 6),
     dict(padding="SAME", stride_h=2, stride_w=2, depth_multiplier=3), True),
    ("batch2-k5", (2, 8, 7, 3), (1, 5, 5, 3), (2, 8, 7, 3),
     dict(padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1), True),
    ("tanh-ignored-k2x3", (1, 6, 7, 2), (1, 2, 3, 2), (1, 5, 5, 2),
     dict(padding="VALID", stride_h=1, stride_w=1, depth_multiplier=1, fused_activation_function="TANH"), True),
    ("one-input-channel-m4", (1, 6, 6, 1), (1, 3, 3, 4), (1, 3, 3, 4),
     dict(padding="SAME", stride_h=2, stride_w=2, depth_multiplier=4), True),
]


def _dw_case(variant, x_shape, w_shape, out_shape, options, with_bias):
    @case("DEPTHWISE_CONV_2D", variant)
    def make(rng):
        bias = Const(rand(rng, w_shape[3])) if with_bias else None
        return one_op("DEPTHWISE_CONV_2D", [rand(rng, *x_shape), Const(rand(rng, *w_shape)), bias], [out_shape],
                      version=2, **options)


for _c in _DW:
    _dw_case(*_c)


# -- TRANSPOSE_CONV ---------------------------------------------------------------------
# (variant, input shape, weights [O, KH, KW, I], output shape, options, bias?)
_TCONV = [
    ("stride2-same", (1, 4, 4, 3), (5, 3, 3, 3), (1, 8, 8, 5), dict(padding="SAME", stride_h=2, stride_w=2), True),
    ("stride2-valid", (1, 4, 4, 3), (5, 3, 3, 3), (1, 9, 9, 5), dict(padding="VALID", stride_h=2, stride_w=2), True),
    ("stride1-same-nobias", (1, 5, 5, 2), (3, 3, 3, 2), (1, 5, 5, 3), dict(padding="SAME", stride_h=1, stride_w=1),
     False),
    ("stride2-same-odd-output", (1, 4, 4, 3), (2, 3, 3, 3), (1, 7, 7, 2),
     dict(padding="SAME", stride_h=2, stride_w=2), True),
    ("stride2-k4-same", (1, 3, 5, 2), (4, 4, 4, 2), (1, 6, 10, 4), dict(padding="SAME", stride_h=2, stride_w=2), True),
    ("stride2x1-batch2", (2, 3, 4, 2), (3, 3, 2, 2), (2, 6, 4, 3), dict(padding="SAME", stride_h=2, stride_w=1), True),
    ("relu", (1, 4, 4, 3), (4, 3, 3, 3), (1, 8, 8, 4),
     dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU"), True),
    ("tanh-ignored", (1, 3, 3, 2), (2, 3, 3, 2), (1, 6, 6, 2),
     dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="TANH"), True),
    ("stride3-valid-k2", (1, 3, 3, 2), (2, 2, 2, 2), (1, 8, 8, 2), dict(padding="VALID", stride_h=3, stride_w=3),
     True),
]


def _tconv_case(variant, x_shape, w_shape, out_shape, options, with_bias):
    @case("TRANSPOSE_CONV", variant)
    def make(rng):
        args = [Const(np.array(out_shape, np.int32)), Const(rand(rng, *w_shape)), rand(rng, *x_shape)]
        if with_bias:
            args.append(Const(rand(rng, w_shape[0])))
        return one_op("TRANSPOSE_CONV", args, [out_shape], version=4 if "fused_activation_function" in options
                      else 3, **options)


for _c in _TCONV:
    _tconv_case(*_c)


@case("TRANSPOSE_CONV", "output-shape-from-input")
def _tconv_dynamic(rng):
    shape = np.array([1, 8, 8, 3], np.int32)
    return one_op("TRANSPOSE_CONV", [shape, Const(rand(rng, 3, 3, 3, 2)), rand(rng, 1, 4, 4, 2)], [(1, 8, 8, 3)],
                  version=3, padding="SAME", stride_h=2, stride_w=2)


# -- Convolution2DTransposeBias (MediaPipe custom op) -----------------------------------

def transpose_conv_bias_options(padding: str, stride_h: int, stride_w: int) -> bytes:
    """MediaPipe's raw TfLiteTransposeConvParams: int32 padding (1 SAME, 2 VALID), stride_w, stride_h."""
    return struct.pack("<iii", {"SAME": 1, "VALID": 2}[padding], stride_w, stride_h)


_MP = [
    ("same-stride2-k4", (1, 4, 4, 3), (5, 4, 4, 3), (1, 8, 8, 5), ("SAME", 2, 2)),
    ("same-stride2-k3", (1, 5, 3, 2), (4, 3, 3, 2), (1, 10, 6, 4), ("SAME", 2, 2)),
    ("valid-stride2-k3", (1, 4, 4, 3), (2, 3, 3, 3), (1, 9, 9, 2), ("VALID", 2, 2)),
    ("same-stride1-k3-batch2", (2, 4, 5, 2), (3, 3, 3, 2), (2, 4, 5, 3), ("SAME", 1, 1)),
    ("valid-stride2x1-k2", (1, 3, 4, 2), (3, 2, 2, 2), (1, 6, 5, 3), ("VALID", 2, 1)),
]


def _mp_case(variant, x_shape, w_shape, out_shape, opts):
    @case("Convolution2DTransposeBias", variant)
    def make(rng):
        args = [rand(rng, *x_shape), Const(rand(rng, *w_shape)), Const(rand(rng, w_shape[0]))]
        return one_op("Convolution2DTransposeBias", args, [out_shape],
                      custom_options=transpose_conv_bias_options(*opts))


for _c in _MP:
    _mp_case(*_c)


# -- pooling ----------------------------------------------------------------------------
# (variant, input shape, output shape, options)
_POOL = [
    ("f2s2-valid", (1, 8, 8, 3), (1, 4, 4, 3), dict(padding="VALID", filter_height=2, filter_width=2, stride_h=2,
                                                     stride_w=2)),
    ("f3s2-same", (1, 9, 9, 2), (1, 5, 5, 2), dict(padding="SAME", filter_height=3, filter_width=3, stride_h=2,
                                                    stride_w=2)),
    ("f3s1-same-relu6", (1, 6, 7, 3), (1, 6, 7, 3),
     dict(padding="SAME", filter_height=3, filter_width=3, stride_h=1, stride_w=1, fused_activation_function="RELU6")),
    ("f3s2-same-odd", (1, 7, 10, 4), (1, 4, 5, 4), dict(padding="SAME", filter_height=3, filter_width=3, stride_h=2,
                                                         stride_w=2)),
    ("f2s1-valid-batch2", (2, 5, 5, 3), (2, 4, 4, 3),
     dict(padding="VALID", filter_height=2, filter_width=2, stride_h=1, stride_w=1)),
    ("f3x2-s2x1-same-relu", (1, 7, 6, 2), (1, 4, 6, 2),
     dict(padding="SAME", filter_height=3, filter_width=2, stride_h=2, stride_w=1, fused_activation_function="RELU")),
    ("global-valid", (1, 7, 7, 5), (1, 1, 1, 5), dict(padding="VALID", filter_height=7, filter_width=7, stride_h=1,
                                                       stride_w=1)),
    ("f2s2-same-tanh-ignored", (1, 5, 5, 2), (1, 3, 3, 2),
     dict(padding="SAME", filter_height=2, filter_width=2, stride_h=2, stride_w=2, fused_activation_function="TANH")),
    ("f4s3-same", (1, 10, 11, 2), (1, 4, 4, 2), dict(padding="SAME", filter_height=4, filter_width=4, stride_h=3,
                                                      stride_w=3)),
]


def _pool_case(op, variant, x_shape, out_shape, options):
    @case(op, variant)
    def make(rng):
        x = rand(rng, *x_shape)
        return one_op(op, [x], [out_shape], **options)


for _op in ("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
    for _c in _POOL:
        _pool_case(_op, *_c)


# -- FULLY_CONNECTED --------------------------------------------------------------------

def _fc_case(variant, x_shape, w_shape, out_shape, *, bias=True, const_weights=True, **options):
    @case("FULLY_CONNECTED", variant)
    def make(rng):
        w = rand(rng, *w_shape)
        args = [rand(rng, *x_shape), Const(w) if const_weights else w,
                Const(rand(rng, w_shape[0])) if bias else None]
        return one_op("FULLY_CONNECTED", args, [out_shape], **options)


_fc_case("basic", (2, 8), (4, 8), (2, 4))
_fc_case("nobias", (3, 8), (5, 8), (3, 5), bias=False)
_fc_case("relu", (2, 6), (4, 6), (2, 4), fused_activation_function="RELU")
_fc_case("relu6-batch1", (1, 16), (10, 16), (1, 10), fused_activation_function="RELU6")
_fc_case("relu-n1-to-1", (2, 6), (3, 6), (2, 3), fused_activation_function="RELU_N1_TO_1")
_fc_case("keep-num-dims", (2, 3, 8), (4, 8), (2, 3, 4), keep_num_dims=True)
_fc_case("flatten-rank3", (2, 3, 8), (4, 8), (6, 4))
_fc_case("flatten-rank4", (1, 2, 2, 6), (5, 8), (3, 5))
_fc_case("weights-as-input", (2, 7), (3, 7), (2, 3), const_weights=False)
_fc_case("vector-input", (8,), (4, 8), (1, 4))


# -- BATCH_MATMUL -----------------------------------------------------------------------

def _bmm_case(variant, a_shape, b_shape, out_shape, *, const_rhs=False, **options):
    @case("BATCH_MATMUL", variant)
    def make(rng):
        rhs = rand(rng, *b_shape)
        return one_op("BATCH_MATMUL", [rand(rng, *a_shape), Const(rhs) if const_rhs else rhs], [out_shape],
                      **options)


_bmm_case("rank2", (3, 4), (4, 5), (3, 5))
_bmm_case("rank3", (2, 3, 4), (2, 4, 5), (2, 3, 5))
_bmm_case("adj-x", (2, 4, 3), (2, 4, 5), (2, 3, 5), adj_x=True)
_bmm_case("adj-y", (2, 3, 4), (2, 5, 4), (2, 3, 5), adj_y=True)
_bmm_case("adj-x-adj-y", (2, 4, 3), (2, 5, 4), (2, 3, 5), adj_x=True, adj_y=True)
_bmm_case("broadcast-rank4", (2, 1, 3, 4), (1, 3, 4, 2), (2, 3, 3, 2))
_bmm_case("rank5", (1, 2, 2, 3, 4), (1, 2, 2, 4, 3), (1, 2, 2, 3, 3))
_bmm_case("rank2-by-rank3", (3, 4), (2, 4, 5), (2, 3, 5))
_bmm_case("rank3-by-rank2-const", (2, 3, 4), (4, 6), (2, 3, 6), const_rhs=True)


# -- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR ------------------------------------------
# (variant, input shape, output size, flags)
_RESIZE = [
    ("up2x", (1, 4, 4, 3), (8, 8), {}),
    ("up2x-align-corners", (1, 4, 4, 3), (8, 8), dict(align_corners=True)),
    ("up2x-half-pixel", (1, 4, 4, 3), (8, 8), dict(half_pixel_centers=True)),
    ("odd-up", (1, 3, 5, 2), (7, 8), {}),
    ("odd-up-align-corners", (1, 3, 5, 2), (7, 8), dict(align_corners=True)),
    ("odd-up-half-pixel", (1, 3, 5, 2), (7, 8), dict(half_pixel_centers=True)),
    ("down", (2, 7, 9, 3), (4, 5), {}),
    ("down-align-corners", (2, 7, 9, 3), (4, 5), dict(align_corners=True)),
    ("down-half-pixel", (2, 7, 9, 3), (4, 5), dict(half_pixel_centers=True)),
    ("to-1x1-align-corners", (1, 3, 3, 2), (1, 1), dict(align_corners=True)),
    ("up-align-corners-half-pixel", (1, 3, 4, 2), (5, 7), dict(align_corners=True, half_pixel_centers=True)),
    ("down-align-corners-half-pixel", (1, 7, 9, 2), (3, 4), dict(align_corners=True, half_pixel_centers=True)),
    ("up3x-half-pixel-batch2", (2, 2, 3, 3), (6, 9), dict(half_pixel_centers=True)),
]


def _resize_case(op, variant, x_shape, size, flags):
    @case(op, variant)
    def make(rng):
        x = rand(rng, *x_shape)
        return one_op(op, [x, Const(np.array(size, np.int32))], [(x_shape[0], *size, x_shape[3])], **flags)


for _op in ("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"):
    for _c in _RESIZE:
        _resize_case(_op, *_c)


@case("RESIZE_BILINEAR", "size-from-input")
def _resize_dynamic(rng):
    return one_op("RESIZE_BILINEAR", [rand(rng, 1, 3, 4, 2), np.array([5, 6], np.int32)], [(1, 5, 6, 2)])


# -- EMBEDDING_LOOKUP -------------------------------------------------------------------

@case("EMBEDDING_LOOKUP", "rank2-table")
def _embedding_rank2(rng):
    ids = np.array([3, 0, 9, 3, 5], np.int32)
    return one_op("EMBEDDING_LOOKUP", [ids, Const(rand(rng, 10, 4))], [(5, 4)])


@case("EMBEDDING_LOOKUP", "rank3-table")
def _embedding_rank3(rng):
    ids = np.array([1, 6, 2], np.int32)
    return one_op("EMBEDDING_LOOKUP", [ids, Const(rand(rng, 7, 2, 3))], [(3, 2, 3)])


# -- LSTM / UNIDIRECTIONAL_SEQUENCE_LSTM ------------------------------------------------

def lstm_args(rng: np.random.Generator, x: np.ndarray, n_cell: int, *, n_output: int | None = None,
              cifg: bool = False, peephole: bool = False, layer_norm: bool = False,
              batch: int | None = None) -> list:
    """The 24 LSTM inputs for input ``x`` (last axis n_input); optional parts as asked."""
    n_input = x.shape[-1]
    n_out = n_output or n_cell
    batch = x.shape[0] if batch is None else batch
    w = lambda *s: Const(rand(rng, *s, scale=0.4))  # noqa: E731  (small weights keep gates unsaturated)
    gates = ("input", "forget", "cell", "output")
    args: list = [x]
    args += [None if cifg and g == "input" else w(n_cell, n_input) for g in gates]
    args += [None if cifg and g == "input" else w(n_cell, n_out) for g in gates]
    args += [None if not peephole or (cifg and g == "input") else w(n_cell) for g in ("input", "forget", "output")]
    args += [None if cifg and g == "input" else w(n_cell) for g in gates]
    args += [w(n_out, n_cell), w(n_out)] if n_output else [None, None]
    args += [Var((batch, n_out)), Var((batch, n_cell))]
    args += [None if not layer_norm or (cifg and g == "input") else w(n_cell) for g in gates]
    return args


def _lstm_case(variant, batch, n_input, n_cell, n_output=None, **opts):
    flags = {k: opts.pop(k) for k in ("cifg", "peephole", "layer_norm") if k in opts}

    @case("LSTM", variant)
    def make(rng):
        x = rand(rng, batch, n_input)
        args = lstm_args(rng, x, n_cell, n_output=n_output, **flags)
        return one_op("LSTM", args, [(batch, n_output or n_cell)], version=1, **opts)


_lstm_case("basic", 2, 3, 4, fused_activation_function="TANH")
_lstm_case("cifg", 1, 4, 5, cifg=True, fused_activation_function="TANH")
_lstm_case("peephole", 2, 3, 4, peephole=True, fused_activation_function="TANH")
_lstm_case("projection-clip", 2, 3, 5, 3, fused_activation_function="TANH", proj_clip=0.3)
_lstm_case("cell-clip", 2, 3, 4, fused_activation_function="TANH", cell_clip=0.2)


@case("LSTM", "twenty-inputs")
def _lstm_twenty_inputs(rng):
    """The older 20-input form, without layer-norm tensors."""
    x = rand(rng, 2, 3)
    return one_op("LSTM", lstm_args(rng, x, 4)[:20], [(2, 4)], fused_activation_function="TANH")


_lstm_case("relu-activation", 2, 3, 4, fused_activation_function="RELU")
_lstm_case("relu6-activation", 2, 3, 4, fused_activation_function="RELU6")
_lstm_case("layer-norm", 2, 3, 4, layer_norm=True, fused_activation_function="TANH")
_lstm_case("layer-norm-cifg-peephole-projection", 3, 4, 5, 2, cifg=True, peephole=True, layer_norm=True,
           fused_activation_function="TANH")


def _seq_lstm_case(variant, steps, batch, n_input, n_cell, n_output=None, time_major=False, **flags):
    @case("UNIDIRECTIONAL_SEQUENCE_LSTM", variant)
    def make(rng):
        x = rand(rng, steps, batch, n_input) if time_major else rand(rng, batch, steps, n_input)
        args = lstm_args(rng, x, n_cell, n_output=n_output, batch=batch, **flags)
        lead = (steps, batch) if time_major else (batch, steps)
        return one_op("UNIDIRECTIONAL_SEQUENCE_LSTM", args, [(*lead, n_output or n_cell)],
                      fused_activation_function="TANH", time_major=time_major)


_seq_lstm_case("batch-major", 4, 2, 3, 4)
_seq_lstm_case("time-major", 3, 2, 3, 4, time_major=True)
_seq_lstm_case("cifg-peephole-projection", 5, 1, 2, 4, 3, cifg=True, peephole=True)


# -- L2_NORMALIZATION / LOCAL_RESPONSE_NORMALIZATION ------------------------------------

@case("L2_NORMALIZATION", "rank3")
def _l2norm(rng):
    return one_op("L2_NORMALIZATION", [rand(rng, 2, 5, 8)], [(2, 5, 8)])


@case("L2_NORMALIZATION", "rank4-zero-row")
def _l2norm_zero(rng):
    x = rand(rng, 1, 3, 3, 6)
    x[0, 1, 1] = 0  # a zero vector: the epsilon floor keeps it finite
    return one_op("L2_NORMALIZATION", [x], [(1, 3, 3, 6)])


@case("LOCAL_RESPONSE_NORMALIZATION", "radius2")
def _lrn(rng):
    return one_op("LOCAL_RESPONSE_NORMALIZATION", [rand(rng, 1, 4, 4, 7)], [(1, 4, 4, 7)], radius=2, bias=1.0,
                  alpha=0.5, beta=0.75)


@case("LOCAL_RESPONSE_NORMALIZATION", "radius1-batch2")
def _lrn_small(rng):
    return one_op("LOCAL_RESPONSE_NORMALIZATION", [rand(rng, 2, 3, 3, 4)], [(2, 3, 3, 4)], radius=1, bias=2.0,
                  alpha=0.1, beta=0.5)
