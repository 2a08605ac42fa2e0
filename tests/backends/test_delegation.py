"""Delegation plumbing, with the toy backend (tests/backends/toy_backend.py): export
partitions and lowers, the program carries blobs, specs and the report, the runtime inits,
binds, runs and destroys delegates; bad backends, specs, blobs and calls are refused."""

from __future__ import annotations

import dataclasses
import gc
import importlib.metadata
import json
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import opforge.backends as backends_module
from opforge.backends import (
    Backend, SpecDef, decode_specs, encode_specs, get_backend, parse_spec_args,
    register_backend, resolve_specs,
)
from opforge.cli import cli
from opforge.errors import BackendError, ProgramError
from opforge.export import delegation_report, export
from opforge.program import DelegateCall, Segment, from_bytes, to_bytes, verify
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).parent))
from toy_backend import ToyBackend  # noqa: E402

TOY = register_backend(ToyBackend, replace=True)


class Mixed(torch.nn.Module):
    """add/relu (delegated) → sin (left out) → mul/add (delegated), with a weight."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 8, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        a = torch.relu(x + self.w)
        b = torch.sin(a)
        return a * b + x, a


class Interleaved(torch.nn.Module):
    """A partition's output read by a node that comes, in graph order, before the
    partition's last node: lowering must re-sort the graph."""

    def forward(self, x):
        a = x + 1.0
        s = torch.sin(a)          # reads a before the partition ends
        b = torch.relu(x * 2.0)   # same partition as a (independent of s)
        return s + 0.0, b


def _inputs():
    return (torch.randn(4, 8, generator=torch.Generator().manual_seed(1)),)


@pytest.mark.parametrize("mode", ["lean", "aten"])
@pytest.mark.parametrize("model_cls", [Mixed, Interleaved])
def test_partial_delegation_matches_eager(model_cls, mode):
    model, inputs = model_cls(), _inputs()
    program = export(model, inputs, kernels="portable", backends=["toy"])
    kinds = [type(i).__name__ for i in program.method("forward").instructions]
    assert "DelegateCall" in kinds and "KernelCall" in kinds
    got = load(program, mode=mode).method("forward")(*(t.numpy() for t in inputs))
    want = model(*inputs)
    for g, w in zip(got, want):
        # the toy backend and the portable kernels compute in float32 like eager: the only
        # difference is sin's last bit between NumPy and ATen (≤ 2 ulp of values ≤ 10)
        np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-6, atol=1e-6)


def test_constants_are_baked_into_the_blob_and_leave_the_constant_segment():
    program = export(Mixed(), _inputs(), backends=["toy"])
    assert not any(type(v).__name__ == "TensorValue" and type(v.storage).__name__ == "ConstantStorage"
                   for v in program.method("forward").values)
    assert len(program.segments) == len(program.delegates) == 2
    assert [d.segment for d in program.delegates] == [0, 1]
    blob = json.loads(bytes(program.segments[0].data))
    assert len(blob["constants"]) == 1 and len(blob["constants"][0]) == 32


def test_report_says_what_was_delegated_and_why_each_node_was_not():
    program = export(Mixed(), _inputs(), backends=[("toy", {"skip_relu": True})])
    report = delegation_report(from_bytes(to_bytes(program)))["forward"]
    rejected = {r["node"]: r for r in report["rejected"]}
    assert rejected["sin"]["kind"] == "op" and "only add, mul and relu" in rejected["sin"]["reason"]
    assert rejected["relu"]["kind"] == "compile_spec" and "skip_relu" in rejected["relu"]["reason"]
    assert "test_delegation.py" in rejected["sin"]["source"]
    delegated = [op for d in report["delegates"] for op in d["ops"]]
    assert "aten::relu.default" not in delegated and "aten::mul.Tensor" in delegated
    assert sorted(d["delegate"] for d in report["delegates"]) == list(range(len(program.delegates)))


def test_dtype_and_shape_rejections():
    class M(torch.nn.Module):
        def forward(self, x, y, z):
            return x + 1.0, y + z  # float64; broadcasting (4, 8) + (8,)

    x64 = torch.randn(4, 8, dtype=torch.float64)
    report = delegation_report(export(M(), (x64, torch.randn(4, 8), torch.randn(8)),
                                      backends=["toy"]))["forward"]
    kinds = sorted(r["kind"] for r in report["rejected"])
    assert kinds == ["dtype", "shape"] and not report["delegates"]


def test_specs_are_stored_typed_and_applied_at_run_time():
    program = export(Mixed(), _inputs(), backends=[("toy", {"scale": "2.0"})])
    specs = dict(program.delegates[0].compile_specs)
    assert specs["scale"] == b"f:2.0" and specs["opforge.inputs"] == b"i:1"
    x = _inputs()[0]
    _, a = load(program).method("forward")(x.numpy())
    np.testing.assert_allclose(a, 2 * torch.relu(x + Mixed().w).detach().numpy(), rtol=1e-6)


def test_compile_specs_resolve_encode_decode_and_refuse():
    defs = (SpecDef("n", "int", 0, "a count", lambda v: "negative" if v < 0 else None),
            SpecDef("on", "bool", False, "a flag"), SpecDef("cfg", "json", [], "a list"))
    specs = resolve_specs("b", defs, {"n": "0x10", "on": "yes", "cfg": '[1, "a"]'})
    assert specs == {"n": 16, "on": True, "cfg": [1, "a"]}
    assert decode_specs("b", defs, encode_specs(specs, defs)) == specs
    with pytest.raises(BackendError, match="unknown compile spec.*'m'.*valid: n \\(int"):
        resolve_specs("b", defs, {"m": 1})
    with pytest.raises(BackendError, match="not an int"):
        resolve_specs("b", defs, {"n": "three"})
    with pytest.raises(BackendError, match="negative"):
        resolve_specs("b", defs, {"n": -1})
    with pytest.raises(BackendError, match="not a int value"):
        decode_specs("b", defs, [("n", b"s:3")])
    with pytest.raises(BackendError, match="does not know"):
        decode_specs("b", defs, [("zz", b"i:3")])
    with pytest.raises(BackendError, match="not KEY=VALUE"):
        parse_spec_args(["novalue"])


def test_unknown_backend_and_unusable_backend_are_refused_before_capture():
    with pytest.raises(BackendError, match="backend 'nope' — unknown — valid: .*toy"):
        export(Mixed(), _inputs(), backends=["nope"])

    class Missing(ToyBackend):
        name = "missing_engine"

        def unavailable(self):
            return "libengine.so is not installed — fix: pip install engine"

    register_backend(Missing, replace=True)
    with pytest.raises(BackendError, match="cannot be used here: libengine.so is not installed"):
        export(Mixed(), _inputs(), backends=["missing_engine"])
    program = export(Mixed(), _inputs(), backends=["toy"])
    lacking = dataclasses.replace(program, delegates=tuple(
        dataclasses.replace(d, id="xyz") for d in program.delegates))  # no such backend here
    with pytest.raises(BackendError, match="needs backend 'xyz'"):
        load(to_bytes(lacking))


def test_entry_point_backends_are_found(monkeypatch):
    ep = importlib.metadata.EntryPoint("toy_ep", "toy_backend:ToyEpBackend", "opforge.backends")

    class ToyEpBackend(ToyBackend):
        name = "toy_ep"

    monkeypatch.setattr(sys.modules["toy_backend"], "ToyEpBackend", ToyEpBackend, raising=False)
    monkeypatch.setattr(backends_module, "_entry_points", lambda: {"toy_ep": ep})
    monkeypatch.setattr(backends_module, "_registered", dict(backends_module._registered))
    assert "toy_ep" in backends_module.backend_names()
    assert get_backend("toy_ep").name == "toy_ep"
    bad = importlib.metadata.EntryPoint("bad", "toy_backend:ToyBackend", "opforge.backends")
    monkeypatch.setattr(backends_module, "_entry_points", lambda: {"bad": bad})
    with pytest.raises(BackendError, match="not an opforge Backend named 'bad'"):
        get_backend("bad")
    with pytest.raises(BackendError, match="already registered"):
        register_backend(ToyBackend)


def test_corrupt_blob_is_a_backend_error_at_load():
    program = export(Mixed(), _inputs(), backends=["toy"])
    blob = bytearray(program.segments[0].data)
    blob[0] = ord("[")
    segments = (Segment(bytes(blob)),) + program.segments[1:]
    data = to_bytes(dataclasses.replace(program, segments=segments))
    with pytest.raises(BackendError, match=r"delegates\[0\] \('toy'.*refused: toy blob refused"):
        load(data)


def _replace_call(program, fn):
    method = program.method("forward")
    instructions = tuple(fn(i) if type(i) is DelegateCall else i for i in method.instructions)
    return dataclasses.replace(program, methods=(dataclasses.replace(method, instructions=instructions),))


def test_delegate_calls_are_checked_against_the_stored_counts():
    program = export(Mixed(), _inputs(), backends=["toy"])
    short = _replace_call(program, lambda i: DelegateCall(i.delegate, i.args[:-1]))
    with pytest.raises(ProgramError, match="arguments — valid: .* input\\(s\\) \\+ 1 output"):
        load(short)
    no_io = dataclasses.replace(program, delegates=tuple(
        dataclasses.replace(d, compile_specs=tuple(p for p in d.compile_specs if p[0] != "opforge.inputs"))
        for d in program.delegates))
    with pytest.raises(ProgramError, match="'opforge.inputs' is missing"):
        load(no_io)
    out_of_range = _replace_call(program, lambda i: DelegateCall(7, i.args))
    with pytest.raises(ProgramError, match="delegate index 7"):
        verify(out_of_range)


def test_handles_are_made_once_shared_and_destroyed():
    made, destroyed = [], []

    class Counting(ToyBackend):
        name = "toy_counting"

        def init(self, blob, specs, context):
            handle = super().init(blob, specs, context)
            made.append(handle)
            assert context.registry is not None and context.max_memory > 0
            return handle

        def destroy(self, handle):
            destroyed.append(handle)

    register_backend(Counting, replace=True)
    program = export(Mixed(), _inputs(), backends=["toy_counting"])
    loaded = load(program)
    # one method instance per thread (an instance runs one call at a time: a second thread
    # entering it gets ConcurrentCallError); the instances share the two delegate handles
    methods = [loaded.method("forward") for _ in range(8)]
    x = _inputs()[0].numpy()
    results = []
    threads = [threading.Thread(target=lambda m=m: results.append(m(x)[0])) for m in methods]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 2 and len(results) == 8
    assert all(np.array_equal(r, results[0]) for r in results)
    del loaded, methods, threads
    gc.collect()
    assert len(destroyed) == 2


def test_kernel_error_names_the_delegate():
    class Failing(ToyBackend):
        name = "toy_failing"

        def execute(self, handle, inputs, outputs):
            raise RuntimeError("engine fault 42")

    register_backend(Failing, replace=True)
    forward = load(export(Mixed(), _inputs(), backends=["toy_failing"])).method("forward")
    with pytest.raises(Exception, match=r"delegate 0 \(toy_failing\).*engine fault 42"):
        forward(_inputs()[0].numpy())


def test_undelegated_nodes_are_still_checked_against_the_kernel_set():
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x + 1.0).sort()[0]

    program = export(M(), _inputs(), backends=["toy"], kernels="portable")
    ops = [op.key for op in program.method("forward").operators]
    assert ops == ["aten::sort.values_stable"] or ops == ["aten::sort.values"]


def test_cli_export_explain_and_inspect(tmp_path, monkeypatch):
    factory = tmp_path / "toyfactory.py"
    factory.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        a = torch.relu(x + 1)\n"
        "        return torch.sin(a) * a\n"
        "def make():\n"
        "    return M(), (torch.randn(4, 8),)\n")
    out = tmp_path / "m.opf"
    runner = CliRunner()
    result = runner.invoke(cli, ["export", f"{factory}:make", "-o", str(out), "--backend", "toy",
                                 "--compile-spec", "scale=1", "--explain"])
    assert result.exit_code == 0, result.output
    for needle in ("delegates of forward", "left out of delegation", "aten::sin.default",
                   "only add, mul and relu", "toyfactory.py:5"):
        assert needle in result.output, needle
    shown = runner.invoke(cli, ["inspect", str(out)])
    assert shown.exit_code == 0 and "scale=f:1.0" in shown.output and "add, relu" in shown.output
    data = json.loads(runner.invoke(cli, ["inspect", str(out), "--json"]).output)
    assert data["delegation"]["forward"]["rejected"][0]["op"] == "aten::sin.default"
    assert data["delegate_bytes"] > 0 and data["constant_bytes"] == 0
    bad = runner.invoke(cli, ["export", f"{factory}:make", "-o", str(out), "--compile-spec", "a=1"])
    assert bad.exit_code != 0 and "without --backend" in str(bad.exception)
    bad = runner.invoke(cli, ["export", f"{factory}:make", "-o", str(out), "--backend", "toy",
                              "--compile-spec", "nope=1"])
    assert bad.exit_code != 0 and "unknown compile spec(s) 'nope'" in str(bad.exception)


def test_a_method_keeps_its_delegates_alive_without_its_loaded_program():
    destroyed = []

    class Tracking(ToyBackend):
        name = "toy_tracking"

        def destroy(self, handle):
            destroyed.append(handle)

    register_backend(Tracking, replace=True)
    forward = load(export(Mixed(), _inputs(), backends=["toy_tracking"])).method("forward")
    gc.collect()
    assert not destroyed
    forward(_inputs()[0].numpy())
    del forward
    gc.collect()
    assert len(destroyed) == 2


def test_a_backend_may_preserve_ops_for_its_specs():
    class Preserving(ToyBackend):
        name = "toy_preserving"

        def preserved_ops(self, specs):
            return ("aten::linear",)

    register_backend(Preserving, replace=True)
    program = export(torch.nn.Linear(8, 3), _inputs(), kernels="portable", backends=["toy_preserving"])
    assert [op.key for op in program.method("forward").operators] == ["aten::linear.out"]
