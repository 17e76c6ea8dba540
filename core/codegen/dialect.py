"""The C family's dialect interface: how OpenCL C, CUDA C++ and MSL spell what a kernel needs.

Kernels (:mod:`litegpu.codegen.kernels`) are written once, as :mod:`.ir` trees, and
never name a GPU API; :mod:`.crender` renders them in the C family's kernel language
below. What differs between the C-family APIs is data, one :class:`Dialect` table each
(:mod:`.opencl`, :mod:`.cuda`, :mod:`.metal`; a plugin registers its own through the
``litegpu_dialects`` hook):

- a kernel's signature: its prefix, how a buffer parameter is declared, whether
  tensors arrive as (buffer, element offset) pairs or as pointers the runtime has
  already offset, and the extra parameters some APIs deliver the thread ids through;
- local (threadgroup) memory: the qualifier of a pointer into it and the declaration
  of an array in it; the barrier between its phases;
- the global / local / group ids of a work-item along axis 0, 1 or 2;
- a vector value: its constructor, and how lane ``j`` of a vector is read;
- the precision prelude: the ``real``/``real4``/``FT`` types and the ``LD``/``ST``/
  ``LD4``/``ST4``/``TO_REAL4`` half load/store macros of each precision mode;
- the library: definitions of the kernel language's functions the API lacks.

The kernel language is C statements (declarations, ``for``/``if``, arithmetic, C casts
between scalars) plus the vector types ``float4``/``float8``/``float16``, ``real4``,
``int4``-style integer quads, and these functions, in OpenCL C's spelling (OpenCL has
them built in; another dialect's library defines what its API lacks): the math of
OpenCL's scalar builtins (``exp``, ``tanh``, ``rint``, ``fmax``, ``clamp``, ...
overloaded for vectors with scalar bounds), ``vload{4,8,16}``/``vstore4``,
``vload_half{,4,8,16}``/``vstore_half{,4}``, ``convert_float{4,8,16}``/``convert_half4``
and the saturating or rounding integer conversions ``convert_<int>_sat`` and
``convert_long_rte``. Anything else a kernel needs goes through this table.

WGSL is not a table of this kind: it has no preprocessor and declares variables
differently, so it renders the tree itself (:mod:`.wgsl`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

AXES = "xyz"
#: The quads of an 8- and a 16-lane vector by name: OpenCL's swizzles, and the fields of the
#: structs a dialect without swizzles defines wide vectors as.
QUADS = {8: ("lo", "hi"), 16: ("s0123", "s4567", "s89ab", "scdef")}


@dataclass(frozen=True)
class Dialect:
    """One GPU API's spellings. Format fields name their placeholders.

    OpenCL's ``.sN`` lanes and ``.lo``/``.hi``/``.s0123`` quads of wide vectors are
    swizzles; a dialect without them defines ``float8`` as a struct of quads ``lo`` and
    ``hi`` and ``float16`` of ``s0123``, ``s4567``, ``s89ab`` and ``scdef``, so the quads
    read the same and :meth:`vector_lane` spells a lane.
    """

    name: str                       # "opencl", "cuda", "metal"
    suffix: str                     # a source file's suffix
    kernel_prefix: str              # what precedes a kernel's name
    buffer_param: str               # {ptr} (pointer type) {name} {index} (parameter position)
    offset_param: str | None        # {name} {index}; None: the runtime passes pointers at their offset
    global_space: str               # qualifier of a pointer to device memory (with its trailing space)
    local_space: str                # qualifier of a pointer into local memory
    local_array: str                # {type} {name} {size}: an array in local memory
    restrict: str                   # a non-aliasing pointer's qualifier ("" for none)
    barrier: str                    # a statement: every work-item of the group waits; local memory is visible
    global_id: str                  # {d} (0, 1, 2) and {axis} (x, y, z), an int
    local_id: str
    group_id: str
    id_params: str                  # parameters appended to a signature (ids delivered as arguments)
    vector: str                     # {type} {args}: a vector from lanes, quads or one scalar
    exact_grid: bool                # launches run exactly the global size (no guard needed)
    swizzles: bool                  # OpenCL's ``.sN`` lanes; else wide vectors are structs of quads
    preludes: dict[str, str] = field(default_factory=dict)   # per precision name: types and LD/ST macros
    library: str = ""               # definitions of kernel-language functions the API lacks
    max_buffers: int = 0            # buffer parameters a kernel may take (0: no limit that binds)
    max_lanes: int = 16             # the widest vector a kernel may use
    max_local_bytes: int = 32768    # local memory a work-group may use (what every device of the API has)
    int64: bool = True              # 64-bit integer values and tensors
    flat_launches: bool = False     # prefer one launch axis (groups per axis are few: WGSL's 65535)
    # {cond} {a} {b}: ``a`` where ``cond`` holds, else ``b``; lane by lane when they are vectors,
    # as OpenCL's ``?:`` (C++ cannot overload it: CUDA spells OpenCL's ``select``)
    choose: str = "({cond} ? {a} : {b})"
    # {type} {x}: the bits of scalar ``x`` read as ``type`` (a 32-bit float, int or uint)
    bitcast: str = "as_{type}({x})"
    # {type} {name} {size} {values}: a constant table declared in a kernel's outermost scope
    table: str = "__constant {type} {name}[{size}] = {{{values}}};"

    def id(self, kind: str, d: int) -> str:
        """Work-item id ``kind`` ("global", "local", "group") along axis ``d``."""
        return getattr(self, f"{kind}_id").format(d=d, axis=AXES[d])

    def make_vector(self, vtype: str, *args: str) -> str:
        """A ``vtype`` value from ``args`` (lanes, smaller vectors, or one scalar to broadcast);
        a scalar ``vtype`` is a C cast."""
        if not vtype[-1].isdigit():
            return f"({vtype})({', '.join(args)})"
        return self.vector.format(type=vtype, args=", ".join(args))

    def vector_lane(self, var: str, j: int, width: int) -> str:
        """Lane ``j`` of the ``width``-lane vector ``var``."""
        if self.swizzles:
            return f"{var}.s{j:x}"
        if width <= 4:
            return f"{var}.{'xyzw'[j]}"
        return f"{var}.{QUADS[width][j // 4]}.{'xyzw'[j % 4]}"

    def render(self, kernel, precision) -> str:
        """``kernel`` (a :class:`~litegpu.codegen.ir.Kernel`) as source in ``precision``
        (a :class:`~litegpu.codegen.Precision`): one C-family renderer serves every table."""
        from .crender import CRenderer
        return CRenderer(self, precision).kernel(kernel)

    def storage_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype a tensor stored as ``dtype`` has in this API's buffers: the same (C
        pointers take every element type)."""
        return np.dtype(dtype)

    def prelude(self, precision_name: str) -> str:
        """Everything a program of this dialect starts with, in ``precision_name`` mode."""
        if precision_name not in self.preludes:
            raise KeyError(f"the {self.name} dialect renders no {precision_name} programs")
        return self.library + self.preludes[precision_name]
