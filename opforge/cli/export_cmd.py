"""``opforge export MODULE:FACTORY -o model.opf``: export a model to a program file.

``FACTORY`` is a callable in a module (found from the current directory first, like every
verb's user modules) or a ``path/to/file.py``, returning
either ``(model, example_inputs)`` — one method, ``forward`` unless ``--method NAME``
renames it — or a dict ``{method_name: (module_or_bound_method, example_inputs)}``, of
which ``--method`` (repeatable) selects some; all by default. Nothing is written when
export fails, including when a kernel set given with ``--kernels`` misses operators
(unless ``--allow-missing``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

import click

from opforge._user_files import os_error_text, regular_file_problem
from opforge.errors import ExportError

__all__ = ["export", "load_factory", "methods_from_factory"]

_API = "`opforge export`"


def load_factory(spec: str) -> Any:
    """Resolve ``MODULE:FACTORY`` (``pkg.mod:fn`` or ``path/file.py:fn``) to the callable."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ExportError(
            f"{_API}: {spec!r} — not MODULE:FACTORY — valid: e.g. opforge.examples.zoo:mlp or "
            "models.py:make_model — fix: name the module and the factory separated by ':'"
        )
    if module_name.endswith(".py") and os.path.exists(module_name):
        _refuse_special(module_name)
    try:
        if module_name.endswith(".py"):
            path = os.path.abspath(module_name)
            loader_spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
            if loader_spec is None or not os.path.exists(path):
                raise ModuleNotFoundError(f"no file {path}")
            module = importlib.util.module_from_spec(loader_spec)
            loader_spec.loader.exec_module(module)
        else:
            from opforge.cli import use_current_directory

            use_current_directory()  # the CLI's rule, also when called from Python
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ExportError(
            f"{_API}: module {module_name!r} — cannot be imported ({exc}) — valid: an importable module "
            "or a .py file — fix: check the name, run from the project directory, or set PYTHONPATH"
        ) from exc
    except OSError as exc:
        if exc.filename not in (module_name, os.path.abspath(module_name)):
            raise  # raised by the module's own code: its traceback is what the user needs
        raise ExportError(f"{_API}: factory file {os_error_text(exc, module_name, 'read')}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        candidates = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))[:12]
        raise ExportError(
            f"{_API}: {spec!r} — module {module_name!r} has no callable {attr!r} — valid: "
            f"{', '.join(candidates) or 'a function returning (model, example_inputs)'} — fix: name one of them"
        )
    return factory


def _refuse_special(path: str) -> None:
    """A FIFO or device named as the factory's file would block (or act) when opened."""
    problem = regular_file_problem(path, "a Python source file",
                                   "name the .py file that defines the factory")
    if problem is not None:
        raise ExportError(f"{_API}: factory file {problem}")


def methods_from_factory(spec: str, result: Any, selected: tuple[str, ...]) -> dict[str, tuple[Any, Any]]:
    """The ``{method: (module, inputs)}`` to export from what the factory returned."""
    if isinstance(result, dict):
        unknown = [m for m in selected if m not in result]
        if unknown:
            raise ExportError(
                f"{_API}: --method {', '.join(unknown)} — not returned by {spec!r} — valid: "
                f"{', '.join(map(str, result))} — fix: pick from those"
            )
        return {name: result[name] for name in (selected or tuple(result))}
    if isinstance(result, (tuple, list)) and len(result) in (2, 3):
        if len(selected) > 1:
            raise ExportError(
                f"{_API}: --method given {len(selected)} times — {spec!r} returns one (model, inputs) "
                "pair — valid: one --method NAME to name it — fix: return a dict {name: (module, inputs)} "
                "from the factory to export several methods"
            )
        return {selected[0] if selected else "forward": tuple(result)}
    raise ExportError(
        f"{_API}: {spec!r} returned {type(result).__name__} — valid: (model, example_inputs), "
        "(model, example_inputs, dynamic_shapes) or {method_name: (module, example_inputs[, "
        "dynamic_shapes])} — fix: return one of those"
    )


@click.command("export")
@click.argument("factory")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False), help="Program file to write.")
@click.option("--method", "methods", multiple=True, metavar="NAME",
              help="Method name (one (model, inputs) factory) or methods to pick (dict factory). Repeatable.")
@click.option("--strict", is_flag=True, help="Use torch.export's strict (TorchDynamo) capture.")
@click.option("--preserve-op", "preserve_ops", multiple=True, metavar="OP",
              help="Keep OP (e.g. aten::linear) out of decomposition. Repeatable.")
@click.option("--kernels", "kernels", multiple=True, metavar="SET",
              help="Check every op has a kernel in SET: portable, aten or a native LIB.so "
              "(union of all given). Repeatable.")
@click.option("--allow-missing", is_flag=True, help="Write the program even if --kernels misses ops (warns).")
@click.option("--backend", "backends", multiple=True, metavar="NAME",
              help="Delegate what backend NAME takes (e.g. cpu); the rest stays on kernels. Repeatable.")
@click.option("--target", default=None, metavar="TRIPLE",
              help="The machine the program is for (x86_64-linux-gnu, aarch64-linux-gnu; default: "
              "this one). The cpu backend delegates nothing for one its engine is not built for "
              "(--explain says why).")
@click.option("--compile-spec", "compile_specs", multiple=True, metavar="KEY=VALUE",
              help="A compile spec for the backend(s), e.g. num_threads=2. Repeatable.")
@click.option("--op-packages", "op_packages", type=click.Path(dir_okay=False), metavar="FILE",
              help="JSON/YAML list of op packages (OpPackageInfo) for the backend.")
@click.option("--dim", "dims", multiple=True, metavar="INPUT:DIM:NAME:MIN:MAX",
              help="Make dimension DIM of input number INPUT dynamic, named NAME, in [MIN, MAX] "
              "(the same NAME on several inputs shares the size). Repeatable; applies to every "
              "method. Derived dims (2*s): return dynamic_shapes from the factory. MAX 'inf' "
              "(no upper bound) needs --grow NAME.")
@click.option("--grow", "grow", multiple=True, metavar="NAME",
              help="Let the memory of dynamic dimension NAME grow at run time (outside the "
              "planned arenas, doubling when a call needs more, within the memory limit) "
              "instead of planning it at its max; NAME may then have no max. Repeatable.")
@click.option("--explain", is_flag=True, help="Print every node left out of delegation, with why.")
@click.option("--no-debug-handles", "no_debug_handles", is_flag=True,
              help="Leave out the debug table (each instruction's FX node and source line, "
                   "what `opforge compare` aligns runs by).")
@click.option("-q", "--quiet", is_flag=True, help="No progress, only errors.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the written program's summary and delegation report as JSON on stdout "
                   "(as `opforge inspect --json`); progress and warnings stay on stderr.")
def export(factory: str, output: str, methods: tuple[str, ...], strict: bool, preserve_ops: tuple[str, ...],
           kernels: tuple[str, ...], allow_missing: bool, backends: tuple[str, ...],
           target: str | None, compile_specs: tuple[str, ...], op_packages: str | None, dims: tuple[str, ...],
           grow: tuple[str, ...], explain: bool, no_debug_handles: bool, quiet: bool,
           as_json: bool) -> None:
    """Export FACTORY (MODULE:FUNCTION returning (model, example_inputs)) to a program file."""
    import warnings

    from rich.console import Console

    console = Console(stderr=True, quiet=quiet)
    specs = _compile_specs(compile_specs, op_packages, backends)
    if target is not None:
        backends = _for_target(backends, target)
    with console.status(f"importing {factory}") as status:
        from opforge.export import export as export_program
        from opforge.program import save

        result = load_factory(factory)()
        wanted = methods_from_factory(factory, result, methods)
        if dims:
            wanted = {name: with_dims(name, entry, dims) for name, entry in wanted.items()}

        def on_step(step: str, method: str) -> None:
            status.update(f"[bold]{step}[/bold] ({method})")

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", UserWarning)
            program = export_program(
                None, None, methods=wanted, strict=strict, preserve_ops=preserve_ops,
                kernels=list(kernels) or None, allow_missing=allow_missing, on_step=on_step,
                backends=list(backends), compile_specs=specs, grow=grow,
                debug_handles=not no_debug_handles,
            )
        status.update(f"writing {output}")
        save(program, output)
    for warning in caught:
        if issubclass(warning.category, UserWarning):
            console.print(f"[yellow]warning:[/yellow] {warning.message}", soft_wrap=True, markup=False)
    if as_json:
        import json

        from opforge.cli.inspect_cmd import summary

        data = summary(program)
        data["file"] = {"path": output, "bytes": os.path.getsize(output)}
        click.echo(json.dumps(data, indent=2))
        return
    _summary(console, program, output)
    if backends:
        from opforge.cli.delegation_view import print_delegation
        from opforge.cli.tables import table_console
        from opforge.export import delegation_report

        print_delegation(table_console(stderr=True, quiet=quiet) if not explain else table_console(),
                         delegation_report(program), explain=explain)
        foreign = next((b.target for b in backends if getattr(b, "target", None)), None)
        if foreign is not None:
            from opforge.backends.cpu.targets import foreign_reason

            console.print("note: " + foreign_reason(foreign, every=True), soft_wrap=True,
                          markup=False)


def _for_target(backends: tuple, target: str) -> tuple:
    """``--backend`` names with the cpu backend made for ``target``; ``--target`` with
    another backend is an error (only the cpu backend builds for a machine)."""
    from opforge.backends.cpu import CpuBackend
    from opforge.backends.cpu.targets import check_target

    check_target(target, f"{_API}: --target")
    others = [b for b in backends if b != "cpu"]
    if others:
        raise ExportError(f"{_API}: --target {target} with --backend {others[0]} — valid: --target "
                          "with the cpu backend only (the others do not build for a machine) — "
                          f"fix: drop --target, or export for {target} with --backend cpu")
    return tuple(CpuBackend(target=target) for _ in backends)


def with_dims(method: str, entry: tuple, dims: tuple[str, ...], api: str = _API) -> tuple:
    """``(module, inputs, dynamic_shapes)`` with the ``--dim`` options applied (``api``:
    the command errors name)."""
    import torch

    module, inputs = entry[0], entry[1]
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    shapes: list[dict] = [{} for _ in inputs]
    made: dict[str, Any] = {}
    ranges: dict[str, tuple[int, int | None]] = {}
    for text in dims:
        parts = text.split(":")
        try:
            position, dim, name, low = int(parts[0]), int(parts[1]), parts[2], int(parts[3])
            high = None if parts[4] == "inf" else int(parts[4])
            if len(parts) != 5 or not name.isidentifier() or not 0 <= position < len(inputs):
                raise ValueError(text)
        except (ValueError, IndexError):
            raise ExportError(
                f"{api}: --dim {text!r} (method {method!r}) — valid: INPUT:DIM:NAME:MIN:MAX with "
                f"INPUT in 0..{len(inputs) - 1} and NAME an identifier — fix: e.g. --dim 0:0:batch:1:64"
            ) from None
        _check_dim(api, method, text, inputs[position], position, dim, name, low, high)
        if ranges.setdefault(name, (low, high)) != (low, high):
            first = ranges[name]
            raise ExportError(
                f"{api}: --dim {text!r} (method {method!r}) — {name!r} is already in "
                f"[{first[0]}, {'inf' if first[1] is None else first[1]}] — valid: one range per "
                "name (dimensions sharing a name are one size) — fix: give both the same "
                "MIN:MAX, or another NAME")
        if name not in made:
            made[name] = (torch.export.Dim(name, min=low) if high is None
                          else torch.export.Dim(name, min=low, max=high))
        shapes[position][dim] = made[name]
    return (module, inputs, tuple(s or None for s in shapes))


def _check_dim(api: str, method: str, text: str, value: Any, position: int, dim: int,
               name: str, low: int, high: int | None) -> None:
    """One ``--dim``'s DIM, MIN and MAX against the example input it names."""
    import torch

    where = f"{api}: --dim {text!r} (method {method!r})"
    if not isinstance(value, torch.Tensor):
        raise ExportError(f"{where} — input {position} is a {type(value).__name__}, not a tensor "
                          "— valid: the number of a tensor input — fix: count the tensor inputs "
                          "from 0")
    if not 0 <= dim < value.dim():
        raise ExportError(
            f"{where} — DIM {dim}, but input {position} has {value.dim()} dimension(s) (shape "
            f"{tuple(value.shape)}) — valid: DIM in 0..{value.dim() - 1} — fix: e.g. --dim "
            f"{position}:{max(value.dim() - 1, 0)}:{name}:{low}:{'inf' if high is None else high}")
    if low < 0 or (high is not None and high < low):
        fix = (f"swap them: --dim {position}:{dim}:{name}:{high}:{low}" if low >= 0 else
               f"a size is never negative: --dim {position}:{dim}:{name}:0:"
               f"{'inf' if high is None else max(high, 0)}")
        raise ExportError(
            f"{where} — MIN {low}, MAX {'inf' if high is None else high} — valid: 0 <= MIN <= "
            f"MAX (or MAX 'inf') — fix: {fix}")
    size = value.shape[dim]
    if size < low or (high is not None and size > high):
        raise ExportError(
            f"{where} — the example input {position} has size {size} in dimension {dim}, "
            f"outside [{low}, {'inf' if high is None else high}] — valid: a range holding the "
            f"example's size — fix: widen the range to hold {size}, or export with an example "
            "of a size inside it")


def _compile_specs(items: tuple[str, ...], op_packages: str | None,
                   backends: tuple[str, ...]) -> dict[str, Any]:
    """``--compile-spec KEY=VALUE`` and ``--op-packages FILE`` → the compile specs dict."""
    from opforge.backends import parse_spec_args

    if (items or op_packages) and not backends:
        raise ExportError(f"{_API}: --compile-spec/--op-packages without --backend — valid: "
                          "compile specs of a backend — fix: add --backend NAME (e.g. cpu)")
    specs: dict[str, Any] = dict(parse_spec_args(items))
    if op_packages:
        problem = regular_file_problem(op_packages, "a JSON or YAML op-package list",
                                       "name the file listing your OpPackageInfo entries")
        if problem is not None:
            raise ExportError(f"{_API}: --op-packages {problem}")
        from opforge.backends.oppackage import load_op_package_infos

        infos = load_op_package_infos(op_packages)
        specs["op_packages"] = [info.as_dict() if hasattr(info, "as_dict") else dict(info)
                                for info in infos]
    return specs


def _summary(console: Any, program: Any, output: str) -> None:
    meta = program.metadata
    console.print(f"wrote [bold]{output}[/bold] ({os.path.getsize(output)} bytes)")
    for method in program.methods:
        arena = int(meta.get(f"opforge.memory_plan.{method.name}.arena_bytes", 0))
        naive = int(meta.get(f"opforge.memory_plan.{method.name}.naive_bytes", 0))
        console.print(
            f"  {method.name}: {len(method.instructions)} instructions, {len(method.operators)} operators, "
            f"arena {arena} bytes (naive {naive}, reuse ×{naive / arena if arena else 1:.2f})"
        )
