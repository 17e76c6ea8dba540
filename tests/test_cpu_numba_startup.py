"""numba's start-up as litegpu sets it (litegpu_cpu.numba_startup): running a model imports
no scipy.linalg (numba's BLAS probe is answered without it) and no C parser (numba's FFI
is made on first use), and a user's numba code that calls BLAS or a cffi function still
works in the same process."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("scipy")

CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    import litegpu
    from litegpu.testing.builder import ModelBuilder
    b = ModelBuilder()
    x = b.input("x", (2, 3), np.float32)
    y = b.tensor("y", (2, 3), np.float32)
    b.op("RELU", [x], [y])
    b.output(y)
    interp = litegpu.Interpreter(model_content=b.build())
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.full((2, 3), -1.0, np.float32))
    interp.invoke()
    assert (interp.get_tensor(interp.get_output_details()[0]["index"]) == 0).all()
    print("after a run:", "scipy.linalg" in sys.modules)
    print("pycparser after a run:", "pycparser" in sys.modules)
    import numba
    @numba.njit
    def dot(a, b):
        return np.dot(a, b)
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    assert np.allclose(dot(a, a.T), a @ a.T)
    print("after np.dot in numba:", "scipy.linalg" in sys.modules)
    try:
        import cffi
    except ImportError:
        cffi = None
    if cffi is not None:
        ffi = cffi.FFI()
        ffi.cdef("double sqrt(double);")
        c_sqrt = ffi.dlopen(None).sqrt
        @numba.njit
        def root(v):
            return c_sqrt(v)
        assert root(9.0) == 3.0
        print("cffi in numba works")
""")


def test_a_run_imports_no_scipy_linalg_and_numba_blas_still_works(tmp_path) -> None:
    """Twice, on one cache: the first run compiles (typing a global asks numba's FFI whether
    it is a cffi function, which makes it), the second loads what the first compiled."""
    env = {"LITEGPU_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    for run in ("cold", "warm"):
        res = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=600,
                             env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-2000:]
        assert "after a run: False" in res.stdout
        assert "after np.dot in numba: True" in res.stdout
        if importlib.util.find_spec("cffi") is not None:
            assert "cffi in numba works" in res.stdout
    if importlib.util.find_spec("cffi") is not None:
        assert "pycparser after a run: False" in res.stdout     # a warm run never made numba's FFI
