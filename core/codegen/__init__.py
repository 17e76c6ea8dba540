"""GPU kernels written once, rendered per GPU API.

- :mod:`.dialect`: the interface, what a GPU API spells differently (a table per API:
  :mod:`.opencl`, ...; all of them in :data:`.dialects.DIALECTS`);
- :mod:`.ir`: kernels as a small typed tree, rendered by :mod:`.crender` (OpenCL C, CUDA
  C++, MSL) and :mod:`.wgsl`; :mod:`.formulas`: the elementwise formulas, written once;
- :mod:`.kernels`: the op kernels, one generator per op, written against
  :class:`.nodegen.NodeGen` (as trees, or still as C text spelled through the dialect);
- :mod:`.fusion` and :mod:`.planning`: which nodes a GPU backend takes and which
  elementwise followers fold into their producer's kernel;
- :mod:`.render`: a partition as one program source with launch sizes, for any dialect.

A GPU plugin is the runtime around it: device, build, memory, launch, events, cache.
"""
from .dialect import Dialect
from .dialects import DIALECTS
from .nodegen import (HALF_ARITHMETIC, Arg, Follower, KernelSpec, NodeGen, Precision, c_float, c_type, prelude,
                      requested_precision, round_up, strides_of)

__all__ = ["DIALECTS", "HALF_ARITHMETIC", "Arg", "Dialect", "Follower", "KernelSpec", "NodeGen", "Precision", "c_float", "c_type",
           "prelude", "requested_precision", "round_up", "strides_of"]
