"""litegpu's own native code (:mod:`litegpu_cpu.native`, :mod:`litegpu_cpu.objects`,
:mod:`litegpu_cpu.jit`): the builtin that calls a plan's C entry, reading symbols from
object files, refusing to link what cannot be resolved (LLVM would abort the process),
and a warm process running a model's task functions from litegpu's cache without
importing numba."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from numba import cfunc, types

from litegpu_cpu import jit, native
from litegpu_cpu.kernels import tasks


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, nogil=True)
def _spin_then_add(arguments):
    """Spin ``arguments[0]`` steps of a hash, then add 1 to ``arguments[1]``."""
    h = arguments[2]
    for _ in range(arguments[0]):
        h = h * 6364136223846793005 + 1442695040888963407
    arguments[2] = h
    arguments[1] += 1


def test_call_block_is_a_builtin_that_calls_the_entry():
    assert type(native.call_block).__name__ == "builtin_function_or_method"
    block = np.array([_spin_then_add.address, 10, 41, 0], np.int64)
    native.call_block(block)
    assert block[2] == 42


# Numba code of one's own takes litegpu's numba objects made real (they are deferred until
# numba is needed, see litegpu_cpu.jit).
_load_acquire = jit.real(tasks._load_acquire)


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, nogil=True)
def _wait_for_flag(arguments):
    """Spin until the int64 at address ``arguments[0]`` is set (``arguments[2]`` = 1), or
    give up after ``arguments[1]`` looks (``arguments[2]`` = -1)."""
    for _ in range(arguments[1]):
        if _load_acquire(arguments[0]) != 0:
            arguments[2] = 1
            return
    arguments[2] = -1


def test_call_block_releases_the_gil():
    """A C entry waits for a flag that only another Python thread sets: it is set (rather
    than the wait running out) only if the call let that thread run."""
    flag = np.zeros(1, np.int64)
    block = np.array([_wait_for_flag.address, flag.ctypes.data, 3_000_000_000, 0], np.int64)
    setter = threading.Timer(0.05, lambda: flag.__setitem__(0, 1))
    setter.start()
    native.call_block(block)
    setter.join()
    assert block[3] == 1


@cfunc(types.void(types.CPointer(types.int64)), nopython=True)
def _divide(arguments):
    """``arguments[2] = arguments[0] // arguments[1]``: raises on a zero divisor (numba's
    error model for Python), so the callback carries numba's error path."""
    arguments[2] = arguments[0] // arguments[1]


def test_undefined_symbols_of_numbas_object_code():
    code = _divide._library._get_compiled_object()
    needs = native.undefined_symbols(code)
    assert needs is not None and {"numba_gil_ensure", "PyErr_WriteUnraisable"} <= set(needs)
    assert not any(name.startswith("llvm.") for name in needs)
    assert native.resolvable(needs)
    assert native.undefined_symbols(b"not an object file" * 8) is None
    assert native.undefined_symbols(code[:100]) is None        # truncated: no symbol table reachable


def test_an_object_needing_an_unknown_symbol_is_refused_not_linked():
    code = _divide._library._get_compiled_object()
    with pytest.raises(native.NativeError, match="litegpu_no_such_symbol"):
        native.load_object(code, _divide.native_name, ["litegpu_no_such_symbol"])


def test_a_linked_object_computes_and_reports_a_raise_as_numba_does(monkeypatch):
    """Linked without numba's runtime, the callback divides as numba's does, and a zero
    divisor goes to Python's unraisable hook (numba's shows its ZeroDivisionError there;
    litegpu's shims a RuntimeError) and the process goes on."""
    code = _divide._library._get_compiled_object()
    address = native.load_object(code, _divide.native_name, native.undefined_symbols(code))
    ours, numbas = (np.array([a, 45, 7, 0], np.int64) for a in (address, _divide.address))
    native.call_block(ours)
    native.call_block(numbas)
    assert ours[3] == numbas[3] == 6
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda raised: seen.append(raised.exc_type))
    native.call_block(np.array([address, 1, 0, 0], np.int64))
    assert seen == [RuntimeError]


_WARM_CHILD = r"""
import json, sys
import numpy as np
import litegpu
from litegpu.testing.builder import ModelBuilder
b = ModelBuilder()
x = b.input("x", [1, 12, 12, 8])
w = b.const("w", np.linspace(-1, 1, 3 * 3 * 8, dtype=np.float32).reshape(1, 3, 3, 8))
bias = b.const("bias", np.linspace(-0.5, 0.5, 8, dtype=np.float32))
y = b.tensor("y", [1, 12, 12, 8])
b.op("DEPTHWISE_CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1)
z = b.tensor("z", [1, 12, 12, 8])
b.op("LOGISTIC", [y], [z])
b.output(z)
it = litegpu.Interpreter(model_content=b.build(), num_threads=2)
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.linspace(-3, 3, 12 * 12 * 8, dtype=np.float32).reshape(1, 12, 12, 8))
it.invoke()
imported = "numba" in sys.modules
print(json.dumps({"out": it.get_tensor(it.get_output_details()[0]["index"]).tolist(), "numba imported": imported}))
"""


def test_a_warm_process_runs_its_task_functions_without_numba(tmp_path):
    """Cold, the task functions compile with numba; warm, they are linked from litegpu's
    cache and numba is never imported (~0.35 s of start-up: the import and its compiler's
    set-up), with the same output bits."""
    env = dict(os.environ, LITEGPU_CACHE_DIR=str(tmp_path / "cache"))

    def child() -> dict:
        done = subprocess.run([sys.executable, "-c", _WARM_CHILD], env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    cold, warm = child(), child()
    assert cold["numba imported"] and not warm["numba imported"]
    assert warm["out"] == cold["out"]
    assert list((tmp_path / "cache").glob("numba/*/objects/*.o"))
