"""``opforge check MANIFEST --kernels lib.so``: the opcheck of a library's kernels.

The checking is ``opforge.check`` (samples, isolation, comparison); this module loads the
manifest and the library, runs ``check_op`` for each op the library serves, and prints a
table and every failure in full, or ``--json``. Exit status: 0 when every op passed against
a reference; 1 when a kernel failed, crashed or ran on no sample; 3 when nothing failed but
some op had no reference (its values were compared with nothing), unless
``--allow-no-reference``.
"""

from __future__ import annotations

import json
import sys

import click

EXIT_FAILED, EXIT_UNVERIFIED = 1, 3
MAX_SHOWN = 4  # failing samples shown per kind of failure, without --show-all


def _references(pairs: tuple[str, ...]) -> dict:
    from opforge.manifest import resolve_reference

    found = {}
    for pair in pairs:
        op, sep, ref = pair.partition("=")
        if not sep or ":" not in ref:
            raise click.BadParameter(f"{pair!r} — valid: OP=module:function, e.g. "
                                     "my_ops::mul3=my_ref:mul3", param_hint="--reference")
        found[op.strip()] = resolve_reference(ref.strip(), what="reference",
                                              source="opforge check --reference")
    return found


@click.command("check")
@click.argument("manifest", type=click.Path(dir_okay=False))  # or a module: load_definitions
@click.option("--kernels", "library", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The compiled kernel library (from `opforge build`).")
@click.option("--op", "ops", multiple=True, help="Check only this op (ns::op); repeatable.")
@click.option("--reference", "references", multiple=True, metavar="OP=module:function",
              help="The reference of an op whose manifest entry has no `python:`; repeatable.")
@click.option("--seed", default=0, show_default=True, help="Seed of the sample values.")
@click.option("--timeout", default=10.0, show_default=True,
              help="Seconds a kernel may take on one sample before it counts as hung.")
@click.option("--allow-no-reference", is_flag=True,
              help="Exit 0 (not 3) when ops without a reference pass the consistency checks.")
@click.option("--show-all", is_flag=True,
              help="Print every failing sample (default: the first 4 of each kind of failure).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object.")
def check(manifest, library, ops, references, seed, timeout, allow_no_reference, show_all,
          as_json) -> None:
    """Check compiled kernels: against a reference, fake vs real shapes, eager vs lean;
    each kernel runs in a child process, so a crash is reported, not fatal."""
    from opforge.check import check_op as check_one
    from opforge.manifest import load_definitions
    from opforge.runtime.native import NativeLibrary
    from opforge.torch_bridge.native_eager import use_native_library

    defs = load_definitions(manifest, api="opforge check")
    given = _references(references)
    use_native_library(library, manifest=[d for d in defs if not d.is_aten],
                       command="opforge check")
    native = NativeLibrary(library)
    served = set(native.keys())
    candidates = [d for d in defs if d.out_key in served]
    unknown_ops = sorted(set(ops) - {d.name for d in candidates})
    if unknown_ops:
        import difflib

        names = [d.name for d in candidates]
        hints = [f"{op!r} → did you mean {near[0]!r}?" for op in unknown_ops
                 for near in [difflib.get_close_matches(op, names, n=1, cutoff=0.6)] if near]
        raise click.BadParameter(
            f"{', '.join(map(repr, unknown_ops))} — not an op of {manifest} that {library} serves — "
            f"valid: {', '.join(names) or '(none)'} — fix: "
            + ("; ".join(hints) if hints else "pass one of those names"), param_hint="--op")
    selected = [d for d in candidates if not ops or d.name in ops]
    if not selected:
        raise click.ClickException(f"no op of {manifest} is served by {library}")
    unknown = sorted(set(given) - {d.name for d in selected})
    if unknown:
        raise click.BadParameter(f"{', '.join(unknown)} — not an op checked here — valid: "
                                 f"{', '.join(d.name for d in selected)}",
                                 param_hint="--reference")
    reports = [check_one(d, native.kernel(d.out_key), reference=given.get(d.name), seed=seed,
                         timeout=timeout, max_per_kind=None if show_all else MAX_SHOWN)
               for d in selected]
    failed = sum(not r.ok for r in reports)
    unverified = [r for r in reports if r.ok and not r.verified]
    code = EXIT_FAILED if failed else EXIT_UNVERIFIED if unverified and \
        not allow_no_reference else 0
    if as_json:
        click.echo(json.dumps({"library": native.path, "seed": seed, "ok": code == 0,
                               "exit_status": code,
                               "ops": [r.to_json() for r in reports]}, indent=2))
        sys.exit(code)
    _print(reports, library)
    if failed:
        raise click.ClickException(f"{failed} of {len(reports)} op(s) failed the check")
    if unverified:
        names = ", ".join(r.op for r in unverified)
        click.echo(f"check: {len(reports)} op(s) passed; {len(unverified)} of them without a "
                   f"reference ({names}): their values were not checked", err=True)
        sys.exit(0 if allow_no_reference else EXIT_UNVERIFIED)
    click.echo(f"check: {len(reports)} op(s) passed")


def _print(reports, library) -> None:
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console

    console = table_console()
    table = Table("op", "reference", "dtypes", "run", "passed", "failed", "crashed",
                  "refused", "skipped", "result", title=f"opforge check {escape(library)}")
    for r in reports:
        result = "[red]FAIL" if not r.ok else "[green]pass" if r.verified else \
            "[yellow]pass (no reference)"
        table.add_row(escape(r.op), escape(r.reference or "none"), ", ".join(r.dtypes) or "-",
                      str(r.samples), str(r.passed), str(r.failed), str(r.crashed),
                      str(r.refused), str(r.skipped), result)
    console.print(table)
    for r in reports:
        lines = []
        for check, (count, kept) in (r.grouped().items() if not r.ok else ()):
            lines.append(f"FAIL {check}: {count} sample(s)")
            lines += [f"  {m}" for m in kept]
            if count > len(kept):
                lines.append(f"  ... and {count - len(kept)} more {check} failure(s) "
                             "(--show-all prints them)")
        for check in sorted(set(r.failures) - set(r.counts)) if not r.ok else ():
            lines.append(f"FAIL {check}")
            lines.append(f"  {r.failures[check]}")
        lines += [f"note: {n}" for n in r.notes[:3]] if not r.ok or r.refused else []
        lines += [f"WARNING: {w}" for w in r.warnings]
        if lines:
            console.print(f"{r.op}:", style="bold", markup=False, highlight=False)
            for line in lines:
                console.print(f"  {line}", markup=False, highlight=False)
