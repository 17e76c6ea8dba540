"""Fused elementwise chains run by one generic task function while their own kernels compile.

A fused chain (:mod:`.fusion`) is a task function generated for it and compiled by numba:
~0.1 s each after ~0.3 s of numba's own start, the larger part of a first run once the
package's kernels are prebuilt (face_landmark: 5 chains, 1.2 s to its first result;
elementwise_200: one chain of 200 ops, ~3 s). So a first process runs a chain no process
has compiled on the chain machine, :func:`chain_machine`, at once, and compiles its
generated kernel on a background thread (:mod:`.compile_queue`) for the processes after
it (:func:`first_tier`).

The machine interprets a chain program of int64 words: for a block of up to :data:`BLOCK`
elements (whole rows when a row is shorter) of the chain's ``[rows, cols]`` loop, every
instruction is a vectorized loop. An operand read per element, and an output, are read or
written where they are; other operands (per last-dimension position, one value, one per
row, the chain's constants, bools) are loaded into registers, blocks of a frame of its
task's, as are the values between the nodes; bool outputs are stored from registers.

The instructions are the generated kernels' own: every op template :mod:`.fusion`
renders from :mod:`litegpu.codegen.formulas` (and the cpu's own math functions), over the
value kinds it knows (float32, int32, bool as 0 / 1 words), each the same expression on the
same float32 or int32 values, so a chain gives the bits of its generated kernel from the
first invoke on (tests/test_cpu_chainvm.py checks every instruction). It is slower than
that kernel (one pass over L1 per op, where the generated loop keeps values in registers:
2-3x on a chain), which is why it is only the first tier. Its source is generated here,
the same for every model, so ``litegpu prebuild`` compiles it once (:mod:`.prebuild`).

A chain the machine cannot take (an op whose template holds a constant of the node, as
LEAKY_RELU's alpha; more than seven arrays) compiles its generated kernel at once.
"""
from __future__ import annotations

import functools

import numpy as np

from litegpu.backend import NodeContext

from . import fusion, numba_cache, objects
from .compile_queue import compile_later
from .generated import load_generated
from .kernels import mathfn, xnn_sigmoid
from .kernels.registry import bindable
from .kernels.tasks import ARRAYS, bind_task

#: Elements each instruction handles at once (a register is one block of words): a
#: smaller block pays the dispatch and the loops' set-up more often (256: 2.5x on an ADD).
BLOCK = 4096
_HEADER = 10                # words of ``ip`` before the instructions
_WORDS = 5                  # words per instruction: code, destination, three operands
_CONSTANTS = ARRAYS - 1     # the array index that names the constants (``k``)
# Instruction codes below _OPS: loads (register <- array or constants) and bool stores.
_LOAD_WORD, _LOAD_BOOL, _STORE_BOOL = range(3)
_OPS = 3
# How a load indexes its operand (fusion's modes).
_MODES = {"full": 0, "lastdim": 1, "scalar": 2, "row": 3}


@functools.lru_cache(maxsize=None)
def _instructions() -> dict[tuple[str, str], int]:
    """Every op template the machine runs, with its operand kinds then its result's kind
    (fusion's ``_expression`` templates and activation clamps), numbered from :data:`_OPS`."""
    f = fusion
    table = [(f._formula(op, "f", 0.0, False), "f" * (1 if op in f._UNARY_OPS else 2) + "f")
             for op in sorted(f._UNARY_OPS - {"LEAKY_RELU"} | set(f._FLOAT_BINARY))]   # (alpha: the node's)
    table += [(f._formula(op, "f", 0.0, True), "fff") for op in ("MAXIMUM", "MINIMUM")]
    table += [(f._GELU, "ff"), (f._GELU_TANH, "ff")]
    for op in sorted(f._INT_OPS):
        unary = op in f._UNARY_OPS
        table.append((f._formula(op, "i", 0.0, False), "ii" if unary else "iii"))
        if op in ("MAXIMUM", "MINIMUM"):
            table.append((f._formula(op, "i", 0.0, True), "iii"))
    for op, template in sorted(f._COMPARE.items()):
        table += [(template, "ffb"), (template, "iib")] + ([(template, "bbb")] if op in ("EQUAL", "NOT_EQUAL") else [])
    table += [(template, "bb" if op == "LOGICAL_NOT" else "bbb") for op, template in sorted(f._LOGICAL.items())]
    table += [(f._SELECT, kinds) for kinds in ("bfff", "biii", "bbbb")]
    table += [(f._clamp(name), "ff") for name in sorted({a for a in f._ACTIVATION.values() if a})]
    return {entry: _OPS + n for n, entry in enumerate(dict.fromkeys(table))}


_READ = {"f": "F{x}[j]", "i": "I{x}[j]", "b": "(I{x}[j] != 0)"}
_WRITE = {"f": "Fd[j] = np.float32({e})", "i": "Id[j] = np.int32({e})", "b": "Id[j] = 1 if ({e}) else 0"}


@functools.lru_cache(maxsize=None)
def machine_source() -> str:
    """The source of :func:`chain_machine` (the same for every chain and model)."""
    ops = []
    for (template, kinds), code in _instructions().items():
        operands = {name: _READ[kind].format(x=name) for name, kind in zip("abc", kinds[:-1])}
        ops += [f"                    {'elif' if ops else 'if'} code == {code}:",
                "                        for j in range(n):",
                f"                            {_WRITE[kinds[-1]].format(e=template.format(**operands))}"]
    body = "\n".join(ops)
    # The frames come first, so the chain's arrays are a1 .. a7 whatever their number.
    arrays = ", ".join(f"a{j + 1}" for j in range(ARRAYS - 1))

    def pick(index: str) -> str:
        return "(" + " else ".join(f"a{j + 1} if {index} == {j}" for j in range(ARRAYS - 2)) + f" else a{ARRAYS - 1})"

    def place(x: str) -> str:    # a register of the frame, or (negative) an array at the block
        return f"advanced(Rf, {x} * width) if {x} >= 0 else advanced({pick(f'(-1 - {x})')}, r0 * c + j0)"
    maths = [f for f in fusion._MATHFN if f"_{f}" in body]
    return "\n".join([
        '"""Generated by litegpu_cpu.chainvm; safe to delete."""',
        "import numpy as np",
        "from litegpu_cpu.kernels.tasks import task_function, advanced, address_of, _call_task, "
        "int32_pointer as _i32, uint8_pointer as _u8",
        f"from litegpu_cpu.kernels.mathfn import {', '.join(f'{f} as _{f}' for f in maths)}  # mathfn {mathfn.DIGEST}",
        f"from litegpu_cpu.kernels.xnn_sigmoid import sigmoid32 as _sigmoid32  # xnn_sigmoid {xnn_sigmoid.DIGEST}",
        "",
        "",
        "@task_function()",
        f"def chain_machine(t, frames, {arrays}, ip, k):",
        f'    """Rows ``t * ip[2] ..`` of a chain program (``ip``: rows, cols, rows per task, '
        f'instructions, block, registers, rows per block, the generated kernel\'s task function, '
        f'int64 and float32 parameters once it is ready (0: not yet), then {_WORDS} words per instruction '
        f'from word {_HEADER})."""',
        "    if ip[7] != 0:   # the chain's own kernel is ready: its task, on the same arrays",
        f"        _call_task(ip[7], t, {', '.join(f'address_of(a{j + 1})' for j in range(ARRAYS - 1))}, "
        "address_of(frames), ip[8], ip[9])",
        "        return",
        "    rows, c, part, count, width, stack = ip[0], ip[1], ip[2], ip[3], ip[4], ip[6]",
        "    Rf = advanced(frames, t * ip[5] * width)",
        "    Ri = _i32(Rf)",
        "    ki = _i32(k)",
        "    end = min(rows, (t + 1) * part)",
        "    for r0 in range(t * part, end, stack):",
        "        nr = min(stack, end - r0)",
        "        for j0 in range(0, c, width):",
        "            cols = min(width, c - j0)",
        "            n = nr * cols",
        "            for q in range(count):",
        f"                w = {_HEADER} + {_WORDS} * q",
        "                code, rd, ra, rb, rc = ip[w], ip[w + 1], ip[w + 2], ip[w + 3], ip[w + 4]",
        f"                if code == {_LOAD_BOOL}:",
        f"                    bytes_ = _u8({pick('ra')})",
        "                    at = rd * width",
        "                    for i in range(nr):",
        "                        src = rb + ((r0 + i) * c + j0 if rc == 0 else j0 if rc == 1 else 0 if rc == 2 else r0 + i)",
        "                        step = 1 if rc < 2 else 0",
        "                        for j in range(cols):",
        "                            Ri[at + i * cols + j] = 1 if bytes_[src + j * step] != 0 else 0",
        f"                elif code == {_LOAD_WORD}:",
        f"                    words = ki if ra == {_CONSTANTS} else _i32({pick('ra')})",
        "                    at = rd * width",
        "                    if rc == 0:",
        "                        src = rb + r0 * c + j0",
        "                        for j in range(n):",
        "                            Ri[at + j] = words[src + j]",
        "                    elif rc == 2:",
        "                        v = words[rb]",
        "                        for j in range(n):",
        "                            Ri[at + j] = v",
        "                    else:",
        "                        for i in range(nr):",
        "                            if rc == 1:",
        "                                for j in range(cols):",
        "                                    Ri[at + i * cols + j] = words[rb + j0 + j]",
        "                            else:",
        "                                v = words[rb + r0 + i]",
        "                                for j in range(cols):",
        "                                    Ri[at + i * cols + j] = v",
        f"                elif code == {_STORE_BOOL}:",
        f"                    bytes_ = _u8({pick('ra')})",
        "                    at, src = r0 * c + j0, rd * width",
        "                    for j in range(n):",
        "                        bytes_[at + j] = np.uint8(Ri[src + j] != 0)",
        "                else:",
        f"                    Fd = {place('rd')}",
        f"                    Fa = {place('ra')}",
        f"                    Fb = {place('rb')}",
        f"                    Fc = {place('rc')}",
        "                    Id, Ia, Ib, Ic = _i32(Fd), _i32(Fa), _i32(Fb), _i32(Fc)",
        body,
        "",
    ])


def chain_machine():
    """The machine's task function (its module generated once per process)."""
    return load_generated(machine_source(), "chain_machine")


def _registers(uses: list[list[int]], results: list[int | None], fixed: dict[int, int]
               ) -> tuple[dict[int, int], int]:
    """A place per value: ``fixed`` ones (arrays, as negative places) keep theirs, the others
    get a register, reused once the value's last reader has run: (place of each value,
    register count). ``uses[n]`` are the values instruction ``n`` reads, ``results[n]`` the
    one it writes (None: a store)."""
    last = {}
    for n, read in enumerate(uses):
        for v in read:
            last[v] = n
    free: list[int] = []
    count = 0
    place = dict(fixed)
    held: dict[int, int] = {}
    for n, (read, value) in enumerate(zip(uses, results)):
        # A destination is never an operand's register: LLVM's vectorized loop runs only
        # when its runtime check finds the two apart (in place counts as overlapping).
        if value is not None and value not in place:
            if free:
                reg = free.pop()
            else:
                reg, count = count, count + 1
            place[value] = held[value] = reg
        for v in set(read):
            if last[v] == n and v in held:
                free.append(held.pop(v))
        if value in held and value not in last:     # written, never read
            free.append(held.pop(value))
    return place, count


def program(group: "fusion.FusedGroup") -> tuple[np.ndarray, np.ndarray] | None:
    """``(params, constants)`` of ``group`` as a chain program, or None when the machine
    cannot run it (see the module docstring). A float or int operand read per element is
    read where it is, and an output of those kinds is written where it goes; the rest goes
    through registers."""
    nodes, out_shape = group.nodes, tuple(group.nodes[0].outputs[0].shape)
    if len(group.inputs) + len(group.outputs) > ARRAYS - 1:
        return None
    table = _instructions()
    values: dict[int, int] = {}            # tensor -> value
    kinds: dict[int, str] = {}
    fixed: dict[int, int] = {}             # value -> its array (negative place)
    code: list[tuple[int, int, int, int]] = []
    uses: list[list[int]] = []
    results: list[int | None] = []
    pool: list[np.ndarray] = []
    pool_size = 0

    def emit(op: int, reads: list[int], result: int | None, a=0, b=0, c=0) -> int:
        code.append((op, a, b, c))
        uses.append(reads)
        results.append(result)
        return result

    value_count = 0

    def new_value() -> int:
        nonlocal value_count
        value_count += 1
        return value_count - 1

    for ctx in nodes:
        operands = []
        for t, spec in zip(ctx.node.inputs, ctx.inputs):
            if t not in values:
                kind = kinds[t] = fusion._KIND[np.dtype(spec.dtype)]
                mode = _MODES[fusion._mode(tuple(spec.shape), out_shape)]
                value = values[t] = new_value()
                if spec.value is not None:
                    words = np.asarray(spec.value, fusion.F32 if kind == "f" else np.int32).reshape(-1).view(fusion.F32)
                    emit(_LOAD_WORD, [], value, _CONSTANTS, pool_size, mode)
                    pool.append(words)
                    pool_size += words.size
                elif kind != "b" and mode == 0:
                    fixed[value] = -1 - group.inputs.index(t)
                else:
                    emit(_LOAD_BOOL if kind == "b" else _LOAD_WORD, [], value, group.inputs.index(t), 0, mode)
            operands.append(values[t])
        out = ctx.node.outputs[0]
        kind = kinds[out] = fusion._KIND[np.dtype(ctx.outputs[0].dtype)]
        op = table.get((fusion._expression(ctx), "".join(kinds[t] for t in ctx.node.inputs) + kind))
        if op is None:
            return None
        value = emit(op, operands, new_value(), *operands)
        activation = fusion._ACTIVATION.get(ctx.attrs.get("activation", "NONE")) if kind == "f" else None
        if activation:
            value = emit(table[(fusion._clamp(activation), "ff")], [value], new_value(), value)
        values[out] = value
        if out in group.outputs and kind != "b":
            fixed[value] = -1 - (len(group.inputs) + group.outputs.index(out))
    for j, t in enumerate(group.outputs):
        if kinds[t] == "b":
            emit(_STORE_BOOL, [values[t]], None, j + len(group.inputs), values[t])
    place, registers = _registers(uses, results, fixed)
    words = []
    for (op, a, b, c), read, result in zip(code, uses, results):
        if op in (_LOAD_WORD, _LOAD_BOOL):
            words += [op, place[result], a, b, c]
        elif op == _STORE_BOOL:
            words += [op, place[read[0]], a, 0, 0]
        else:
            regs = [place[v] for v in read]
            words += [op, place[result], *regs, *[0] * (3 - len(regs))]
    part, _ = fusion.task_rows(group)
    # A row shorter than a block: blocks of whole rows (contiguous in every array).
    header = [group.rows, group.cols, part, len(code), BLOCK, registers, max(1, BLOCK // max(group.cols, 1)), 0, 0, 0]
    constants = np.concatenate(pool) if pool else np.zeros(1, fusion.F32)
    return np.array(header + words, np.int64), constants


def machine_kernel(group: "fusion.FusedGroup"):
    """The group's kernel through :func:`chain_machine` (:func:`.kernels.registry.bindable`,
    inputs and outputs in group order), or None when the machine cannot run it. Its
    ``switch(address)`` makes every run of it run the group's generated task function at
    ``address`` instead (see :func:`first_tier`)."""
    made = program(group)
    if made is None:
        return None
    params, constants = made
    part, tasks = fusion.task_rows(group)
    frame_words = int(params[5]) * BLOCK
    machine = chain_machine()
    # The generated kernel's parameters, kept with the program (its row holds their addresses).
    own = np.array([group.rows, group.cols, part], np.int64), group.constants

    def bind(inputs, outputs):
        frames = np.zeros(max(tasks, 1) * max(frame_words, 1), np.float32)
        return bind_task(machine, tasks, (frames, *inputs), tuple(outputs), params, constants,
                         (np.dtype(np.float32), *group.dtypes))

    def switch(address: int) -> None:
        """From now on, run the generated task function at ``address`` instead (the same
        tasks over the same arrays, the same bits): its parameters first, then the address,
        one aligned word that running plans read whole."""
        params[8], params[9] = own[0].ctypes.data, own[1].ctypes.data
        params[7] = address

    k = bindable(bind)
    k.kernel_name = f"fused task ({len(group.nodes)} elementwise ops, chain machine)"
    k.switch = switch            # (which holds ``own``)
    return k


def covers(ctx: NodeContext) -> bool:
    """True when the machine has ``ctx``'s op (with the kinds of its operands)."""
    kinds = "".join(fusion._KIND[np.dtype(s.dtype)] for s in (*ctx.inputs, *ctx.outputs))
    return (fusion._expression(ctx), kinds) in _instructions()


def first_tier(group: "fusion.FusedGroup", fused):
    """``group`` on the machine while ``fused``, its generated kernel that no process has
    compiled yet, compiles in a background process (:mod:`.compile_queue`); once it is
    ready, the runs of this process switch to it too, and later processes link it. None
    where that would not help or is not wanted: the machine is not linked without a
    compile (nothing prebuilt: it takes seconds), prebuilt kernels are switched off
    (``$LITEGPU_PREBUILT_DIR`` set empty: every kernel compiles when first needed), the cache
    cannot keep the generated kernel, or the machine cannot run the chain (an operand
    repeating every few rows: :func:`.fusion._period`)."""
    if objects.prebuilt_dir() is None or numba_cache.home().mode != numba_cache.WRITABLE \
            or group.periods or not chain_machine().linked():
        return None
    k = machine_kernel(group)
    if k is not None:
        compile_later(fused, k.switch)
    return k
