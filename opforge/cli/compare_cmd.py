"""``opforge compare MODEL|PROGRAM``: find the first operator where runs of a model diverge.

    MODULE:FACTORY → reference (eager float64, node by node) → runs (eager, lean, aten, cpu
    debug build, quantized) → per-node error table, first divergence per run → --json, --html

A PROGRAM (an .opf file) has no model beside it: its runs (``lean``, ``aten``) are
compared with the first of them. Exit status 1 when some run leaves its tolerance.
"""

from __future__ import annotations

import os

import click

from opforge.errors import OpforgeError

__all__ = ["compare"]

_API = "`opforge compare`"


@click.command("compare")
@click.argument("target", metavar="MODEL|PROGRAM")
@click.option("--inputs", "input_paths", multiple=True, metavar="NPY[,NPY...]",
              help="Input .npy files in input order (repeat, or comma-separate). Default: the "
                   "factory's example inputs; random ones (--seed) for a PROGRAM.")
@click.option("--against", default=None, metavar="RUNS",
              help="Comma-separated runs: eager, lean, aten, native (the C++ runtime; outputs "
                   "only), cpu, cpu-fused, quantized. Default: eager,lean,aten (and cpu when the "
                   "backend is installed); lean,aten for a PROGRAM, the first being the reference.")
@click.option("--rtol", type=float, default=1e-3, show_default=True,
              help="Float runs: a node is out when max|x - r| > atol + rtol * max|r|.")
@click.option("--atol", type=float, default=1e-5, show_default=True, help="See --rtol.")
@click.option("--min-sqnr", type=float, default=20.0, show_default=True,
              help="The quantized run: a node is out when its SQNR falls below this (dB).")
@click.option("--scheme", default="8a8w", show_default=True,
              help="Quantization scheme of the quantized run.")
@click.option("--calibration", type=click.Path(exists=True, dir_okay=False), metavar="LIST",
              help="The quantized run's calibration samples (an input list, as opforge quantize "
                   "--calibration takes). Default: the inputs compared, on which nothing clips.")
@click.option("--kernels", "libraries", multiple=True, metavar="LIB",
              help="A native kernel library or 'pkg.module:function' registrar, loaded into "
                   "every program run (as opforge run --kernels); repeatable.")
@click.option("--method", "method_name", default="forward", show_default=True,
              help="The method of a PROGRAM.")
@click.option("--rows", type=click.Choice(["all", "diverged"]), default="all", show_default=True,
              help="Print every node, or only those some run is out of tolerance on.")
@click.option("--seed", default=0, show_default=True, help="Seed of a PROGRAM's random inputs.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON on stdout.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Write a self-contained HTML page: per-node SQNR along the graph, and the table.")
def compare(target: str, input_paths: tuple[str, ...], against: str | None, rtol: float,
            atol: float, min_sqnr: float, scheme: str, calibration: str | None,
            libraries: tuple[str, ...], method_name: str, rows: str, seed: int, as_json: bool, html_path: str | None) -> None:
    """Run MODEL (MODULE:FACTORY) or PROGRAM (.opf) everywhere on the same inputs and name,
    per run, the first node that leaves its tolerance against the reference."""
    from rich.console import Console

    from opforge.cli.run_cmd import _read_npy
    from opforge.cli.tables import table_console

    status_console = Console(stderr=True, quiet=as_json)
    paths = [p for given in input_paths for p in given.split(",") if p]
    inputs = [_read_npy(p, _API, "--inputs") for p in paths]
    is_program = os.path.isfile(target) and not target.endswith(".py") or target.endswith(".opf")
    try:
        with status_console.status(f"comparing {target}") as status:
            if is_program:
                result = _compare_program(target, inputs, against, rtol, atol, libraries,
                                          method_name, seed)
            else:
                result = _compare_model(target, inputs, against, rtol, atol, min_sqnr, scheme,
                                        libraries, lambda text: status.update(text),
                                        calibration)
    except OpforgeError as e:
        raise click.ClickException(str(e)) from None
    from opforge.compare.report import print_comparison, to_html, to_json

    if html_path:
        try:
            with open(html_path, "w", encoding="utf-8") as f:
                f.write(to_html(result, title=f"opforge compare {target}"))
        except OSError as e:
            raise click.ClickException(f"{_API}: --html {html_path!r} — cannot write it ({e})") from None
    if as_json:
        click.echo(to_json(result))
    else:
        print_comparison(table_console(), result, rows=rows)
        if html_path:
            click.echo(f"plot: {html_path}")
    if any(result.first_divergence(r.name) is not None for r in result.runs):
        raise SystemExit(1)


def _compare_model(target, inputs, against, rtol, atol, min_sqnr, scheme, libraries, step,
                   calibration=None):
    from opforge.cli.export_cmd import load_factory, methods_from_factory
    from opforge.compare import compare as run_compare

    step(f"importing {target}")
    result = load_factory(target)()
    wanted = methods_from_factory(target, result, ())
    model, example = (wanted.get("forward") or next(iter(wanted.values())))[:2]
    if inputs and len(inputs) != len(example):
        raise click.ClickException(f"{_API}: --inputs — found {len(inputs)} file(s) — valid: "
                                   f"{len(example)}, one per model input — fix: pass them in order")
    if inputs:
        _check_model_takes(model, inputs, example)
    if against is None:
        from opforge.backends.cpu.engine import missing

        against = "eager,lean,aten" + ("" if missing() else ",cpu")
    samples = None
    if calibration:
        from opforge.cli.quantize_cmd import _samples

        samples = _samples(calibration, "--calibration")
    return run_compare(model, inputs or list(example), against=against.split(","), rtol=rtol,
                       atol=atol, min_sqnr=min_sqnr, scheme=scheme, kernels=libraries,
                       calibration=samples, on_step=step)


def _check_model_takes(model, inputs, example) -> None:
    """Run the model once on the --inputs: inputs it refuses (a wrong shape) are one clear
    error here, not a torch.export failure deep in the comparison."""
    import numpy as np
    import torch

    def shown(values) -> str:
        return ", ".join(f"{str(v.dtype).removeprefix('torch.')}{list(v.shape)}"
                         if hasattr(v, "shape") else type(v).__name__ for v in values)

    given = [torch.from_numpy(np.ascontiguousarray(a)) if isinstance(a, np.ndarray) else a
             for a in inputs]
    buffers = {name: b.clone() for name, b in model.named_buffers()}  # a cache stays as it is
    try:
        with torch.no_grad():
            torch.func.functional_call(model, buffers, tuple(given))
    except Exception as exc:  # noqa: BLE001 - whatever the model raises on these inputs
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        raise click.ClickException(
            f"{_API}: --inputs ({shown(inputs)}) — the model refuses them: "
            f"{type(exc).__name__}: {reason} — valid: inputs the model runs on, like its "
            f"example inputs ({shown(example)}) — fix: pass .npy files of those shapes and "
            "dtypes, in input order") from None


def _compare_program(target, inputs, against, rtol, atol, libraries, method_name, seed):
    from opforge.cli.run_cmd import _random_inputs
    from opforge.compare import compare_program
    from opforge.program import load
    from opforge.runtime import load as load_runtime

    program = load(target)
    if not inputs:
        inputs = _random_inputs(load_runtime(program, kernels=list(libraries)).method(method_name), seed)
    return compare_program(program, inputs, against=(against or "lean,aten").split(","),
                           rtol=rtol, atol=atol, kernels=libraries, method=method_name)
