"""How ``opforge export --explain`` and ``opforge inspect`` show delegation: the delegates
(backend, nodes, ops, blob size) and, for every node a backend left out, why."""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["print_delegation", "ops_summary"]


def ops_summary(ops: list[str], limit: int = 6) -> str:
    """``["aten::add.Tensor", "aten::add.Tensor", "aten::relu.default"]`` → ``"add×2, relu"``."""
    counts = Counter(op.split("::", 1)[-1].split(".", 1)[0] for op in ops)
    items = [f"{name}×{n}" if n > 1 else name for name, n in counts.most_common()]
    return ", ".join(items[:limit]) + (f", +{len(items) - limit} more" if len(items) > limit else "")


def print_delegation(console: Any, report: dict, *, explain: bool = True,
                     implementations: dict[int, list[dict]] | None = None) -> None:
    """Print ``opforge.export.delegation_report(program)``; ``explain`` adds the table of
    nodes left out with their reasons; ``implementations`` (delegate index → per-node rows
    from the backend's ``describe_blob``) adds which implementation runs each node."""
    from rich.markup import escape
    from rich.table import Table

    for method, data in report.items():
        delegates, rejected = data.get("delegates", []), data.get("rejected", [])
        table = Table("#", "backend", "nodes", "ops", "blob bytes", "in/out",
                      title=f"delegates of {escape(method)}")
        for d in delegates:
            table.add_row(str(d.get("delegate", "?")), escape(d["backend"]), str(d["nodes"]),
                          escape(ops_summary(d["ops"])), str(d["blob_bytes"]),
                          f"{d['inputs']}/{d['outputs']}")
        if delegates:
            console.print(table)
        delegated = sum(d["nodes"] for d in delegates)
        console.print(f"{method}: {delegated} node(s) delegated in {len(delegates)} delegate(s), "
                      f"{len(rejected)} left out")
        for d in delegates:
            rows = (implementations or {}).get(d.get("delegate"))
            if rows:
                impl = Table("node", "op", "implementation",
                             title=f"delegate {d.get('delegate')} ({escape(d['backend'])}): implementations")
                for row in rows:
                    impl.add_row(escape(str(row.get("node", ""))), escape(str(row.get("op", ""))),
                                 escape(str(row.get("impl", ""))))
                console.print(impl)
        if explain and rejected:
            # three columns in graph order, the reason taking what is left of the width:
            # readable in 100 columns (the source line under the node, the backend named
            # only when several backends were asked)
            backends = {r["backend"] for r in rejected}
            why = Table("node · op", "kind", "why", title=f"left out of delegation in {escape(method)}",
                        show_lines=False)
            why.columns[0].overflow = why.columns[2].overflow = "fold"
            why.columns[0].ratio, why.columns[2].ratio = 2, 5
            for r in rejected:
                where = f"\n[dim]{escape(r['source'])}[/dim]" if r.get("source") else ""
                who = f" ({escape(r['backend'])})" if len(backends) > 1 else ""
                why.add_row(f"{escape(r['node'])} · {escape(r['op'])}{where}",
                            r["kind"] + who, escape(r["reason"]))
            console.print(why)

