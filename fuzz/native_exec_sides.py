"""The two workers of fuzz/native_exec_fuzz.py, one case at a time each.

The native side runs in the sanitized worker (libasan preloaded, the ASan+UBSan build of the
runtime, every Python allocation through malloc so that LeakSanitizer sees what holds the
runtime's handles): it loads the case with ``executor="native"``, draws every method's inputs
from the case's seed and the native method's input specs, calls each method twice and again
after a state reset, reads the live state back, and answers with what happened and the
outputs. The lean side runs in a plain interpreter: it draws the same inputs (the same seed,
the same specs in the same order, so the same numbers), runs them on the lean runtime and
compares. Only the runtime under test pays for the sanitizers: Python under ASan's malloc
runs about four times slower, and the lean runtime's allocations are none of LeakSanitizer's
business. Both workers keep what every case shares: the lean side one kernel registry
(portable kernels and the example library, read-only while programs load).
"""

from __future__ import annotations

import ctypes
import math
import os
import re
import resource
import warnings
from pathlib import Path

import numpy as np

import opforge.program as P
from opforge.errors import InternalError, OpforgeError

import exec_fuzz as EF
import native_program_fuzz as NF
from native_exec_compare import compare_calls

MAX_MEMORY = 1 << 30  # the load memory limit of both runtimes (bytes per method instance)
MAX_INPUT_BYTES = 256 << 20  # a case whose inputs at their upper bound need more is not run
TOO_BIG = "refused: inputs over 256 MiB (not run)"


def _reason(error: Exception) -> str:
    return f"{type(error).__name__}: {error}"[:1200]


def _attempt(call):
    """('ok', value), ('refused', reason) or ('finding', what)."""
    try:
        return "ok", call()
    except InternalError as e:
        return "finding", f"InternalError: {e}"[:400]
    except OpforgeError as e:
        text = str(e)
        if "an allocation failed" in text or isinstance(e.__cause__, MemoryError):
            return "finding", f"allocation failure behind the limit: {text}"[:400]
        return "refused", _reason(e)
    except MemoryError as e:
        return "refused", f"MemoryError: {e}"[:80]  # NumPy's own allocation (lean side)
    except Exception as e:  # noqa: BLE001 -- anything else is a finding
        return "finding", f"{type(e).__name__}: {e}"[:400]


def symbolic_definitions(data: bytes) -> dict[str, P.Method]:
    """The methods with symbols, as ``opforge.program`` reads the file ({} when it refuses
    it): a dynamic method's inputs are drawn from its symbols and size expressions."""
    try:
        program = P.from_bytes(data)
    except OpforgeError:
        return {}
    return {m.name: m for m in program.methods if m.symbols}


class _Specs:
    """What ``exec_fuzz._inputs`` and ``dynamic_shapes`` read of a method: its input specs
    (index, dtype, shape at the upper bound), with the definition for a dynamic one."""

    def __init__(self, inputs, definition: P.Method | None = None) -> None:
        self._def = definition
        self.inputs = inputs if definition is None else [
            type(s)(index, s.dtype, s.shape) for index, s in zip(definition.inputs, inputs)]


def draw_calls(plan: list, definitions: dict, seed: int) -> dict[str, list[list]]:
    """Each planned method's three calls' inputs (the third after a state reset), drawn from
    ``seed`` in plan order: ``plan`` lists (method name, the native method's input specs)."""
    rng = np.random.default_rng(seed)
    calls = {}
    for name, specs in plan:
        definition = definitions.get(name)
        dynamic = definition is not None and bool(definition.symbols)
        shim = _Specs(specs, definition if dynamic else None)
        calls[name] = [EF._inputs(shim, rng, dynamic) for _ in range(3)]
    return calls


def _outputs(values) -> list:
    return [np.array(v, copy=True) if isinstance(v, np.ndarray) else v for v in values]


def run_calls(loaded, calls_per_method: dict) -> tuple[list, str | None]:
    """Every method's calls on one runtime: a list of (method, call, status, value), and a
    finding (or None)."""
    record = []
    for name, calls in calls_per_method.items():
        status, method = _attempt(lambda: loaded.method(name))
        if status != "ok":
            record.append((name, -1, status, method))
            if status == "finding":
                return record, method
            continue
        for k, inputs in enumerate(calls):
            if k == 2 and loaded.state_names:
                status, value = _attempt(loaded.reset_state)
                if status == "finding":
                    return record, value
            status, value = _attempt(lambda: _outputs(method(*inputs)))
            record.append((name, k, status, value))
            if status == "finding":
                return record, value
        for state in loaded.state_names:
            status, value = _attempt(lambda: loaded.read_state(state))
            if status == "finding":
                return record, value
    return record, None


# --- the native side (the sanitized worker) ------------------------------------------------

def native_side(data: bytes, library: str, seed: int, definitions: dict) -> tuple[str, object]:
    """(outcome, payload): ('finding: <what>', None); ('refused: <reason>', 'load') for a
    program refused at load; (TOO_BIG, None); else (outcome, (plan, record)), the outcome
    'ran' or 'refused: <the first refused call's reason>'."""
    from opforge.runtime import load

    status, native = _attempt(lambda: load(data, executor="native", kernels=[library],
                                           max_memory=MAX_MEMORY))
    if status != "ok":
        return f"{status}: {native}", "load" if status == "refused" else None
    plan = []
    for name in native.method_names:
        got, method = _attempt(lambda: native.method(name))
        if got != "ok":
            if got == "finding":
                return "finding: " + method, None
            continue
        total = sum(np.dtype(s.dtype).itemsize * math.prod(s.shape)
                    for s in method.inputs if s.is_tensor)
        if total > MAX_INPUT_BYTES:
            return TOO_BIG, None
        plan.append((name, method.inputs))
    record, finding = run_calls(native, draw_calls(plan, definitions, seed))
    if finding is not None:
        return "finding: " + finding, None
    refused = [v for _, _, s, v in record if s == "refused"]
    return ("ran" if not refused else "refused: " + refused[0]), (plan, record)


def _leaks(log_dir: Path) -> str | None:
    """Ask LeakSanitizer now; the first leak whose allocation stack passes through
    libopforge_runtime (Python's and NumPy's own are not ours), or None."""
    check = getattr(ctypes.CDLL(None), "__lsan_do_recoverable_leak_check", None)
    if check is None or not check():
        return None
    log = log_dir / f"asan.{os.getpid()}"
    text = log.read_text(errors="replace") if log.exists() else ""
    for block in re.split(r"\n(?=(?:Direct|Indirect) leak of )", text):
        if block.startswith(("Direct leak", "Indirect leak")) and (
                "libopforge_runtime" in block or "native_runtime/" in block):
            return "leak: " + " | ".join(line.strip() for line in block.splitlines()[:8])[:900]
    return None


def native_worker(conn, library: str, log_dir: str, leak_every: int, seeds: list[bytes]) -> None:
    """Answer each case of a batch (a list of (data, seed, definitions)) with native_side's
    (outcome, payload) as soon as it is done, so the supervisor knows which case was running
    when the worker died or stopped answering. LeakSanitizer is asked every ``leak_every``
    cases (each check stops the process and scans its whole heap, Python's objects
    included: ~1 s, far more than a case) and when an empty batch comes; a leak replaces
    that case's outcome and ends the worker (a later check would report the same blocks
    again), and the supervisor starts a new one for the rest."""
    warnings.simplefilter("ignore")
    log = Path(log_dir)
    # stderr to a file the supervisor reads when this worker dies: UBSan writes its report
    # there, not to log_path, when libubsan comes in with the runtime after libasan
    stderr = os.open(log / f"stderr.{os.getpid()}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(stderr, 2)
    for seed in seeds:  # warm up: lazy imports, NumPy's first use
        native_side(seed, library, 0, symbolic_definitions(seed))
    done = 0
    while True:
        batch = conn.recv()
        if batch is None:
            return
        if not batch:  # the supervisor's last question: leaks since the last check
            leak = _leaks(log)
            conn.send(("finding: " + leak if leak else "ran", None))
            continue
        for data, seed, definitions in batch:
            outcome, payload = native_side(data, library, seed, definitions)
            done += 1
            leak = None
            if leak_every and done % leak_every == 0 and not outcome.startswith("finding"):
                leak = _leaks(log)
                if leak:
                    outcome, payload = "finding: " + leak, None
            conn.send((outcome, payload))
            if leak:
                return


# --- the lean side (the reference, a plain interpreter) ------------------------------------

def _refused_at_load(reason: str, lean, data: bytes, seed: int) -> str:
    """A program the native runtime refuses at load and the lean one loads: 'native_earlier'
    when the lean runtime refuses every method's calls (the native loader checks at load
    what the lean runtime checks per call: outputs in constants, kernel arguments), else
    'load_disagree'."""
    if "a constant tensor, where the kernel writes" in reason:
        return "native_earlier: " + reason  # loader.py's rule, for every kernel's outputs
    if "leaves int64 on the way" in reason and NF.intermediate_overflow(data):
        return "by_design_int64_bounds: " + reason  # native_program_fuzz's documented one
    rng = np.random.default_rng(seed)
    calls = {}
    for m in lean.program.methods:
        got, method = _attempt(lambda: lean.method(m.name))
        if got == "ok":
            dynamic = bool(m.symbols)
            shim = _Specs(method.inputs, m) if dynamic else method
            calls[m.name] = [EF._inputs(shim, rng, dynamic) for _ in range(3)][:1]
    ran, _ = run_calls(lean, calls)
    if any(s == "ok" for _, _, s, _ in ran):
        return "load_disagree: native refuses " + reason
    return "native_earlier: " + reason


def lean_side(data: bytes, seed: int, definitions: dict, native_outcome: str, payload,
              registry) -> str | None:
    """The comparison of one case (see native_exec_fuzz's docstring), None when there is
    nothing to compare: the same calls on the lean runtime, against native_side's answer."""
    from opforge.runtime import load

    status, lean = _attempt(lambda: load(data, registry=registry, max_memory=MAX_MEMORY))
    if payload == "load":
        return _refused_at_load(native_outcome[len("refused: "):], lean, data, seed) \
            if status == "ok" else None
    if status != "ok":
        return "load_disagree: lean refuses " + lean
    plan, record = payload
    reference, finding = run_calls(lean, draw_calls(plan, definitions, seed))
    if finding is not None:  # the lean runtime's own finding: exec_fuzz's business, noted
        return "lean_finding: " + finding[:200]
    return compare_calls(record, reference, {m.name: m for m in lean.program.methods})


def lean_registry(library: str):
    """The portable kernels and the example library's, loaded once for every case."""
    from opforge.runtime.loader import load_kernel_library
    from opforge.runtime.registry import KernelRegistry

    registry = KernelRegistry.portable()
    load_kernel_library("native_exec_fuzz", library, registry)
    return registry


def lean_worker(conn, library: str, seeds: list[bytes]) -> None:
    """Answer each case of a batch (a list of (data, seed, definitions, native outcome,
    payload)) with (lean_side's comparison,) as soon as it is done."""
    from opforge.runtime import load

    resource.setrlimit(resource.RLIMIT_AS, (EF.MAX_WORKER_BYTES, EF.MAX_WORKER_BYTES))
    warnings.simplefilter("ignore")  # NumPy's overflow and NaN warnings
    registry = lean_registry(library)
    for seed in seeds:  # warm up: lazy imports, NumPy's first use
        _attempt(lambda: load(seed, registry=registry, max_memory=MAX_MEMORY))
    while True:
        batch = conn.recv()
        if batch is None:
            return
        for case in batch:
            conn.send((lean_side(*case, registry=registry),))
