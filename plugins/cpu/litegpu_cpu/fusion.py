"""Fuse runs of elementwise nodes into one generated numba task function.

A run of consecutive static elementwise nodes with one output shape becomes a single
kernel that reads each element once, keeps intermediates in registers and writes only
the values used after the run. Operands are indexed per element, as a scalar,
broadcast along the last dimension (bias adds, squeeze-excite scales), one value per
last-dimension row (LayerNorm's mean and variance, shaped [..., 1]), or as the output's
trailing dimensions repeated over its leading ones (a decoder's RoPE tables over the
heads, its attention mask over batch and heads: row ``r % period``, the period a run-time
parameter).

The kernel is a task function (:mod:`.kernels.tasks`, so it chains with the steps around
it into one call) looping over the output as ``[rows, cols]`` (blocks of rows as tasks
shared by the threads when it is big, an inner loop over ``cols`` that LLVM vectorizes): a last-dimension operand is then read
at the inner index, where a flat loop would need ``i % channels`` per element, an
integer division that stops vectorization (PRELU on 96x96x16: 236 us against 22 us on
one thread).

Values are float32, int32 or bool (numpy's byte, read as ``!= 0``): the float math
ops, int32 arithmetic, comparisons, logical ops and SELECT, so a loop counter's ADD, a
WHILE condition's LESS and LOGICAL_AND, and an embedding's index fix-up are task
functions too (and a loop made only of them runs as one compiled call).

The float (and int32) arithmetic ops and the fused activations' clamps have one formula
each, the GPU kernels' (:mod:`litegpu.codegen.formulas`), rendered as numba source over
float32 by :mod:`litegpu.codegen.pyrender`; LOGISTIC, TANH and GELU are the cpu's own
(``_CPU_UNARY``, ``_GELU``: functions of :mod:`.kernels.mathfn` that match LiteRT to the
bit and vectorize).

Generated sources are cached as modules (:mod:`.generated`); shapes are run-time
arguments, so identical chains share one compiled function.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import numpy as np

from litegpu import env
from litegpu.backend import NodeContext
from litegpu.chains import attention_chain, reader_counts
from litegpu.codegen import formulas, ir, pyrender
from litegpu.codegen.fusion import folded_square_sum
from litegpu.ops.registry import CLAMP_ACTIVATIONS

from .generated import load_generated
from .kernels import mathfn, xnn_sigmoid
from .kernels.qelementwise import folded_table
from .kernels.registry import bindable, is_quantized_node
from .kernels.tasks import ARRAYS, bind_task

F32 = np.dtype(np.float32)
PARALLEL_MIN_ELEMENTS = 1 << 15
# Inner-loop length when no operand fixes it: trailing dimensions are merged until the
# loop is long enough to vectorize well (MIN_COLS), never past MAX_COLS, so rows remain
# for every thread.
MIN_COLS, MAX_COLS = 256, 4096

# The float ops fused: their formulas are litegpu.codegen.formulas' (the GPU kernels'),
# rendered as numba source over float32 (litegpu.codegen.pyrender) with {a} and {b} for the
# operands, except where the cpu computes differently on purpose (_CPU_UNARY).
_FLOAT_UNARY = ("NEG", "ABS", "SQUARE", "RSQRT", "EXP", "LOG", "SIN", "COS", "FLOOR", "CEIL",
                "HARD_SWISH", "LEAKY_RELU", "ELU", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")
_FLOAT_BINARY = ("ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "PRELU")
# How the cpu spells math functions: exp through kernels.mathfn's exp32 (it vectorizes,
# where np.exp is a libm call per element), fma through its fma32 (llvm.fma).
_FUNCTIONS = {"exp": "_exp32({0})", "fma": "_fma32({0}, {1}, {2})"}
# The cpu's own formulas, and why: LOGISTIC and TANH call kernels.xnn_sigmoid's sigmoid32
# (XNNPACK's AVX-512F kernel to the bit where LiteRT runs it, else kernels.mathfn's) and
# mathfn's tanh32 (XNNPACK's rational fit where LiteRT runs it, else tanh64 rounded), which
# vectorize (the GPU's 1 / (1 + exp(-x)) rounds twice, its tanh is litegpu's own rational
# fit within 4e-7); SIN, COS, RSQRT and SQRT are XNNPACK's (mathfn's xnn_sin32, xnn_cos32,
# xnn_rsqrt32 and xnn_sqrt32: LiteRT's bits, where numba's libm calls do not match).
_CPU_UNARY = {
    "LOGISTIC": "_sigmoid32({a})",
    "TANH": "_tanh32({a})",
    "SIN": "_xnn_sin32({a})",
    "COS": "_xnn_cos32({a})",
    "RSQRT": "_xnn_rsqrt32({a})",
    "SQRT": "_xnn_sqrt32({a})",
}
# GELU in float32 arithmetic that vectorizes, a few ulps from the float64 formula
# (kernels.mathfn; the same functions as the standalone kernel's, where the GPU's is a
# rational fit of erf or tanh).
_GELU = "_gelu32({a})"
_GELU_TANH = "_gelu_tanh32({a})"
# The mathfn functions the import line names (with that module's digest, so editing it
# changes every source using it); sigmoid32 comes from xnn_sigmoid, with its digest.
_MATHFN = ("exp32", "tanh32", "gelu32", "gelu_tanh32", "fma32", "xnn_sin32", "xnn_cos32", "xnn_rsqrt32",
           "xnn_sqrt32")
_UNARY_OPS = frozenset(_FLOAT_UNARY) | frozenset(_CPU_UNARY)
_OPERAND_TYPES = {"f": ir.REAL, "i": ir.INT}


@functools.lru_cache(maxsize=None)
def _formula(op: str, kind: str, alpha: float, swapped: bool) -> str:
    """The template of float or int (``kind`` "f" / "i") op ``op``: its formula in
    :mod:`litegpu.codegen.formulas` over operands ``{a}`` (and ``{b}``), or the cpu's own.
    ``alpha`` is LEAKY_RELU's; ``swapped`` says MAXIMUM / MINIMUM's second operand is first."""
    if op in _CPU_UNARY:
        return _CPU_UNARY[op]
    a, b = (pyrender.operand(name, _OPERAND_TYPES[kind]) for name in ("{a}", "{b}"))
    attrs = {"alpha": alpha, "swapped": swapped}
    expr = formulas.UNARY[op](a, attrs) if op in _UNARY_OPS else formulas.BINARY[op](a, b, attrs)
    return pyrender.render(expr, _FUNCTIONS)


@functools.lru_cache(maxsize=None)
def _clamp(name: str) -> str:
    """The clamp of activation ``name`` (:func:`litegpu.codegen.formulas.clamp`) as a template over ``{a}``."""
    return pyrender.render(formulas.clamp(name, pyrender.operand("{a}")), _FUNCTIONS)


def _template(ctx: NodeContext, kind: str) -> str:
    """The template of unary or binary ``ctx`` on ``kind`` operands (see :func:`_formula`)."""
    return _formula(ctx.node.op, kind, float(ctx.attrs.get("alpha", 0.0)), bool(ctx.attrs.get("swapped")))


# Fused activations are clamps in LiteRT; TANH and SIGN_BIT have no range and change nothing.
_ACTIVATION = {name: None if name == "NONE" else name for name in CLAMP_ACTIVATIONS} | {"TANH": None, "SIGN_BIT": None}

# Value kinds by dtype: float32, int32 and bool.
_KIND = {F32: "f", np.dtype(np.int32): "i", np.dtype(np.bool_): "b"}
_DTYPE = {kind: dtype for dtype, kind in _KIND.items()}
# int32 ops (numba computes in int64; the store back to int32 wraps as numpy does).
_INT_OPS = {"ADD", "SUB", "MUL", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "NEG", "ABS"}
_COMPARE = {"LESS": "{a} < {b}", "LESS_EQUAL": "{a} <= {b}", "GREATER": "{a} > {b}", "GREATER_EQUAL": "{a} >= {b}",
            "EQUAL": "{a} == {b}", "NOT_EQUAL": "{a} != {b}"}
_LOGICAL = {"LOGICAL_AND": "{a} & {b}", "LOGICAL_OR": "{a} | {b}", "LOGICAL_NOT": "not {a}"}
_SELECT = "{b} if {a} else {c}"


def _expression(ctx: NodeContext) -> str | None:
    """The expression template of ``ctx``'s op for its operand kinds, or None."""
    op, specs = ctx.node.op, (*ctx.inputs, *ctx.outputs)
    if len(ctx.outputs) != 1 or any(s is None or np.dtype(s.dtype) not in _KIND for s in specs):
        return None
    kinds = "".join(_KIND[np.dtype(s.dtype)] for s in specs)   # inputs then the output
    if op in _UNARY_OPS or op in _FLOAT_BINARY:
        arity = 1 if op in _UNARY_OPS else 2
        if kinds == "f" * (arity + 1) and ctx.attrs.get("activation", "NONE") in _ACTIVATION:
            return _template(ctx, "f")
        if kinds == "i" * (arity + 1) and op in _INT_OPS and ctx.attrs.get("activation", "NONE") == "NONE":
            return _template(ctx, "i")
        return None
    if op == "GELU":
        return (_GELU_TANH if ctx.attrs.get("approximate") else _GELU) if kinds == "ff" else None
    if op in _COMPARE:
        ordered = kinds in ("ffb", "iib") or (kinds == "bbb" and op in ("EQUAL", "NOT_EQUAL"))
        return _COMPARE[op] if ordered else None
    if op in _LOGICAL:
        return _LOGICAL[op] if kinds == "b" * (2 if op == "LOGICAL_NOT" else 3) else None
    if op in ("SELECT", "SELECT_V2") and len(kinds) == 4 and kinds[0] == "b" and kinds[1] == kinds[2] == kinds[3]:
        # SELECT (TF1) takes a rank-1 condition per dim-0 slice: only equal shapes or a scalar here.
        cond, out = ctx.inputs[0].shape, ctx.outputs[0].shape
        if op == "SELECT" and tuple(cond) != tuple(out) and int(np.prod(cond, dtype=np.int64)) != 1:
            return None
        return _SELECT
    return None


def fusable(ctx: NodeContext) -> bool:
    """True for a static elementwise node this module can generate code for (never a
    quantized one: the generated code is float arithmetic)."""
    return not ctx.dynamic and not is_quantized_node(ctx) and _expression(ctx) is not None


def generate_alone(ctx: NodeContext) -> bool:
    """True for a node that gets a generated kernel even outside a fused run: every
    fusable one (off with ``LITEGPU_CPU_FUSION=0`` like fusion itself). The kernel is a
    task function, so it runs in one call with its task-function neighbours, where a numpy
    ufunc is a Python call of its own (and LOGISTIC or EXP through numpy take several
    passes, a binary op with a fused clamp two)."""
    return env.flag("LITEGPU_CPU_FUSION", True) and fusable(ctx)


def fusion_runs(nodes: list[NodeContext], outputs=()) -> list[list[int]]:
    """Positions grouped into steps: maximal runs of fusable nodes with one output shape, a
    node followed by one it can compute itself (:func:`folded_pair`: a conv and its clamp,
    swish on int8), and every other node alone. ``outputs`` are the tensors read after the nodes.

    An attention's chain of nodes (:func:`litegpu.chains.attention_chain`) is one step too.

    Disabled with ``LITEGPU_CPU_FUSION=0``.
    """
    if not env.flag("LITEGPU_CPU_FUSION", True):
        return [[i] for i in range(len(nodes))]
    readers = reader_counts(nodes, outputs)
    steps: list[list[int]] = []
    i = 0
    while i < len(nodes):
        chain = attention_chain(nodes, i, readers)
        if chain is not None:
            steps.append(list(range(i, i + len(chain.nodes))))
            i += len(chain.nodes)
            continue
        j = i + 1
        if fusable(nodes[i]):
            shape = tuple(nodes[i].outputs[0].shape)
            while j < len(nodes) and fusable(nodes[j]) and tuple(nodes[j].outputs[0].shape) == shape:
                j += 1
        if j < len(nodes) and folded_pair(nodes[j - 1], nodes[j]) is not None \
                and readers[nodes[j - 1].node.outputs[0]] == 1:
            # the pair is a step of its own: a run's last node leaves it (a residual ADD,
            # then x * x) to go with its follower
            j = j - 1 if j - i >= 2 else j + 1
        steps.append(list(range(i, j)))
        i = j
    return steps


# Ops whose cpu kernels clamp on store, and the standalone ops that are such a clamp.
_CLAMPING = {"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"}
_CLAMPS = set(CLAMP_ACTIVATIONS) - {"NONE"}


def folded_pair(first: NodeContext, second: NodeContext) -> NodeContext | None:
    """One node context computing ``second``'s output from ``first``'s inputs, when a kernel
    can take the pair on: a float conv's clamp (:func:`folded_activation`), an 8-bit
    table op's arithmetic with its own input (:func:`.kernels.qelementwise.folded_table`),
    a sum or mean of squares (:func:`folded_square_sum`); else None."""
    return folded_activation(first, second) or folded_table(first, second) or folded_square_sum(first, second)


def folded_activation(producer: NodeContext, clamp: NodeContext) -> NodeContext | None:
    """``producer`` (a conv or FC with no fused activation) computing ``clamp``'s output
    with the clamp as its fused activation, when ``clamp`` (RELU, RELU6, RELU_N1_TO_1 on
    float32) reads its output; else None. Converters leave such pairs (blazeface's convs
    are followed by a RELU node 27 times): one pass over the output instead of two. The
    caller checks that nothing else reads the producer's output."""
    node = producer.node
    if is_quantized_node(producer) or is_quantized_node(clamp):
        return None
    if node.op not in _CLAMPING or producer.dynamic or clamp.dynamic or clamp.node.op not in _CLAMPS \
            or producer.attrs.get("activation") != "NONE" or len(node.outputs) != 1 \
            or tuple(clamp.node.inputs) != tuple(node.outputs):
        return None
    if any(s is None or np.dtype(s.dtype) != F32 for s in (*producer.outputs, *clamp.outputs)):
        return None
    return replace(producer, node=replace(node, outputs=tuple(clamp.node.outputs)),
                   attrs={**producer.attrs, "activation": clamp.node.op}, outputs=list(clamp.outputs))


def _mode(shape: tuple[int, ...], out_shape: tuple[int, ...]) -> str | None:
    """How an operand of ``shape`` is indexed inside a loop over ``out_shape``."""
    size = int(np.prod(shape, dtype=np.int64))
    aligned = (1,) * (len(out_shape) - len(shape)) + tuple(shape)    # numpy's right alignment
    if aligned == tuple(out_shape):
        return "full"    # (also BERT's [64, 128] position table added to a [1, 64, 128] input)
    if size == 1:
        return "scalar"
    if out_shape and len(shape) >= 1 and shape[-1] == out_shape[-1] and size == shape[-1] \
            and len(shape) <= len(out_shape):
        return "lastdim"
    if len(out_shape) >= 2 and len(aligned) == len(out_shape) and aligned[-1] == 1 \
            and aligned[:-1] == tuple(out_shape[:-1]):
        return "row"      # one value per last-dimension row (LayerNorm's mean and variance)
    if _period(aligned, tuple(out_shape)):
        return "period"   # the output's trailing rows, repeated (a RoPE table, a mask over heads)
    return None


def _period(aligned: tuple[int, ...], out_shape: tuple[int, ...]) -> int:
    """The rows after which an operand of right-aligned shape ``aligned`` repeats when it is
    the output's trailing dimensions, its leading ones broadcast (``[16, 32]`` in a ``[1,
    4, 16, 32]`` output: 16 rows of 32), else 0."""
    lead = next((d for d, n in enumerate(aligned) if n != 1), len(aligned))
    if len(out_shape) < 2 or lead == 0 or lead >= len(out_shape) - 1 or aligned[lead:] != out_shape[lead:]:
        return 0
    return int(np.prod(out_shape[lead:-1], dtype=np.int64))


@dataclass
class FusedGroup:
    """A run of nodes fused into one kernel: external inputs in, escaping values out."""

    nodes: list[NodeContext]
    inputs: list[int]
    outputs: list[int]
    source: str
    parallel: bool
    rows: int
    cols: int
    constants: np.ndarray
    dtypes: tuple            # of the inputs, then the outputs
    periods: tuple = ()      # the rows after which each "period" operand repeats (ip[3] on)


def _columns(out_shape: tuple[int, ...], lastdim: bool) -> int:
    """The inner-loop length: the last dimension when an operand is indexed along it,
    else trailing dimensions merged as :data:`MIN_COLS` / :data:`MAX_COLS` say."""
    if not out_shape:
        return 1
    cols = max(out_shape[-1], 1)
    if not lastdim:
        for d in reversed(out_shape[:-1]):
            if cols >= MIN_COLS or cols * d > MAX_COLS:
                break
            cols *= d
    return cols


# How an operand is read inside the [rows, cols] loop, by mode (``x{n}`` a pointer, or the
# constant pool ``k`` at an offset).
_INDEX = {"full": "r * c + j", "scalar": "0", "lastdim": "j", "row": "r"}
# Row blocks a parallel kernel is split into (tasks, shared by the threads).
_PARALLEL_TASKS = 8


# How a value of each kind is read from an array (``{p}[{i}]``) and assigned (``{e}``).
_READ = {"f": "{p}[{i}]", "i": "{p}[{i}]", "b": "({p}[{i}] != 0)"}
_VALUE = {"f": "np.float32({e})", "i": "np.int32({e})", "b": "{e}"}
_STORE = {"f": "{v}", "i": "{v}", "b": "np.uint8({v})"}
_POINTER = {"f": "{a}", "i": "_i32({a})", "b": "_u8({a})"}


def plan_group(nodes: list[NodeContext], escaping: set[int]) -> FusedGroup | None:
    """Generate the fused kernel's source for ``nodes`` (all :func:`fusable`, one output shape)."""
    out_shape = tuple(nodes[0].outputs[0].shape)
    names: dict[int, str] = {}
    kinds: dict[int, str] = {}
    inputs: list[int] = []
    pool: list[np.ndarray] = []   # constants as 32-bit words, one argument (dispatch cost grows per argument)
    pool_size = 0
    lastdim = False
    periods: list[int] = []
    body: list[str] = []
    for k, ctx in enumerate(nodes):
        if tuple(ctx.outputs[0].shape) != out_shape:
            return None
        operands = []
        for t, spec in zip(ctx.node.inputs, ctx.inputs):
            if t not in names:
                mode = _mode(tuple(spec.shape), out_shape)
                if mode is None:
                    return None
                lastdim |= mode in ("lastdim", "row", "period")
                # (the row's offset in the operand is computed once per row: numba's ``%``
                # checks for a zero divisor, and that branch in the inner loop kept it
                # scalar: a RoPE chain over [1, 12, 64, 32] took 115 us, LiteRT's 7)
                index = _INDEX.get(mode) or f"o{len(periods)} + j"
                if mode == "period":
                    aligned = (1,) * (len(out_shape) - len(spec.shape)) + tuple(spec.shape)
                    periods.append(_period(aligned, out_shape))
                kind = kinds[t] = _KIND[np.dtype(spec.dtype)]
                if spec.value is not None:
                    words = np.asarray(spec.value, F32 if kind == "f" else np.int32).reshape(-1).view(F32)
                    names[t] = _READ[kind].format(p="k" if kind == "f" else "ki", i=f"{pool_size} + {index}")
                    pool.append(words)
                    pool_size += words.size
                else:
                    names[t] = _READ[kind].format(p=f"x{len(inputs)}", i=index)
                    inputs.append(t)
            operands.append(names[t])
        a, b, c = (*operands, None, None)[:3]
        expr = _expression(ctx).format(a=a, b=b, c=c)
        kind = kinds[ctx.node.outputs[0]] = _KIND[np.dtype(ctx.outputs[0].dtype)]
        body.append(f"            v{k} = {_VALUE[kind].format(e=expr)}")
        act = _ACTIVATION.get(ctx.attrs.get("activation", "NONE")) if kind == "f" else None
        if act:
            body.append(f"            v{k} = np.float32({_clamp(act).format(a=f'v{k}')})")
        names[ctx.node.outputs[0]] = f"v{k}"
    outputs = [ctx.node.outputs[0] for ctx in nodes if ctx.node.outputs[0] in escaping]
    if not outputs or len(inputs) + len(outputs) > ARRAYS:
        return None
    for j, t in enumerate(outputs):
        body.append(f"            y{j}[r * c + j] = {_STORE[kinds[t]].format(v=names[t])}")
    size = int(np.prod(out_shape, dtype=np.int64))
    cols = _columns(out_shape, lastdim)
    rows = size // cols if cols else 0
    parallel = size >= PARALLEL_MIN_ELEMENTS and rows >= 2
    arrays = [*inputs, *outputs]
    pointers = [_POINTER[kinds[t]].format(a=f"a{j}") for j, t in enumerate(arrays)]
    names_ = [f"x{j}" for j in range(len(inputs))] + [f"y{j}" for j in range(len(outputs))]
    maths = [f for f in _MATHFN if any(f"_{f}" in line for line in body)]
    source = "\n".join([
        '"""Generated by litegpu_cpu.fusion; safe to delete."""',
        "import numpy as np",
        "from litegpu_cpu.kernels.tasks import task_function, int32_pointer as _i32, uint8_pointer as _u8",
        *([f"from litegpu_cpu.kernels.mathfn import {', '.join(f'{f} as _{f}' for f in maths)}"
           f"  # mathfn {mathfn.DIGEST}"] if maths else []),
        *([f"from litegpu_cpu.kernels.xnn_sigmoid import sigmoid32 as _sigmoid32  # xnn_sigmoid {xnn_sigmoid.DIGEST}"]
          if any("_sigmoid32" in line for line in body) else []),
        "",
        "",
        "@task_function()",
        f"def fused(t, {', '.join(f'a{j}' for j in range(ARRAYS))}, ip, k):",
        f"    {', '.join(names_)}, = {', '.join(pointers)},",
        *(["    ki = _i32(k)"] if any("ki[" in line for line in body) else []),
        "    rows, c, part = ip[0], ip[1], ip[2]",
        "    for r in range(t * part, min(rows, (t + 1) * part)):",
        *[f"        o{n} = (r % ip[{3 + n}]) * c" for n in range(len(periods))],
        "        for j in range(c):",
        *body,
        "",
    ])
    constants = np.concatenate(pool) if pool else np.zeros(1, F32)
    return FusedGroup(nodes, inputs, outputs, source, parallel, rows, cols, constants,
                      tuple(_DTYPE[kinds[t]] for t in arrays), tuple(periods))


def _sigmoid_kind(group: FusedGroup) -> int | None:
    """``elementwise.SWISH`` for a group that is ``x * LOGISTIC(x)`` (MUL of its input and
    the LOGISTIC of it, in either order, no fused activation), the LOGISTIC's kind for a
    lone LOGISTIC; float32 of one shape, the last node's result the group's only output.
    None otherwise, or where XNNPACK's AVX-512F sigmoid is not the one LiteRT runs."""
    from .kernels.elementwise import SIGMOID, SWISH
    nodes = group.nodes
    if not xnn_sigmoid.MATCHES_LITERT or len(group.inputs) != 1 or not 1 <= len(nodes) <= 2 \
            or nodes[0].node.op != "LOGISTIC" or group.outputs != [nodes[-1].node.outputs[0]] \
            or any(np.dtype(d) != np.float32 for d in group.dtypes):
        return None
    shapes = {tuple(s.shape) for ctx in nodes for s in (*ctx.inputs, *ctx.outputs)}
    if len(shapes) != 1:
        return None
    if len(nodes) == 1:
        return SIGMOID
    mul, x, s = nodes[1], nodes[0].node.inputs[0], nodes[0].node.outputs[0]
    if mul.node.op != "MUL" or sorted(mul.node.inputs) != sorted((x, s)) or x == s \
            or mul.attrs.get("activation", "NONE") != "NONE":
        return None
    return SWISH


def make_fused_kernel(group: FusedGroup):
    """The group's kernel (:func:`.kernels.registry.bindable`), inputs and outputs in group
    order: its task function over blocks of rows, several when it is big enough to run in
    parallel; a sigmoid or a swish (:func:`_sigmoid_kind`) through the 16-lane kernel of
    :mod:`.kernels.xnn_sigmoid` instead, where it is XNNPACK's (the generated loop
    vectorizes its table lookup as a gather: twice the time)."""
    kind = _sigmoid_kind(group)
    if kind is not None:
        from .kernels.elementwise import float_unary
        k = float_unary(group.nodes[0], kind)
        k.kernel_name = f"fused task ({len(group.nodes)} elementwise ops, 16-lane sigmoid)"
        return k
    fused = load_generated(group.source, "fused")
    if not fused.linked():           # no process compiled it yet: the chain machine, meanwhile
        from .chainvm import first_tier
        k = first_tier(group, fused)
        if k is not None:
            return k
    return generated_kernel(group, fused)


def task_rows(group: FusedGroup) -> tuple[int, int]:
    """(rows per task, tasks) of the group's ``[rows, cols]`` loop: blocks of rows shared by
    the threads when it is big enough to run in parallel, else one task."""
    part = -(-group.rows // _PARALLEL_TASKS) if group.parallel else group.rows
    return part, -(-group.rows // part) if part else 1


def generated_kernel(group: FusedGroup, fused=None):
    """The group's generated kernel (``fused``: its task function, loaded already), compiled
    now when it is neither compiled in this process nor kept by an earlier one."""
    fused = fused or load_generated(group.source, "fused")
    part, tasks = task_rows(group)
    params = np.array([group.rows, group.cols, part, *group.periods], np.int64)
    k = bindable(lambda inputs, outputs: bind_task(fused, tasks, inputs, outputs, params, group.constants,
                                                   group.dtypes))
    k.kernel_name = f"fused task ({len(group.nodes)} elementwise ops)"
    return k
