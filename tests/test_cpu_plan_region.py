"""The cpu backend's plan launcher (:func:`litegpu_cpu.kernels.tasks.run_plan`) running a
whole plan in one parallel region: rows stay in order across threads (a row reads what
every task of the row before wrote), every task runs exactly once, and one-task rows,
empty rows and single-threaded runs give the same results."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from numba import carray

from litegpu_cpu.kernels import threads as kthreads
from litegpu_cpu.kernels.tasks import bound_tasks, chained, ensure_workers, plan_call, task_function


@task_function()
def _mix(t, a0, a1, a2, a3, a4, a5, a6, a7, ip, fp):
    """Element ``t`` of the output: the sum of the whole input (written by every task of
    the previous row) plus ``t``, and a count of this task's runs in ``a2``. Odd tasks
    take longer (the sum repeated), so that a thread done with its own tasks would read
    the input too early if the launcher did not wait for the whole row."""
    n = ip[0]
    x, y, runs = carray(a0, n), carray(a1, n), carray(a2, n)
    delay = np.float32(0)
    for k in range(3000 * (t % 2)):         # a dependent chain the compiler must keep
        delay = delay * np.float32(0.5) + x[k % n]
    total = np.float32(0)
    for i in range(n):
        total += x[i]
    y[t] = total * fp[0] + np.float32(t) + delay * np.float32(0)
    runs[t] += np.float32(1)


def _mix_rows(x, y, runs, counts):
    """Rows of :func:`_mix` between ``x`` and ``y`` (alternating), ``counts[i]`` tasks in row i."""
    params = np.array([x.size], np.int64)
    scale = np.array([0.25], np.float32)
    calls, src, dst = [], x, y
    for tasks in counts:
        calls.append(bound_tasks(_mix, tasks, (src, dst, runs), params, scale))
        src, dst = dst, src
    return chained(calls)


def _expected(x, counts):
    """What :func:`_mix_rows` leaves in the array its last row wrote, both arrays starting
    as ``x``: a row writes only its first ``tasks`` elements."""
    src, dst = x.astype(np.float32).copy(), x.astype(np.float32).copy()
    for tasks in counts:
        dst[:tasks] = np.float32(src.sum(dtype=np.float32) * np.float32(0.25)) + np.arange(tasks, dtype=np.float32)
        src, dst = dst, src
    return src


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = kthreads.current()
    kthreads.configure_threads(min(request.param, kthreads.default_count()))
    ensure_workers(request.param)
    yield request.param
    kthreads.configure_threads(before)


@pytest.mark.parametrize("tasks", [1, 2, 3, 8, 16])
def test_rows_read_every_task_of_the_row_before(threads, tasks):
    n, rows, repeats = 16, 40, 50
    x = np.zeros(n, np.float32)
    y = np.zeros(n, np.float32)
    runs = np.zeros(n, np.float32)
    call = _mix_rows(x, y, runs, [tasks] * rows)
    for _ in range(repeats):
        x[:] = np.arange(n, dtype=np.float32) / 7
        y[:] = np.arange(n, dtype=np.float32) / 7      # tasks < n: the rest stays as is
        call()
        result = x if rows % 2 == 0 else y
        np.testing.assert_allclose(result, _expected(np.arange(n, dtype=np.float32) / 7, [tasks] * rows),
                                   rtol=1e-5)
    np.testing.assert_array_equal(runs[:tasks], rows * repeats)
    np.testing.assert_array_equal(runs[tasks:], 0)


def test_mixed_and_empty_rows(threads):
    """One-task rows between many-task rows, and a row of no tasks, in one plan."""
    n = 16
    x, y, runs = (np.zeros(n, np.float32) for _ in range(3))
    x[:] = 1
    y[:] = 1
    counts = (8, 1, 0, 5, 1, 16)
    call = chained([_mix_rows(x, y, runs, [tasks]) for tasks in counts])
    call()
    # Each part reads x and writes y; every task of every row ran once.
    np.testing.assert_array_equal(runs, [sum(t > i for t in counts) for i in range(n)])
    assert call.rows.shape[0] == 6
    plan_call(call.rows[:0], (), ())()      # an empty plan does nothing


def test_serial_stretches_between_parallel_rows(threads):
    """Runs of one-task rows (one thread runs a run in order, the others wait once at its
    end) between many-task rows, each row reading the one before: the chain's result and
    every task run exactly once, whichever thread took each stretch."""
    n, repeats = 16, 30
    counts = [8, *[1] * 12, 3, 1, 16, *[1] * 7, 2, 1, 1]
    x, y, runs = (np.zeros(n, np.float32) for _ in range(3))
    call = _mix_rows(x, y, runs, counts)
    start = np.arange(n, dtype=np.float32) / 5
    for _ in range(repeats):
        x[:] = start
        y[:] = start
        call()
        np.testing.assert_allclose(x if len(counts) % 2 == 0 else y, _expected(start, counts), rtol=1e-5)
    np.testing.assert_array_equal(runs, [repeats * sum(t > i for t in counts) for i in range(n)])


def test_plans_called_from_two_threads_at_once_finish(threads):
    """Two plans called at once from two threads (one gets the workers, the other runs on
    its own thread) each run every task once, again and again: a part never waits for a
    task no thread has claimed."""
    import threading

    n, rows, repeats = 16, 20, 30
    arrays = [[np.zeros(n, np.float32) for _ in range(3)] for _ in range(2)]
    calls = [_mix_rows(x, y, runs, [8] * rows) for x, y, runs in arrays]
    start = threading.Barrier(2)

    def repeat(call):
        start.wait()
        for _ in range(repeats):
            call()

    pair = [threading.Thread(target=repeat, args=(call,)) for call in calls]
    for thread in pair:
        thread.start()
    for thread in pair:
        thread.join(60)
    assert not any(thread.is_alive() for thread in pair), "a plan did not finish"
    for _, _, runs in arrays:
        np.testing.assert_array_equal(runs[:8], rows * repeats)


def _run_in_child(conn, x, y, runs, counts):
    call = _mix_rows(x, y, runs, counts)
    call()                   # the parent's workers are not here
    ensure_workers(2)        # workers of its own
    call()
    conn.send((x.copy(), y.copy(), runs.copy()))
    conn.close()


def test_a_forked_child_runs_plans_without_the_parents_workers():
    """After fork the child has the parent's launcher state but none of its worker threads:
    its plans still run every task once (the caller takes the parts no worker claims) and
    it starts workers of its own when asked."""
    import multiprocessing
    kthreads.configure_threads(min(2, kthreads.default_count()))
    n, counts = 16, [8, 1, 1, 16, 2, 1]
    start = np.arange(n, dtype=np.float32) / 3
    x, y, runs = start.copy(), start.copy(), np.zeros(n, np.float32)
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=_run_in_child, args=(child, x, y, runs, counts))
    process.start()
    assert parent.poll(60), "the child's plan did not finish"
    cx, cy, cruns = parent.recv()
    process.join(10)
    assert process.exitcode == 0
    np.testing.assert_allclose(cx if len(counts) % 2 == 0 else cy, _expected(start, counts * 2), rtol=1e-5)
    np.testing.assert_array_equal(cruns, [2 * sum(t > i for t in counts) for i in range(n)])


# A child process: the caller and one worker on one core, the first row's task 0 long (the
# scheduler gives the worker the core during it; the worker runs task 1, waits for the row
# and yields), the other 999 rows quick (the caller runs them alone, the worker still
# waiting at the first row's barrier).
_LATE_WORKER = """
import os

import numpy as np
from numba import carray

from litegpu_cpu.kernels.tasks import bound_tasks, chained, int64_pointer, task_function
from litegpu_cpu.kernels.threads import configure_threads


@task_function()
def spin_then_count(t, a0, a1, a2, a3, a4, a5, a6, a7, ip, fp):
    sink = carray(int64_pointer(a1), 2)
    h = sink[t]
    for _ in range(ip[1] * (1 - t)):        # task 0 of a slow row: ip[1] steps of a hash
        h = h * 6364136223846793005 + 1442695040888963407
    sink[t] = h
    carray(a0, 2)[t] += np.float32(1)


os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
configure_threads(2)
runs, sink = np.zeros(2, np.float32), np.zeros(2, np.int64)
slow, quick = np.array([2, 5_000_000], np.int64), np.array([2, 0], np.int64)
call = chained([bound_tasks(spin_then_count, 2, (runs, sink), slow)]
               + [bound_tasks(spin_then_count, 2, (runs, sink), quick) for _ in range(999)])
for _ in range(20):
    call()
assert (runs == 20 * 1000).all(), runs
"""


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins a process to one core (Linux)")
def test_a_worker_descheduled_inside_a_job_still_finds_its_counters(tmp_path):
    """A worker the OS descheduled inside a job may read and write the job's counters after
    the caller has run every task that was left; they must live until the caller sees the
    worker leave. Here the worker wakes up at the first row's barrier after the caller
    finished the whole plan. glibc unmaps a freed block from its mmap threshold on (pinned
    at 4 KiB here; the plan's counters are 192 KB), so counters freed too early were a
    segfault of the worker (as in the README's dask example, where two processes share
    two cores), not silently corrupted memory."""
    script = tmp_path / "late_worker.py"
    script.write_text(_LATE_WORKER)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "4096", "NUMBA_NUM_THREADS": "2", "PYTHONFAULTHANDLER": "1"}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
