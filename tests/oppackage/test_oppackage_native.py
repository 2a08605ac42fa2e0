"""Op packages in the native runtime: a cpu delegate's package ops run from C
(opforge/native_runtime/src/backend_cpu_package*.cpp), as the Python cpu backend runs them
(engine.py _add_package → oppackage/runtime.py prepare): the same library, the same op
instances made by create, the same engine calling execute.

Outside a delegate a package is never called (docs/op-packages.md: the lean runtime runs a
claimed node that the delegate could not take on its kernels), so a program exported
without the cpu backend needs nothing of this: its custom ops run on kernel libraries.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.errors import OpforgeError
from opforge.export import delegation_report, export
from opforge.runtime import load

from oppackage_support import example_infos, needs_compiler

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [needs_compiler, pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                                 reason="the cpu backend's engine cannot run here")]


class Model(torch.nn.Module):
    def forward(self, x, y):
        a = torch.ops.my_ops.mul3(x)      # → ExampleCustomOp
        b = a + y                          # aten.add.Tensor → ElementWiseAdd (override)
        return torch.sin(b), torch.add(b, y, alpha=0.5)


@pytest.fixture(scope="module")
def program(example_library):
    from opforge.examples.my_ops import register_examples

    register_examples()
    g = torch.Generator().manual_seed(0)
    inputs = torch.randn(4, 5, generator=g), torch.randn(5, generator=g)
    specs = {"op_packages": [i.as_dict() for i in example_infos(example_library)]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = export(Model(), inputs, backends=[("cpu", specs)], kernels="portable")
    return exported, [t.numpy() for t in inputs]


def _check_outputs(got, want) -> None:
    """The delegate's output (package ops and oneDNN's add in one engine) bit for bit; sin
    runs outside it on the portable kernel natively and NumPy's in Python (<= 1 ulp each
    of the exact value, so within 2 float32 ulps of each other: rtol 2.4e-7)."""
    assert len(got) == len(want) == 2
    assert np.ascontiguousarray(got[1]).tobytes() == np.ascontiguousarray(want[1]).tobytes()
    np.testing.assert_allclose(got[0], want[0], rtol=2.4e-7, atol=1e-7)


def test_package_ops_in_a_cpu_delegate_run_natively_as_in_python(program):
    exported, arrays = program
    (delegate,) = delegation_report(exported)["forward"]["delegates"]
    assert delegate["backend"] == "cpu"
    assert delegate["ops"].count("aten::add.Tensor") == 2 and "my_ops::mul3.default" in delegate["ops"]
    want = load(exported).method("forward")(*arrays)
    forward = load(exported, executor="native").method("forward")
    for _ in range(2):  # the second call over the first call's memory
        _check_outputs(forward(*arrays), want)


def _engine_env(tmp_path: Path) -> dict[str, str]:
    """A C process's environment: the engine the Python backend uses, oneDNN beside it."""
    from opforge.backends.cpu import engine
    from opforge.backends.cpu.engine_build import find_onednn

    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_OP_PACKAGES"}
    env["OPFORGE_CPU_ENGINE"] = engine.library()._name
    env["LD_LIBRARY_PATH"] = str(find_onednn(headers=False) / "lib")
    return env


def test_opforge_run_loads_a_package_only_when_allowed(program, example_library, tmp_path):
    """From C (opforge-run: no Python in the process): refused until the library is
    allowed ($OPFORGE_OP_PACKAGES, its folder here), then the Python runtime's outputs."""
    from opforge.native_runtime.build import build_runtime
    from opforge.program import save

    exported, arrays = program
    save(exported, tmp_path / "m.opf")
    for k, a in enumerate(arrays):
        np.save(tmp_path / f"in{k}.npy", a)
    run = [str(build_runtime().tool("opforge-run")), str(tmp_path / "m.opf"), "--output-dir",
           str(tmp_path / "out"), *[a for k in range(2) for a in ("--input", str(tmp_path / f"in{k}.npy"))]]
    env = _engine_env(tmp_path)
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "OPFORGE_OP_PACKAGES" in done.stderr and "opf_op_package_trust" in done.stderr, done.stderr

    env["OPFORGE_OP_PACKAGES"] = f"/nonexistent:{Path(example_library).parent}"
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = [np.load(tmp_path / "out" / f"output_{k}.npy") for k in range(2)]
    _check_outputs(got, load(exported).method("forward")(*arrays))


def test_a_world_writable_package_folder_is_refused(program, example_library, tmp_path):
    exported, _ = program
    open_folder = tmp_path / "anyone"
    open_folder.mkdir()
    open_folder.chmod(0o777)
    copy = open_folder / "libQnnExampleOpPackage.so"
    copy.write_bytes(Path(example_library).read_bytes())
    edited = _with_node(exported, lambda node: node.update(package_path=str(copy)), specs=False)
    os.environ["OPFORGE_OP_PACKAGES"] = str(copy)
    try:
        with pytest.raises(OpforgeError, match="world-writable"):
            load(edited, executor="native")
    finally:
        del os.environ["OPFORGE_OP_PACKAGES"]


def _with_node(exported, edit, *, specs: bool = True):
    """``exported`` with each package node's JSON body edited (its blob sealed again);
    ``specs`` False drops the op_packages compile spec (the node's path is used)."""
    sys.path.insert(0, str(ROOT))
    from fuzz.cpu_blob_write import write_blob
    from opforge.backends.cpu import blob as B
    from opforge.program import Segment

    (d,) = exported.delegates
    plan, data = B.parse(exported.segments[d.segment].data)
    plan = json.loads(json.dumps(plan))
    for op in plan["ops"]:
        if op["kind"] == "package":
            raw = bytes.fromhex(op["node"])
            body = json.loads(raw[16:])
            result = edit(body)
            if isinstance(result, bytes):
                op["node"] = result.hex()
                continue
            text = json.dumps(body).encode()
            op["node"] = (raw[:12] + len(text).to_bytes(4, "little") + text).hex()
    segments = list(exported.segments)
    segments[d.segment] = Segment(write_blob(plan, bytes(data)))
    compile_specs = d.compile_specs if specs else tuple(kv for kv in d.compile_specs if kv[0] != "op_packages")
    delegates = (dataclasses.replace(d, compile_specs=compile_specs),)
    return dataclasses.replace(exported, segments=tuple(segments), delegates=delegates)


HOSTILE = {
    "a shape the plan does not have": (lambda n: n["outputs"][0].update(shape=[4, 6]), "in the blob's plan"),
    "another dtype": (lambda n: n["inputs"][0].update(dtype="float64"), "in the blob's plan"),
    "an op type the package lacks": (lambda n: n.update(op_type="Frobnicate"), "valid: ElementWiseAdd"),
    "another platform": (lambda n: n.update(platform="aarch64_android"), "exported for platform"),
    "bad magic": (lambda n: b"OFPKGNDX" + bytes(8), "magic"),
    "a list where a scalar is": (lambda n: n.update(input_slots=[[0]] * len(n["inputs"])), "input slot"),
    "a param of the wrong kind": (lambda n: n["params"].append(
        {"name": "alpha", "kind": "int", "list": False, "values": [1.5]}), "not a int"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_package_nodes_are_refused_with_a_message(program, case):
    exported, _ = program
    edit, message = HOSTILE[case]
    with pytest.raises(OpforgeError, match=message):
        load(_with_node(exported, edit), executor="native")


def test_a_claimed_node_left_out_of_the_delegate_runs_on_native_kernels(example_library):
    """Outside a delegate nothing calls a package: a node ElementWiseAdd claims but cannot
    take (int32) runs on the portable kernels, natively as in Python."""
    class IntAdd(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.int32) + 1, torch.ops.aten.add.Tensor(x, x)

    specs = {"op_packages": [i.as_dict() for i in example_infos(example_library)]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = export(IntAdd(), (torch.randn(3),), backends=[("cpu", specs)], kernels="portable")
    (rejected,) = delegation_report(exported)["forward"]["rejected"]
    assert rejected["kind"] == "dtype" and "ElementWiseAdd" in rejected["reason"]
    x = np.array([1.5, 2.0, -1.0], np.float32)
    want = load(exported).method("forward")(x)
    got = load(exported, executor="native").method("forward")(x)
    np.testing.assert_array_equal(got[0], [2, 3, 0])
    for g, w in zip(got, want):
        assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()
