"""The cpu backend's export for another machine (targets.py, ``opforge export --target``):
for aarch64, where opforge ships no engine (docs/backend-cpu.md "aarch64"),
nothing is delegated, every node says why, and the program computes what the program
exported without a backend computes. Needs no engine: the host's is not used."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from opforge.backends.cpu import CpuBackend  # noqa: E402
from opforge.backends.cpu.targets import TARGETS, host_target  # noqa: E402
from opforge.cli import cli  # noqa: E402
from opforge.errors import BackendError  # noqa: E402
from opforge.examples.zoo import ZOO  # noqa: E402
from opforge.export import delegation_report, export  # noqa: E402
from opforge.runtime import load  # noqa: E402

ARM = "aarch64-linux-gnu"


def _export(name: str, backends):
    module, inputs = ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(module.eval(), inputs, backends=backends), inputs


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_an_aarch64_export_keeps_every_op_on_the_portable_kernels(name):
    program, inputs = _export(name, [CpuBackend(target=ARM)])
    report = delegation_report(program)["forward"]
    assert report["delegates"] == [] and report["rejected"]
    # every node left out names the target and the oneDNN packages looked up
    for r in report["rejected"]:
        assert r["backend"] == "cpu" and r["kind"] == "partition"
        assert ARM in r["reason"] and "2.6.3" in r["reason"] and "portable kernels" in r["reason"]
    assert program.delegates == ()
    # the same program as one exported without a backend: the same kernels on the same
    # graph, so the same bits on lean; and PyTorch's values (float32 kernels in another
    # order: 1e-5 relative, the tolerance of the native runtime's parity suite)
    plain, _ = _export(name, [])
    arrays = [x.numpy() for x in inputs]
    got = load(program).method("forward")(*arrays)
    want = load(plain).method("forward")(*arrays)
    assert [np.asarray(g).tobytes() for g in got] == [np.asarray(w).tobytes() for w in want]
    module, _ = ZOO[name]()
    with torch.no_grad():
        eager = module.eval()(*inputs)
    np.testing.assert_allclose(np.asarray(got[0]), eager.numpy(), rtol=1e-5, atol=1e-5)


def test_targets_are_checked():
    with pytest.raises(BackendError, match="target 'riscv64-linux-gnu' — unknown — valid: "
                                           + ", ".join(TARGETS)):
        CpuBackend(target="riscv64-linux-gnu")
    assert CpuBackend(target=host_target()).target is None  # this machine: delegated as usual
    assert CpuBackend(target=ARM).unavailable() is None  # this machine's engine is not needed


def test_cli_target_explains_and_refuses_other_backends(tmp_path):
    factory = tmp_path / "factory_mlp.py"
    factory.write_text("from opforge.examples.zoo import mlp\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        out = tmp_path / "mlp.opf"
        result = CliRunner().invoke(cli, ["export", "factory_mlp:mlp", "-o", str(out),
                                          "--backend", "cpu", "--target", ARM, "--explain"])
        assert result.exit_code == 0, result.output
        # the reasons are checked above (the table wraps them at the pipe's width)
        assert "forward: 0 node(s) delegated in 0 delegate(s), 8 left out" in result.output
        assert "note: target aarch64-linux-gnu: opforge ships no cpu engine for arm64" in result.output
        assert "every op stays on the portable kernels" in result.output
        result = CliRunner().invoke(cli, ["export", "factory_mlp:mlp", "-o", str(out), "-q",
                                          "--backend", "toy", "--target", ARM])
        assert result.exit_code != 0 and "--target with the cpu backend only" in str(result.exception)
    finally:
        sys.path.remove(str(tmp_path))
