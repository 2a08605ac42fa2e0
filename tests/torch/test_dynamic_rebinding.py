"""Rebinding a dynamic method at a new shape (runtime/rebinding.py): a long-lived instance
that has been through other shapes, evictions and refused calls gives, at every shape,
exactly what a fresh instance gives there."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import ProgramError
from opforge.examples.zoo import ZOO
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load

MAX = 24
SIZES = (1, 2, 3, 5, 7, 11, 13, 23, MAX)  # 1, primes, the maximum


@pytest.fixture(scope="module")
def transformer():
    """The zoo transformer layer with a dynamic sequence, as bench/dynamic_shapes.py has it."""
    model, (x,) = ZOO["transformer_layer"]()
    program = from_bytes(to_bytes(export(model, (x,), kernels="portable",
                                         dynamic_shapes=({1: Dim("seq", min=1, max=MAX)},))))
    return model, load(program)


def _input(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((2, n, 64)).astype(np.float32)


def _fresh(loaded, n: int) -> np.ndarray:
    return loaded.method("forward")(_input(n))[0]


def test_every_size_rebound_matches_a_fresh_instance_and_eager(transformer):
    model, loaded = transformer
    forward = loaded.method("forward")
    # A -> B -> A -> C -> ... : each size after others, then each again (cached, swapped in)
    order = [SIZES[0]] + [n for pair in zip(SIZES[1:], [SIZES[0]] * len(SIZES)) for n in pair]
    for n in order + list(reversed(SIZES)):
        got = forward(_input(n))[0]
        np.testing.assert_array_equal(got, _fresh(loaded, n), err_msg=f"seq {n}")
        with torch.no_grad():
            expected = model(torch.from_numpy(_input(n))).numpy()
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, err_msg=f"seq {n}")


def test_views_outputs_follow_the_binding_of_their_call(transformer):
    _, loaded = transformer
    forward = loaded.method("forward")
    a = forward(_input(5), views=True)[0]
    assert a.shape == (2, 5, 64)
    b = forward(_input(7), views=True)[0]
    assert b.shape == (2, 7, 64)
    np.testing.assert_array_equal(b, _fresh(loaded, 7))
    again = forward(_input(5), views=True)[0]  # the cached binding's view, refilled
    assert again is a
    np.testing.assert_array_equal(again, _fresh(loaded, 5))


def test_eviction_then_rebinding(transformer):
    _, loaded = transformer
    forward = loaded.method("forward")
    forward.SHAPE_CACHE_SIZE = 3
    sizes = (2, 3, 5, 7, 11)  # more than the cache holds: every call of a cycle misses
    for _ in range(2):
        for n in sizes:
            np.testing.assert_array_equal(forward(_input(n))[0], _fresh(loaded, n))
    assert list(forward._shapes) == [((2, n, 64),) for n in sizes[-3:]]
    # the least recently used goes: 7 and 11 stay after 5 is used again and 2 bound
    forward(_input(5))
    forward(_input(2))
    assert list(forward._shapes) == [((2, n, 64),) for n in (11, 5, 2)]
    np.testing.assert_array_equal(forward(_input(7))[0], _fresh(loaded, 7))


@pytest.mark.parametrize("bad, needle", [
    (np.zeros((2, MAX + 1, 64), np.float32), r"input 0 dimension 1 — found size 25 — valid: "
                                             r"seq with symbol seq in \[1, 24\]"),
    (np.zeros((2, 0, 64), np.float32), r"dimension 1 — found size 0"),
    (np.zeros((3, 4, 64), np.float32), r"input 0 dimension 0 — found size 3 — valid: 2"),
    (np.zeros((2, 4), np.float32), r"input 0 — found rank 2"),
    (np.zeros((2, 9, 64), np.float64), r"input 0 — found dtype float64"),  # shape binds first
])
def test_a_refused_call_leaves_the_next_calls_correct(transformer, bad, needle):
    _, loaded = transformer
    forward = loaded.method("forward")
    np.testing.assert_array_equal(forward(_input(4))[0], _fresh(loaded, 4))
    with pytest.raises(ProgramError, match=needle):
        forward(bad)
    for n in (4, 9, 13, 4):  # the shape before, the refused one's shape, a new one, back
        np.testing.assert_array_equal(forward(_input(n))[0], _fresh(loaded, n),
                                      err_msg=f"seq {n}")


def test_dynamic_batch_mlp_rebinds_like_a_fresh_instance():
    model, (x,) = ZOO["mlp"]()
    loaded = load(export(model, (x,), kernels="portable",
                         dynamic_shapes=({0: Dim("batch", min=1, max=17)},)))
    forward = loaded.method("forward")
    forward.SHAPE_CACHE_SIZE = 2
    rng = np.random.default_rng(0)
    for n in (1, 17, 1, 2, 3, 17, 5, 2):
        batch = rng.standard_normal((n, x.shape[1])).astype(np.float32)
        got = forward(batch)[0]
        np.testing.assert_array_equal(got, loaded.method("forward")(batch)[0])
        with torch.no_grad():
            np.testing.assert_allclose(got, model(torch.from_numpy(batch)).numpy(),
                                       rtol=1e-4, atol=1e-5)


class _ScaleBySize(torch.nn.Module):
    def forward(self, x):
        return (x * x.shape[1]) + x.shape[1]  # mul.Scalar and add.Scalar of a symbolic int


def test_symbolic_scalar_arguments_are_rebound_per_shape():
    # add/mul are shape-generic binders (their pairs are rebound from a template), but not
    # where a symbolic int is an argument: its folded value changes with the shape
    x = torch.randn(2, 5)
    loaded = load(export(_ScaleBySize(), (x,), kernels="portable",
                         dynamic_shapes=({1: Dim("n", min=1, max=MAX)},)))
    forward = loaded.method("forward")
    for n in (5, 1, 7, 5, 24, 2):
        given = torch.randn(2, n)
        np.testing.assert_allclose(forward(given.numpy())[0], (given * n + n).numpy(),
                                   rtol=1e-6, err_msg=f"n {n}")


def test_shape_generic_binders_are_rebound_from_a_template(transformer):
    _, loaded = transformer
    forward = loaded.method("forward")
    forward(_input(3))
    forward(_input(4))
    plan = forward._rebind
    templates = {forward.instructions[plan.instruction_index.index(i)][1]
                 for i in plan.templated()}
    assert {"aten::add.out", "aten::matmul.out", "aten::clone.out"} <= templates
    np.testing.assert_array_equal(forward(_input(6))[0], _fresh(loaded, 6))


class _Elementwise(torch.nn.Module):
    def forward(self, x, y):
        a = torch.tanh(x).exp() + torch.floor(y * 3.0)
        b = torch.sign(x - y).abs() - torch.neg(y) * torch.isnan(x / y).float()
        return torch.maximum(a, b) / (y.abs() + 1.0), (x > y)


def test_elementwise_templates_at_every_size():
    # unary, binary and comparison binders are shape-generic: most of this program is
    # rebound from templates; sign's two steps and the casts are bound per shape
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    n = Dim("n", min=1, max=MAX)
    loaded = load(export(_Elementwise(), (x, y), kernels="portable",
                         dynamic_shapes=({1: n}, {1: n})))
    forward = loaded.method("forward")
    forward.SHAPE_CACHE_SIZE = 3
    for k in (4, 1, 13, 4, MAX, 2, 7, 1):
        a, b = torch.randn(3, k), torch.randn(3, k)
        got = forward(a.numpy(), b.numpy())
        expected = _Elementwise()(a, b)
        np.testing.assert_allclose(got[0], expected[0].numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(got[1], expected[1].numpy())
    assert len(forward._rebind.templated()) >= 6


def test_traced_calls_rebind_like_untraced_ones(transformer):
    from opforge.runtime import Tracer

    _, loaded = transformer
    forward = loaded.method("forward")
    names = [op for _, op in forward.instructions]  # known before the first call
    assert len(names) == 47 and "aten::native_layer_norm.out" in names
    for n in (6, 1, 6, 17):
        tracer = Tracer()
        got = forward.run([_input(n)], tracer=tracer)[0]
        np.testing.assert_array_equal(got, _fresh(loaded, n))
        assert [op for op in (s.op for s in tracer.summary()) if op.startswith("aten::")]
    assert [op for _, op in forward.instructions] == names
