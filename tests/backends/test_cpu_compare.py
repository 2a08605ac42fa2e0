"""`opforge compare` inside a cpu delegate (issue 27): the debug build keeps every engine
result, so a wrong lowering of one op is named as its node, not as the whole delegate.

Also: a normal cpu program's debug table says which nodes each engine op computes (fused
groups together), the debug build's extra outputs are checked like the rest of the blob,
and a normal blob is unchanged by the debug handles (no extra outputs). Needs torch and
the cpu backend.
"""

from __future__ import annotations

import json
import sys
import zlib
from pathlib import Path

import pytest
import torch

from opforge.backends.cpu import CpuBackend, blob
from opforge.backends.cpu.engine import missing
from opforge.backends.cpu.lowering import elementwise
from opforge.backends.cpu.lowering.core import HARDSIGMOID
from opforge.compare import compare
from opforge.errors import BackendError
from opforge.export import export
from opforge.program import debug_info
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))
from test_compare import Chain  # noqa: E402  (the same twelve-node chain)

pytestmark = pytest.mark.skipif(missing() is not None, reason=f"cpu backend: {missing()}")


@pytest.fixture(scope="module")
def inputs():
    return (torch.randn(4, 16, generator=torch.Generator().manual_seed(1)),)


def test_every_node_inside_the_delegate_is_observed_and_right(inputs):
    result = compare(Chain(), inputs, against=["cpu"])
    assert result.first_divergence("cpu") is None
    run = result.runs[0]
    inside = {name for (name, _), where in run.where.items() if where.startswith("inside delegate")}
    assert {"addmm", "relu", "mul", "add", "sigmoid", "sub", "tanh", "abs_1"} <= inside
    # the weights' permutes are folded at export: not engine results, not observed
    observed = [row.name for row in result.rows if row.errors["cpu"] is not None]
    assert "permute" not in observed and len(observed) >= 11


def test_a_wrong_lowering_of_one_op_is_named_inside_the_delegate(inputs, monkeypatch):
    # the planted bug: sigmoid lowered as oneDNN's hard sigmoid (off by up to ~0.07)
    monkeypatch.setitem(elementwise.ELTWISE, "aten::sigmoid", lambda n, a: (HARDSIGMOID, 1 / 6, 0.5))
    result = compare(Chain(), inputs, against=["lean", "cpu", "cpu-fused"])
    first = result.first_divergence("cpu")
    assert first is not None and first.name == "sigmoid"
    assert result.runs[1].where[("sigmoid", 0)] == "inside delegate 0"
    assert all(row.errors["cpu"] is None or row.errors["cpu"].within
               for row in result.rows[:first.index])
    assert result.first_divergence("lean") is None
    # fused as in production: the sigmoid is a post-op, its group is reported at its last node
    fused = result.first_divergence("cpu-fused")
    assert fused is not None and fused.name == "tanh"
    where = result.runs[2].where[("tanh", 0)]
    assert where.startswith("inside delegate 0, fused: addmm+") and "+sigmoid+" in where
    assert all(row.errors["cpu-fused"] is None for row in result.rows[1:fused.index])


def test_the_debug_table_maps_engine_ops_to_fused_node_groups(inputs):
    program = export(Chain(), inputs, backends=["cpu"])
    forward = debug_info(program).methods["forward"]
    ops = forward.delegate_ops[0]
    groups = [[forward.nodes[h].name for h in op] for op in ops if op]
    flat = [name for group in groups for name in group]
    assert "sigmoid" in flat and "addmm" in flat
    assert any(len(group) > 1 for group in groups)  # fusion: one op computes several nodes
    # the normal blob keeps no node results: its delegate has only the model's output
    handle = load(program).delegates.handles[0]
    assert handle.debug_outputs == [] and len(handle.outputs) == 1


def test_the_debug_mode_is_checked():
    assert CpuBackend(debug=True).debug == "nodes" and CpuBackend().debug is None
    with pytest.raises(BackendError, match="'nodes' or 'groups'"):
        CpuBackend(debug="all")


def test_the_debug_build_refuses_a_malformed_debug_list(inputs):
    program = export(Chain(), inputs, backends=[(CpuBackend(debug=True), {})])
    data = bytes(program.segments[program.delegates[0].segment].data)
    plan, _ = blob.parse(data)
    assert plan["debug"] and plan["debug"][0][0] == len(plan["outputs"]) - len(plan["debug"])
    def rewrite(debug):
        magic, version, plan_len, data_len, _, _ = blob.HEADER.unpack_from(data, 0)
        doc = json.loads(data[32:32 + plan_len])
        doc["debug"] = debug
        text = json.dumps(doc).encode()
        head_len = 32 + len(text)
        pad = bytes((head_len + 63) // 64 * 64 - head_len)
        consts = data[(32 + plan_len + 63) // 64 * 64:]
        return blob.HEADER.pack(magic, version, len(text), len(consts),
                                zlib.crc32(text + consts), 0) + text + pad + consts

    good = plan["debug"]
    for bad in ([[0, "addmm", 0]], [[good[0][0], 7, 0]], good * 50, "x",
                [[good[0][0], "addmm", -1]]):
        with pytest.raises(BackendError, match="debug"):
            blob.parse(rewrite(bad))


def test_a_folded_batch_norm_is_one_group_and_big_delegates_are_cut():
    """The cnn's batch norms are folded into their convolutions (cpu backend and PT2E):
    the tensor is the batch norm's, so the convolution is not observed and the batch norm
    is, within tolerance. The transformer layer has more node results than the engine's 64
    delegate outputs: the debug build cuts its delegates, and every result is observed."""
    from opforge.examples import zoo

    model, inputs = zoo.cnn()
    result = compare(model, inputs, against=["cpu", "quantized"])
    assert result.first_divergence("cpu") is None and result.first_divergence("quantized") is None
    rows = {row.label: row for row in result.rows}
    for run in ("cpu", "quantized"):
        assert rows["convolution"].errors[run] is None
        assert rows["_native_batch_norm_legit_no_training"].errors[run].within
    model, inputs = zoo.transformer_layer()
    result = compare(model, inputs, against=["cpu"])
    assert result.first_divergence("cpu") is None
    observed = [row for row in result.rows if row.errors["cpu"] is not None]
    assert len(observed) > 64
    where = {w for w in result.runs[0].where.values() if w.startswith("inside delegate")}
    assert len(where) > 1  # several delegates
