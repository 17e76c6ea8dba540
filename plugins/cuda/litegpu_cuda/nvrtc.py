"""NVRTC: CUDA C++ source to PTX or a cubin, with no GPU and no CUDA toolkit installed.

NVRTC ships as a pip wheel (``nvidia-cuda-nvrtc``) and ``cuda_fp16.h`` with
``nvidia-cuda-runtime``; ``cuda-bindings`` calls it. Why ``cuda-bindings`` and not
``cuda-core``: the bindings are the stable, complete mirror of the driver and NVRTC C
APIs that the runtime here needs one call at a time (module loading, raw launches
with our own argument buffers, events on a user's stream), while ``cuda.core`` is
still versioned 0.x with an API that changes between releases.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from litegpu.errors import BackendUnavailableError
from litegpu.env import install_hint

#: Build options: fp32 as LiteRT computes it (no fast math: no flush to zero, exact
#: division and square root), C++17.
# --fmad=false: NVRTC fuses ``a * b + c`` by default; the kernels round each operation as
# written (LiteRT's arithmetic), asking for a fused multiply-add by name where they want one.
OPTIONS = ("-std=c++17", "-default-device", "--fmad=false")


@dataclass
class CompileError(Exception):
    """NVRTC refused a source; ``log`` is its compiler log."""

    log: str

    def __str__(self) -> str:
        return f"NVRTC failed to compile the program:\n{self.log}"


def import_nvrtc():
    """``cuda.bindings.nvrtc``, or BackendUnavailableError saying how to get it."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise BackendUnavailableError(f"NVIDIA's cuda-bindings is not installed ({exc}); "
                                      f"{install_hint('cuda')}") from None
    return nvrtc


@functools.cache
def include_dirs() -> tuple[str, ...]:
    """Directories holding ``cuda_fp16.h`` (the ``nvidia-cuda-runtime`` wheel, or a CUDA toolkit)."""
    found = []
    try:
        import nvidia.cu13 as wheel   # nvidia-cuda-runtime >= 13
        found += [os.path.join(p, "include") for p in wheel.__path__]
    except ImportError:
        pass
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found.append(os.path.join(home, "include"))
    # One directory only: two CUDA versions' headers must not mix.
    return tuple(d for d in found if os.path.exists(os.path.join(d, "cuda_fp16.h")))[:1]


def version() -> str:
    """NVRTC's version, e.g. "13.0"."""
    nvrtc = import_nvrtc()
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def _check(nvrtc, result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, name = nvrtc.nvrtcGetErrorString(err)
        raise BackendUnavailableError(f"NVRTC: {name.decode(errors='replace')}")


def compile_source(source: str, arch: str, name: str = "program.cu", cubin: bool = False,
                   extra: tuple[str, ...] = ()) -> bytes:
    """The PTX (or, with ``cubin``, the cubin) of ``source`` for ``arch``.

    ``arch`` is a compute capability as NVRTC names it: "80", "90" (``compute_80`` for
    PTX, ``sm_80`` for a cubin); ``extra`` are more NVRTC options (with
    ``-fdevice-syntax-only`` nothing is generated and ``b""`` is returned). Raises
    :class:`CompileError` with NVRTC's log.
    """
    nvrtc = import_nvrtc()
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(nvrtc, err)
    try:
        options = [*OPTIONS, f"--gpu-architecture={'sm' if cubin else 'compute'}_{arch}",
                   *(f"-I{d}" for d in include_dirs()), *extra]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(prog)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError(log.rstrip(b"\x00 ").decode(errors="replace"))
        if "-fdevice-syntax-only" in extra:
            return b""
        get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin
                         else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
        err, size = get_size(prog)
        _check(nvrtc, err)
        out = b" " * size
        _check(nvrtc, get(prog, out))
        return out
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
