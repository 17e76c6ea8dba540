"""LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM: a whole sequence in one launch, written with
:mod:`litegpu.codegen.ir`, so every dialect (WGSL included) renders it.

A work-group per batch row runs every time step of that row (rows are independent,
so groups never wait for each other). The group keeps the row's recurrent state in
local memory as float, whatever the storage precision: the output state ``h``
double-buffered, the cell state ``c``, and, per variant, the projection input ``m``
and the layer-norm pre-activations. One time step is:

1. gates: cells are cut into blocks of ``4 * R`` (R float4 groups); a block's
   work-item accumulates all four gates of its cells as ``4 * R`` float4 registers
   over the input and recurrent weights, repacked at compile time to
   ``[n_input + n_output][gate][n_cell]`` so each load is four neighbouring cells of
   one gate; ``x`` and ``h`` are scalar broadcasts;
2. (layer norm) mean and stddev of each normalized gate's row, then the cell update;
3. the cell update, the output gate, ``m = o * act(c)``;
4. (projection) blocks of output units: ``W_proj m + b``, clipped.

The new ``h`` goes to the output and to the other half of the ``h`` buffer, so nobody
overwrites state that a work-item of the same group still reads; barriers separate
the phases. The initial state is read from the state tensors (inputs 18 and 19) and
the final state is written back into them, as LiteRT updates its variable tensors.

The kernel takes at most seven buffers (x, y, the two states, the gate weights, one
table of the per-cell vectors and the projection with its bias as a last row), within
WebGPU's eight. Everything is float4 (WGSL's widest vector is enough); the local
state must fit the group's local memory (the dialect's ``max_local_bytes``: 32 KiB,
WebGPU's 16 KiB).

Work-items per group (``LANES``): on PoCL's CPU device a group runs on one core and
its barriers are expensive, so one work-item walking the cell blocks is fastest
(measured 4-5x faster than 4 work-items with barriers); a GPU wants more lanes, but
a generator does not know its device yet. Rows run in parallel either way.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from litegpu.ops.nn import LAYER_NORM_EPSILON, LSTM_INPUT_NAMES
from litegpu.ops.registry import CLAMP_ACTIVATIONS

from .. import formulas, ir
from ..ir import FLOAT, FLOAT4, Expr, Sym, call, select
from ..nodegen import KernelSpec, NodeGen
from . import Decline, generator

_F32 = np.dtype(np.float32)
_GATES = ("input", "forget", "cell", "output")
_OUTPUT_STATE, _CELL_STATE = 18, 19
# The per-cell vectors ([4][cp] each) in the order they sit in the packed table.
_TABLES = ("bias", "post", "norm", "peep")

#: Work-items per batch row (see the module docstring). Any value is correct.
LANES = 1

# Inside an LSTM the activation is a real function on the cell input and state (TFLite's
# ApplyActivationToVector), not a fused output clamp: TANH really is tanh here.
_ACTIVATIONS = (*CLAMP_ACTIVATIONS, "TANH", "SIGN_BIT")


def _activation(b: ir.KernelBuilder, name: str, v: Expr) -> Expr:
    """The LSTM activation ``name`` of the float4 ``v``; a clamp lets NaN through, as
    XNNPACK's compares and selects do (:func:`litegpu.codegen.formulas.clamp`)."""
    if name == "TANH":
        return call("tanh", v)
    if name == "SIGN_BIT":
        return select(call("signbit", v), ir.lit(1.0, FLOAT4), ir.lit(0.0, FLOAT4))
    if name == "NONE":
        return v
    # The clamp reads its operand more than once: name it rather than repeat a load.
    return formulas.clamp(name, v if isinstance(v, Sym) else b.let("av", v, FLOAT4))


def _sigmoid(v: Expr) -> Expr:
    return 1.0 / (1.0 + call("exp", -v))




def _weights(g: NodeGen) -> dict[str, np.ndarray | None]:
    """The weight inputs by name (None where omitted); Decline if one is not constant,
    as weights are repacked at compile time."""
    out: dict[str, np.ndarray | None] = {}
    for pos, name in enumerate(LSTM_INPUT_NAMES):
        if pos in (0, _OUTPUT_STATE, _CELL_STATE):
            continue
        spec = g.ctx.inputs[pos] if pos < len(g.ctx.inputs) else None
        if spec is not None and spec.value is None:
            raise Decline(f"LSTM {name} (input {pos}) is not constant: weights are repacked at compile time")
        out[name] = None if spec is None else np.asarray(spec.value, np.float32)
    return out


def _check_state(g: NodeGen) -> tuple[int, int]:
    """The tensor indices of the output and cell state (the executor hands them to the
    partition as inputs and outputs, so the state written back reaches the next invoke)."""
    states = []
    for pos in (_OUTPUT_STATE, _CELL_STATE):
        t, spec = g.ctx.node.inputs[pos], g.ctx.inputs[pos]
        if spec.value is not None:
            raise Decline(f"LSTM state (input {pos}) is a constant; the kernel updates its state in place")
        states.append(t)
    return states[0], states[1]


def _block(n: int) -> tuple[int, int]:
    """(float4 groups per work-item block R, padded size) for ``n`` units: R divides
    ceil(n / 4), as large as 4 (16 float4 accumulators fit the registers)."""
    quads = -(-n // 4)
    return next(r for r in (4, 3, 2, 1) if quads % r == 0), 4 * quads


@dataclass(frozen=True)
class _Shape:
    """Sizes of one LSTM node, padded where the kernel works in float4 blocks."""

    steps: int
    batch: int
    n_input: int
    n_cell: int
    n_output: int
    seq: bool
    time_major: bool

    @property
    def cell_block(self) -> tuple[int, int]:
        """(R, padded n_cell) of the gate phase."""
        return _block(self.n_cell)

    @property
    def out_block(self) -> tuple[int, int]:
        """(R, padded n_output) of the projection phase."""
        return _block(self.n_output)

    def row(self, t: Expr, b: Expr, width: int) -> Expr:
        """Element offset of row ``b`` at time ``t`` of x or y ([T,B,*] time-major, else [B,T,*])."""
        if self.time_major or not self.seq:
            return (t * self.batch + b) * width
        return (b * self.steps + t) * width


def _repack(w: dict, s: _Shape, layer_norm: tuple[bool, ...], tables: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Weights as the kernel reads them, padded with zeros to whole blocks; absent gates
    (CIFG's input gate) and absent parts are zeros:

    - ``W [n_input + n_output][4][cp]``: input then recurrent weights, gates i, f, c, o;
    - ``tab [len(tables)][4][cp]``: of ``tables``, ``bias`` is added before the gate (0 for
      layer-norm gates), ``post`` after the norm; ``peep`` and ``norm`` are the peephole
      and layer-norm weights;
    - ``proj [n_cell + 1][pp]``: the projection transposed, its bias as the last row.
    """
    _, cp = s.cell_block
    _, pp = s.out_block
    out = {name: np.zeros((4, cp), np.float32) for name in _TABLES}
    wcat = np.zeros((s.n_input + s.n_output, 4, cp), np.float32)
    for k, gate in enumerate(_GATES):
        if w[f"input_to_{gate}"] is None:
            continue
        wcat[:s.n_input, k, :s.n_cell] = w[f"input_to_{gate}"].T
        wcat[s.n_input:, k, :s.n_cell] = w[f"recurrent_to_{gate}"].T
        out["post" if layer_norm[k] else "bias"][k, :s.n_cell] = w[f"{gate}_gate_bias"]
        if layer_norm[k]:
            out["norm"][k, :s.n_cell] = w[f"{gate}_layer_norm"]
        if gate != "cell" and w[f"cell_to_{gate}"] is not None:
            out["peep"][k, :s.n_cell] = w[f"cell_to_{gate}"]
    packed = {"W": wcat, "tab": np.stack([out[name] for name in tables])}
    if w["projection_weights"] is not None:
        proj = np.zeros((s.n_cell + 1, pp), np.float32)
        proj[:s.n_cell, :s.n_output] = w["projection_weights"].T
        if w["projection_bias"] is not None:
            proj[s.n_cell, :s.n_output] = w["projection_bias"]
        packed["proj"] = proj
    return packed


@generator("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def lstm(g: NodeGen) -> list[KernelSpec]:
    """The whole op in one launch: see the module docstring."""
    ctx, attrs = g.ctx, g.attrs
    if any(s is not None and s.dtype != _F32 for s in (*ctx.inputs, *ctx.outputs)):
        raise Decline("LSTM on non-float tensors")
    w = _weights(g)
    h_state, c_state = _check_state(g)
    seq = ctx.node.op == "UNIDIRECTIONAL_SEQUENCE_LSTM"
    time_major = bool(attrs.get("time_major", False))
    x_shape = tuple(ctx.inputs[0].shape)
    steps, batch = ((x_shape[0], x_shape[1]) if time_major else (x_shape[1], x_shape[0])) if seq \
        else (1, x_shape[0])
    s = _Shape(steps, batch, x_shape[-1], w["input_to_forget"].shape[0], w["recurrent_to_forget"].shape[1],
               seq, time_major)
    if s.batch == 0 or s.steps == 0:
        return []   # no output elements, and the state stays as it is
    if attrs["activation"] not in _ACTIVATIONS:
        raise Decline(f"LSTM activation {attrs['activation']}")
    cifg = w["input_to_input"] is None
    layer_norm = tuple(w[f"{gate}_layer_norm"] is not None and not (cifg and gate == "input") for gate in _GATES)
    peephole = any(w[f"cell_to_{gate}"] is not None for gate in ("input", "forget", "output"))
    projection = w["projection_weights"] is not None
    _, cp = s.cell_block
    _, pp = s.out_block
    local_floats = 2 * pp + cp + (cp if projection else 0) + (4 * cp + 8 if any(layer_norm) else 0)
    limit = g.dialect.max_local_bytes
    if local_floats * 4 > limit:
        raise Decline(f"LSTM state of {local_floats * 4} bytes per batch row does not fit one work-group's "
                      f"local memory ({limit} bytes in {g.dialect.name})")

    # Parameters (the order they are asked for is the kernel's parameter order).
    b = g.new_kernel()
    tables = ("bias",) + (("post", "norm") if any(layer_norm) else ()) + (("peep",) if peephole else ())
    packed = _repack(w, s, layer_norm, tables)
    bufs = {"x": g.input(b, 0), "y": g.output(b, 0), "hs": g.tensor(b, h_state, writes=True),
            "cs": g.tensor(b, c_state, writes=True), "W": g.const(b, packed["W"]),
            "tab": g.const(b, packed["tab"])}
    if projection:
        bufs["proj"] = g.const(b, packed["proj"])
    _Writer(b, s, bufs, tables, attrs, cifg, layer_norm, peephole).body()
    return [g.kernel(b, (LANES, s.batch), (LANES, 1))]


class _Writer:
    """Builds the kernel body of one LSTM node (see the module docstring)."""

    def __init__(self, b: ir.KernelBuilder, s: _Shape, bufs: dict[str, ir.Buffer], tables: tuple[str, ...],
                 attrs: dict, cifg: bool, layer_norm: tuple[bool, ...], peephole: bool) -> None:
        self.b, self.s, self.bufs = b, s, bufs
        self.activation = attrs["activation"]
        self.cell_clip, self.proj_clip = float(attrs["cell_clip"]), float(attrs["proj_clip"])
        self.cifg, self.ln, self.peephole, self.projection = cifg, layer_norm, peephole, "proj" in bufs
        self.r, self.cp = s.cell_block
        self.rp, self.pp = s.out_block
        self.table_rows = {name: j for j, name in enumerate(tables)}

    def body(self) -> None:
        """Prologue (state into local memory), the time loop, epilogue (state back)."""
        b, s, cp, pp = self.b, self.s, self.cp, self.pp
        self.hl = b.local_array("hl", FLOAT, 2 * pp)
        self.cl = b.local_array("cl", FLOAT, cp)
        if self.projection:
            self.ml = b.local_array("ml", FLOAT, cp)
        if any(self.ln):
            self.gz = b.local_array("gz", FLOAT, 4 * cp)
            self.st = b.local_array("st", FLOAT, 8)
        self.lid, self.row_b = b.let("lid", b.local_id(0)), b.let("b", b.global_id(1))
        # Padding units start at 0; they never reach an output or the state.
        self._state_in(self.hl, self.bufs["hs"], pp, s.n_output)
        self._state_in(self.cl, self.bufs["cs"], cp, s.n_cell)
        b.barrier()
        with b.for_("t", 0, s.steps) as t:
            self.t = t
            self.hcur = b.let("hcur", (t & 1) * pp)
            self.hnext = b.let("hnext", ((t + 1) & 1) * pp)
            self._gates()
            if self.projection:
                self._projection()
        with b.for_("i", self.lid, s.n_output, LANES) as i:
            b.store(self.bufs["hs"], self.row_b * s.n_output + i, self.hl.load(ir.plus(i, (s.steps & 1) * pp)))
        with b.for_("i", self.lid, s.n_cell, LANES) as i:
            b.store(self.bufs["cs"], self.row_b * s.n_cell + i, self.cl.load(i))

    # -- pieces ---------------------------------------------------------------------------
    def _state_in(self, array: ir.LocalArray, state: ir.Buffer, padded: int, n: int) -> None:
        """This row's ``n`` units of ``state`` into ``array``, zeros up to ``padded``."""
        b = self.b
        with b.for_("i", self.lid, padded, LANES) as i:
            value = state.load(self.row_b * n + i, as_float=True)
            if n == padded:
                b.local_store(array, i, value)
            else:   # an if, not a select: WGSL's select would read past the row too
                with b.if_(i < n):
                    b.local_store(array, i, value)
                with b.else_():
                    b.local_store(array, i, 0.0)

    @contextlib.contextmanager
    def _blocks(self, n_blocks: int, width: int, name: str) -> Iterator[Sym]:
        """A loop of this work-item's blocks (yields the block's first unit), then a barrier."""
        b = self.b
        with b.for_("blk", self.lid, n_blocks, LANES) as blk:
            yield b.let(name, blk * width)
        b.barrier()

    def _table(self, name: str, gate: int, q: int, c0: Expr) -> Expr:
        """float4 of a [4][cp] table at gate ``gate``, cells c0 + 4q ..."""
        row = self.table_rows[name]
        return self.bufs["tab"].load(ir.plus(c0, (4 * row + gate) * self.cp + 4 * q), 4, as_float=True)

    def _store_y(self, value: Sym, col: Expr, width: int) -> None:
        """Store a float4 into output columns col..col+3 (masked past ``width``)."""
        b, y, off = self.b, self.bufs["y"], self.s.row(self.t, self.row_b, width)
        if width % 4 == 0:
            b.store(y, off + col, value)
            return
        for j in range(4):
            with b.if_(ir.plus(col, j) < width):
                b.store(y, ir.plus(off + col, j), value.lane(j))

    def _mac(self, z: dict[tuple[int, int], Sym], v: Sym, wr: Sym) -> None:
        """Every accumulator += ``v`` times its float4 of the weight row at ``wr``."""
        for (k, q), acc in z.items():
            self.b.assign(acc, v * self.bufs["W"].load(ir.plus(wr, k * self.cp + 4 * q), 4, as_float=True), "+")

    def _gates(self) -> None:
        """Gate phase, then (layer norm) the normalizing phases; ends after a barrier."""
        b, s, cp = self.b, self.s, self.cp
        with self._blocks(cp // (4 * self.r), 4 * self.r, "c0") as c0:
            z = {(k, q): b.var(f"z{k}_{q}", self._table("bias", k, q, c0), FLOAT4)
                 for k in range(4) for q in range(self.r)}   # gate k, float4 group q
            xr = b.let("xr", s.row(self.t, self.row_b, s.n_input))
            with b.for_("k", 0, s.n_input) as k:
                v = b.let("v", self.bufs["x"].load(xr + k, as_float=True), FLOAT)
                self._mac(z, v, b.let("wr", k * (4 * cp) + c0))
            with b.for_("k", 0, s.n_output) as k:
                v = b.let("v", self.hl.load(self.hcur + k), FLOAT)
                self._mac(z, v, b.let("wr", (s.n_input + k) * (4 * cp) + c0))
            for q in range(self.r):
                zq = [z[k, q] for k in range(4)]
                cold = b.let("cold", self.cl.load(ir.plus(c0, 4 * q), 4), FLOAT4)
                if self.peephole:
                    b.assign(zq[0], self._table("peep", 0, q, c0) * cold, "+")
                    b.assign(zq[1], self._table("peep", 1, q, c0) * cold, "+")
                if any(self.ln):
                    for k in range(4):
                        b.local_store(self.gz, ir.plus(c0, k * cp + 4 * q), zq[k])
                else:
                    self._update(zq, q, c0, cold)
        if any(self.ln):
            self._normalized_update()

    def _normalized_update(self) -> None:
        """Layer norm: stats of the normalized i/f/c gates, the cell update from ``gz``;
        then, when the output gate is normalized, its stats and the output."""
        b, cp, r = self.b, self.cp, self.r
        self._stats([k for k in range(3) if self.ln[k]])
        with self._blocks(cp // (4 * r), 4 * r, "c0") as c0:
            for q in range(r):
                zq = [b.var(f"z{k}_{q}", self.gz.load(ir.plus(c0, k * cp + 4 * q), 4), FLOAT4) for k in range(4)]
                for k in range(3):
                    if self.ln[k]:
                        self._normalize(zq[k], k, q, c0)
                self._update(zq, q, c0, self.cl.load(ir.plus(c0, 4 * q), 4), output_waits=self.ln[3])
        if self.ln[3]:
            # The output gate's norm needs every new cell (its peephole) first.
            self._stats([3])
            with self._blocks(cp // (4 * r), 4 * r, "c0") as c0:
                for q in range(r):
                    z3 = b.var(f"z3_{q}", self.gz.load(ir.plus(c0, 3 * cp + 4 * q), 4), FLOAT4)
                    self._normalize(z3, 3, q, c0)
                    self._output(z3, q, c0, self.cl.load(ir.plus(c0, 4 * q), 4))

    def _update(self, z: list[Sym], q: int, c0: Sym, cold: Expr, output_waits: bool = False) -> None:
        """The new cell state of group ``q`` from z0..z3 and the old state; then the output
        gate, unless it ``output_waits`` for its layer norm (then z3 goes back to gz)."""
        b = self.b
        f = b.let("f", _sigmoid(z[1]), FLOAT4)
        ig = b.let("ig", 1.0 - f if self.cifg else _sigmoid(z[0]), FLOAT4)
        cn = b.var("cn", f * cold + ig * _activation(b, self.activation, z[2]), FLOAT4)
        if self.cell_clip > 0:
            b.assign(cn, call("clamp", cn, -self.cell_clip, self.cell_clip))
        b.local_store(self.cl, ir.plus(c0, 4 * q), cn)
        if self.peephole:
            b.assign(z[3], self._table("peep", 3, q, c0) * cn, "+")
        if output_waits:
            b.local_store(self.gz, ir.plus(c0, 3 * self.cp + 4 * q), z[3])
        else:
            self._output(z[3], q, c0, cn)

    def _output(self, z3: Sym, q: int, c0: Sym, cn: Expr) -> None:
        """``m = sigmoid(z3) * act(c)`` of group ``q`` into ``ml`` (projection) or the
        new ``h`` and the output."""
        b = self.b
        m = b.let("m", _sigmoid(z3) * _activation(b, self.activation, cn), FLOAT4)
        if self.projection:
            b.local_store(self.ml, ir.plus(c0, 4 * q), m)
            return
        b.local_store(self.hl, ir.plus(self.hnext + c0, 4 * q), m)
        self._store_y(m, ir.plus(c0, 4 * q), self.s.n_output)

    def _normalize(self, z: Sym, k: int, q: int, c0: Sym) -> None:
        """Layer norm of gate ``k`` (group ``q``): (z - mean) / stddev * weight + bias."""
        st = self.st
        self.b.assign(z, (z - st.load(2 * k)) * st.load(2 * k + 1) * self._table("norm", k, q, c0)
                      + self._table("post", k, q, c0))

    def _stats(self, gates: list[int]) -> None:
        """Mean and 1/stddev of the row's pre-activations of ``gates`` into ``st``, two-pass
        like TFLite's MeanStddevNormalization; ends with a barrier."""
        if not gates:
            return
        b, n, gz = self.b, self.s.n_cell, self.gz
        for j, k in enumerate(gates):
            with b.if_(self.lid.eq(j % LANES)):
                sum_ = b.var("sum", 0.0, FLOAT)
                sq = b.var("sq", 0.0, FLOAT)
                with b.for_("c", 0, n) as c:
                    b.assign(sum_, gz.load(ir.plus(c, k * self.cp)), "+")
                mean = b.let("mean", sum_ / n, FLOAT)
                with b.for_("c", 0, n) as c:
                    d = b.let("d", gz.load(ir.plus(c, k * self.cp)) - mean, FLOAT)
                    b.assign(sq, d * d, "+")
                b.local_store(self.st, 2 * k, mean)
                b.local_store(self.st, 2 * k + 1, 1.0 / call("sqrt", sq / n + LAYER_NORM_EPSILON))
        b.barrier()

    def _projection(self) -> None:
        """Projection phase: new h = clip(W_proj m + b), into h and the output."""
        b, s, rp, pp = self.b, self.s, self.rp, self.pp
        proj = self.bufs["proj"]
        with self._blocks(pp // (4 * rp), 4 * rp, "p0") as p0:
            acc = [b.var(f"a{q}", proj.load(ir.plus(p0, s.n_cell * pp + 4 * q), 4, as_float=True), FLOAT4)
                   for q in range(rp)]
            with b.for_("k", 0, s.n_cell) as k:
                v = b.let("v", self.ml.load(k), FLOAT)
                wr = b.let("wr", k * pp + p0)
                for q in range(rp):
                    b.assign(acc[q], v * proj.load(ir.plus(wr, 4 * q), 4, as_float=True), "+")
            for q in range(rp):
                if self.proj_clip > 0:
                    b.assign(acc[q], call("clamp", acc[q], -self.proj_clip, self.proj_clip))
                b.local_store(self.hl, ir.plus(self.hnext + p0, 4 * q), acc[q])
                self._store_y(acc[q], ir.plus(p0, 4 * q), s.n_output)
