"""Whole models on the compiled cpu backend: every zoo model fully delegated, the common
layers delegated as far as the backend goes (the rest on portable kernels), all matching
a float64 reference as closely as eager float32 does.

The criterion: run the model in float64 eager (the reference), in float32 eager, and on
the backend. The backend's max error against the reference may be at most 8× eager's own
float32 error plus 2 ulp of the output's scale: oneDNN sums in another order and uses
other vectorised math than ATen (a few ulp per op), but a kernel that is 0.1% off is
~1000× eager's error and fails. Both modes of the runtime run the program.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import get_backend
from opforge.examples.zoo import ZOO
from opforge.export import delegation_report, export
from opforge.program import DelegateCall, KernelCall
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))
from test_runtime_common_layers import MODELS as COMMON  # noqa: E402


def _require_backend():
    problem = get_backend("cpu").unavailable()
    assert problem is None, f"the cpu backend must be usable in this environment: {problem}"


def _check_against_float64(model, inputs, got):
    with torch.no_grad():
        want32 = model(*inputs)
        model64 = _double(model)
        want64 = model64(*[t.double() if t.is_floating_point() else t for t in inputs])
    want32 = want32 if isinstance(want32, (tuple, list)) else (want32,)
    want64 = want64 if isinstance(want64, (tuple, list)) else (want64,)
    for g, w32, w64 in zip(got, want32, want64):
        w32, w64 = w32.numpy(), w64.numpy()
        assert g.shape == w32.shape and g.dtype == w32.dtype
        eager_err = float(np.max(np.abs(w32 - w64))) if w32.size else 0.0
        scale = float(np.max(np.abs(w64))) if w64.size else 0.0
        err = float(np.max(np.abs(g - w64))) if g.size else 0.0
        assert err <= 8 * eager_err + 2 * np.finfo(np.float32).eps * scale, (err, eager_err, scale)


def _double(model):
    import copy

    return copy.deepcopy(model).double()


@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_models_are_fully_delegated_and_match_float64(name):
    _require_backend()
    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    model.eval()
    program = export(model, inputs, kernels="portable", backends=["cpu"])
    report = delegation_report(program)["forward"]
    kernel_calls = [i for i in program.method("forward").instructions if type(i) is KernelCall]
    assert not kernel_calls and not report["rejected"], report["rejected"]
    assert sum(type(i) is DelegateCall for i in program.method("forward").instructions) >= 1
    forward = load(program).method("forward")
    arrays = [t.numpy() for t in inputs]
    for _ in range(2):  # the second call runs over the first call's memory
        _check_against_float64(model, inputs, forward(*arrays))


@pytest.mark.parametrize("name", sorted(COMMON))
def test_common_layers_delegate_what_the_backend_takes_and_match(name):
    _require_backend()
    factory, inputs = COMMON[name]
    torch.manual_seed(0)
    model = factory().eval()
    program = export(model, inputs, kernels="portable", backends=["cpu"])
    report = delegation_report(program)["forward"]
    for rejection in report["rejected"]:  # every node left out says why
        assert rejection["kind"] and rejection["reason"], rejection
    for mode in ("lean", "aten"):
        forward = load(program, mode=mode).method("forward")
        _check_against_float64(model, inputs, forward(*[t.numpy() for t in inputs]))
