"""The OpenCL C dialect (OpenCL 1.2, what every OpenCL driver builds)."""
from __future__ import annotations

from .dialect import Dialect

# Every prelude turns contraction off: OpenCL C lets a compiler fuse ``a * b + c`` into one
# rounding (clang does, within an expression), and the kernels' arithmetic is LiteRT's only
# where each operation rounds as written (a fused multiply-add is asked for by name).
_NO_CONTRACTION = "#pragma OPENCL FP_CONTRACT OFF\n"
_OPENCL_PRELUDES = {
    "F32": (_NO_CONTRACTION + "typedef float real; typedef float4 real4; typedef float FT;\n"
            "#define LD(p, i) ((p)[i])\n#define ST(p, i, v) ((p)[i] = (v))\n"
            "#define LD4(p, i) vload4(0, (p) + (i))\n#define ST4(p, i, v) vstore4((v), 0, (p) + (i))\n"
            "#define TO_REAL4(v) convert_float4(v)\n"),
    "F32_F16": (_NO_CONTRACTION + "typedef float real; typedef float4 real4; typedef half FT;\n"
                "#define LD(p, i) vload_half((i), (p))\n#define ST(p, i, v) vstore_half((float)(v), (i), (p))\n"
                "#define LD4(p, i) vload_half4(0, (p) + (i))\n"
                "#define ST4(p, i, v) vstore_half4(convert_float4(v), 0, (p) + (i))\n"
                "#define TO_REAL4(v) convert_float4(v)\n"),
    "F16": (_NO_CONTRACTION + "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
            "typedef half real; typedef half4 real4; typedef half FT;\n"
            "#define LD(p, i) ((p)[i])\n#define ST(p, i, v) ((p)[i] = (real)(v))\n"
            "#define LD4(p, i) vload4(0, (p) + (i))\n#define ST4(p, i, v) vstore4(convert_half4(v), 0, (p) + (i))\n"
            "#define TO_REAL4(v) convert_half4(v)\n"),
}

OPENCL = Dialect(
    name="opencl", suffix=".cl",
    kernel_prefix="__kernel void",
    buffer_param="{ptr} {name}",
    offset_param="int {name}",
    global_space="__global ", local_space="__local ", local_array="__local {type} {name}[{size}];",
    restrict="restrict",
    barrier="barrier(CLK_LOCAL_MEM_FENCE);",
    global_id="get_global_id({d})", local_id="get_local_id({d})", group_id="get_group_id({d})",
    id_params="",
    vector="({type})({args})",
    exact_grid=True, swizzles=True,
    preludes=_OPENCL_PRELUDES,
)


def portable_preludes() -> dict[str, str]:
    """The precision preludes without OpenCL's fp16 extension pragma: a dialect whose
    library defines the kernel language's half loads and stores (CUDA, Metal) uses them."""
    return {name: "".join(line for line in text.splitlines(keepends=True) if not line.startswith("#pragma"))
            for name, text in _OPENCL_PRELUDES.items()}
