"""``opforge example``: the main job on the bundled example, end to end.

Stage by stage: define (load ``my_ops.yaml``), register with PyTorch, run the custom ops
eagerly and compare them with their reference semantics. Later stages (build → export →
run on the lean runtime) are appended here as they land.
"""

from __future__ import annotations

import click


@click.command("example")
@click.option("--seed", default=0, show_default=True, help="Seed of the example inputs.")
def example(seed: int) -> None:
    """Define the bundled my_ops operators, register them, and run them eagerly."""
    import torch
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from opforge.examples.my_ops import manifest_path, register_examples
    from opforge.manifest import load_manifest

    console = Console()
    path = manifest_path()
    console.rule("[bold]1. define")
    defs = load_manifest(path)
    for d in defs:
        console.print(f"  {escape(str(d.functional))}  [dim]({escape(d.source)})[/dim]", soft_wrap=True)
        console.print(f"    out variant: {escape(str(d.out))}", soft_wrap=True)

    console.rule("[bold]2. register with PyTorch (functional, out, fake)")
    register_examples()
    console.print(f"  registered {len(defs)} operator(s): " + ", ".join(d.name for d in defs))

    console.rule("[bold]3. run eagerly")
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 5, generator=gen)
    ops = torch.ops.my_ops
    checks = [
        ("my_ops::mul3(x)", ops.mul3(x), x * 3),
        ("my_ops::mul4(x)", ops.mul4(x), x * 4),
        ("my_ops::minmax(x, 1)[0]", ops.minmax(x, 1)[0], x.amin(1)),
        ("my_ops::minmax(x, 1)[1]", ops.minmax(x, 1)[1], x.amax(1)),
        ("my_ops::scaled_sum(x, 0.5, [1])", ops.scaled_sum(x, 0.5, [1]), x.sum(1) * 0.5),
    ]
    out = torch.empty_like(x)
    ops.mul3.out(x, output=out)
    checks.append(("my_ops::mul3.out(x, output=out)", out, x * 3))
    table = Table("call", "shape", "max |error| vs expected", "ok")
    failed = 0
    for name, got, want in checks:
        err = (got - want).abs().max().item() if got.numel() else 0.0
        ok = got.shape == want.shape and err == 0.0
        failed += not ok
        table.add_row(name, str(tuple(got.shape)), f"{err:.3g}", "[green]yes" if ok else "[red]NO")
    console.print(table)
    if failed:
        raise click.ClickException(f"{failed} example check(s) failed")
    console.print("[bold green]example: all stages passed")
