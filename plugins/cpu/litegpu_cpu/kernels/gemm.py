"""GEMMs on two threads: numpy's own OpenBLAS, called from two tasks of a plan (halves).

Products with a constant right-hand side (weights) go to :mod:`.packed` where it fits;
this module takes the rest (BATCH_MATMUL-like products of two activations, output
widths that are not a multiple of 16, a handful of rows).

OpenBLAS runs on the calling thread only (see :mod:`.threads`: its spinning workers fight
the launcher's), so a plain ``np.matmul`` uses one core. Here a task function splits the
product into two halves and each task calls OpenBLAS's ``cblas_sgemm`` on its half,
through the function's address (found with ctypes in the OpenBLAS that numpy bundles) and
a small LLVM intrinsic. The launcher's workers are awake between kernels of a plan, so a
split costs ~2 us where handing half to a Python thread cost 13-60 us. Measured on the
2-core VM (single np.matmul -> split): 64x128x128 23 -> 14 us, 3136x24x144 231 -> 127 us,
3136x576x64 2974 -> 1306 us, 49x4608x512 3135 -> 1599 us.

The address is an argument, not a constant baked into the code, so the kernel stays in
litegpu's cache of machine code. Without a usable OpenBLAS symbol (another BLAS build) every product
falls back to ``np.matmul`` on the calling thread, and nothing else changes.
"""
from __future__ import annotations

import ctypes

import numpy as np
from llvmlite import ir

from ..jit import carray, intrinsic, types
from .tasks import bound_tasks, task_function
from .threads import current as current_threads, numpy_openblas_symbol

# Products below this many multiply-adds are not worth a parallel region.
SPLIT_MIN_MACS = 1 << 17

_CBLAS_ROW_MAJOR, _CBLAS_NO_TRANS, _CBLAS_TRANS = 101, 111, 112
# cblas_sgemm with 64-bit integers (the ILP64 OpenBLAS numpy >= 2 wheels bundle).
_SYMBOLS = ("scipy_cblas_sgemm64_", "cblas_sgemm64_")

_ADDRESS: int | None = None
_SEARCHED = False


def sgemm_address() -> int:
    """The address of numpy's OpenBLAS ``cblas_sgemm`` (64-bit ints), or 0 when not found."""
    global _ADDRESS, _SEARCHED
    if not _SEARCHED:
        _SEARCHED = True
        fn = numpy_openblas_symbol(_SYMBOLS)
        if fn is not None:
            _ADDRESS = ctypes.cast(fn, ctypes.c_void_p).value
    return _ADDRESS or 0


@intrinsic
def _sgemm(typingctx, fn, transa, transb, m, n, k, a, lda, b, ldb, c, ldc, beta):
    """``C = op(A) @ op(B) + beta * C`` through the cblas_sgemm at address ``fn`` (row-major,
    alpha 1); pointers and sizes are passed as integers, ``beta`` as a float32."""
    sig = types.void(*([types.intp] * 12), types.float32)

    def codegen(context, builder, signature, args):
        fn_, ta, tb, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_, beta_ = args
        i32, f32 = ir.IntType(32), ir.FloatType()
        i64 = ir.IntType(64)
        p8 = ir.IntType(8).as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, p8, i64, p8, i64, f32, p8, i64])
        callee = builder.inttoptr(fn_, fnty.as_pointer())
        builder.call(callee, [ir.Constant(i32, _CBLAS_ROW_MAJOR), builder.trunc(ta, i32), builder.trunc(tb, i32),
                              m_, n_, k_, ir.Constant(f32, 1.0), builder.inttoptr(a_, p8), lda_,
                              builder.inttoptr(b_, p8), ldb_,
                              beta_, builder.inttoptr(c_, p8), ldc_])
        return context.get_dummy_value()

    return sig, codegen


_ZERO = np.float32(0)


@task_function()
def _gemm_half(part, ap, bp, cp, biasp, _a4, _a5, _a6, _a7, ip, fp):
    """Half ``part`` (0 or 1) of ``c = a @ b`` (``b`` given as [N, K] when ``transb``): the
    rows of ``c`` before ``at`` (or its columns when ``split_n``) or the rest, through
    OpenBLAS at address ``fn``; with ``epilogue``, then ``clamp(c + bias, lo, hi)`` on that
    part while it is still in cache. ``ip``: fn, m, n, k, the rows of b, ldb, tb, split_n,
    at, epilogue; ``fp``: lo, hi. The addresses BLAS gets derive from the ``noalias``
    pointers (see :mod:`.tasks`), so LLVM knows that the call writes ``c``."""
    q = carray(ip, 10)
    fn, m, n, k, b_rows, ldb, tb, split_n, at, epilogue = q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9]
    lo_v, hi_v = fp[0], fp[1]
    lo = 0 if part == 0 else at
    hi = at if part == 0 else (n if split_n else m)
    if hi <= lo:
        return
    c = carray(cp, (m, n))
    bias = carray(biasp, n if epilogue else 1)
    a_at, b_at, c_at = carray(ap, (m, k)).ctypes.data, carray(bp, (b_rows, ldb)).ctypes.data, c.ctypes.data
    if split_n:
        b_off = lo * ldb if tb == _CBLAS_TRANS else lo
        _sgemm(fn, _CBLAS_NO_TRANS, tb, m, hi - lo, k, a_at, k, b_at + 4 * b_off, ldb, c_at + 4 * lo, n, _ZERO)
        if epilogue:
            for r in range(m):
                for j in range(lo, hi):
                    c[r, j] = min(max(c[r, j] + bias[j], lo_v), hi_v)
    else:
        _sgemm(fn, _CBLAS_NO_TRANS, tb, hi - lo, n, k, a_at + 4 * lo * k, k, b_at, ldb, c_at + 4 * lo * n, n,
               _ZERO)
        if epilogue:
            for r in range(lo, hi):
                for j in range(n):
                    c[r, j] = min(max(c[r, j] + bias[j], lo_v), hi_v)


def gemm_halves(fn: int, a: np.ndarray, b: np.ndarray, c: np.ndarray, transb: bool, split_n: bool,
                at: int, bias: np.ndarray, lo_v, hi_v, epilogue: bool):
    """A call of no arguments computing ``c = a @ b`` (``b`` as [N, K] when ``transb``) in
    two halves, one per thread (:func:`_gemm_half`): the rows of ``c`` before ``at`` (its
    columns when ``split_n``) and the rest, then with ``epilogue`` each half clamped
    ``clamp(c + bias, lo_v, hi_v)`` in the same parallel region; with ``at`` = M and not
    ``split_n``, the whole product as one task on the calling thread. All three arrays are
    C-contiguous float32 2-D; they are bound here, by address."""
    m, k = a.shape
    n = c.shape[1]
    params = np.array([fn, m, n, k, b.shape[0], b.shape[1], _CBLAS_TRANS if transb else _CBLAS_NO_TRANS,
                       split_n, at, epilogue], np.int64)
    floats = np.array([lo_v, hi_v], np.float32)
    whole = at >= m and not split_n
    return bound_tasks(_gemm_half, 1 if whole else 2, (a, b, c, bias), params, floats)


def plan(m: int, n: int, k: int, threads: int | None = None) -> tuple[bool, int] | None:
    """How to split an [M, K] x [K, N] product: ``(split_n, at)``, or None to run
    ``np.matmul`` on the calling thread (small product, one thread, no OpenBLAS).
    ``threads`` defaults to numba's thread count (set by the backend before it compiles)."""
    if threads is None:
        threads = current_threads()
    # One row is a GEMV: numpy's gemv beats sgemm halves (1x1024x1000: 46 us vs 117).
    if threads < 2 or m < 2 or m * n * k < SPLIT_MIN_MACS or not sgemm_address():
        return None
    if m >= 2 * n or n < 2:
        return False, m // 2
    return True, n // 2


def bind_matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray, how: tuple[bool, int] | None,
                transb: bool = False, epilogue: tuple[np.ndarray, np.float32, np.float32] | None = None):
    """A call of no arguments computing ``out = a @ b`` (``a @ b.T`` when ``transb``), then,
    with ``epilogue = (bias, lo, hi)``, ``out = clamp(out + bias, lo, hi)``: split over two
    threads as :func:`plan` decided, else on the calling thread (one task of
    :func:`gemm_halves`, which chains with the plan around it; three numpy calls where
    numpy's OpenBLAS symbol was not found). The operands are checked
    here, once: a mistake would read or write out of bounds inside BLAS."""
    kb = b.shape[1] if transb else b.shape[0]
    nb = b.shape[0] if transb else b.shape[1]
    if a.shape[1] != kb or out.shape != (a.shape[0], nb) or not (
            a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous) or \
            a.dtype != np.float32 or b.dtype != np.float32 or out.dtype != np.float32 or \
            (epilogue is not None and epilogue[0].shape != (nb,)):
        raise ValueError(f"gemm operands {a.shape} x {b.shape}{' (transposed)' if transb else ''} -> "
                         f"{out.shape} do not fit")
    bias, lo_v, hi_v = epilogue if epilogue is not None else (_NO_BIAS, _NEG_INF, _POS_INF)
    fn = sgemm_address()
    if how is not None:
        return gemm_halves(fn, a, b, out, transb, how[0], how[1], bias, lo_v, hi_v, epilogue is not None)
    if fn:
        return gemm_halves(fn, a, b, out, transb, False, a.shape[0], bias, lo_v, hi_v, epilogue is not None)

    def numpy_matmul() -> None:
        np.matmul(a, b.T if transb else b, out=out)
        if epilogue is not None:
            np.add(out, bias, out=out)
            if lo_v > -np.inf or hi_v < np.inf:
                np.clip(out, lo_v, hi_v, out=out)
    return numpy_matmul


_NO_BIAS = np.zeros(1, np.float32)
_NEG_INF, _POS_INF = np.float32(-np.inf), np.float32(np.inf)


# -- batched products (BATCH_MATMUL) ------------------------------------------------------------

_BATCH_HEAD = 8     # ip's fixed part before the per-batch offsets


@task_function()
def _gemm_batches(t, ap, bp, cp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of a batched product: batches ``t * chunk ..`` of ``c[i] = op(a) @ op(b)``
    through OpenBLAS at address ``fn``, each [M, N] of ``c`` in order, ``a`` and ``b``
    read from the element offsets the batch has in them (broadcast batches share one).
    ``ip``: fn, batches, chunk, m, n, k, transa, transb, then the batches' offsets
    in ``a``, then in ``b``."""
    q = carray(ip, _BATCH_HEAD)
    fn, batches, chunk, m, n, k, ta, tb = q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]
    offsets = carray(ip, _BATCH_HEAD + 2 * batches)
    lda = m if ta == _CBLAS_TRANS else k
    ldb = k if tb == _CBLAS_TRANS else n
    a_at, b_at, c_at = carray(ap, 1).ctypes.data, carray(bp, 1).ctypes.data, carray(cp, 1).ctypes.data
    for i in range(t * chunk, min(batches, (t + 1) * chunk)):
        _sgemm(fn, ta, tb, m, n, k, a_at + 4 * offsets[_BATCH_HEAD + i], lda,
               b_at + 4 * offsets[_BATCH_HEAD + batches + i], ldb, c_at + 4 * i * m * n, n, _ZERO)


def batched_matmul(a_shape: tuple, b_shape: tuple, adj_x: bool, adj_y: bool, threads: int | None = None):
    """``bind(a, b, out) -> call`` for BATCH_MATMUL of float32 operands of these shapes
    (batch dimensions broadcast, ``adj_x`` / ``adj_y`` transposing the last two axes): one
    OpenBLAS call per batch, the batches shared out over the plan's threads (a task function,
    so the call chains with its neighbours), or None without OpenBLAS's symbol."""
    fn = sgemm_address()
    if not fn or len(a_shape) < 2 or len(b_shape) < 2:
        return None
    if threads is None:
        threads = current_threads()
    m, k = (a_shape[-1], a_shape[-2]) if adj_x else (a_shape[-2], a_shape[-1])
    kb, n = (b_shape[-1], b_shape[-2]) if adj_y else (b_shape[-2], b_shape[-1])
    batch = np.broadcast_shapes(tuple(a_shape[:-2]), tuple(b_shape[:-2]))
    batches = int(np.prod(batch, dtype=np.int64))
    if kb != k or min(m, n, k, batches) == 0:
        return None

    def offsets(shape):
        """Each output batch's element offset in an operand of ``shape`` (0 along broadcast axes)."""
        lead = tuple(shape[:-2])
        index = np.arange(int(np.prod(lead, dtype=np.int64)), dtype=np.int64).reshape(lead)
        index = np.broadcast_to(index.reshape((1,) * (len(batch) - len(lead)) + lead), batch)
        return index.reshape(-1) * (shape[-1] * shape[-2])

    tasks = min(batches, threads) if threads > 1 and batches * m * n * k >= SPLIT_MIN_MACS else 1
    chunk = -(-batches // tasks)
    tasks = -(-batches // chunk)
    params = np.concatenate([np.array([fn, batches, chunk, m, n, k, _CBLAS_TRANS if adj_x else _CBLAS_NO_TRANS,
                                       _CBLAS_TRANS if adj_y else _CBLAS_NO_TRANS], np.int64),
                             offsets(a_shape), offsets(b_shape)])
    out_shape = (*batch, m, n)

    def bind(a: np.ndarray, b: np.ndarray, out: np.ndarray):
        if a.shape != tuple(a_shape) or b.shape != tuple(b_shape) or out.shape != out_shape or \
                any(x.dtype != np.float32 or not x.flags.c_contiguous for x in (a, b, out)):
            raise ValueError(f"batched product for {a_shape} x {b_shape} -> {out_shape} given "
                             f"{a.shape} x {b.shape} -> {out.shape}")
        return bound_tasks(_gemm_batches, tasks, (a, b, out), params)
    return bind
