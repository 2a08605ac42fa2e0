"""The cpu backend's native call path (opforge/backends/cpu/fastcall.py): a method that is one
cpu delegate call runs it through the ``_fastcall`` extension at any size, on the caller's
arrays, with the same results, errors, locks and fallbacks as the ctypes path it replaces."""

from __future__ import annotations

import gc
import sysconfig
import threading
import weakref
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu import fastcall
from opforge.errors import ConcurrentCallError, KernelError, OpforgeError
from opforge.export import export
from opforge.program import save
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")
HEADERS = (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file()


class Small(nn.Module):  # two outputs
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        y = torch.tanh(self.fc(x)) * 1.5 + 0.25
        return y, torch.relu(x) * 2.0


class Conv(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        with torch.no_grad():  # away from the identity
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))).mean((2, 3))


class Gather(nn.Module):
    def __init__(self):
        super().__init__()
        self.table = nn.Parameter(torch.randn(9, 4, dtype=torch.float64), requires_grad=False)

    def forward(self, idx, x):  # the delegate reads idx first: its inputs in the method's order
        return self.table[idx], x[:, idx]


@pytest.fixture
def small(tmp_path):
    """The Small model's program file and a method of it on the native path."""
    if fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    path = _program(tmp_path, Small(), (torch.randn(5, 16),))
    return path, load(path).method("forward")


def _program(tmp_path, model, inputs, name="m.opf"):
    torch.manual_seed(0)
    path = tmp_path / name
    save(export(model.eval(), inputs, backends=["cpu"]), path)
    return path


def _pair(path, monkeypatch):
    """The method with the native path, and one on the ctypes path."""
    native = load(path).method("forward")
    monkeypatch.setenv(fastcall.DISABLE_ENV, "0")
    plain = load(path).method("forward")
    monkeypatch.delenv(fastcall.DISABLE_ENV)
    assert native._native is not None and plain._native is None
    return native, plain


def _eager(model, inputs):
    with torch.no_grad():
        out = model(*[torch.from_numpy(np.array(a)) for a in inputs])
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


@pytest.mark.skipif(not HEADERS, reason="Python's headers are not installed: the extension "
                    "cannot be built here and the ctypes path runs (its own tests)")
def test_the_extension_builds_and_loads_here():
    assert fastcall.problem() is None, fastcall.problem()
    assert fastcall.module().Call is not None


@pytest.mark.parametrize("case", ["small", "conv"])
def test_results_equal_the_ctypes_path_and_eager(tmp_path, monkeypatch, case):
    if fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    torch.manual_seed(1)
    model = Small() if case == "small" else Conv()
    shape = (5, 16) if case == "small" else (2, 3, 12, 12)
    path = _program(tmp_path, model, (torch.randn(shape),))
    native, plain = _pair(path, monkeypatch)
    rng = np.random.default_rng(2)
    slot = native._fast_inputs[0][0]
    for _ in range(3):
        x = rng.standard_normal(shape).astype(np.float32)
        x.setflags(write=False)  # read in place all the same
        keep = x.copy()
        slot[...] = 7.0
        got = native(x)
        assert np.all(slot == 7.0)  # the caller's array was read, not the arena's slot
        np.testing.assert_array_equal(x, keep)
        want = plain(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape and g.flags.c_contiguous
            np.testing.assert_array_equal(g, w)
        # float32 against eager: a 16- or 27-term product and tanh/BatchNorm in float32
        # differ by a few ulps of the operands' magnitude (~1), hence 1e-5
        for g, e in zip(got, _eager(model, [x])):
            if g.dtype.kind == "f":
                np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)
    a, b = native(x), native(x, views=True)
    assert not np.shares_memory(a[0], b[0])  # fresh outputs per call, views=True too
    np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("layout", ["fortran", "strided", "unaligned", "big_endian", "tensor"])
def test_inputs_it_does_not_take_go_the_python_path(tmp_path, layout):
    if fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    torch.manual_seed(3)
    model = Small()
    path = _program(tmp_path, model, (torch.randn(5, 16),))
    f = load(path).method("forward")
    base = np.random.default_rng(4).standard_normal((5, 16)).astype(np.float32)
    if layout == "fortran":
        x = np.asfortranarray(base)
    elif layout == "strided":
        x = np.repeat(base, 2, axis=1)[:, ::2]
    elif layout == "unaligned":
        raw = bytearray(base.nbytes + 1)
        x = np.frombuffer(raw, np.float32, count=base.size, offset=1).reshape(base.shape)
        x[...] = base
        assert not x.flags.aligned
    elif layout == "big_endian":  # refused, as on the ctypes path (not read as raw bytes)
        with pytest.raises(OpforgeError, match=r"found dtype >f4 — valid: float32"):
            f(base.astype(">f4"))
        return
    else:
        x = torch.from_numpy(base)
    slot = f._fast_inputs[0][0]
    slot[...] = 7.0
    got = f(x)
    np.testing.assert_array_equal(slot, base)  # converted and copied into the arena
    want = load(path).method("forward")(base)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_bad_inputs_get_the_same_errors(small, monkeypatch):
    native, plain = _pair(small[0], monkeypatch)
    for args in ((np.zeros((5, 15), np.float32),), (np.zeros((5, 16), np.float64),),
                 (), (np.zeros((5, 16), np.float32),) * 2):
        with pytest.raises(OpforgeError) as a:
            native(*args)
        with pytest.raises(OpforgeError) as b:
            plain(*args)
        assert type(a.value) is type(b.value) and str(a.value) == str(b.value)


def test_an_engine_error_names_the_instruction(tmp_path, monkeypatch):
    if fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    torch.manual_seed(5)
    x = torch.randn(2, 9, 3, dtype=torch.float64)
    path = _program(tmp_path, Gather(), (torch.tensor([[8, -9], [0, 4]]), x))
    native, plain = _pair(path, monkeypatch)
    bad = np.array([[-10, 0], [0, 4]])
    with pytest.raises(KernelError, match=r"instruction 0 .*`aten::index.Tensor`: index — found "
                       r"values in \[-10, 4\] — valid: \[-9, 8\]") as a:
        native(bad, x.numpy())
    with pytest.raises(KernelError) as b:
        plain(bad, x.numpy())
    assert str(a.value) == str(b.value)
    good = np.array([[-1, 3], [7, -2]])  # the engine is usable after the error
    for g, w in zip(native(good, x.numpy()), plain(good, x.numpy())):
        np.testing.assert_array_equal(g, w)


def test_a_busy_instance_raises_and_the_delegate_lock_is_taken(small):
    f = small[1]
    x = np.ones((5, 16), np.float32)
    want = f(x)
    assert f._busy.acquire(False)  # another thread is inside this instance
    try:
        with pytest.raises(ConcurrentCallError, match="one instance per thread"):
            f(x)
    finally:
        f._busy.release()
    lock = f._delegates.locks[0]  # another instance is inside the shared delegate
    done = []
    lock.acquire()
    try:
        t = threading.Thread(target=lambda: done.append(f(x)))
        t.start()
        t.join(0.3)
        assert t.is_alive() and not done  # waiting for the delegate's lock
    finally:
        lock.release()
    t.join(30)
    assert not t.is_alive()
    for g, w in zip(done[0], want):
        np.testing.assert_array_equal(g, w)


def test_a_closed_delegate_is_refused(small):
    f = small[1]
    f._delegates.close()
    with pytest.raises(OpforgeError, match="closed"):
        f(np.ones((5, 16), np.float32))


def test_a_dropped_method_is_freed_without_the_collector(small):
    program = load(small[0])
    gc.disable()
    try:
        f = program.method("forward")
        assert f._native is not None
        f(np.ones((5, 16), np.float32))
        ref = weakref.ref(f)
        del f
        assert ref() is None  # no reference cycle through the extension's call object
    finally:
        gc.enable()


def test_disabled_by_the_environment(tmp_path, monkeypatch):
    path = _program(tmp_path, Small(), (torch.randn(5, 16),))
    monkeypatch.setenv(fastcall.DISABLE_ENV, "0")
    assert fastcall.module() is None and "OPFORGE_CPU_FASTCALL=0" in fastcall.problem()
    f = load(path).method("forward")
    assert f._native is None
    assert f(np.ones((5, 16), np.float32))[0].shape == (5, 8)
