"""``opforge run PROGRAM.opf``: run a program file on the lean (NumPy) or ATen runtime.

    load (verify, resolve kernels) → inputs (.npy files, an input list, or random) →
    run N iterations per inference (traced with --profile/--trace) → report → write outputs

Never imports torch in lean mode: this verb is what runs on a device with NumPy only.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path

import click
import numpy as np

from opforge._user_files import os_error_text, regular_file_problem

__all__ = ["run", "profile_table"]


@click.command("run")
@click.argument("program", type=click.Path(exists=True, dir_okay=False))
@click.option("--input", "input_paths", multiple=True, type=click.Path(dir_okay=False),
              help="An input .npy file; repeat in input order.")
@click.option("--input-list", type=click.Path(exists=True, dir_okay=False),
              help="A file with one inference per line: input .npy paths separated by spaces.")
@click.option("--output-dir", type=click.Path(file_okay=False),
              help="Write outputs here: output_{j}.npy (inference_{i}/output_{j}.npy for a list).")
@click.option("--mode", type=click.Choice(["lean", "aten"]), default="lean", show_default=True,
              help="lean: portable NumPy kernels (no torch); aten: PyTorch's own kernels.")
@click.option("--method", "method_name", default="forward", show_default=True,
              help="The method to run.")
@click.option("--executor", type=click.Choice(["lean", "native"]), default="lean",
              show_default=True,
              help="lean: the NumPy runtime; native: the C++ runtime (libopforge_runtime, "
                   "lean mode, native kernel libraries only).")
@click.option("--kernels", "libraries", multiple=True,
              help="A native kernel library, or a Python registrar 'pkg.module:function' "
                   "called with the registry (module found from the current directory "
                   "first; see docs/python-kernels.md); repeatable.")
@click.option("--iterations", type=click.IntRange(min=1), default=1, show_default=True,
              help="Runs per inference; more than one prints a latency summary.")
@click.option("--profile", is_flag=True, help="Print the ops that took the most time.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False),
              help="Write a Chrome/Perfetto trace (JSON) of every instruction.")
@click.option("--seed", default=0, show_default=True, help="Seed of generated random inputs.")
@click.option("--op-packages", "op_packages", type=click.Path(dir_okay=False), metavar="FILE",
              help="JSON/YAML op-package list: the package libraries the program's delegates "
                   "may load (a program naming any other library is refused).")
def run(program: str, input_paths: tuple[str, ...], input_list: str | None,
        output_dir: str | None, mode: str, method_name: str, executor: str,
        libraries: tuple[str, ...],
        iterations: int, profile: bool, trace_path: str | None, seed: int,
        op_packages: str | None) -> None:
    """Run PROGRAM (an .opf file) and report its outputs, latency and profile."""
    from opforge.cli.tables import table_console
    from opforge.runtime import Tracer, load

    console = table_console()
    if input_paths and input_list:
        raise click.UsageError("pass either --input (repeatable) or --input-list, not both")
    if op_packages:
        from opforge.backends.oppackage import load_op_package_infos
        from opforge.backends.oppackage.runtime import trust_packages

        trust_packages(info.op_package_path for info in load_op_package_infos(op_packages))
    loaded = load(program, mode=mode, kernels=libraries, executor=executor)
    method = loaded.method(method_name)
    console.print(f"[bold]{program}[/bold]: method {method_name!r}, "
                  + ("native runtime" if executor == "native" else f"mode {mode}")
                  + f", {len(method.instructions)} instruction(s)")
    if input_list:
        inferences = [[_read_npy(p) for p in line] for line in _read_input_list(input_list)]
    elif input_paths:
        inferences = [[_read_npy(p) for p in input_paths]]
    else:
        inferences = [_random_inputs(method, seed)]
        console.print(f"no inputs given: generated random inputs (seed {seed}): "
                      + (", ".join(s.describe() for s in method.inputs) or "none"))

    tracer = Tracer() if (profile or trace_path) else None
    latencies: list[int] = []
    results = []
    for inputs in inferences:
        for _ in range(iterations):
            start = time.perf_counter_ns()
            outputs = method.run(inputs, tracer=tracer)
            latencies.append(time.perf_counter_ns() - start)
        results.append(outputs)

    _print_outputs(console, results)
    if method.memory_growths:
        console.print(f"growing memory: grew {method.memory_growths} time(s); "
                      f"{method.growing_bytes} bytes held outside the arenas")
    if len(latencies) > 1:
        _print_latency(console, latencies, traced=tracer is not None)
    if output_dir:
        try:
            _write_outputs(console, Path(output_dir), results,
                           per_inference=input_list is not None)
        except OSError as e:
            raise _write_error("--output-dir", e, e.filename or output_dir) from None
    if profile:
        _print_profile(console, tracer)
    if trace_path:
        try:
            tracer.save(trace_path)
        except OSError as e:
            raise _write_error("--trace", e, trace_path) from None
        console.print(f"trace: {len(tracer.events)} event(s) written to {trace_path} "
                      "(open in ui.perfetto.dev)")


def _write_error(option: str, e: OSError, path: str) -> click.ClickException:
    return click.ClickException(f"`opforge run {option}`: {os_error_text(e, path, 'write')}")


def _refuse_special(option: str, path: str, command: str = "opforge run") -> None:
    """A FIFO or device given as an input file would block (or act) when opened."""
    problem = regular_file_problem(path, "a regular file", "save the data to a file first")
    if problem is not None:
        raise click.ClickException(f"`{command} {option}`: input {problem}")


def _read_npy(path: str, command: str = "opforge run", option: str = "--input") -> np.ndarray:
    _refuse_special(option, path, command)
    try:
        _check_npy_size(path)
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, MemoryError) as e:
        raise click.ClickException(
            f"`{command}`: input {path!r} — cannot read it as .npy ({e}) — valid: a NumPy "
            ".npy file without pickled objects — fix: save it with numpy.save(path, array)"
        ) from None


def _check_npy_size(path: str) -> None:
    """``ValueError`` unless the header's shape and dtype describe exactly the bytes that
    follow it: a header declaring terabytes made ``np.load`` allocate them first."""
    fmt = np.lib.format
    with open(path, "rb") as f:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, _, dtype = fmt.read_array_header_2_0(f)
        else:
            return  # (3, 0) and later: np.load's own checks
        if dtype.hasobject:
            return  # refused by np.load (allow_pickle=False)
        have = os.fstat(f.fileno()).st_size - f.tell()
    need = dtype.itemsize
    for d in shape:
        need *= d
    if need > have:
        raise ValueError(f"its header declares {dtype}{list(shape)}, {need} bytes, and only "
                         f"{have} bytes follow it")


def _read_input_list(path: str, command: str = "opforge run",
                     option: str = "--input-list") -> list[list[str]]:
    """One inference per non-empty line; a relative path is tried from the current
    directory first, then from the list file's directory ('#' starts a comment).
    ``command``/``option`` name the caller in errors (``opforge quantize --calibration``)."""
    base = Path(path).parent
    _refuse_special(option, path, command)
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise click.ClickException(f"`{command} {option}`: {path!r} — cannot read it as "
                                   f"text ({e}) — valid: a text file of .npy paths — fix: check "
                                   "the path") from None
    inferences = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        paths = []
        for item in line.split():
            if not os.path.exists(item) and os.path.exists(base / item):
                item = str(base / item)
            if not os.path.exists(item):
                raise click.ClickException(
                    f"`{command} {option} {path}`: line {number} — input {item!r} does "
                    "not exist — valid: .npy paths, relative to the current directory or the "
                    "list file — fix: correct the path"
                )
            paths.append(item)
        inferences.append(paths)
    if not inferences:
        raise click.ClickException(f"`{command} {option} {path}`: the file lists no "
                                   "inferences — valid: one line of .npy paths per inference")
    return inferences


def _random_inputs(method, seed: int) -> list:
    rng = np.random.default_rng(seed)
    inputs = []
    for spec in method.inputs:
        if not spec.is_tensor:
            inputs.append(spec.dtype(1))
            continue
        dtype = np.dtype(spec.dtype)
        if dtype.kind == "b":
            inputs.append(rng.random(spec.shape) < 0.5)
        elif dtype.kind in "iu":
            inputs.append(rng.integers(0, 10, size=spec.shape).astype(dtype))
        elif dtype.kind == "c":
            inputs.append((rng.standard_normal(spec.shape)
                           + 1j * rng.standard_normal(spec.shape)).astype(dtype))
        else:
            inputs.append(rng.standard_normal(spec.shape).astype(dtype))
    return inputs


def _print_outputs(console, results: list) -> None:
    from rich.table import Table

    table = Table("inference", "output", "dtype", "shape", "min", "max", "mean")
    shown = results[:4]
    for i, outputs in enumerate(shown):
        for j, out in enumerate(outputs):
            array = np.asarray(out)
            numeric = array.size and array.dtype.kind in "biuf"
            stats = ([f"{array.min():.6g}", f"{array.max():.6g}",
                      f"{array.astype(np.float64).mean():.6g}"] if numeric else ["", "", ""])
            table.add_row(str(i), str(j), str(array.dtype), str(tuple(array.shape)), *stats)
    console.print(table)
    if len(results) > len(shown):
        console.print(f"({len(results) - len(shown)} more inference(s) not shown)")


def _print_latency(console, latencies: list[int], *, traced: bool) -> None:
    us = sorted(t / 1e3 for t in latencies)
    deciles = statistics.quantiles(us, n=10, method="inclusive")
    console.print(
        f"latency over {len(us)} call(s): median {statistics.median(us):.1f} µs, "
        f"p10 {deciles[0]:.1f} µs, p90 {deciles[-1]:.1f} µs, min {us[0]:.1f} µs"
        + (" (tracing on: each instruction timed)" if traced else ""))


def _write_outputs(console, directory: Path, results: list, *, per_inference: bool) -> None:
    written = 0
    for i, outputs in enumerate(results):
        folder = directory / f"inference_{i}" if per_inference else directory
        folder.mkdir(parents=True, exist_ok=True)
        for j, out in enumerate(outputs):
            np.save(folder / f"output_{j}.npy", np.asarray(out))
            written += 1
    console.print(f"wrote {written} output file(s) to {directory}")


def profile_table(tracer, top: int = 20):
    """A rich ``Table`` of the ``top`` ops by total time in ``tracer`` (op, calls, total ms,
    % of total, mean µs) — what ``opforge run --profile`` prints."""
    from rich.table import Table

    rows = tracer.summary()
    table = Table("op", "calls", "total ms", "% of total", "mean µs",
                  title=f"top {min(top, len(rows))} of {len(rows)} op(s) by total time")
    for stats in rows[:top]:
        table.add_row(stats.op, str(stats.calls), f"{stats.total_ms:.3f}",
                      f"{100 * stats.share:.1f}", f"{stats.mean_us:.1f}")
    return table


def _print_profile(console, tracer) -> None:
    console.print(profile_table(tracer))
