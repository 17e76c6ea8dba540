"""litegpu's own native code: calling C functions from Python at the cost of a builtin
call, and linking cached machine code without numba.

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
builtin once on a test block, and where that fails a ctypes call that does the same
takes its place.

:func:`load_object` links object code numba emitted for a task function (kept by
:mod:`.objects`) into the same llvmlite engine, so a warm process runs its kernels
without setting up numba's compiler.
"""
from __future__ import annotations

import ctypes
import logging
import struct
import threading
from functools import lru_cache

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


class NativeError(RuntimeError):
    """Machine code that cannot be linked into this process (a symbol it needs is missing)."""


@lru_cache(maxsize=None)
def host_cpu() -> tuple[str, str]:
    """(name, features) of the CPU machine code is generated for, as numba targets it
    (asked once a process: every cache key of :mod:`.objects` holds it)."""
    import llvmlite.binding as llvm
    return llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten()


def undefined_symbols(code: bytes) -> list[str] | None:
    """The symbols object file ``code`` uses and does not define, from its symbol table;
    None when it is not a 64-bit little-endian ELF file (the one format read here)."""
    if len(code) < 64 or code[:4] != b"\x7fELF" or code[4] != 2 or code[5] != 1:
        return None
    try:
        table, table_size, strings_at = 0, 0, 0
        shoff, = struct.unpack_from("<Q", code, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", code, 0x3A)
        for i in range(shnum):
            _, kind, _, _, offset, size, link = struct.unpack_from("<IIQQQQI", code, shoff + i * shentsize)
            if kind == 2:                                 # SHT_SYMTAB; its names in section ``link``
                table, table_size = offset, size
                strings_at = struct.unpack_from("<Q", code, shoff + link * shentsize + 24)[0]
        names = set()
        for at in range(table, table + table_size, 24):
            name, info, _, section = struct.unpack_from("<IBBH", code, at)
            if name and section == 0 and info >> 4 != 0:  # undefined, global or weak
                names.add(code[strings_at + name:code.index(b"\0", strings_at + name)].decode())
        return sorted(names)
    except (struct.error, ValueError, UnicodeDecodeError):
        return None


# What numba's C callbacks may reference from numba's own C helpers, which are not
# exported where ctypes could find them: the GIL pair, and calls only made when a callback
# raises (a task function cannot: it reports bad input in its parameters) or frees an
# array numba allocated (a task function allocates none). Defined by :func:`_shims` in the
# engine itself, so they resolve only this engine's objects and never numba's.
_RAISING = ("numba_do_raise", "numba_runtime_build_excinfo_struct", "numba_unpickle")
_FREEING = ("NRT_Free", "NRT_MemInfo_call_dtor", "NRT_decref")
_SHIMS = ("numba_gil_ensure", "numba_gil_release", *_RAISING, *_FREEING)


def _in_process(name: str) -> bool:
    try:
        getattr(ctypes.pythonapi, name)      # dlsym over the process: CPython, libc
        return True
    except AttributeError:
        return False


def resolvable(needs: list[str]) -> bool:
    """True when every symbol in ``needs`` can be linked in this process without numba."""
    return all(name in _SHIMS or _in_process(name) for name in needs)


def _shims_ir() -> str:
    from llvmlite import ir
    i8p, i32, i64 = ir.IntType(8).as_pointer(), ir.IntType(32), ir.IntType(64)
    module = ir.Module("litegpu_native_shims")

    def define(name: str, result, *args):
        function = ir.Function(module, ir.FunctionType(result, list(args)), name)
        return function, ir.IRBuilder(function.append_basic_block())

    def api(b, name: str, result, *args):
        return b.inttoptr(ir.Constant(i64, _address(getattr(ctypes.pythonapi, name))),
                          ir.FunctionType(result, list(args)).as_pointer())

    ensure, b = define("numba_gil_ensure", ir.VoidType(), i32.as_pointer())
    b.store(b.call(api(b, "PyGILState_Ensure", i32), []), ensure.args[0])
    b.ret_void()
    release, b = define("numba_gil_release", ir.VoidType(), i32.as_pointer())
    b.call(api(b, "PyGILState_Release", ir.VoidType(), i32), [b.load(release.args[0])])
    b.ret_void()
    text = bytearray(b"a litegpu task function raised\0")
    message = ir.GlobalVariable(module, ir.ArrayType(ir.IntType(8), len(text)), "litegpu_raised")
    message.initializer = ir.Constant(ir.ArrayType(ir.IntType(8), len(text)), text)
    message.global_constant = True
    runtime_error = _address(ctypes.pythonapi.PyExc_RuntimeError)
    for name in _RAISING:           # the callback then writes a RuntimeError as unraisable
        _, b = define(name, i8p)
        exc = b.load(b.inttoptr(ir.Constant(i64, runtime_error), i8p.as_pointer()))
        b.call(api(b, "PyErr_SetString", ir.VoidType(), i8p, i8p), [exc, b.bitcast(message, i8p)])
        b.ret(ir.Constant(i8p, None))
    for name in _FREEING:
        _, b = define(name, i8p)
        b.ret(ir.Constant(i8p, None))
    return str(module)


def load_object(code: bytes, symbol: str, needs: list[str]) -> int:
    """Link object code ``code`` (numba's, for this CPU) into :func:`engine` and return the
    address of ``symbol``; :class:`NativeError` when a symbol in ``needs`` cannot be found
    (checked first: LLVM aborts the process on an unresolved symbol)."""
    import llvmlite.binding as llvm
    if not resolvable(needs):
        raise NativeError(f"needs {[n for n in needs if n not in _SHIMS and not _in_process(n)]}")
    jit = engine()
    with _LOCK:
        if "shims" not in _MADE:
            jit.add_module(llvm.parse_assembly(_shims_ir()))
            _MADE["shims"] = True
        jit.add_object_file(llvm.ObjectFileRef.from_data(code))
        jit.finalize_object()
        address = jit.get_function_address(symbol)
    if not address:
        raise NativeError(f"the object defines no {symbol}")
    return address


def _make_call_block():
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
