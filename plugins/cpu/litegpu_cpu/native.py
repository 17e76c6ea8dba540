"""Calling compiled C functions from Python at the cost of a builtin call.

A plan's launcher is a C function (a numba ``cfunc``). Called through ctypes it cost
~0.6 us a call on the 2-core test machine, through a numba dispatcher ~0.2 us (argument
typing); a wake-word model's whole invoke is ~7 us. :data:`call_block` is a builtin
function, made here once per process from a few lines of LLVM IR compiled with llvmlite,
that takes one int64 numpy array, the *block*, and calls the C function whose address is
``block[0]`` with a pointer to ``block[1:]``, with the GIL released around the call:
~0.05 us. ``functools.partial(call_block, block)`` is then a plan's whole call.

The IR reads the array's data pointer at its fixed offset in numpy's ``PyArrayObject``
(after the object header) and calls CPython's ``PyEval_SaveThread`` /
``PyEval_RestoreThread`` / ``Py_IncRef`` through their addresses; :func:`_check` runs the
builtin once on a test block, and where its layout assumption does not hold (a
free-threaded CPython) a ctypes call that does the same takes its place.
"""
from __future__ import annotations

import ctypes
import logging
import sys
import threading

import numpy as np

log = logging.getLogger("litegpu.cpu.native")

_METH_O = 0x0008
_LOCK = threading.Lock()
_MADE: dict[str, object] = {}


class _MethodDef(ctypes.Structure):
    """CPython's ``PyMethodDef``."""
    _fields_ = [("name", ctypes.c_char_p), ("meth", ctypes.c_void_p), ("flags", ctypes.c_int),
                ("doc", ctypes.c_char_p)]


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


def engine():
    """The process's llvmlite MCJIT engine for litegpu's own native code (made once)."""
    with _LOCK:
        found = _MADE.get("engine")
        if found is None:
            import llvmlite.binding as llvm
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            machine = llvm.Target.from_default_triple().create_target_machine(opt=2, jit=True)
            found = _MADE["engine"] = (llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine), machine)
        return found[0]


def _trampoline_ir() -> str:
    """``PyObject *call(PyObject *self, PyObject *block)``: see the module docstring."""
    from llvmlite import ir
    i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
    module = ir.Module("litegpu_native_call")
    function = ir.Function(module, ir.FunctionType(i8p, [i8p, i8p]), "litegpu_call_block")
    b = ir.IRBuilder(function.append_basic_block())

    def api(name: str, result, *args):
        return b.inttoptr(ir.Constant(i64, _address(getattr(ctypes.pythonapi, name))),
                          ir.FunctionType(result, list(args)).as_pointer())

    data = b.load(b.bitcast(b.gep(function.args[1], [ir.Constant(i64, object.__basicsize__)]),
                            i64.as_pointer().as_pointer()))
    target = b.inttoptr(b.load(data), ir.FunctionType(ir.VoidType(), [i64.as_pointer()]).as_pointer())
    state = b.call(api("PyEval_SaveThread", i8p), [])
    b.call(target, [b.gep(data, [ir.Constant(i64, 1)])])
    b.call(api("PyEval_RestoreThread", ir.VoidType(), i8p), [state])
    none = b.inttoptr(ir.Constant(i64, id(None)), i8p)
    b.call(api("Py_IncRef", ir.VoidType(), i8p), [none])
    b.ret(none)
    return str(module)


def _builtin():
    import llvmlite.binding as llvm
    jit = engine()
    module = llvm.parse_assembly(_trampoline_ir())
    module.verify()
    with _LOCK:
        jit.add_module(module)
        jit.finalize_object()
        definition = _MethodDef(b"call_block", jit.get_function_address("litegpu_call_block"), _METH_O,
                                b"call_block(block): call block[0] with &block[1], GIL released")
        _MADE["definition"] = definition          # must outlive the function object
    new = ctypes.pythonapi.PyCFunction_NewEx
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.py_object, ctypes.py_object]
    return new(ctypes.addressof(definition), None, None)


_ENTRY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _ctypes_call(block: np.ndarray) -> None:
    """:data:`call_block` through ctypes (slower, no layout assumption)."""
    _ENTRY(int(block[0]))(block[1:].ctypes.data)


def _check(call) -> bool:
    """True when ``call`` runs a test block correctly: a C function adding its first
    argument into its second (written in IR here, so no numba is needed)."""
    import llvmlite.binding as llvm
    from llvmlite import ir
    i64 = ir.IntType(64)
    module = ir.Module("litegpu_native_check")
    function = ir.Function(module, ir.FunctionType(ir.VoidType(), [i64.as_pointer()]), "litegpu_native_add")
    b = ir.IRBuilder(function.append_basic_block())
    second = b.gep(function.args[0], [ir.Constant(i64, 1)])
    b.store(b.add(b.load(function.args[0]), b.load(second)), second)
    b.ret_void()
    jit = engine()
    with _LOCK:
        jit.add_module(llvm.parse_assembly(str(module)))
        jit.finalize_object()
        add = jit.get_function_address("litegpu_native_add")
    block = np.array([add, 5, 37], np.int64)
    call(block)
    return int(block[2]) == 42


def _make_call_block():
    if not getattr(sys, "_is_gil_enabled", lambda: True)():
        log.debug("free-threaded CPython: plans are called through ctypes")
        return _ctypes_call
    try:
        call = _builtin()
        if _check(call):
            return call
        log.warning("litegpu's native call failed its check; plans are called through ctypes (slower)")
    except Exception as exc:        # llvmlite or CPython differ: the slower call still works
        log.warning("litegpu's native call could not be made (%s); plans are called through ctypes", exc)
    return _ctypes_call


call_block = _make_call_block()
"""``call_block(block)``: call the C function at ``block[0]`` (``void f(int64_t *)``) with
``&block[1]``, the GIL released; ``block`` a C-contiguous int64 numpy array."""
