"""OpenCL C generation: what a kernel generator returns, and the helpers it writes with.

A generator (registered per op in :mod:`litegpu_opencl.kernels`) receives a
:class:`NodeGen` for one node at compile time and returns the node's kernels as
:class:`KernelSpec` objects: OpenCL C with shapes, strides, constants and the fused
activation baked in, the launch sizes, and the arguments (tensors of the partition,
constants to upload). The program builder dedupes sources, names kernels and binds
arguments; a generator never touches pyopencl.

Storage and arithmetic precision are macros of the prelude, so one source serves
F32, F32_F16 (half storage, float arithmetic) and F16 (half arithmetic where the
device has ``cl_khr_fp16``):

- ``LD(p, i)`` / ``ST(p, i, v)``: element ``i`` of a float tensor as ``real`` / stored;
- ``LD4(p, i)`` / ``ST4(p, i, v)``: four consecutive elements from element ``i``;
- ``real`` / ``real4``: the arithmetic type; accumulators of reductions use ``float``;
- ``FT``: the element type of a float tensor's pointer (``float`` or ``half``).

A tensor marked ``full_precision`` (see :class:`litegpu.ops.TensorSpec`) stays float32
in half storage: its pointer is ``float`` and the :class:`NodeGen` accessors
(``load``, ``load4``, ``loadv``, ``store``, ``store4``) spell its loads and stores, so
generators go through them rather than the macros.

Integer and bool tensors are plain C arrays (``int``, ``long``, ``uchar``).
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from litegpu.backend import NodeContext
from litegpu.errors import InvalidArgumentError, UnsupportedError
from litegpu.ops import TensorSpec
from litegpu.ops.registry import ACTIVATION_RANGES

from . import formulas, ir
from .crender import CRenderer, c_float
from .dialect import Dialect
from .opencl import OPENCL
from .wgsl import WgslDialect, WgslRenderer


@dataclass(frozen=True)
class Precision:
    """How float tensors are stored and computed."""

    half_storage: bool = False
    half_arith: bool = False

    @property
    def name(self) -> str:
        """LiteRT's name for the mode: F32, F32_F16 or F16."""
        if self.half_arith:
            return "F16"
        return "F32_F16" if self.half_storage else "F32"

    def storage_of(self, spec: TensorSpec) -> np.dtype:
        """The dtype tensor ``spec`` has in device memory."""
        return self.storage_dtype(spec.dtype, spec.full_precision)

    def layout_of(self, spec: TensorSpec) -> tuple[int, np.dtype]:
        """(elements, storage dtype) of tensor ``spec`` in device memory."""
        return int(np.prod(spec.shape, dtype=np.int64)), self.storage_of(spec)

    def nbytes_of(self, spec: TensorSpec) -> int:
        """Bytes tensor ``spec`` takes in device memory."""
        size, storage = self.layout_of(spec)
        return size * storage.itemsize

    @property
    def storage(self) -> str:
        """Storage precision in words, for reports."""
        return "fp16" if self.half_storage else "fp32"

    @property
    def arithmetic(self) -> str:
        """Arithmetic precision in words, for reports."""
        return "fp16" if self.half_arith else "fp32"

    def storage_dtype(self, dtype: np.dtype, full_precision: bool = False) -> np.dtype:
        """The dtype a tensor of ``dtype`` has in device memory (a ``full_precision``
        tensor, see :class:`litegpu.ops.TensorSpec`, is never narrowed)."""
        dtype = np.dtype(dtype)
        if dtype == np.float32 and self.half_storage and not full_precision:
            return np.dtype(np.float16)
        if dtype == np.bool_:
            return np.dtype(np.uint8)
        return dtype


#: The delegate option (``load_delegate(name, {HALF_ARITHMETIC: False})``) that keeps fp32
#: arithmetic over fp16 storage when precision loss is allowed: TFLite GPU's F32_F16.
HALF_ARITHMETIC = "half_arithmetic"


def requested_precision(options, device_half: bool) -> Precision:
    """The precision a program compiled with ``options`` (:class:`litegpu.backend.CompileOptions`)
    runs in: F32 unless precision loss is allowed; then half storage, with half arithmetic
    (F16) where the device computes in half (``device_half``) and :data:`HALF_ARITHMETIC`
    is not turned off, else float arithmetic (F32_F16)."""
    if not options.precision_loss_allowed:
        return Precision()
    return Precision(half_storage=True, half_arith=device_half and bool(options.extra.get(HALF_ARITHMETIC, True)))


class StoredTensor:
    """Mixin of a GPU plugin's device tensor: its ``size`` and ``nbytes`` from its ``shape``
    and ``storage`` (the dtype it has in device memory, see :meth:`Precision.storage_of`)."""

    shape: tuple[int, ...]
    storage: np.dtype

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes in device memory."""
        return self.size * self.storage.itemsize

    @classmethod
    def check_binding(cls, t: int, tensor: object, layout: tuple[int, np.dtype]) -> None:
        """Raise InvalidArgumentError unless ``tensor`` is one of ``cls`` holding ``layout``
        (elements, storage dtype): what a program needs bound as its tensor ``t``."""
        size, storage = layout
        if not isinstance(tensor, cls) or tensor.storage != storage or tensor.size != size:
            got = f"{tensor.size} x {tensor.storage}" if isinstance(tensor, cls) else type(tensor).__name__
            raise InvalidArgumentError(f"tensor {t}: the device buffer holds {got}, "
                                       f"the program needs {size} x {storage}")


def prelude(precision: Precision, dialect: Dialect = OPENCL) -> str:
    """What every kernel source of a program in ``dialect`` and ``precision`` starts with."""
    return dialect.prelude(precision.name)


_C_TYPES = {np.dtype(np.int32): "int", np.dtype(np.int64): "long", np.dtype(np.uint8): "uchar",
            np.dtype(np.int8): "char", np.dtype(np.int16): "short", np.dtype(np.bool_): "uchar",
            np.dtype(np.uint32): "uint", np.dtype(np.float64): "double"}


def c_type(dtype: np.dtype) -> str:
    """The pointer element type of a tensor of ``dtype`` ("FT" for float32)."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return "FT"
    if dtype not in _C_TYPES:
        raise KeyError(f"no OpenCL type for {dtype}")
    return _C_TYPES[dtype]


def clamp_c(activation: str, x: str, ctype: str = "real", lower=None, g: "NodeGen | None" = None,
            vtype: str | None = None) -> str:
    """The clamp of ``activation`` (``litegpu.ops.registry.ACTIVATION_RANGES``: TANH and
    SIGN_BIT clamp nothing, as in LiteRT) as a C expression of ``x`` with ``ctype``
    bounds. The scalar bounds make it valid for vectors too (the kernel language's fmax
    and clamp take a vector with scalar limits); ``lower`` spells a lower bound alone
    for integers (``max``).

    On floats a NaN passes through, as LiteRT's clamps let it (XNNPACK's ``max(lo, x)``
    then ``min(hi, x)``: on x86 the second operand wins when either is NaN), where
    ``fmax``/``clamp`` alone would turn it into a bound. ``g`` (the :class:`NodeGen`)
    spells that choice for its dialect; ``x`` appears more than once, so pass a variable.
    Given ``x``'s type ``vtype`` (``real``, ``real4``), the clamp is spelled as XNNPACK's
    compares and selects (``lo > x ? lo : x``: one x86 max instruction, as fast as
    ``fmax``); without it, as ``isnan(x) ? x : clamp(x, ...)``, valid for either type."""
    lo, hi = ACTIVATION_RANGES[activation]
    bound = lambda v: f"({ctype}){v:g}"   # noqa: E731 - 0, 6, -1: the literals C reads exactly
    if lo == -np.inf and hi == np.inf:
        return x
    if lower is not None:
        return f"{lower}({x}, {bound(lo)})" if hi == np.inf else f"clamp({x}, {bound(lo)}, {bound(hi)})"
    if vtype is not None:
        lo_v, hi_v = g.vector(vtype, bound(lo)), g.vector(vtype, bound(hi))
        y = g.choose(f"({lo_v} > {x})", lo_v, x)
        return y if hi == np.inf else g.choose(f"({hi_v} < {y})", hi_v, y)
    clamped = f"fmax({x}, {bound(lo)})" if hi == np.inf else f"clamp({x}, {bound(lo)}, {bound(hi)})"
    return g.choose(f"isnan({x})", x, clamped)


@dataclass
class Arg:
    """One kernel argument: a tensor of the partition (by index) or a constant to upload."""

    tensor: int | None = None          # a tensor index of the subgraph
    const: np.ndarray | None = None    # a constant the generator made (already in its final dtype)


@dataclass
class KernelSpec:
    """One kernel launch of a node: source, sizes, arguments.

    Each argument is two kernel arguments: a buffer and an element offset into it.

    ``source`` is one ``__kernel void KERNEL(...)`` definition; the builder replaces the
    name ``KERNEL`` with a name derived from the source, so identical kernels share one
    compiled function.
    """

    source: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Arg]

    @property
    def digest(self) -> str:
        """A short content hash of the source (the kernel's name in the program)."""
        return hashlib.sha256(self.source.encode()).hexdigest()[:16]


@dataclass
class Follower:
    """An elementwise node folded into its producer's store (see :mod:`.fusion`).

    ``other`` is the operand that is not the running value: None for unary ops, else
    its tensor index; ``swap`` is True when the running value is the op's second
    operand; ``kind`` says how ``other`` is indexed: "scalar" (one element, inlined when
    constant), "same" (the output's shape) or "channel" (a vector over the last axis).
    """

    ctx: NodeContext
    other: int | None = None
    swap: bool = False
    kind: str = ""


class NodeGen:
    """What a generator writes one node's kernels with.

    Parameters are collected as the generator asks for tensors: ``param(t)`` returns
    the C name of tensor ``t``'s pointer and records the argument; :meth:`kernel`
    wraps a body into a :class:`KernelSpec` with the recorded parameters.
    """

    def __init__(self, ctx: NodeContext, precision: Precision, specs: dict[int, TensorSpec],
                 followers: list[Follower] | None = None, out_tensor: int | None = None,
                 dialect: Dialect = OPENCL) -> None:
        self.ctx = ctx
        self.dialect = dialect
        self.attrs = ctx.attrs
        self.precision = precision
        self.specs = specs
        self.followers = followers or []
        # The tensor the step finally writes: the last follower's output, else the node's.
        self.out_tensor = out_tensor if out_tensor is not None else ctx.node.outputs[0]
        self._params: list[tuple[str, str, Arg]] = []   # (pointer type, name, arg)
        self._names: dict[tuple, str] = {}
        self._full: set[str] = set()   # float pointers that stay float32 in half storage

    # -- tensors and constants ----------------------------------------------------------
    def spec(self, t: int) -> TensorSpec:
        """The spec of tensor ``t``."""
        return self.specs[t]

    def input(self, pos: int) -> str:
        """The C name of the node's input ``pos`` (a pointer to const)."""
        return self._tensor(self.ctx.node.inputs[pos], const=True)

    def output(self, pos: int = 0) -> str:
        """The C name of the node's output ``pos``; output 0 is the step's final output."""
        t = self.out_tensor if pos == 0 else self.ctx.node.outputs[pos]
        return self._tensor(t, const=False)

    def tensor_param(self, t: int, const: bool = True) -> str:
        """The C name of any tensor of the partition."""
        return self._tensor(t, const)

    def _tensor(self, t: int, const: bool) -> str:
        key = ("t", t)
        if key in self._names:
            return self._names[key]
        name = f"t{len(self._params)}"
        ctype = c_type(self.specs[t].dtype)
        if ctype == "FT" and self.precision.half_storage and self.specs[t].full_precision:
            ctype = "float"
            self._full.add(name)
        self._params.append((self.global_ptr(ctype, const), name, Arg(tensor=t)))
        self._names[key] = name
        return name

    def const(self, array: np.ndarray, storage: bool = True) -> str:
        """Upload a constant the generator made (repacked weights, index tables).

        Float arrays are stored like float tensors (half in F32_F16 mode) unless
        ``storage`` is False, when they stay float32 (read them with plain indexing).
        """
        array = np.ascontiguousarray(array)
        if array.dtype == np.float32 and storage:
            ctype = "FT"
            array = array.astype(self.precision.storage_dtype(np.float32))
        elif array.dtype == np.float32:
            ctype = "float"
        else:
            ctype = c_type(array.dtype)
            array = array.astype(self.precision.storage_dtype(array.dtype))
        name = f"t{len(self._params)}"
        self._params.append((self.global_ptr(ctype, True), name, Arg(const=array)))
        return name

    # -- loads and stores ---------------------------------------------------------------
    def pointee(self, ptr: str) -> str:
        """The element type of float pointer ``ptr`` (``FT``, or ``float`` at full precision)."""
        return "float" if ptr in self._full else "FT"

    def alias(self, local: str, ptr: str) -> None:
        """Declare ``local`` a pointer into ``ptr``'s tensor (it is loaded like ``ptr``)."""
        if ptr in self._full:
            self._full.add(local)

    def load(self, ptr: str, index: str, dtype: np.dtype = np.float32) -> str:
        """Expression reading element ``index`` of a tensor of ``dtype``."""
        if np.dtype(dtype) != np.float32:
            return f"{ptr}[{index}]"
        return f"((real)({ptr})[{index}])" if ptr in self._full else f"LD({ptr}, {index})"

    def load4(self, ptr: str, index: str) -> str:
        """Four consecutive float elements from ``index`` as a ``real4``."""
        return f"TO_REAL4(vload4(0, ({ptr}) + ({index})))" if ptr in self._full else f"LD4({ptr}, {index})"

    def loadv(self, ptr: str, index: str, vec: int) -> str:
        """``vec`` (1, 2, 4, 8 or 16) consecutive float elements as a ``float{vec}``,
        whatever the arithmetic type (accumulators are float)."""
        if vec == 1:
            return f"((float)({self.load(ptr, index)}))"
        if ptr in self._full:
            return f"vload{vec}(0, ({ptr}) + ({index}))"
        if self.precision.half_arith:
            return f"convert_float{vec}(vload{vec}(0, ({ptr}) + ({index})))"
        if self.precision.half_storage:
            return f"vload_half{vec}(0, ({ptr}) + ({index}))"
        return f"vload{vec}(0, ({ptr}) + ({index}))"

    def store(self, ptr: str, index: str, value: str) -> str:
        """Statement storing ``value`` at element ``index`` of a float tensor."""
        return f"({ptr})[{index}] = (float)({value});" if ptr in self._full else f"ST({ptr}, {index}, {value});"

    def store4(self, ptr: str, index: str, value: str) -> str:
        """Statement storing a ``real4`` at four consecutive elements from ``index``."""
        if ptr in self._full:
            return f"vstore4(convert_float4({value}), 0, ({ptr}) + ({index}));"
        return f"ST4({ptr}, {index}, {value});"

    def store_output(self, index: str, value: str, pos: int = 0) -> str:
        """Statements storing ``value`` (a ``real``) at ``index`` of the step's output.

        Applies the node's fused activation and every follower, in order; ``index`` is
        the flat index into the output (row-major), which followers use to read their
        other operands.
        """
        out = self.output(pos)
        if pos != 0:
            t = self.ctx.node.outputs[pos]
            if np.dtype(self.specs[t].dtype) != np.float32:
                return f"{out}[{index}] = {value};"
            return self.store(out, index, value)
        if np.dtype(self.specs[self.out_tensor].dtype) != np.float32:
            # No followers fold into non-float outputs (see fusion); going through ``real``
            # would round integers beyond 2**24.
            return f"{out}[{index}] = {value};"
        steps, result = self.finish(value, index, vector=False)
        return f"{{ {steps}{self.store(out, index, result)} }}"

    def store_output4(self, index: str, value: str) -> str:
        """Like :meth:`store_output` for four consecutive elements along the last axis
        (``index`` is the first; the caller guarantees the last axis is a multiple of 4)."""
        steps, result = self.finish(value, index, vector=True)
        return f"{{ {steps}{self.store4(self.output(0), index, result)} }}"

    def finish(self, value: str, index: str, vector: bool) -> tuple[str, str]:
        """``value`` (C text) after the fused activation and the followers: (statements,
        result variable), for a generator still written in C text. The formulas are
        :mod:`.formulas`', rendered in this dialect; each stage goes into its own local
        variable, so an expression that uses its operand twice (HARD_SWISH,
        SQUARED_DIFFERENCE) does not double the source per follower."""
        t = ir.REAL4 if vector else ir.REAL
        renderer = CRenderer(self.dialect, self.precision)
        lines: list[str] = []

        def declare(name: str, text: str) -> ir.Sym:
            lines.append(f"const {t} {name} = {text};")
            return ir.Sym(name, t)

        v = self._follow(declare("ep_in", value), lambda name, expr: declare(name, renderer.expr(expr)),
                         lambda k, f, channels, exact: declare(f"epy{k}", self._other(f, index, channels, vector, exact)))
        return " ".join(lines) + " ", v.name

    def _other(self, f: Follower, index: str, channels: int, vector: bool, exact: bool) -> str:
        spec = self.specs[f.other]
        if f.kind == "scalar":
            if spec.value is not None:
                lit = c_float(np.asarray(spec.value).reshape(-1)[0])
                return self.vector("real4", lit) if vector else f"(real)({lit})"
            ptr = self.tensor_param(f.other)
            return self.vector("real4", self.load(ptr, "0")) if vector else self.load(ptr, "0")
        idx = index if f.kind == "same" else f"(({index}) % {channels})"
        if exact and spec.value is not None and self.precision.half_storage:
            key = ("exact", f.other)   # uploaded once per kernel, however many stores read it
            if key not in self._names:
                self._names[key] = self.const(np.asarray(spec.value, np.float32).reshape(-1), storage=False)
            ptr = self._names[key]
            return f"TO_REAL4(vload4(0, {ptr} + ({idx})))" if vector else f"(real){ptr}[{idx}]"
        ptr = self.tensor_param(f.other)
        return self.load4(ptr, idx) if vector else self.load(ptr, idx)

    # -- the kernel -----------------------------------------------------------------------
    def kernel(self, body: str, global_size: tuple[int, ...], local_size: tuple[int, ...] | None = None
               ) -> KernelSpec:
        """A kernel of ``body`` (C statements) over the parameters recorded so far."""
        d = self.dialect
        global_size = tuple(int(g) for g in global_size)
        if d.offset_param is not None:
            # Each tensor is passed as (buffer, element offset): intermediates live at offsets
            # of one arena buffer (sub-buffers are not used: PoCL 3.1 asserts on them as args).
            params = [p for k, (ptype, name, _) in enumerate(self._params) for p in (
                d.buffer_param.format(ptr=ptype, name=f"{name}_b", index=2 * k),
                d.offset_param.format(name=f"{name}_o", index=2 * k + 1))]
            views = "".join(f"  {ptype} {d.restrict} {name} = {name}_b + {name}_o;\n" for ptype, name, _ in self._params)
        else:
            params = [d.buffer_param.format(ptr=ptype, name=name, index=k)
                      for k, (ptype, name, _) in enumerate(self._params)]
            views = ""
        if d.max_buffers and len(self._params) > d.max_buffers:
            raise UnsupportedError(f"node {self.ctx.node.index} ({self.ctx.node.op}): its {d.name} kernel would take "
                                   f"{len(self._params)} buffers; {d.name} allows {d.max_buffers}")
        if d.id_params:
            params.append(d.id_params)
        guard = ""
        if local_size is None and not d.exact_grid:
            # This API runs whole groups: work-items past the global size leave at once.
            guard = "  if (" + " || ".join(f"{d.id('global', k)} >= {n}" for k, n in enumerate(global_size)) \
                + ") return;\n"
        source = f"{d.kernel_prefix} KERNEL({', '.join(params)})\n{{\n{guard}{views}{body}\n}}\n"
        return KernelSpec(source, global_size, None if local_size is None else tuple(int(x) for x in local_size),
                          [arg for _, _, arg in self._params])

    # -- kernels written as a tree (litegpu.codegen.ir), rendered for any dialect ---------
    def new_kernel(self) -> ir.KernelBuilder:
        """A builder for one kernel of this node. Its parameters are taken through
        :meth:`ir_input`, :meth:`ir_output`, :meth:`ir_tensor` and :meth:`ir_const`, which
        record what the runtime binds; :meth:`ir_kernel` renders it."""
        self._ir_args: dict[str, Arg] = {}
        self._ir_tensors: dict[int, ir.Buffer] = {}
        return ir.KernelBuilder()

    def ir_tensor(self, b: ir.KernelBuilder, t: int, writes: bool = False) -> ir.Buffer:
        """Tensor ``t`` of the partition as a parameter of ``b``'s kernel (once per tensor)."""
        if t not in self._ir_tensors:
            spec = self.specs[t]
            buf = b.buffer(spec.dtype, writes, bool(spec.full_precision))
            self._ir_args[buf.name] = Arg(tensor=t)
            self._ir_tensors[t] = buf
        return self._ir_tensors[t]

    def ir_input(self, b: ir.KernelBuilder, pos: int) -> ir.Buffer:
        """The node's input ``pos``."""
        return self.ir_tensor(b, self.ctx.node.inputs[pos])

    def ir_output(self, b: ir.KernelBuilder, pos: int = 0) -> ir.Buffer:
        """The node's output ``pos``; output 0 is the step's final output (see :meth:`output`)."""
        return self.ir_tensor(b, self.out_tensor if pos == 0 else self.ctx.node.outputs[pos], writes=True)

    def ir_const(self, b: ir.KernelBuilder, array: np.ndarray, storage: bool = True) -> ir.Buffer:
        """A constant the generator made, as :meth:`const` uploads it (float arrays in the
        tensors' storage unless ``storage`` is False, when they stay float32)."""
        array = np.ascontiguousarray(array)
        full = array.dtype == np.float32 and not storage
        buf = b.buffer(array.dtype, full_precision=full)
        stored = array if full else array.astype(self.precision.storage_dtype(array.dtype))
        stored = stored.astype(self.dialect.storage_dtype(stored.dtype))
        self._ir_args[buf.name] = Arg(const=stored)
        return buf

    def ir_store_output(self, b: ir.KernelBuilder, index: ir.Operand, value: ir.Expr, pos: int = 0) -> None:
        """Store ``value`` (a ``real``, or a ``real4`` for four consecutive elements along the
        last axis) at ``index`` of the node's output ``pos``: for output 0, of the step's
        final output after the node's fused activation and every follower, in order
        (``index`` is the flat row-major index, which followers read their operands at)."""
        index = ir.as_expr(index, ir.INT)
        out = self.ir_output(b, pos)
        if pos != 0 or not out.is_float:
            # No followers fold into other outputs or non-float ones (see fusion); a float
            # value stored into integers is converted as C converts.
            b.store(out, index, value if value.type.scalar == out.element().scalar else value.cast(out.element()))
            return
        vector = value.type.lanes == 4
        v = self._follow(value, b.let, lambda k, f, channels, exact: self._ir_other(b, f, index, channels, vector, exact))
        b.store(out, index, v)

    def _follow(self, value: ir.Expr, declare: Callable[[str, ir.Expr], ir.Sym],
                other: Callable[[int, Follower, int, bool], ir.Expr]) -> ir.Sym:
        """``value`` after the node's fused activation and every follower, in order: each
        stage is ``declare``d as a variable (an expression that reads its operand twice, as
        HARD_SWISH and the clamps do, then repeats no source); ``other(k, follower,
        channels, exact)`` gives a binary follower's other operand."""
        shape = self.specs[self.out_tensor].shape
        channels = int(shape[-1]) if shape else 1
        # A chain that ends on a quantization grid (the float view's requantization) reads
        # its constants in float32 even in half storage: scales and integer biases must
        # not round to 11 bits.
        exact = any(f.ctx.node.op == "QUANT_SIM" for f in self.followers)

        def stage(k: int, expr: ir.Expr, activation: str) -> ir.Sym:
            v = declare(f"ep{k}", expr)
            if ACTIVATION_RANGES[activation] == (-np.inf, np.inf):
                return v
            return declare(f"ep{k}c", formulas.clamp(activation, v))

        v = stage(0, value, self.attrs.get("activation", "NONE"))
        for k, f in enumerate(self.followers, start=1):
            if f.other is None:
                expr = formulas.UNARY[f.ctx.node.op](v, f.ctx.attrs)
            else:
                y = other(k, f, channels, exact)
                expr = formulas.BINARY[f.ctx.node.op](*((y, v) if f.swap else (v, y)), f.ctx.attrs)
            v = stage(k, expr, f.ctx.attrs.get("activation", "NONE"))
        return v

    def _ir_other(self, b: ir.KernelBuilder, f: Follower, index: ir.Expr, channels: int, vector: bool,
                  exact: bool) -> ir.Expr:
        """A follower's other operand at the element(s) being stored."""
        spec = self.specs[f.other]
        lanes = 4 if vector else 1
        if f.kind == "scalar":
            if spec.value is not None:
                return ir.lit(float(np.asarray(spec.value).reshape(-1)[0]), ir.REAL.with_lanes(lanes))
            one = self.ir_tensor(b, f.other).load(0)
            return ir.vector(ir.REAL4, one) if vector else one
        idx = index if f.kind == "same" else index % channels
        if exact and spec.value is not None and self.precision.half_storage:
            key = -1 - f.other   # uploaded once per kernel, however many stores read it
            if key not in self._ir_tensors:
                self._ir_tensors[key] = self.ir_const(b, np.asarray(spec.value, np.float32).reshape(-1), storage=False)
            return self._ir_tensors[key].load(idx, lanes)
        return self.ir_tensor(b, f.other).load(idx, lanes)

    def ir_kernel(self, b: ir.KernelBuilder, global_size: tuple[int, ...],
                  local_size: tuple[int, ...] | None = None) -> KernelSpec:
        """The kernel ``b`` built, rendered in this node's dialect and precision."""
        k = b.kernel(global_size, local_size)
        if self.precision.half_arith and any(p.full_precision and self._ir_args[p.name].tensor is not None
                                             for p in k.params):
            # A tensor kept at full precision holds a 16-bit grid, which half arithmetic
            # cannot (a generator's float32 tables, such as resize taps, need no such care).
            k = ir.float_arithmetic(k)
        d = self.dialect
        if d.max_buffers and len(k.params) > d.max_buffers:
            raise UnsupportedError(f"node {self.ctx.node.index} ({self.ctx.node.op}): its {d.name} kernel would take "
                                   f"{len(k.params)} buffers; {d.name} allows {d.max_buffers}")
        try:
            source = d.render(k, self.precision)
        except TypeError as exc:   # a type or size this API has not (WGSL: int64, 8 lanes)
            raise UnsupportedError(f"no {d.name} kernel for this variant: {exc}") from None
        return KernelSpec(source, k.global_size, k.local_size, [self._ir_args[p.name] for p in k.params])

    # -- dialect spellings ----------------------------------------------------------------
    def global_ptr(self, ctype: str, const: bool = False) -> str:
        """The type of a pointer to ``ctype`` elements in device memory."""
        return f"{self.dialect.global_space}{'const ' if const else ''}{ctype}*"

    def local_ptr(self, ctype: str, const: bool = False) -> str:
        """The type of a pointer to ``ctype`` elements in local memory."""
        return f"{'const ' if const else ''}{self.dialect.local_space}{ctype}*"

    def local_array(self, ctype: str, name: str, size: int) -> str:
        """The declaration of a local-memory array (at the top of the kernel body)."""
        return self.dialect.local_array.format(type=ctype, name=name, size=size)

    def barrier(self) -> str:
        """A statement: the group's work-items wait here and see each other's local stores."""
        return self.dialect.barrier

    def global_id(self, d: int) -> str:
        """This work-item's global id along axis ``d``."""
        return self.dialect.id("global", d)

    def local_id(self, d: int) -> str:
        """This work-item's id within its group along axis ``d``."""
        return self.dialect.id("local", d)

    def vector(self, vtype: str, *args: str) -> str:
        """A ``vtype`` value made of ``args`` (or one scalar broadcast to every lane)."""
        return self.dialect.make_vector(vtype, *args)

    def choose(self, cond: str, a: str, b: str) -> str:
        """``a`` where ``cond`` holds, else ``b``: lane by lane when they are vectors (the
        condition then being a comparison's mask), as OpenCL's ``?:``."""
        return self.dialect.choose.format(cond=cond, a=a, b=b)

    def lane(self, var: str, j: int, width: int) -> str:
        """Lane ``j`` of the ``width``-lane vector ``var``."""
        return self.dialect.vector_lane(var, j, width)

    def reset(self) -> None:
        """Forget recorded parameters (to write a second kernel of the same node)."""
        self._params.clear()
        self._names.clear()
        self._full.clear()


def round_up(n: int, multiple: int) -> int:
    """``n`` rounded up to a multiple of ``multiple``."""
    return (n + multiple - 1) // multiple * multiple


def strides_of(shape: tuple[int, ...]) -> list[int]:
    """Row-major element strides of ``shape``."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= int(d)
    return out[::-1]
