"""A finding as a runnable Python file: the graph's source, what went wrong, and a main
that exports it with the cpu backend and prints each output's error against float64."""

from __future__ import annotations

from fuzz.cpu_diff.generate import render
from fuzz.cpu_diff.graph import Graph, source
from fuzz.cpu_diff.oracle import Outcome

__all__ = ["repro_source"]

_MAIN = '''

if __name__ == "__main__":
    import numpy as np
    from opforge.export import export
    from opforge.runtime import load

    model, xs = Graph().eval(), inputs()
    with torch.no_grad():
        want = model.double()(*[x.double() if x.is_floating_point() else x for x in xs])
    model = Graph().eval()
    for backends in ([], ["cpu"]):
        program = export(model, xs, kernels="portable", backends=backends)
        for mode in ("lean", "aten"):
            got = load(program, mode=mode).method("forward")(*[x.numpy() for x in xs])
            errors = [float(np.max(np.abs(np.asarray(g, dtype=np.float64) - w.double().numpy())))
                      for g, w in zip(got, want)]
            print(backends or "portable", mode, "max |error| per output:", errors)
'''


def repro_source(graph: Graph, outcome: Outcome, seed: int | None, command: str = "") -> str:
    head = [f"# cpu_differential finding: {outcome.status} ({outcome.where})",
            f"# {outcome.detail}"]
    if seed is not None:
        head.append(f"# graph seed {seed}" + (f"; rerun: {command}" if command else ""))
    head.append(f"# {len(graph.nodes)} nodes: " + ", ".join(n.op for n in graph.nodes))
    return "\n".join(head) + "\n" + source(graph, render) + _MAIN
