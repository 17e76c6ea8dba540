"""GPU kernels written once, rendered per GPU API.

- :mod:`.ir`: kernels as a small typed tree, rendered by :mod:`.crender` (OpenCL C, CUDA
  C++, MSL: one renderer, a :class:`.dialect.Dialect` table of spellings per API) and
  :mod:`.wgsl`; plugins register the dialects (:data:`.dialects.DIALECTS`);
- :mod:`.formulas`: the elementwise formulas, written once, which :mod:`.pyrender` also
  renders for the cpu backend's fused numba kernels;
- :mod:`.kernels`: the op kernels, one generator per op, written against
  :class:`.nodegen.NodeGen`;
- :mod:`.fusion` and :mod:`.planning`: which nodes a GPU backend takes and which
  elementwise followers fold into their producer's kernel;
- :mod:`.render`: a partition as one program source with launch sizes, for any dialect.

A GPU plugin is the runtime around it: device, build, memory, launch, events, cache.
"""
from .dialect import Dialect
from .dialects import DIALECTS
from .nodegen import (HALF_ARITHMETIC, Arg, Follower, KernelSpec, NodeGen, Precision, requested_precision, round_up,
                      strides_of)

__all__ = ["DIALECTS", "HALF_ARITHMETIC", "Arg", "Dialect", "Follower", "KernelSpec", "NodeGen", "Precision",
           "requested_precision", "round_up", "strides_of"]
