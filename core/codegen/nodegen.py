"""What a kernel generator writes with, and what it returns.

A generator (registered per op in :mod:`litegpu.codegen.kernels`) receives a
:class:`NodeGen` for one node at compile time, builds the node's kernels as
:mod:`.ir` trees (shapes, strides, constants and the fused activation baked in) and
returns them rendered in the node's dialect as :class:`KernelSpec` objects: source,
launch sizes, and the arguments (tensors of the partition, constants to upload). The
program builder dedupes sources, names kernels and binds arguments; a generator never
touches a GPU API.

Storage and arithmetic precision are the renderer's (:class:`Precision`): one tree
serves F32, F32_F16 (half storage, float arithmetic) and F16 (half arithmetic where the
device has it). A tensor marked ``full_precision`` (see :class:`litegpu.ops.TensorSpec`)
stays float32 in half storage; its buffer says so and its loads and stores follow.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from litegpu.backend import HALF_ARITHMETIC, NodeContext
from litegpu.errors import InvalidArgumentError, UnsupportedError
from litegpu.ops import VIEW_OPS, TensorSpec
from litegpu.ops.registry import ACTIVATION_RANGES

from . import formulas, ir
from .dialect import Dialect
from .opencl import OPENCL


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


@dataclass
class Arg:
    """One kernel argument: a tensor of the partition (by index) or a constant to upload."""

    tensor: int | None = None          # a tensor index of the subgraph
    const: np.ndarray | None = None    # a constant the generator made (already in its final dtype)


@dataclass
class KernelSpec:
    """One kernel launch of a node: source, sizes, arguments.

    ``source`` is one kernel named ``KERNEL`` in its dialect; the builder replaces the
    name with one derived from the source, so identical kernels share one compiled
    function. ``args`` are its buffer parameters in order. ``copy_of``: ``(source,
    destination)`` tensors when the kernel only copies one into the other element for
    element, so a run that binds both to one buffer skips it (see
    :func:`litegpu.codegen.render.running`).
    """

    source: str
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None
    args: list[Arg]
    copy_of: tuple[int, int] | None = None

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
    constant), "same" (the output's shape), "channel" (a vector over the last axis) or
    "chain" (a value the kernel computed: the producer's output or an earlier follower's).
    """

    ctx: NodeContext
    other: int | None = None
    swap: bool = False
    kind: str = ""


#: Work-groups one axis of a launch may count on every API (CUDA's grid y and z, WebGPU's
#: ``maxComputeWorkgroupsPerDimension``): past it a row op takes its one-work-item form,
#: and the hybrid product's work-groups take several outputs each.
MAX_GROUPS = 65535


def group_per_output(g: "NodeGen", b: ir.KernelBuilder, outputs: int, output: Callable[[ir.Sym], None]
                     ) -> "KernelSpec":
    """The kernel ``b`` holds, with a work-group of ``g.lanes`` work-items on each of
    ``outputs`` elements: ``output(e)`` builds element ``e``'s work. Past
    :data:`MAX_GROUPS` outputs each work-group takes every ``MAX_GROUPS``-th in turn, a
    barrier between turns (the next reuses the group's local memory)."""
    groups = min(outputs, MAX_GROUPS)
    with b.for_("e", b.group_id(1), outputs, groups) as e:
        output(e)
        if outputs > groups:
            b.barrier()
    return g.kernel(b, (g.lanes, groups), (g.lanes, 1))


class NodeGen:
    """What a generator writes one node's kernels with.

    :meth:`new_kernel` starts a kernel; the node's tensors and the generator's constants
    become its parameters through :meth:`input`, :meth:`output`, :meth:`tensor` and
    :meth:`const`, which record what the runtime binds; :meth:`store_output` stores
    through the fused activation and the folded followers; :meth:`kernel` renders it in
    the node's dialect and precision.
    """

    def __init__(self, ctx: NodeContext, precision: Precision, specs: dict[int, TensorSpec],
                 followers: list[Follower] | None = None, out_tensor: int | None = None,
                 dialect: Dialect = OPENCL, lanes: int = 1) -> None:
        self.ctx = ctx
        self.dialect = dialect
        #: Work-items that share one row or output in kernels that split one (see
        #: :func:`litegpu.codegen.render.kernel_lanes`); 1: a work-item each.
        self.lanes = lanes
        self.attrs = ctx.attrs
        self.precision = precision
        self.specs = specs
        self.followers = followers or []
        # The tensor the step finally writes: the last follower's output, else the node's.
        self.out_tensor = out_tensor if out_tensor is not None else ctx.node.outputs[0]
        self._args: dict[str, Arg] = {}
        self._tensors: dict[int, ir.Buffer] = {}

    def spec(self, t: int) -> TensorSpec:
        """The spec of tensor ``t``."""
        return self.specs[t]

    def new_kernel(self) -> ir.KernelBuilder:
        """A builder for one kernel of this node (see the class docstring)."""
        self._args.clear()
        self._tensors.clear()
        return ir.KernelBuilder()

    def tensor(self, b: ir.KernelBuilder, t: int, writes: bool = False) -> ir.Buffer:
        """Tensor ``t`` of the partition as a parameter of ``b``'s kernel (once per tensor)."""
        if t not in self._tensors:
            spec = self.specs[t]
            buf = b.buffer(spec.dtype, writes, bool(spec.full_precision))
            self._args[buf.name] = Arg(tensor=t)
            self._tensors[t] = buf
        return self._tensors[t]

    def input(self, b: ir.KernelBuilder, pos: int) -> ir.Buffer:
        """The node's input ``pos``."""
        return self.tensor(b, self.ctx.node.inputs[pos])

    def output(self, b: ir.KernelBuilder, pos: int = 0) -> ir.Buffer:
        """The node's output ``pos``; output 0 is the step's final output (the last folded
        follower's, when there are followers)."""
        return self.tensor(b, self.out_tensor if pos == 0 else self.ctx.node.outputs[pos], writes=True)

    def const(self, b: ir.KernelBuilder, array: np.ndarray, storage: bool = True) -> ir.Buffer:
        """A constant the generator made, uploaded with the kernel: a float array in the
        tensors' storage unless ``storage`` is False, when it stays float32 (exact scales,
        interpolation taps); other arrays as the dialect stores their dtype."""
        array = np.ascontiguousarray(array)
        full = array.dtype == np.float32 and not storage
        buf = b.buffer(array.dtype, full_precision=full)
        stored = array if full else array.astype(self.precision.storage_dtype(array.dtype))
        stored = stored.astype(self.dialect.storage_dtype(stored.dtype))
        self._args[buf.name] = Arg(const=stored)
        return buf

    def store_output(self, b: ir.KernelBuilder, index: ir.Operand, value: ir.Expr, pos: int = 0) -> None:
        """Store ``value`` (a ``real``, or a ``real4`` for four consecutive elements along the
        last axis) at ``index`` of the node's output ``pos``: for output 0, of the step's
        final output after the node's fused activation and every follower, in order
        (``index`` is the flat row-major index, which followers read their operands at)."""
        index = ir.as_expr(index, ir.INT)
        out = self.output(b, pos)
        if pos != 0 or not out.is_float:
            # No followers fold into other outputs or non-float ones (see fusion); a float
            # value stored into integers is converted as C converts.
            b.store(out, index, value if value.type.scalar == out.element().scalar else value.cast(out.element()))
            return
        vector = value.type.lanes == 4
        v = self._follow(value, b.let, lambda k, f, channels, exact: self._other(b, f, index, channels, vector, exact))
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
        chain = {self.ctx.node.outputs[0]: v}   # the chain's values by tensor (kind "chain" reads them)
        for k, f in enumerate(self.followers, start=1):
            if f.ctx.node.op in VIEW_OPS:   # a reshape keeping the last axis: the same value
                chain[f.ctx.node.outputs[0]] = v
                continue
            if f.other is None:
                expr = formulas.UNARY[f.ctx.node.op](v, f.ctx.attrs)
            else:
                y = chain[f.other] if f.kind == "chain" else other(k, f, channels, exact)
                expr = formulas.BINARY[f.ctx.node.op](*((y, v) if f.swap else (v, y)), f.ctx.attrs)
            v = stage(k, expr, f.ctx.attrs.get("activation", "NONE"))
            chain[f.ctx.node.outputs[0]] = v
        return v

    def _other(self, b: ir.KernelBuilder, f: Follower, index: ir.Expr, channels: int, vector: bool,
               exact: bool) -> ir.Expr:
        """A follower's other operand at the element(s) being stored."""
        spec = self.specs[f.other]
        lanes = 4 if vector else 1
        if f.kind == "scalar":
            if spec.value is not None:
                return ir.lit(float(np.asarray(spec.value).reshape(-1)[0]), ir.REAL.with_lanes(lanes))
            one = self.tensor(b, f.other).load(0)
            return ir.vector(ir.REAL4, one) if vector else one
        idx = index if f.kind == "same" else index % channels
        if exact and spec.value is not None and self.precision.half_storage:
            key = -1 - f.other   # uploaded once per kernel, however many stores read it
            if key not in self._tensors:
                self._tensors[key] = self.const(b, np.asarray(spec.value, np.float32).reshape(-1), storage=False)
            return self._tensors[key].load(idx, lanes)
        return self.tensor(b, f.other).load(idx, lanes)

    def _keeps_float32(self, k: ir.Kernel) -> bool:
        """Whether ``k`` binds data kept in float32 in half storage, or computes a value the
        model keeps so (an output of the node or of a folded follower): it is there to stay
        exact (a 16-bit grid, the float view's integer sums and requantization scales,
        XNNPACK's resize taps), and half arithmetic would round it all the same (an int8
        conv's requantized sums by up to 72 quanta; a global mean's sum of 3136 codes
        overflowed)."""
        step = [self.ctx, *(f.ctx for f in self.followers)]
        return any(p.full_precision for p in k.params) or any(
            t in self.specs and self.specs[t].full_precision for c in step for t in c.node.outputs)

    def kernel(self, b: ir.KernelBuilder, global_size: tuple[int, ...],
               local_size: tuple[int, ...] | None = None) -> KernelSpec:
        """The kernel ``b`` built, rendered in this node's dialect and precision."""
        k = b.kernel(global_size, local_size)
        if self.precision.half_arith and self._keeps_float32(k):
            k = ir.float_arithmetic(k)
        d = self.dialect
        if d.max_buffers and len(k.params) > d.max_buffers:
            raise UnsupportedError(f"node {self.ctx.node.index} ({self.ctx.node.op}): its {d.name} kernel would take "
                                   f"{len(k.params)} buffers; {d.name} allows {d.max_buffers}")
        try:
            source = d.render(k, self.precision)
        except TypeError as exc:   # a type or size this API has not (WGSL: int64, 8 lanes)
            raise UnsupportedError(f"{d.name}: {exc}") from None
        return KernelSpec(source, k.global_size, k.local_size, [self._args[p.name] for p in k.params])


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
