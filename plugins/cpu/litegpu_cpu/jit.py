"""numba, imported when first needed.

Importing numba (its typing and lowering machinery) takes ~0.2 s on the 2-core test
machine: a third of a warm process's time to its first result, though a warm process
needs none of it (its task functions link from litegpu's cache of machine code,
:mod:`.objects`). So the cpu kernels' modules take numba's names from here, and what
they make with them at import is *deferred*:

- ``njit(...)(f)``, ``intrinsic(f)``, ``cfunc(sig, ...)(f)``: a :class:`Jitted` holding the
  function and how to compile it;
- ``types``, ``carray``, ``cgutils``: :class:`Numba` expressions (``types.void(
  types.int64, types.CPointer(types.float32))``) evaluated against numba later; their
  ``str`` is stable, so a signature can key a cache entry before numba is imported;
- :func:`when_ready` callbacks: what must subclass or register with numba at once (a
  numba type and its data model).

:func:`materialize` imports numba once (litegpu's cache locator installed first, see
:mod:`.numba_cache`), runs the callbacks, makes every deferred object real and puts the
real objects in place of the deferred ones in the module namespaces of the package and
its generated modules, so numba, compiling a function, finds real objects among its
globals. It runs on the first need: a task function missing from the machine-code cache
(it compiles), a jitted function called from Python, an attribute read from one. When
numba is already imported when the kernels are (a test, a user's own numba code), the
kernels materialize at once: there is nothing to save.
"""
from __future__ import annotations

import sys
import threading

_LOCK = threading.RLock()
_READY: list = []          # callbacks run once numba is imported
_MADE: list["Jitted"] = []
_DONE = False


class Numba:
    """An expression over numba's namespace (``types.CPointer(types.float32)``), evaluated
    by :func:`real`."""

    __slots__ = ("_path", "_base", "_args", "_kwargs")

    def __init__(self, path: str, base: "Numba | None" = None, args: tuple | None = None,
                 kwargs: dict | None = None) -> None:
        self._path, self._base, self._args, self._kwargs = path, base, args, kwargs

    def __getattr__(self, name: str) -> "Numba":
        if name.startswith("__"):
            raise AttributeError(name)
        if _DONE:
            return getattr(real(self), name)
        return Numba(name, self)

    def __call__(self, *args, **kwargs):
        if _DONE:
            return real(self)(*real(args), **real(kwargs))
        return Numba("", self, args, kwargs)

    def __getitem__(self, index):
        if _DONE:
            return real(self)[real(index)]
        return Numba("[]", self, (index,), None)

    def __str__(self) -> str:
        if self._args is not None:
            keywords = sorted((self._kwargs or {}).items())
            inner = ", ".join([*map(str, self._args), *(f"{k}={v}" for k, v in keywords)])
            return f"{self._base}[{inner}]" if self._path == "[]" else f"{self._base}({inner})"
        return f"{self._base}.{self._path}" if self._base is not None else self._path

    __repr__ = __str__

    def _evaluate(self):
        if self._base is None:
            import importlib
            return importlib.import_module(self._path)
        base = real(self._base)
        if self._args is None:
            return getattr(base, self._path)
        args = real(self._args)
        if self._path == "[]":
            return base[args[0]]
        return base(*args, **real(self._kwargs))


class Jitted:
    """A function given to a numba decorator (``njit``, ``intrinsic``, ``cfunc``), compiled
    through the real decorator once numba is imported (:func:`materialize`). Calling it, or
    reading an attribute (``py_func``, ``address``), materializes."""

    def __init__(self, decorator: Numba, function) -> None:
        self.decorator, self.function, self.made = decorator, function, None
        self.__name__ = getattr(function, "__name__", "jitted")
        self.__qualname__ = getattr(function, "__qualname__", self.__name__)
        self.__module__ = getattr(function, "__module__", None)
        self.__doc__ = getattr(function, "__doc__", None)
        _MADE.append(self)

    def __call__(self, *args, **kwargs):
        return real(self)(*args, **kwargs)

    def __getattr__(self, name: str):
        # (numba probes values it types for ``_numba_type_``: no materializing mid-typing)
        if name.startswith(("__", "_numba")) or name in ("decorator", "function", "made"):
            raise AttributeError(name)
        return getattr(real(self), name)


class _Decorator(Numba):
    """``njit(...)``, ``intrinsic``, ``cfunc(sig, ...)``: applied to a function, a
    :class:`Jitted`; otherwise an expression."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        if _DONE:
            return real(self)(*real(args), **real(kwargs))
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Numba):
            return Jitted(self, args[0])
        return _Decorator("", self, args, kwargs)


def real(value):
    """``value`` with every deferred object in it made real (materializing first):
    expressions evaluated, jitted functions compiled objects; tuples, lists and dicts
    through."""
    if isinstance(value, Jitted):
        if value.made is None:
            materialize()
        return value.made
    if isinstance(value, Numba):
        materialize()
        return value._evaluate()
    if isinstance(value, tuple):
        return tuple(real(v) for v in value)
    if isinstance(value, list):
        return [real(v) for v in value]
    if isinstance(value, dict):
        return {k: real(v) for k, v in value.items()}
    return value


def when_ready(callback) -> None:
    """Run ``callback()`` once numba is imported (now, when it is already): for what must
    subclass or register with numba itself."""
    with _LOCK:
        if _DONE:
            callback()
        else:
            _READY.append(callback)


def materialize() -> None:
    """Import numba and make every deferred object real, in place (see the module docstring);
    once a process."""
    global _DONE
    if _DONE:
        return
    with _LOCK:
        if _DONE:
            return
        from . import numba_cache
        numba_cache.install()            # (imports numba) before any cache=True function is made
        _DONE = True                     # (expressions evaluate from here on)
        for callback in _READY:
            callback()
        _READY.clear()
        for jitted in _MADE:
            jitted.made = real(jitted.decorator)(jitted.function)
        _MADE.clear()
        _replace_in_modules()
        _typeof_deferred()
        # The intrinsics registered their typing just now, perhaps after numba's typing
        # context was made (the first jitted function makes it): let it see them.
        from numba.core.registry import cpu_target
        cpu_target.typing_context.refresh()


def _replace_in_modules() -> None:
    """Real objects for the deferred ones among the globals of the package's modules and of
    its generated ones (numba resolves a compiled function's globals by name)."""
    from .numba_cache import GENERATED_MARK
    for name, module in list(sys.modules.items()):
        space = getattr(module, "__dict__", None)
        if space is None or not (name.startswith("litegpu_cpu") or space.get(GENERATED_MARK)):
            continue
        for key, value in list(space.items()):
            if _deferred(value):
                space[key] = real(value)


def _deferred(value) -> bool:
    """True for a deferred object, or a tuple, list or dict holding one."""
    if isinstance(value, (Jitted, Numba)):
        return True
    if isinstance(value, (tuple, list)):
        return any(_deferred(v) for v in value)
    if isinstance(value, dict):
        return any(_deferred(v) for v in value.values())
    return False


def _typeof_deferred() -> None:
    """A deferred object kept elsewhere (a closure's cell, a user's module that imported it
    early) types as the real one when numba meets it."""
    from numba.core.registry import cpu_target
    from numba.core.typing.typeof import typeof_impl

    @typeof_impl.register(Jitted)
    @typeof_impl.register(Numba)
    def _typeof(value, context):
        # (an intrinsic types through the typing context's globals, not typeof)
        return cpu_target.typing_context.resolve_value_type(real(value))


njit = _Decorator("njit", Numba("numba"))
cfunc = _Decorator("cfunc", Numba("numba"))
intrinsic = _Decorator("intrinsic", Numba("numba.extending"))
types = Numba("numba.types")
carray = Numba("carray", Numba("numba"))
cgutils = Numba("numba.core.cgutils")


def materialize_if_imported() -> None:
    """Materialize now when numba is imported already (nothing to save by waiting)."""
    if "numba" in sys.modules:
        materialize()
