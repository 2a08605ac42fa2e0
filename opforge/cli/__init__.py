"""The ``opforge`` command.

Each verb lives in its own module and is imported only when it is run, so that
``opforge run`` never pays for (or needs) PyTorch. To add a verb, add one line to
``_VERBS``: ``name -> "module:click_command"``.
"""

# Finding the user's modules: one rule for every verb
#
# Verbs import user code by module name: the factory of ``export MODULE:FACTORY``, the
# MANIFEST of ``manifest``/``build``/``check`` when it names a module, the registrar of
# ``run --kernels module:function``, and the ``python:``/``fake:`` references of a
# manifest. Every verb finds them the same way, the way ``python -m`` does: the current
# directory first, then PYTHONPATH and the installed packages. ``use_current_directory``
# puts the current directory at ``sys.path[0]`` before any verb runs (the ``opforge``
# console script would otherwise have its own bin directory there). A ``path/to/file.py``
# is loaded from that file wherever it is.

from __future__ import annotations

import importlib
import os
import sys

import click

__all__ = ["main", "cli", "use_current_directory"]

# verb -> (module, attribute, one-line help). Kept here so `opforge --help` lists every
# verb without importing any of them.
_VERBS: dict[str, tuple[str, str, str]] = {
    "schema": ("opforge.cli.schema_cmd", "schema", "Parse an ATen function schema; show its out/functional twin."),
    "manifest": ("opforge.cli.manifest_cmd", "manifest", "Validate an operator manifest and list its ops and kernels."),
    "example": ("opforge.cli.example_cmd", "example", "Run the bundled example end to end."),
    "export": ("opforge.cli.export_cmd", "export", "Export MODULE:FACTORY to a program file."),
    "inspect": ("opforge.cli.inspect_cmd", "inspect", "Show a program file's methods, ops, plan and constants."),
    "run": ("opforge.cli.run_cmd", "run", "Run a program file on the lean or ATen runtime."),
    "compare": ("opforge.cli.compare_cmd", "compare", "Find the first node where runs of a model (eager, lean, ATen, cpu, quantized) diverge."),
    "generate": ("opforge.cli.generate_cmd", "generate", "Generate tokens with a decoder program (prefill, then decode step by step)."),
    "build": ("opforge.cli.build_cmd", "build", "Compile a manifest's native kernels into a library."),
    "signature": ("opforge.cli.signature_cmd", "signature", "Print the C++ declarations a manifest's kernels must have."),
    "check": ("opforge.cli.check_cmd", "check", "opcheck for compiled kernels: shapes, reference, eager vs runtime."),
    "msop": ("opforge.cli.msop_cmd", "msop", "MindSpore-style AOT ops: build and install vendor packages."),
    "quantize": ("opforge.cli.quantize_cmd", "quantize", "Quantize MODULE:FACTORY (PT2E) to a program file, with a per-node report."),
    "bundle": ("opforge.cli.bundle_cmd", "bundle", "Write an app folder (CMake, main.c, selected kernels) that runs programs without Python."),
    "native-tools": ("opforge.cli.native_tools_cmd", "native_tools", "Build opforge-run and opforge-generate; --install-dir copies them with the runtime libraries."),
    "oppackage": ("opforge.cli.oppackage_cmd", "oppackage", "Op packages: skeleton from an OpDef XML, build for a target."),
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_VERBS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _VERBS:
            return None
        module, attr, _ = _VERBS[name]
        return getattr(importlib.import_module(module), attr)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in _VERBS:
            import difflib

            near = difflib.get_close_matches(name, list(_VERBS), n=2, cutoff=0.6)
            hint = f"did you mean {' or '.join(repr(n) for n in near)}?" if near else \
                "see `opforge --help`"
            ctx.fail(f"no verb {name!r} — valid: {', '.join(sorted(_VERBS))} — fix: {hint}")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, _VERBS[name][2]) for name in sorted(_VERBS)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="opforge")
def cli() -> None:
    """opforge: define a custom operator once; build, export and run it.

    User modules (export's MODULE:FACTORY, a MANIFEST given as a module, run --kernels
    module:function, a manifest's python:/fake: references) are imported from the current
    directory first, then PYTHONPATH and installed packages, for every verb.
    """
    use_current_directory()


def use_current_directory() -> None:
    """Put the current directory first on ``sys.path`` (see the comment at the top)."""
    cwd = os.getcwd()
    if sys.path and sys.path[0] in (cwd, ""):
        return
    while cwd in sys.path:
        sys.path.remove(cwd)
    sys.path.insert(0, cwd)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script; user errors print cleanly, exit code 1."""
    from opforge.errors import OpforgeError

    try:
        cli.main(args=argv, prog_name="opforge", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(1)
    except OpforgeError as exc:
        click.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(1)
