"""Running a kernel on samples in a child process, so a crash is a result, not the end.

    run_isolated(kernel, jobs, timeout=10.0) → [KernelRun, ...]   one per job, in order

# Design
#
# One forked child runs the jobs in order and sends one KernelRun back per job through a
# pipe. If the pipe ends early, the child died on the job after the last one received: the
# job gets a KernelRun whose ``crash`` names the signal (SIGSEGV, SIGABRT, ...) and a new
# child takes the rest. A job that sends nothing within ``timeout`` seconds is killed and
# reported as hung. Forking (not spawning) keeps the kernel, the loaded library and the
# sample arrays as they are, with no pickling of the inputs; only results come back.
#
# In the child each output is a view into a larger buffer filled with one byte pattern,
# with 64-byte guard zones before and after it. After the call, a changed guard byte means
# the kernel wrote outside the output (a wrong element size or bad indexing); an input that
# changed means it wrote into an input. The call is then repeated on outputs filled with a
# second pattern: an element that differs between the two runs was not written (it kept
# the buffer's contents) or is not deterministic. These checks need no reference.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

__all__ = ["Job", "KernelRun", "run_isolated", "run_job"]

_GUARD = 64
_FILLS = (0xA5, 0x5A)


@dataclass
class Job:
    """One kernel call: the functional arguments (NumPy), and the outputs to allocate."""

    args: list
    out_meta: list  # [(shape, numpy dtype)], from the op's fake
    out_is_list: bool = False  # the out overload takes one Tensor[] out
    eager: Callable | None = None  # () -> [numpy arrays]: the same call through torch


@dataclass
class KernelRun:
    """What one job produced."""

    outs: list | None = None  # the kernel's outputs (copies), None if it did not finish
    error: str | None = None  # the failure the kernel reported (a KernelError's text)
    problems: list = field(default_factory=list)  # guards, inputs, unwritten elements
    eager: list | None = None
    eager_error: str | None = None
    crash: str | None = None  # "SIGSEGV", "exit status 3", "timed out after 10 s"


def _guarded(shape: tuple, dtype: np.dtype, fill: int) -> tuple[np.ndarray, np.ndarray]:
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    buffer = np.full(_GUARD + nbytes + _GUARD, fill, dtype=np.uint8)
    return buffer, buffer[_GUARD:_GUARD + nbytes].view(dtype).reshape(shape)


def _snapshot(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, (list, tuple)):
        return [_snapshot(v) for v in value]
    return None


def _changed(before, after) -> bool:
    if isinstance(before, np.ndarray):
        return before.tobytes() != np.ascontiguousarray(after).tobytes()
    if isinstance(before, list):
        return any(_changed(b, a) for b, a in zip(before, after))
    return False


def _call(kernel, job: Job, fill: int):
    buffers, outs = zip(*[_guarded(s, d, fill) for s, d in job.out_meta]) if job.out_meta \
        else ((), ())
    if job.out_is_list:
        kernel(*job.args, list(outs))
    else:
        kernel(*job.args, *outs)
    return buffers, outs


def run_job(kernel: Callable, job: Job) -> KernelRun:
    """Run one job in this process (the child's body; see the module text)."""
    run = KernelRun()
    before = [_snapshot(a) for a in job.args]
    try:
        buffers, outs = _call(kernel, job, _FILLS[0])
    except Exception as e:  # KernelError, or a marshalling error: the kernel refused
        run.error = str(e) if type(e).__name__ == "KernelError" else f"{type(e).__name__}: {e}"
        return run
    for n, buffer in enumerate(buffers):
        head, tail = buffer[:_GUARD], buffer[len(buffer) - _GUARD:]
        if (head != _FILLS[0]).any() or (tail != _FILLS[0]).any():
            where = "before" if (head != _FILLS[0]).any() else "after"
            run.problems.append(f"output {n}: the kernel wrote {where} the end of the output "
                                f"{outs[n].dtype}{list(outs[n].shape)} (a wrong element size "
                                "or dtype, or bad indexing)")
    for n, (b, a) in enumerate(zip(before, job.args)):
        if _changed(b, a):
            run.problems.append(f"argument {n}: the kernel changed an input")
    run.outs = [np.array(o) for o in outs]
    try:
        _, again = _call(kernel, job, _FILLS[1])
        for n, (first, second) in enumerate(zip(run.outs, again)):
            size = max(first.dtype.itemsize, 1)
            a = np.ascontiguousarray(first).reshape(-1).view(np.uint8).reshape(-1, size)
            b = np.ascontiguousarray(second).reshape(-1).view(np.uint8).reshape(-1, size)
            differs = (a != b).any(axis=1)
            if differs.any():
                flat = int(np.flatnonzero(differs)[0])
                index = tuple(int(i) for i in np.unravel_index(flat, first.shape)) \
                    if first.ndim else ()
                run.problems.append(
                    f"output {n}: {int(differs.sum())} of {first.size} element(s) differ "
                    f"between two runs on the same inputs, first at index {index}: the kernel "
                    "does not write every output element (it kept the buffer's old "
                    "contents), or is not deterministic")
    except Exception as e:
        run.problems.append(f"the same call failed the second time: {e}")
    if job.eager is not None:
        try:
            run.eager = [np.array(o) for o in job.eager()]
        except Exception as e:
            run.eager_error = f"{type(e).__name__}: {e}"
    return run


def _child(kernel, jobs: Sequence[Job], start: int, conn) -> None:
    import faulthandler

    faulthandler.disable()  # the parent reports the crash, naming the sample
    for job in jobs[start:]:
        conn.send(run_job(kernel, job))
    conn.close()
    # no interpreter exit: it would flush stdio buffers inherited from the parent (printing
    # the parent's pending output twice) and run its atexit handlers
    os._exit(0)


def _signal_name(exitcode: int | None) -> str:
    if exitcode is None:
        return "no exit status"
    if exitcode < 0:
        try:
            return signal.Signals(-exitcode).name
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit status {exitcode}"


def run_isolated(kernel: Callable, jobs: Sequence[Job], *, timeout: float = 10.0,
                 isolate: bool = True) -> list[KernelRun]:
    """Run every job (see the module text); ``isolate=False`` runs them in this process."""
    if not isolate:
        return [run_job(kernel, job) for job in jobs]
    context = multiprocessing.get_context("fork")
    results: list[KernelRun] = []
    while len(results) < len(jobs):
        receive, send = context.Pipe(duplex=False)
        child = context.Process(target=_child, args=(kernel, jobs, len(results), send),
                                daemon=True)
        child.start()
        send.close()
        while len(results) < len(jobs):
            if not receive.poll(timeout):
                child.kill()
                child.join()
                results.append(KernelRun(crash=f"timed out after {timeout:g} s"))
                break
            try:
                results.append(receive.recv())
            except (EOFError, ConnectionError):
                child.join()
                results.append(KernelRun(crash=_signal_name(child.exitcode)))
                break
        receive.close()
        child.join()
    return results
