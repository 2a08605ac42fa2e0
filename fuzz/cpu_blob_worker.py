"""The worker side of ``cpu_blob_fuzz.py``: a spawned process that loads and runs cases
and says what happened, and ``Worker``, the supervisor's handle on one, which restarts it
after a crash and kills it after a hang.

A worker's outcome for a case is (class, detail), the classes of ``cpu_blob_fuzz``: it
catches exceptions itself (ok, refused, raw, memory) and watches "open" audit events
(opened); crashes and hangs are what ``Worker`` sees from outside. Its address space is
capped (``MAX_WORKER_BYTES``), or under ``--asan`` bounded by ASan's own limits.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import signal
import sys
import tempfile
import time
from multiprocessing.connection import wait
from pathlib import Path

MAX_WORKER_BYTES = 4 << 30


# --- the worker ---------------------------------------------------------------------------

def _inputs(method, rng):
    import numpy as np

    out = []
    for spec in method.inputs:
        if not spec.is_tensor:
            out.append(spec.dtype(rng.integers(-3, 4)))
        elif np.dtype(spec.dtype).kind == "f":
            out.append(rng.standard_normal(spec.shape).astype(spec.dtype))
        elif np.dtype(spec.dtype).kind == "b":
            out.append(rng.random(spec.shape) < 0.5)
        else:  # small non-negative ints: valid embedding ids and indices of the seeds
            out.append(rng.integers(0, 4, spec.shape).astype(spec.dtype))
    return out


def run_case(data: bytes, kernels: list[str], watch: dict,
             plant: str | None = None) -> tuple[str, str]:
    """(class, detail) of one program: loaded, then each method called twice. ``plant``
    (the oracle's self-test) makes the case misbehave after loading: "raw" raises a
    ValueError, "memory" allocates 64 GiB, "open" opens a file."""
    import numpy as np

    from opforge.errors import OpforgeError
    from opforge.runtime import load

    watch["opened"] = []
    watch["active"] = True
    try:
        loaded = load(data, kernels=kernels)
        if plant == "raw":
            raise ValueError("planted")
        if plant == "memory":
            bytearray(64 << 30)
        if plant == "open":
            open(os.devnull, "rb").close()
        rng = np.random.default_rng(0)
        for name in loaded.method_names:
            method = loaded.method(name)
            inputs = _inputs(method, rng)
            method(*inputs)
            method(*inputs)
        del loaded
    except MemoryError as e:
        return "memory", f"MemoryError: {e}"[:300]
    except OpforgeError as e:
        return "refused", f"{type(e).__name__}: {e}"[:600]
    except Exception as e:  # noqa: BLE001 - anything else is a finding
        return "raw", f"{type(e).__name__}: {e}"[:600]
    finally:
        watch["active"] = False
    if watch["opened"]:
        return "opened", f"opened {watch['opened'][:3]}"
    return "ok", ""


def _audit_hook(watch: dict, allowed: set[str]):
    import opforge

    # Python's own reads are not the program's doing: lazy imports and the source lines a
    # traceback quotes, under the installation, the venv or opforge itself.
    roots = tuple({str(Path(p).resolve()) + os.sep for p in
                   (sys.prefix, sys.base_prefix, Path(opforge.__file__).parents[1])})
    imports = {os.path.realpath(p) for p in sys.path if p}  # zipimport probing sys.path

    def audit(event, args):
        if not watch["active"] or event != "open" or not args or args[0] is None:
            return
        path = args[0]
        if isinstance(path, int):  # os.fdopen of a descriptor the process already has
            return
        resolved = os.path.realpath(path) if isinstance(path, (str, bytes, os.PathLike)) else str(path)
        if isinstance(resolved, bytes):
            resolved = resolved.decode(errors="replace")
        if resolved in allowed or resolved in imports or (
                resolved.startswith(roots) and resolved.endswith((".py", ".pyc", ".so"))):
            return
        watch["opened"].append(str(path))

    return audit


def worker(conn, seeds: list[tuple[bytes, list[str]]], trusted: list[str], asan: bool) -> None:
    """Runs cases sent as (data, kernels, plant) until None; answers (class, detail)."""
    if not asan:  # under ASan its own limits replace RLIMIT_AS (see cpu_blob_asan)
        resource.setrlimit(resource.RLIMIT_AS, (MAX_WORKER_BYTES, MAX_WORKER_BYTES))
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)  # oneDNN and libgomp warnings would drown the progress line
    import faulthandler

    # where a fatal signal struck (loading or running), for the supervisor: see _stage()
    faulthandler.enable(open(_fault_file(os.getpid()), "w"))
    from opforge.backends.oppackage.runtime import trust_packages

    trust_packages(trusted)
    watch = {"active": False, "opened": []}
    allowed = {os.path.realpath(p) for s in seeds for p in s[1]} | \
        {os.path.realpath(p) for p in trusted}
    # warm-up, watched but not judged: what an unmutated seed opens (the engine library,
    # importlib metadata of the oneDNN wheels) is opforge's own doing, allowed from then on
    sys.addaudithook(_audit_hook(watch, allowed))
    for data, kernels in seeds:
        run_case(data, kernels, watch)
        allowed.update(os.path.realpath(p) for p in watch["opened"])
    conn.send(("ready", ""))
    while True:
        case = conn.recv()
        if case is None:
            return
        data, kernels, plant = case
        if plant == "crash":  # the oracle's own test: a worker that dies on this case
            os.kill(os.getpid(), signal.SIGSEGV)
        elif plant == "hang":
            time.sleep(3600)
        conn.send(run_case(data, kernels, watch, plant))


def _fault_file(pid: int) -> Path:
    return Path(tempfile.gettempdir()) / f"opforge-cpu-blob-fuzz-fault-{pid}.txt"


def _stage(pid: int) -> str:
    """" while loading" / " while running" from a dead worker's faulthandler dump."""
    path = _fault_file(pid)
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    finally:
        path.unlink(missing_ok=True)
    if "runtime/method.py" in text:
        return " while running"
    return " while loading" if "runtime/loader.py" in text else ""


# --- the supervisor -----------------------------------------------------------------------

class Worker:
    """One spawned worker process; restarted after it dies or hangs. ``asan_dir``: run it
    under AddressSanitizer, its reports written there (see ``cpu_blob_asan``)."""

    asan_dir: Path | None = None  # set by --asan for every worker

    def __init__(self, seeds, trusted) -> None:
        self.seeds, self.trusted = seeds, trusted
        self.job = None  # (case number, started)
        self._start()

    def _start(self) -> None:
        # spawn, not fork: a parent that ran torch has OpenMP threads a forked child waits for
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker, daemon=True, args=(
            child, self.seeds, self.trusted, self.asan_dir is not None))
        saved = dict(os.environ)
        if self.asan_dir is not None:
            import cpu_blob_asan
            from opforge.backends.cpu.engine import sanitized_library

            sanitized_library()  # compiled here: the wait below is for loading and the warm-up
            os.environ.update(cpu_blob_asan.environment(self.asan_dir))
        try:
            self.process.start()
        finally:
            os.environ.clear()
            os.environ.update(saved)
        child.close()
        # the warm-up (the first loads the engine) is not the first case's time
        if not self.conn.poll(900) or self.conn.recv() != ("ready", ""):
            raise RuntimeError("a fuzz worker did not start (see its stderr: run a case with "
                               "--replay)")

    def send(self, n: int, data: bytes, kernels: list[str], plant: str | None) -> None:
        self.job = (n, time.monotonic())
        self.conn.send((data, kernels, plant))

    def answer(self) -> tuple[str, str]:
        """The answer to the job, or the death that replaced it (restarting the worker)."""
        try:
            return self.conn.recv()
        except (EOFError, OSError):
            self.process.join()
            code, pid = self.process.exitcode, self.process.pid
            self._start()
            if code is not None and code < 0:
                what = f"signal {signal.Signals(-code).name}{_stage(pid)}"
            else:
                what = f"worker exited with status {code}{_stage(pid)}"
            if self.asan_dir is not None:
                import cpu_blob_asan

                found = cpu_blob_asan.verdict(self.asan_dir, pid)
                what += f"; {found}" if found else ""
                if found and found.startswith(cpu_blob_asan.OUT_OF_MEMORY):
                    # ASan aborts where the engine would catch std::bad_alloc: a refusal
                    return "refused", f"{what} (std::bad_alloc, caught, without ASan)"
            return "crash", what

    def kill(self, timeout: float) -> tuple[str, str]:
        self.process.kill()
        self.process.join()
        _fault_file(self.process.pid).unlink(missing_ok=True)
        self._start()
        return "hang", f"no answer in {timeout:g} s"

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.process.join(5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        _fault_file(self.process.pid).unlink(missing_ok=True)


def run_once(w: Worker, data: bytes, kernels: list[str], timeout: float) -> tuple[str, str]:
    w.send(0, data, kernels, None)
    ready = wait([w.conn, w.process.sentinel], timeout=timeout)
    w.job = None
    return w.answer() if ready else w.kill(timeout)
