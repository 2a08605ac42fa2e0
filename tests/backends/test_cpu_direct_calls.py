"""Direct calls (runtime/method.py): a method that is one cpu delegate call on exactly its
inputs and outputs runs the delegate on the caller's arrays and returns fresh output arrays,
without the two copies through the arena, when the tensors are large (DIRECT_MIN_BYTES);
anything that does not qualify (a non-contiguous or unaligned input, a small model, a
method with other instructions) takes the copying path with the same results.

These are the Python path's tests: the cpu backend's ``_fastcall`` extension, which makes
the same direct call at every size, is off here (test_cpu_native_calls.py tests it)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu import fastcall
from opforge.export import export
from opforge.runtime import load
from opforge.runtime.direct import DIRECT_MIN_BYTES

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


@pytest.fixture(autouse=True)
def _python_path(monkeypatch):
    monkeypatch.setenv(fastcall.DISABLE_ENV, "0")


class Chain(nn.Module):
    def forward(self, x):
        return torch.tanh(torch.relu(x * 1.5 + 0.25) - x) * x, x.abs() + 1.0


SHAPE = (64, 1024)  # 256 KiB in, 2 × 256 KiB out


def _method(tmp_path, model=None, shape=SHAPE, backends=("cpu",), kernels=None):
    model = model or Chain().eval()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    extra = {"kernels": kernels} if kernels else {}
    path = tmp_path / "m.opf"
    from opforge.program import save

    save(export(model, (x,), backends=list(backends), **extra), path)
    return load(path).method("forward"), model


def _want(model, x):
    with torch.no_grad():
        out = model(torch.from_numpy(np.array(x)))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def _slot(method):
    """The arena slot of input 0: the copying path writes the input there."""
    return method._fast_inputs[0][0]


def test_a_large_delegate_only_method_reads_and_writes_the_callers_arrays(tmp_path):
    f, model = _method(tmp_path)
    assert f._direct is not None
    rng = np.random.default_rng(1)
    x1 = rng.standard_normal(SHAPE).astype(np.float32)
    x2 = rng.standard_normal(SHAPE).astype(np.float32)
    keep1 = x1.copy()
    _slot(f)[...] = 7.0
    y1 = f(x1)
    y2 = f(x2, views=True)
    assert np.all(_slot(f) == 7.0)  # the arena's input slot was never written
    np.testing.assert_array_equal(x1, keep1)  # the input is read, not written
    for got, want in zip(y1, _want(model, x1)):  # the first call's outputs survive the second
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    for got, want in zip(y2, _want(model, x2)):
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    assert not np.shares_memory(y1[0], y2[0]) and not np.shares_memory(y1[0], y1[1])
    y3 = f(x1)
    assert not np.shares_memory(y3[0], y2[0])  # views=True outputs are fresh arrays too
    np.testing.assert_array_equal(y3[0], y1[0])
    # then a call that takes the copying path: the delegate is bound to the arena again
    y4 = f(np.asfortranarray(x2))
    np.testing.assert_array_equal(_slot(f), x2)
    for got, want in zip(y4, y2):
        np.testing.assert_array_equal(got, want)


def test_a_read_only_input_is_read_in_place(tmp_path):
    f, model = _method(tmp_path)
    x = np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)
    x.setflags(write=False)
    _slot(f)[...] = 7.0
    got = f(x)
    assert np.all(_slot(f) == 7.0)
    np.testing.assert_allclose(got[0], _want(model, x)[0], rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("layout", ["transposed", "strided", "unaligned", "float64"])
def test_inputs_that_do_not_qualify_take_the_copying_path(tmp_path, layout):
    f, model = _method(tmp_path)
    rng = np.random.default_rng(3)
    base = rng.standard_normal(SHAPE).astype(np.float32)
    if layout == "transposed":
        x = np.ascontiguousarray(base.T).T  # the values of base, column-major
    elif layout == "strided":
        x = np.repeat(base, 2, axis=1)[:, ::2]
    elif layout == "unaligned":
        raw = bytearray(base.nbytes + 1)
        x = np.frombuffer(raw, np.float32, count=base.size, offset=1).reshape(SHAPE)
        x[...] = base
        assert not x.flags.aligned
    else:
        x = base.astype(np.float64)
        with pytest.raises(Exception, match="float32"):
            f(x)
        return
    _slot(f)[...] = 7.0
    got = f(x)
    np.testing.assert_array_equal(_slot(f), base)  # copied into the arena
    for g, want in zip(got, _want(model, base)):
        np.testing.assert_allclose(g, want, rtol=2e-6, atol=2e-6)


def test_small_tensors_and_other_methods_keep_the_arena(tmp_path):
    small, _ = _method(tmp_path, shape=(4, 16))
    assert 3 * 4 * 16 * 4 < DIRECT_MIN_BYTES and small._direct is None
    lean, _ = _method(tmp_path, backends=())  # no delegate: kernels
    assert lean._direct is None

    class Mixed(nn.Module):  # a delegate and an op the cpu backend leaves to the kernels
        def forward(self, x):
            return torch.relu(x).cumsum(1)

    mixed, model = _method(tmp_path, model=Mixed().eval())
    assert mixed._direct is None
    x = np.random.default_rng(4).standard_normal(SHAPE).astype(np.float32)
    np.testing.assert_allclose(mixed(x)[0], _want(model, x)[0], rtol=1e-5, atol=1e-4)
