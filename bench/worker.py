"""One measurement in its own process: read a JSON spec on stdin, print JSON lines.

    echo '{"mode": "measure", "runtime": "ort", "workload": "mlp", ...}' | python bench/worker.py

Modes:

- ``reference``: build each workload, save its inputs and eager outputs (``io.npz``);
- ``prepare``: export each workload for one runtime (timed: the export time);
- ``measure``: load one artifact, warm up, time ≥ N runs, check against eager, report
  latency percentiles, resident memory and whether torch got imported;
- ``build``: build the bundled example's native kernels, cold then from the cache;
- ``bigload``: load a program with ~100 MB of constants and report load time and VmRSS
  right after load, after the first run and after more runs.

The measuring modes import only what the runtime under test needs (a lean worker never
imports torch), so resident memory and import cost are the runtime's own.
"""

from __future__ import annotations

import gc
import json
import os
import pathlib
import resource
import sys
import time
import tracemalloc
import traceback

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from runtimes import runtime  # noqa: E402  (after the path set-up)


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


def _status_mb(field: str) -> float:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def peak_rss_mb() -> float:
    """The peak resident set of this process: VmHWM, not ``ru_maxrss``. On Linux
    ``ru_maxrss`` survives fork + exec, so a worker started by an orchestrator that has
    imported torch would report the orchestrator's 250 MB as its own peak; VmHWM belongs
    to the worker's own address space."""
    value = _status_mb("VmHWM")
    if value != value:  # NaN: no /proc (not Linux); fall back to getrusage
        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return value


def current_rss_mb() -> float:
    return _status_mb("VmRSS")


def artifact_path(workdir: str, workload: str, runtime_name: str) -> pathlib.Path:
    return pathlib.Path(workdir) / workload / f"{runtime_name}{runtime(runtime_name).suffix}"


def load_io(workdir: str, workload: str) -> tuple[list[np.ndarray], list[np.ndarray]]:
    data = np.load(pathlib.Path(workdir) / workload / "io.npz")
    inputs = [data[k] for k in sorted((k for k in data.files if k.startswith("in")), key=lambda k: int(k[2:]))]
    outputs = [data[k] for k in sorted((k for k in data.files if k.startswith("out")), key=lambda k: int(k[3:]))]
    return inputs, outputs


# -- reference and prepare (these import torch) -------------------------------------------


def reference(spec: dict) -> None:
    import torch
    from quantized_workloads import is_quantized, quantized_workload
    from workloads import workload as build
    for name in spec["workloads"]:
        model, inputs = build(name)
        with torch.inference_mode():
            result = model(*inputs)
        results = result if isinstance(result, (tuple, list)) else (result,)
        folder = pathlib.Path(spec["workdir"]) / name
        folder.mkdir(parents=True, exist_ok=True)
        arrays = {f"in{i}": t.numpy() for i, t in enumerate(inputs)}
        arrays.update({f"out{i}": t.numpy() for i, t in enumerate(results)})
        if is_quantized(name):  # the float model's outputs: what the tolerance is made of
            q = quantized_workload(name)
            with torch.inference_mode():
                floats = q.float_model(*q.inputs)
            floats = floats if isinstance(floats, (tuple, list)) else (floats,)
            arrays.update({f"float{i}": t.numpy() for i, t in enumerate(floats)})
        np.savez(folder / "io.npz", **arrays)
        emit(event="reference", workload=name)


def prepare(spec: dict) -> None:
    import torch
    from quantized_workloads import is_quantized, quantized_workload
    from workloads import workload as build
    rt = runtime(spec["runtime"])
    impl = rt.impl()
    reason = impl.unavailable()
    if not reason:
        # One untimed export first: the first export in a process pays one-off costs
        # (torch.export's and the exporter's own lazy imports and caches), which would
        # otherwise be charged to whichever workload happens to come first.
        model, inputs = build("tiny_add")
        warm = pathlib.Path(spec["workdir"]) / f"warmup-{rt.name}{rt.suffix}"
        try:
            with torch.no_grad():
                impl.export(model, inputs, warm, rt.variant)
        except Exception:
            pass
        warm.unlink(missing_ok=True)
    for name in spec["workloads"]:
        quantized = is_quantized(name)
        missing = reason
        if quantized and not missing and not hasattr(impl, "export_quantized"):
            missing = f"{rt.name} has no quantized path in this bench (export_quantized)"
        if missing:
            emit(event="prepared", runtime=rt.name, workload=name, ok=False, error=missing)
            continue
        # A quantized workload is quantized (calibrated) here, untimed: the export time
        # is the runtime's export of the quantized model, as for a float one.
        model, inputs = build(name)
        path = artifact_path(spec["workdir"], name, rt.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        try:
            with torch.no_grad():
                if quantized:
                    impl.export_quantized(quantized_workload(name), path, rt.variant)
                else:
                    impl.export(model, inputs, path, rt.variant)
        except Exception as error:
            path.unlink(missing_ok=True)
            emit(event="prepared", runtime=rt.name, workload=name, ok=False,
                 error=f"export failed: {type(error).__name__}: {str(error)[:800]}")
            continue
        emit(event="prepared", runtime=rt.name, workload=name, ok=True,
             export_s=time.perf_counter() - start, artifact_bytes=path.stat().st_size)


# -- measure --------------------------------------------------------------------------------


def max_abs_error(actual: list[np.ndarray], expected: list[np.ndarray]) -> float:
    if len(actual) != len(expected):
        return float("inf")
    worst = 0.0
    for a, e in zip(actual, expected):
        if a.shape != e.shape:
            return float("inf")
        if a.size:
            worst = max(worst, float(np.max(np.abs(a.astype(np.float64) - e.astype(np.float64)))))
    return worst


def measure(spec: dict) -> None:
    rt = runtime(spec["runtime"])
    base = dict(event="measure", runtime=rt.name, workload=spec["workload"],
                round=spec.get("round", 0), threads=spec["threads"])
    rss_start = peak_rss_mb()
    start = time.perf_counter()
    impl = rt.impl()
    reason = impl.unavailable()
    import_s = time.perf_counter() - start
    if reason:
        emit(**base, ok=False, error=reason)
        return
    inputs, expected = load_io(spec["workdir"], spec["workload"])
    path = artifact_path(spec["workdir"], spec["workload"], rt.name)
    if not path.exists():
        emit(**base, ok=False, error="no artifact (its export failed or was not run)")
        return
    rss_imported = peak_rss_mb()
    session, args, result, load_s, first_run_s, rss_loaded = _load_and_run_once(
        impl, rt, spec, path, inputs)
    error = max_abs_error(session.outputs(result), expected)

    # Warm-up: at least `warmup` calls and at least `warmup_s` seconds.
    warm_deadline = time.perf_counter() + spec.get("warmup_s", 0.2)
    calls = 0
    start = time.perf_counter()
    while calls < spec.get("warmup", 10) or time.perf_counter() < warm_deadline:
        session.run(args)
        calls += 1
    per_call = (time.perf_counter() - start) / calls
    # Each sample times `inner` back-to-back calls, so that one sample lasts at least
    # `min_sample_s`: a 5 µs call is then not dominated by the clock's own cost.
    inner = max(1, int(spec.get("min_sample_s", 2e-4) / max(per_call, 1e-9)))

    runs = spec.get("runs", 50)
    samples = np.empty(runs)
    gc.collect()
    gc.disable()  # a collection landing in one sample is noise, not the runtime's cost
    try:
        for i in range(runs):
            t0 = time.perf_counter_ns()
            for _ in range(inner):
                session.run(args)
            samples[i] = (time.perf_counter_ns() - t0) / inner / 1e9
    finally:
        gc.enable()
    error = max(error, max_abs_error(session.outputs(session.run(args)), expected))
    allocations = steady_state_allocations(session, args) if hasattr(session, "run_views") else {}
    p10, p50, p90 = np.percentile(samples, [10, 50, 90])
    emit(**base, ok=True, median_s=float(p50), p10_s=float(p10), p90_s=float(p90),
         mean_s=float(samples.mean()), runs=runs, inner=inner, first_run_s=first_run_s,
         import_s=import_s, load_s=load_s, max_abs_error=error,
         rss_start_mb=rss_start, rss_imported_mb=rss_imported, rss_loaded_mb=rss_loaded,
         peak_rss_mb=peak_rss_mb(), torch_imported="torch" in sys.modules,
         thread_pool=getattr(session, "thread_pool", str(spec["threads"])), **allocations,
         samples_s=[float(x) for x in samples])


def steady_state_allocations(session, args, calls: int = 20) -> dict:
    """Bytes allocated during steady-state calls that return views of the runtime's own
    output buffers (tracemalloc sees NumPy's array buffers): the highest transient peak
    above the baseline, and what is still held after ``calls`` calls. Zero for a runtime
    that allocates nothing per call; run after the timed samples, so it costs them nothing."""
    session.run_views(args)
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for _ in range(calls):
            session.run_views(args)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"alloc_peak_bytes": peak - baseline, "alloc_retained_bytes": current - baseline}


def _load_and_run_once(impl, rt, spec: dict, path, inputs):
    """Load the artifact and make the first (unwarmed) call: ``(session, args, result,
    load_s, first_run_s, rss_after_load_mb)``."""
    start = time.perf_counter()
    session = impl.load(path, spec["workload"], spec["threads"], rt.variant)
    load_s = time.perf_counter() - start
    rss_loaded = current_rss_mb()
    args = session.feed(inputs)
    start = time.perf_counter()
    result = session.run(args)
    return session, args, result, load_s, time.perf_counter() - start, rss_loaded


# -- micro ------------------------------------------------------------------------------------


def bigload(spec: dict) -> None:
    rt = runtime(spec["runtime"])
    impl = rt.impl()
    impl.unavailable()  # imports the runtime: load time and RSS below exclude the import
    inputs, expected = load_io(spec["workdir"], spec["workload"])
    path = artifact_path(spec["workdir"], spec["workload"], rt.name)
    rss_before = current_rss_mb()
    session, args, result, load_s, first_run_s, rss_loaded = _load_and_run_once(
        impl, rt, spec, path, inputs)
    rss_first = current_rss_mb()
    times = []
    for _ in range(spec.get("runs", 10)):
        start = time.perf_counter()
        session.run(args)
        times.append(time.perf_counter() - start)
    emit(event="bigload", runtime=rt.name, workload=spec["workload"], file_mb=path.stat().st_size / 2**20,
         load_s=load_s, first_run_s=first_run_s, median_run_s=float(np.median(times)),
         rss_before_load_mb=rss_before, rss_after_load_mb=rss_loaded, rss_after_first_run_mb=rss_first,
         rss_after_runs_mb=current_rss_mb(), peak_rss_mb=peak_rss_mb(),
         max_abs_error=max_abs_error(session.outputs(result), expected),
         torch_imported="torch" in sys.modules)


def build(spec: dict) -> None:
    """Native build of the bundled example kernels: cold (an empty cache) then warm (hit)."""
    import tempfile
    from opforge.native import build_library
    from opforge.examples.my_ops import manifest_path
    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    with tempfile.TemporaryDirectory(prefix="opforge-bench-build-") as tmp:
        cache = pathlib.Path(tmp) / "cache"
        for kind in ("cold", "warm", "warm"):
            start = time.perf_counter()
            result = build_library(manifest_path(), sources, pathlib.Path(tmp) / "libmy_ops.so",
                                   cache_root=cache, progress=False)
            emit(event="build", kind=kind, seconds=time.perf_counter() - start,
                 cached=result.cached, kernels=len(result.kernels), sources=len(sources),
                 library_bytes=result.size)


MODES = {"reference": reference, "prepare": prepare, "measure": measure,
         "bigload": bigload, "build": build}


def main() -> int:
    spec = json.loads(sys.stdin.read())
    try:
        MODES[spec["mode"]](spec)
    except Exception as error:
        emit(event="crash", spec=spec, error=f"{type(error).__name__}: {error}",
             traceback=traceback.format_exc()[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
