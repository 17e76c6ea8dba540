"""LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM: a whole sequence in one launch.

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

Work-items per group (``LANES``): on PoCL's CPU device a group runs on one core and
its barriers are expensive, so one work-item walking the cell blocks is fastest
(measured 4-5x faster than 4 work-items with barriers); a GPU wants more lanes, but
a generator does not know its device yet. Rows run in parallel either way.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from litegpu.ops.nn import LAYER_NORM_EPSILON, LSTM_INPUT_NAMES
from litegpu.ops.registry import CLAMP_ACTIVATIONS

from ..nodegen import NodeGen, c_float, clamp_c
from . import Decline, generator

_F32 = np.dtype(np.float32)
_GATES = ("input", "forget", "cell", "output")
_OUTPUT_STATE, _CELL_STATE = 18, 19
_MAX_LOCAL_BYTES = 32 << 10   # the least local memory an OpenCL full-profile device has

#: Work-items per batch row (see the module docstring). Any value is correct.
LANES = 1

# Inside an LSTM the activation is a real function on the cell input and state (TFLite's
# ApplyActivationToVector), not a fused output clamp: TANH really is tanh here. Each
# takes and returns a float4.
_ACT = {
    **{name: (lambda g, v, name=name: clamp_c(name, v, "float", g=g)) for name in CLAMP_ACTIVATIONS},
    "TANH": lambda g, v: f"tanh({v})",
    "SIGN_BIT": lambda g, v: f"select({g.vector('float4', '0.0f')}, {g.vector('float4', '1.0f')}, signbit({v}))",
}


def _sigmoid(v: str) -> str:
    return f"(1.0f / (1.0f + exp(-({v}))))"


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

    def row(self, t: str, width: int) -> str:
        """Element offset of row ``b`` at time ``t`` of x or y ([T,B,*] time-major, else [B,T,*])."""
        if self.time_major or not self.seq:
            return f"((({t}) * {self.batch} + b) * {width})"
        return f"((b * {self.steps} + ({t})) * {width})"


def _repack(w: dict, s: _Shape, layer_norm: tuple[bool, ...]) -> dict[str, np.ndarray]:
    """Weights as the kernel reads them, padded with zeros to whole blocks; absent gates
    (CIFG's input gate) and absent parts are zeros:

    - ``W [n_input + n_output][4][cp]``: input then recurrent weights, gates i, f, c, o;
    - ``bias [4][cp]``: added before the gate (0 for layer-norm gates); ``post [4][cp]``:
      added after the norm; ``peep``, ``norm [4][cp]``: peephole and layer-norm weights;
    - ``proj [n_cell][pp]`` (transposed) and ``proj_bias [pp]``.
    """
    _, cp = s.cell_block
    _, pp = s.out_block
    out = {name: np.zeros((4, cp), np.float32) for name in ("bias", "post", "peep", "norm")}
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
    out["W"] = wcat
    if w["projection_weights"] is not None:
        proj = np.zeros((s.n_cell, pp), np.float32)
        proj[:, :s.n_output] = w["projection_weights"].T
        out["proj"] = proj
        bias = np.zeros(pp, np.float32)
        if w["projection_bias"] is not None:
            bias[:s.n_output] = w["projection_bias"]
        out["proj_bias"] = bias
    return out


@generator("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")
def lstm(g: NodeGen):
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
    cifg = w["input_to_input"] is None
    layer_norm = tuple(w[f"{gate}_layer_norm"] is not None and not (cifg and gate == "input") for gate in _GATES)
    peephole = any(w[f"cell_to_{gate}"] is not None for gate in ("input", "forget", "output"))
    projection = w["projection_weights"] is not None
    _, cp = s.cell_block
    _, pp = s.out_block
    local_floats = 2 * pp + cp + (cp if projection else 0) + (4 * cp + 8 if any(layer_norm) else 0)
    if local_floats * 4 > _MAX_LOCAL_BYTES:
        raise Decline(f"LSTM state of {local_floats * 4} bytes per batch row does not fit one work-group's "
                      f"local memory ({_MAX_LOCAL_BYTES} bytes)")

    # Parameters (the order they are asked for is the kernel's parameter order).
    p = {"x": g.input(0), "y": g.output(0), "hs": g.tensor_param(h_state, const=False),
         "cs": g.tensor_param(c_state, const=False)}
    packed = _repack(w, s, layer_norm)
    for name in ("W", "bias") + (("post", "norm") if any(layer_norm) else ()) + (("peep",) if peephole else ()) \
            + (("proj", "proj_bias") if projection else ()):
        p[name] = g.const(packed[name])
    gen = _Writer(g, s, p, attrs, cifg, layer_norm, peephole, projection)
    return [g.kernel(gen.body(), (LANES, s.batch), (LANES, 1))]


class _Writer:
    """Writes the kernel body of one LSTM node (see the module docstring)."""

    def __init__(self, g: NodeGen, s: _Shape, p: dict[str, str], attrs: dict, cifg: bool,
                 layer_norm: tuple[bool, ...], peephole: bool, projection: bool) -> None:
        self.g, self.s, self.p = g, s, p
        act = _ACT[attrs["activation"]]
        self.act = lambda v: act(g, v)
        self.cell_clip, self.proj_clip = float(attrs["cell_clip"]), float(attrs["proj_clip"])
        self.cifg, self.ln, self.peephole, self.projection = cifg, layer_norm, peephole, projection
        self.r, self.cp = s.cell_block
        self.rp, self.pp = s.out_block

    def body(self) -> str:
        """Prologue (state into local memory), the time loop, epilogue (state back)."""
        g, s, p, cp, pp = self.g, self.s, self.p, self.cp, self.pp
        arrays = [("hl", 2 * pp), ("cl", cp)] + [("ml", cp)] * self.projection \
            + [("gz", 4 * cp), ("st", 8)] * any(self.ln)
        lines = [f"  {g.local_array('float', name, size)}" for name, size in arrays]
        lines += [
            f"  const int lid = {g.local_id(0)}, b = {g.global_id(1)};",
            # Padding units start at 0; they never reach an output or the state.
            (f"  for (int i = lid; i < {pp}; i += {LANES}) "
             f"hl[i] = i < {s.n_output} ? {g.loadv(p['hs'], f'b * {s.n_output} + i', 1)} : 0.0f;"),
            (f"  for (int i = lid; i < {cp}; i += {LANES}) "
             f"cl[i] = i < {s.n_cell} ? {g.loadv(p['cs'], f'b * {s.n_cell} + i', 1)} : 0.0f;"),
            f"  {g.barrier()}",
            f"  for (int t = 0; t < {s.steps}; ++t) {{",
            f"    {g.local_ptr('float', const=True)} hcur = hl + (t & 1) * {pp};",
            f"    {g.local_ptr('float')} hnext = hl + ((t + 1) & 1) * {pp};",
        ]
        lines += self._gates()
        if self.projection:
            lines += self._projection()
        lines += [
            "  }",
            (f"  for (int i = lid; i < {s.n_output}; i += {LANES}) "
             + g.store(p['hs'], f"b * {s.n_output} + i", f"hl[{(s.steps & 1) * pp} + i]")),
            f"  for (int i = lid; i < {s.n_cell}; i += {LANES}) " + g.store(p['cs'], f"b * {s.n_cell} + i", "cl[i]"),
        ]
        return "\n".join(lines)

    # -- pieces ---------------------------------------------------------------------------
    def _blocks(self, n_blocks: int, width: int, var: str, inner: list[str]) -> list[str]:
        """A loop of this work-item's blocks (``var`` = first unit), then a barrier."""
        return ([f"    for (int blk = lid; blk < {n_blocks}; blk += {LANES}) {{",
                 f"      const int {var} = blk * {width};"]
                + inner + ["    }", f"    {self.g.barrier()}"])

    def _table(self, name: str, gate: int, r: int) -> str:
        """float4 of a [4][cp] table at gate ``gate``, cells c0 + 4r ..."""
        return f"convert_float4(LD4({self.p[name]}, {gate * self.cp} + c0 + {4 * r}))"

    def _store_y(self, value: str, col: str, width: int) -> list[str]:
        """Store a float4 into output columns col..col+3 (masked past ``width``)."""
        g, y, off = self.g, self.p["y"], self.s.row("t", width)
        if width % 4 == 0:
            return [f"      {g.store4(y, f'{off} + {col}', value)}"]
        return [f"      if ({col} + {j} < {width}) {g.store(y, f'{off} + {col} + {j}', g.lane(f'({value})', j, 4))}"
                for j in range(4)]

    def _gates(self) -> list[str]:
        """Gate phase, then (layer norm) the normalizing phases; ends after a barrier."""
        g, s, p, r, cp = self.g, self.s, self.p, self.r, self.cp
        g.alias("xr", p["x"])
        pairs = [(k, q) for k in range(4) for q in range(r)]   # gate k, float4 group q
        mac = " ".join(f"z{k}_{q} += v * convert_float4(LD4(wr, {k * cp + 4 * q}));" for k, q in pairs)
        inner = [f"      float4 z{k}_{q} = {self._table('bias', k, q)};" for k, q in pairs]
        wptr = g.global_ptr("FT", const=True)
        inner += [
            f"      {g.global_ptr(g.pointee(p['x']), const=True)} xr = {p['x']} + {s.row('t', s.n_input)};",
            f"      for (int k = 0; k < {s.n_input}; ++k) {{",
            f"        const float v = {g.loadv('xr', 'k', 1)}; {wptr} wr = {p['W']} + k * {4 * cp} + c0;",
            f"        {mac}",
            "      }",
            f"      for (int k = 0; k < {s.n_output}; ++k) {{",
            f"        const float v = hcur[k]; {wptr} wr = {p['W']} + ({s.n_input} + k) * {4 * cp} + c0;",
            f"        {mac}",
            "      }",
        ]
        for q in range(r):
            inner.append(f"      {{ const float4 cold = vload4(0, cl + c0 + {4 * q});")
            if self.peephole:
                inner.append(f"      z0_{q} += {self._table('peep', 0, q)} * cold; "
                             f"z1_{q} += {self._table('peep', 1, q)} * cold;")
            if any(self.ln):
                inner += [f"      vstore4(z{k}_{q}, 0, gz + {k * cp} + c0 + {4 * q});" for k in range(4)]
            else:
                inner += self._update(q, "cold")
            inner.append("      }")
        lines = self._blocks(cp // (4 * r), 4 * r, "c0", inner)
        if not any(self.ln):
            return lines
        # Layer norm: stats of the normalized i/f/c gates; the cell update from gz.
        lines += self._stats([k for k in range(3) if self.ln[k]])
        inner = []
        for q in range(r):
            inner.append("      {")
            inner += [f"      float4 z{k}_{q} = vload4(0, gz + {k * cp} + c0 + {4 * q});" for k in range(4)]
            inner += [self._normalize(k, q) for k in range(3) if self.ln[k]]
            inner += self._update(q, f"vload4(0, cl + c0 + {4 * q})", output_waits=self.ln[3])
            inner.append("      }")
        lines += self._blocks(cp // (4 * r), 4 * r, "c0", inner)
        if self.ln[3]:
            # The output gate's norm needs every new cell (its peephole) first.
            lines += self._stats([3])
            inner = []
            for q in range(r):
                inner += [f"      {{ float4 z3_{q} = vload4(0, gz + {3 * cp} + c0 + {4 * q});",
                          self._normalize(3, q)]
                inner += self._output(q, f"vload4(0, cl + c0 + {4 * q})") + ["      }"]
            lines += self._blocks(cp // (4 * r), 4 * r, "c0", inner)
        return lines

    def _update(self, q: int, cold: str, output_waits: bool = False) -> list[str]:
        """The new cell state of group ``q`` from z0..z3 and the old state; then the output
        gate, unless it ``output_waits`` for its layer norm (then z3 goes back to gz)."""
        ig = "1.0f - f" if self.cifg else _sigmoid(f"z0_{q}")
        lines = [f"      const float4 f = {_sigmoid(f'z1_{q}')};",
                 f"      const float4 ig = {ig};",
                 f"      float4 cn = f * ({cold}) + ig * {self.act(f'z2_{q}')};"]
        if self.cell_clip > 0:
            lines.append(f"      cn = clamp(cn, {c_float(-self.cell_clip)}, {c_float(self.cell_clip)});")
        lines.append(f"      vstore4(cn, 0, cl + c0 + {4 * q});")
        if self.peephole:
            lines.append(f"      z3_{q} += {self._table('peep', 3, q)} * cn;")
        if output_waits:
            return lines + [f"      vstore4(z3_{q}, 0, gz + {3 * self.cp} + c0 + {4 * q});"]
        return lines + self._output(q, "cn")

    def _output(self, q: int, cn: str) -> list[str]:
        """``m = sigmoid(z3) * act(c)`` of group ``q`` into ``ml`` (projection) or the
        new ``h`` and the output."""
        lines = [f"      const float4 m = {_sigmoid(f'z3_{q}')} * {self.act(cn)};"]
        if self.projection:
            return lines + [f"      vstore4(m, 0, ml + c0 + {4 * q});"]
        return lines + [f"      vstore4(m, 0, hnext + c0 + {4 * q});"] \
            + self._store_y("m", f"c0 + {4 * q}", self.s.n_output)

    def _normalize(self, k: int, q: int) -> str:
        """Layer norm of gate ``k`` (group ``q``): (z - mean) / stddev * weight + bias."""
        return (f"      z{k}_{q} = (z{k}_{q} - st[{2 * k}]) * st[{2 * k + 1}] * {self._table('norm', k, q)}"
                f" + {self._table('post', k, q)};")

    def _stats(self, gates: list[int]) -> list[str]:
        """Mean and 1/stddev of the row's pre-activations of ``gates`` into ``st``, two-pass
        like TFLite's MeanStddevNormalization; ends with a barrier."""
        if not gates:
            return []
        n, cp = self.s.n_cell, self.cp
        lines = []
        for j, k in enumerate(gates):
            lines += [
                f"    if (lid == {j % LANES}) {{",
                f"      {self.g.local_ptr('float', const=True)} zr = gz + {k * cp};",
                "      float sum = 0.0f, sq = 0.0f;",
                f"      for (int c = 0; c < {n}; ++c) sum += zr[c];",
                f"      const float mean = sum / {n};",
                f"      for (int c = 0; c < {n}; ++c) {{ const float d = zr[c] - mean; sq += d * d; }}",
                f"      st[{2 * k}] = mean; st[{2 * k + 1}] = 1.0f / sqrt(sq / {n} + {c_float(LAYER_NORM_EPSILON)});",
                "    }",
            ]
        return lines + [f"    {self.g.barrier()}"]

    def _projection(self) -> list[str]:
        """Projection phase: new h = clip(W_proj m + b), into h and the output."""
        s, p, rp, pp = self.s, self.p, self.rp, self.pp
        inner = [f"      float4 a{q} = convert_float4(LD4({p['proj_bias']}, p0 + {4 * q}));" for q in range(rp)]
        inner += [
            f"      for (int k = 0; k < {s.n_cell}; ++k) {{",
            f"        const float v = ml[k]; {self.g.global_ptr('FT', const=True)} wr = {p['proj']} + k * {pp} + p0;",
            "        " + " ".join(f"a{q} += v * convert_float4(LD4(wr, {4 * q}));" for q in range(rp)),
            "      }",
        ]
        for q in range(rp):
            if self.proj_clip > 0:
                inner.append(f"      a{q} = clamp(a{q}, {c_float(-self.proj_clip)}, {c_float(self.proj_clip)});")
            inner.append(f"      vstore4(a{q}, 0, hnext + p0 + {4 * q});")
            inner += self._store_y(f"a{q}", f"p0 + {4 * q}", s.n_output)
        return self._blocks(pp // (4 * rp), 4 * rp, "p0", inner)
