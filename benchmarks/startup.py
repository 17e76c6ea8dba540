"""Startup cost of one model: import, Interpreter creation + allocation, first invoke.

usage: python benchmarks/startup.py MODEL

"Cold" means every cache empty: run with fresh NUMBA_CACHE_DIR and LITEGPU_CACHE_DIR;
"warm" is a second process with the same directories. The cpu backend's numba kernels
compile lazily, so the first invoke carries the JIT cost.
"""
import sys
import time

t0 = time.perf_counter()
import numpy as np  # noqa: E402

import litegpu  # noqa: E402

t1 = time.perf_counter()
interp = litegpu.Interpreter(model_path=sys.argv[1], num_threads=2)
interp.allocate_tensors()
t2 = time.perf_counter()
for d in interp.get_input_details():
    interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
interp.invoke()
t3 = time.perf_counter()
print(f"import {t1 - t0:.2f}s  create+allocate {t2 - t1:.2f}s  first invoke {t3 - t2:.2f}s  total {t3 - t0:.2f}s")
