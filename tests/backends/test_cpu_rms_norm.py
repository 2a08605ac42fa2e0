"""RMSNorm as one engine op: ``x * rsqrt(mean(x^2, -1, keepdim) + eps) [* w]`` — the five
nodes torch decomposes it into (and ``torch.nn.RMSNorm``'s), with the weight on either side
— is matched by the lowering and runs as ``rms_norm`` (a pass to sum the squares and one to
write, per row). Checked against float64 on many shapes, with the group left unfused where
a value inside it escapes, with NaN and inf, with symbolic rows, and hand-built plans the
engine must refuse (run under ASan/UBSan by test_cpu_sanitized.py too).

Tolerance: the engine sums the squares in 16 float32 lanes and adds the lanes in double,
then rounds three times (mean + eps, the reciprocal square root, x * r * w): a relative
error of a few float32 ulps (≤ 5e-6 measured against float64, here 8e-6); a scale off
by 0.1% is 100 times that.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_cpu_hostile_plans as hostile  # noqa: E402

from opforge.backends.cpu import blob  # noqa: E402
from opforge.export import export  # noqa: E402
from opforge.runtime import load  # noqa: E402

pytestmark = hostile.pytestmark
RTOL = 8e-6


class Rms(nn.Module):
    def __init__(self, dim: int, eps: float, weight: str | None) -> None:
        super().__init__()
        self.eps, self.mode = eps, weight
        g = torch.Generator().manual_seed(dim)
        self.weight = nn.Parameter(torch.rand(dim, generator=g) + 0.5)  # not the default 1

    def forward(self, x):
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.mode == "after":
            return y * self.weight
        return self.weight * y if self.mode == "before" else y


def _export(model, x, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(model, (x,), kernels="portable", backends=["cpu"], **kwargs)


def _kinds(program) -> list[str]:
    return [op["kind"] for d in program.delegates
            for op in blob.parse(program.segments[d.segment].data)[0]["ops"]]


def _float64(model, x):
    with torch.no_grad():
        return model.double()(x.double()).numpy()


@pytest.mark.parametrize("shape", [(1, 8), (3, 5, 33), (2, 7, 768), (4, 1), (6, 16)])
@pytest.mark.parametrize("weight", [None, "after", "before"])
@pytest.mark.parametrize("eps", [1e-6, 1e-2])
def test_rms_norm_is_one_engine_op_and_matches_float64(shape, weight, eps):
    model = Rms(shape[-1], eps, weight).eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(len(shape))) * 3 + 0.5
    program = _export(model, x)
    kinds = _kinds(program)
    assert kinds.count("rms_norm") == 1 and "reduction" not in kinds, kinds
    got = load(program).method("forward")(x.numpy())[0]
    np.testing.assert_allclose(got, _float64(model, x), rtol=RTOL, atol=1e-30)


def test_torch_rms_norm_module_is_one_engine_op():
    model = nn.RMSNorm(48, eps=1e-5).eval()
    with torch.no_grad():
        model.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(3))
    program = _export(model, x)
    assert _kinds(program) == ["rms_norm"]
    got = load(program).method("forward")(x.numpy())[0]
    np.testing.assert_allclose(got, _float64(model, x), rtol=RTOL, atol=1e-30)


class Escapes(Rms):
    def forward(self, x):
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * r * self.weight, r  # r is read outside the group: not fused


def test_a_group_whose_inner_value_escapes_stays_unfused_and_correct():
    model = Escapes(16, 1e-6, "after").eval()
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(4))
    program = _export(model, x)
    assert "rms_norm" not in _kinds(program)
    got = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        y64, r64 = model.double()(x.double())
    np.testing.assert_allclose(got[0], y64.numpy(), rtol=RTOL, atol=1e-30)
    np.testing.assert_allclose(got[1], r64.numpy(), rtol=RTOL, atol=1e-30)


def test_nan_and_inf_propagate_as_in_torch():
    model = Rms(8, 1e-6, "after").eval()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(5))
    x[1, 3], x[2, 0], x[3, 5] = float("nan"), float("inf"), float("-inf")
    program = _export(model, torch.randn(4, 8))
    got = load(program).method("forward")(x.numpy())[0]
    with torch.no_grad():
        want = model(x).numpy()  # float32 eager: inf * rsqrt(inf) = inf * 0 = NaN
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got[0], _float64(model, x)[0], rtol=RTOL, atol=1e-30)
    assert np.all(got[2][np.isfinite(x[2].numpy())] == 0) and np.all(got[3][np.isfinite(x[3].numpy())] == 0)


def test_symbolic_rows_are_one_op_at_every_size():
    model = Rms(32, 1e-6, "after").eval()
    rows = torch.export.Dim("rows", min=1, max=17)
    program = _export(model, torch.randn(5, 32), dynamic_shapes=({0: rows},))
    assert "rms_norm" in _kinds(program)
    method = load(program).method("forward")
    for n in (1, 2, 13, 17):
        x = torch.randn(n, 32, generator=torch.Generator().manual_seed(n)) * 2
        np.testing.assert_allclose(method(x.numpy())[0], _float64(model, x), rtol=RTOL, atol=1e-30)


# --- hand-built plans: the engine's contract for rms_norm --------------------------------------

F32, I32 = hostile.F32, hostile.I32


def _plan(rows=3, n=5, scale=True, src_strides=None, scale_len=None, ia=None, fa=(1e-6,),
          rank3=False, dtype=F32):
    p = hostile.Plan()
    dims = [1, rows, n] if rank3 else [rows, n]
    x = p.tensor(dtype, dims, role="input")
    src = p.alias(x, dims, src_strides) if src_strides is not None else x
    ins = [src]
    if scale:
        ins.append(p.const(np.linspace(0.5, 1.5, scale_len or n).astype(np.float32)))
    y = p.tensor(F32, dims, role="output")
    p.op("rms_norm", ins, [y], [int(scale)] if ia is None else ia, list(fa))
    return p


def _reference(x, w, eps=1e-6):
    x = x.astype(np.float64)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return y * w if w is not None else y


def rms_norm_rows():
    x = (np.arange(15, dtype=np.float32).reshape(3, 5) - 7) / 3
    got = hostile.run(_plan().handle(), x)[0]
    np.testing.assert_allclose(got, _reference(x, np.linspace(0.5, 1.5, 5)), rtol=RTOL)
    return "ran ok"


def rms_norm_no_scale_long_rows():
    x = np.random.default_rng(0).standard_normal((2, 1000)).astype(np.float32)
    got = hostile.run(_plan(rows=2, n=1000, scale=False).handle(), x)[0]
    np.testing.assert_allclose(got, _reference(x, None), rtol=RTOL)
    return "ran ok"


def rms_norm_empty_rows():
    got = hostile.run(_plan(rows=0).handle(), np.zeros((0, 5), np.float32))[0]
    return "ran ok" if got.shape == (0, 5) else f"wrong shape {got.shape}"


def rms_norm_short_scale():
    return hostile.run(_plan(scale_len=4).handle(), np.ones((3, 5), np.float32))


def rms_norm_rank3():
    return hostile.run(_plan(rank3=True).handle(), np.ones((1, 3, 5), np.float32))


def rms_norm_strided_source():
    return hostile.run(_plan(src_strides=[1, 3]).handle(), np.ones((3, 5), np.float32))


def rms_norm_scale_flag_without_scale():
    return hostile.run(_plan(scale=False, ia=[1]).handle(), np.ones((3, 5), np.float32))


def rms_norm_flag_two():
    return hostile.run(_plan(ia=[2]).handle(), np.ones((3, 5), np.float32))


def rms_norm_no_eps():
    return hostile.run(_plan(fa=()).handle(), np.ones((3, 5), np.float32))


def rms_norm_int_source():
    return hostile.run(_plan(dtype=I32).handle(), np.ones((3, 5), np.int32))


CASES = {f.__name__: f for f in [
    rms_norm_rows, rms_norm_no_scale_long_rows, rms_norm_empty_rows, rms_norm_short_scale,
    rms_norm_rank3, rms_norm_strided_source, rms_norm_scale_flag_without_scale,
    rms_norm_flag_two, rms_norm_no_eps, rms_norm_int_source]}
NORMAL = ["rms_norm_rows", "rms_norm_no_scale_long_rows", "rms_norm_empty_rows"]
EXPECT = {
    "rms_norm_short_scale": "refused: .*the scale must be dense, rank 1, 5 values",
    "rms_norm_rank3": r"refused: .*the source \(rows, D\)",
    "rms_norm_strided_source": "refused: .*source and destination must be contiguous",
    "rms_norm_scale_flag_without_scale": "refused: .*inputs",
    "rms_norm_flag_two": r"refused: .*attributes: ia \[has_scale \(0/1\)\], fa \[eps\]",
    "rms_norm_no_eps": r"refused: .*attributes: ia \[has_scale \(0/1\)\], fa \[eps\]",
    "rms_norm_int_source": "refused: .*the source",
}
EXPECT.update({name: "ran ok$" for name in NORMAL})


@pytest.mark.parametrize("name", sorted(CASES))
def test_rms_norm_plans_run_right_or_are_refused(name):
    import re

    result = hostile.outcome_of(CASES, name)
    assert re.match(EXPECT[name], result, re.S), result


if __name__ == "__main__":
    hostile.report_cases(CASES, sys.argv[1:])
