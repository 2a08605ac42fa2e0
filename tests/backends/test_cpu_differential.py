"""The cpu backend's differential tester (fuzz/cpu_differential.py) in CI: a fixed range of
random graphs must all agree with eager float64 on every runtime, and the tester itself
must catch and shrink a planted lowering bug."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fuzz.cpu_diff import ops as catalog  # noqa: E402
from fuzz.cpu_diff.generate import generate, render, replay  # noqa: E402
from fuzz.cpu_diff.graph import Graph, Input, Node, source  # noqa: E402
from fuzz.cpu_diff.oracle import check  # noqa: E402
from fuzz.cpu_diff.shrink import shrink  # noqa: E402
from fuzz.cpu_diff.speed import cache_export_setup  # noqa: E402
from opforge.backends import get_backend  # noqa: E402

CI_SEEDS = range(0, 60)  # ~0.35 s of CPU each


@pytest.fixture(scope="module", autouse=True)
def _backend():
    problem = get_backend("cpu").unavailable()
    assert problem is None, f"the cpu backend must be usable in this environment: {problem}"
    restore = cache_export_setup()
    yield
    restore()  # later tests may register operators the caches would not know


def test_graphs_are_a_function_of_their_seed_and_render_to_runnable_python():
    for seed in (0, 7, 123):
        a, b = generate(seed), generate(seed)
        assert a == b and source(a, render) == source(b, render)
        assert replay(a) is not None
        ns: dict = {}
        exec(source(a, render), ns)
        assert len(ns["Graph"]()(*ns["inputs"]())) == len(a.outputs)
    assert generate(1) != generate(2)


def test_a_fixed_seed_range_agrees_everywhere():
    findings, statuses = [], {}
    for seed in CI_SEEDS:
        outcome = check(generate(seed))
        statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
        if outcome.status in ("disagree", "error"):
            findings.append((seed, outcome.status, outcome.where, outcome.detail))
    assert not findings, findings
    assert statuses.get("agreed", 0) >= len(CI_SEEDS) * 3 // 4, statuses  # the backend took most


def _planted_graph() -> Graph:
    """conv → batch norm → leaky_relu → (+ a second input) → sigmoid, and a cat beside."""
    inputs = (Input((1, 3, 6, 6), "float32", "randn", 11), Input((1, 4, 1, 1), "float32", "randn", 12),
              Input((1, 3, 6, 6), "float32", "randn", 13))
    conv = {"dim": 2, "cin": 3, "cout": 4, "k": 3, "stride": 1, "padding": 1, "dilation": 1,
            "groups": 1, "bias": True, "transposed": False, "output_padding": 0}
    nodes = (
        Node("conv", (0,), tuple(sorted(conv.items())), 21),
        Node("batch_norm", (3,), (("affine", True), ("c", 4), ("dim", 2), ("eps", 1e-3)), 22),
        Node("unary.leaky_relu", (4,), (("alpha", 0.2), ("fn", "leaky_relu")), 23),
        Node("binary.add", (5, 1), (("fn", "add"),), 24),
        Node("unary.sigmoid", (6,), (("fn", "sigmoid"),), 25),
        Node("cat", (0, 2), (("dim", 1), ("n", 2)), 26),
    )
    return Graph(inputs, nodes, (7, 8))


def test_a_planted_lowering_bug_is_found_and_shrunk(monkeypatch):
    graph = _planted_graph()
    assert check(graph).status == "agreed"
    from opforge.backends.cpu import lowering

    right = lowering.ELTWISE["aten::leaky_relu"]

    def slightly_wrong(node, args):  # the negative slope 0.1% off
        alg, alpha, beta = right(node, args)
        return alg, alpha * 1.001, beta

    monkeypatch.setitem(lowering.ELTWISE, "aten::leaky_relu", slightly_wrong)
    outcome = check(graph)
    assert outcome.status == "disagree" and outcome.where in ("cpu-lean", "cpu-aten"), outcome
    small, small_outcome, checks = shrink(graph, outcome, max_checks=60)
    assert small_outcome.status == "disagree"
    assert [n.op for n in small.nodes] == ["unary.leaky_relu"], small.nodes
    assert small.inputs[0].shape < graph.inputs[0].shape  # shapes shrank too
    monkeypatch.undo()
    assert check(small).status == "agreed"  # the minimal graph is fine without the bug


def test_known_differences_are_left_out_unless_asked_for():
    left_out = {"unary.log", "log_softmax"}
    assert left_out <= set(catalog.KNOWN)
    assert all(catalog.OPS[name].weight == 0 for name in left_out)
    ops = {n.op for seed in range(200) for n in generate(seed).nodes}
    assert not ops & left_out
    assert {"conv", "batch_norm", "layer_norm", "group_norm", "pool", "cat", "view", "matmul",
            "linear", "where", "masked_fill", "embedding", "index_select", "pad", "to_copy"} <= ops
