"""Prepared binders (``_binding``: ``prepare`` at the upper bound, ``rebind`` per shape):
at every size, a rebound pair computes what the general kernel computes, with tensors laid
out as a dynamic method lays them out (each a view at the start of its slot, planned at
the upper bound). NumPy only."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.kernels.portable import normalization
from opforge.kernels.portable.linalg import KERNELS as LINALG
from opforge.kernels.portable.normalization import KERNELS as NORMALIZATION
from opforge.kernels.portable.view_copy import KERNELS as VIEW_COPY

MAX = 12
SIZES = (1, 2, 3, 7, 11, MAX)
RNG = np.random.default_rng(0)


class Slots:
    """One arena; ``view(slot, shape)`` is the tensor of ``shape`` at that slot's start."""

    def __init__(self, *max_shapes):
        self.offsets, offset = [], 0
        for shape in max_shapes:
            self.offsets.append(offset)
            offset += -(-int(np.prod(shape)) * 4 // 64) * 64
        self.arena = np.zeros(offset, np.uint8)

    def view(self, slot, shape):
        return np.ndarray(shape, np.float32, self.arena, self.offsets[slot])


def constant(*shape):
    a = RNG.standard_normal(shape).astype(np.float32)
    a.flags.writeable = False
    return a


def _check(kernel, make_args, outs):
    """Prepare at MAX, then at each size: the rebound pair vs the general kernel."""
    rebind = kernel.bind.prepare(make_args(MAX))
    assert rebind is not None
    for n in SIZES:
        args = make_args(n)
        for i, a in enumerate(args):
            if type(a) is np.ndarray and a.flags.writeable and i not in outs:
                a[...] = RNG.standard_normal(a.shape)
        pair = rebind(args)
        assert pair is not None, n
        fn, bound = pair
        fn(*bound)
        got = [args[i].copy() for i in outs]
        expected = [np.empty_like(args[i]) for i in outs]
        reference = list(args)
        for i, e in zip(outs, expected):
            reference[i] = e
        kernel(*reference)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6, err_msg=f"size {n}")
        # and exactly what the binder's own pair computes (the same steps)
        fresh = list(args)
        for i in outs:
            fresh[i] = np.empty_like(args[i])
        fn, bound = kernel.bind(tuple(fresh))
        fn(*bound)
        for g, i in zip(got, outs):
            np.testing.assert_array_equal(g, fresh[i], err_msg=f"size {n}")


@pytest.mark.parametrize("affine", [True, False, "weight"])
def test_layer_norm(affine, monkeypatch):
    # the common case: one normalized dimension (its straight-line steps from the second
    # size on: the first fills the prepared ones and counts)
    slots = Slots((2, MAX, 16), (2, MAX, 16), (2, MAX, 1), (2, MAX, 1))
    weight, bias = (constant(16), constant(16)) if affine else (None, None)
    if affine == "weight":
        bias = None

    def args(n):
        return (slots.view(0, (2, n, 16)), [16], weight, bias, 1e-5, slots.view(1, (2, n, 16)),
                slots.view(2, (2, n, 1)), slots.view(3, (2, n, 1)))

    general = []
    monkeypatch.setattr(normalization, "_layer_norm",
                        lambda *a, f=normalization._layer_norm: general.append(1) or f(*a))
    _check(NORMALIZATION["aten::native_layer_norm.out"], args, outs=(5, 6, 7))
    assert len(general) == 1 + len(SIZES)  # the first rebind's, and the binder's per size


def test_layer_norm_over_two_dimensions():
    slots = Slots((MAX, 4, 6), (MAX, 4, 6), (MAX, 1, 1), (MAX, 1, 1))
    weight, bias = constant(4, 6), constant(4, 6)

    def args(n):
        return (slots.view(0, (n, 4, 6)), [4, 6], weight, bias, 1e-5, slots.view(1, (n, 4, 6)),
                slots.view(2, (n, 1, 1)), slots.view(3, (n, 1, 1)))

    _check(NORMALIZATION["aten::native_layer_norm.out"], args, outs=(5, 6, 7))


@pytest.mark.parametrize("shape, dim", [
    (lambda n: (2, n, 40), -1),     # long rows: NumPy's reduce
    (lambda n: (4, 16, n), -1),     # short rows, many: the transposed maximum (n <= 32)
    (lambda n: (3, n, 5), 1),       # not the last dimension
])
def test_softmax(shape, dim):
    slots = Slots(shape(MAX), shape(MAX))

    def args(n):
        return slots.view(0, shape(n)), dim, False, slots.view(1, shape(n))

    _check(NORMALIZATION["aten::_softmax.out"], args, outs=(3,))


@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("with_bias", [True, False])
def test_linear(batched, with_bias):
    lead = (3,) if batched else ()
    slots = Slots(lead + (MAX, 8), lead + (MAX, 5))
    weight, bias = constant(5, 8), constant(5) if with_bias else None

    def args(n):
        return slots.view(0, lead + (n, 8)), weight, bias, slots.view(1, lead + (n, 5))

    _check(LINALG["aten::linear.out"], args, outs=(3,))


@pytest.mark.parametrize("key, make", [
    ("aten::permute_copy.out", lambda s, n: (s.view(0, (2, n, 3)), [2, 0, 1],
                                             s.view(1, (3, 2, n)))),
    ("aten::view_copy.out", lambda s, n: (s.view(0, (2, n, 4)), [2, n, 2, 2],
                                          s.view(1, (2, n, 2, 2)))),
    ("aten::select_copy.int_out", lambda s, n: (s.view(0, (2, n, 3)), 2, 1,
                                                s.view(1, (2, n)))),
    ("aten::unsqueeze_copy.out", lambda s, n: (s.view(0, (2, n)), 1, s.view(1, (2, 1, n)))),
])
def test_copies(key, make):
    slots = Slots((2, MAX, 4), (2, MAX, 4))
    _check(VIEW_COPY[key], lambda n: make(slots, n), outs=(len(make(slots, 1)) - 1,))


def test_overlap_at_the_upper_bound_declines():
    # out and self in one slot (an in-place program): no promise for every size
    slots = Slots((2, MAX, 3))
    bound = (slots.view(0, (2, MAX, 3)), [2, 0, 1], slots.view(0, (3, 2, MAX)))
    assert VIEW_COPY["aten::permute_copy.out"].bind.prepare(bound) is None
    layer_norm = NORMALIZATION["aten::native_layer_norm.out"]
    x = slots.view(0, (2, MAX, 3))
    assert layer_norm.bind.prepare((x, [3], None, None, 1e-5, x, np.empty((2, MAX, 1),
                                    np.float32), np.empty((2, MAX, 1), np.float32))) is None


def test_relu():
    from opforge.kernels.portable.activation import KERNELS as ACTIVATION

    slots = Slots((3, MAX), (3, MAX))
    _check(ACTIVATION["aten::relu.out"], lambda n: (slots.view(0, (3, n)), slots.view(1, (3, n))),
           outs=(1,))


@pytest.mark.parametrize("key", ["aten::zeros_like.out", "aten::ones_like.out"])
def test_uniform_constants(key):
    from opforge.kernels.portable.factory import KERNELS as FACTORY

    slots = Slots((2, MAX), (2, MAX))
    _check(FACTORY[key], lambda n: (slots.view(0, (2, n)), None, slots.view(1, (2, n))),
           outs=(2,))


def test_where():
    from opforge.kernels.portable.comparison import KERNELS as COMPARISON

    slots = Slots((2, MAX), (2, MAX), (2, MAX))
    arena = np.zeros(2 * MAX, np.bool_)

    def args(n):
        condition = np.ndarray((2, n), np.bool_, arena)
        condition[...] = RNG.standard_normal((2, n)) > 0
        condition.flags.writeable = False  # _check leaves it as drawn: about half True
        return condition, slots.view(0, (2, n)), slots.view(1, (2, n)), slots.view(2, (2, n))

    _check(COMPARISON["aten::where.self_out"], args, outs=(3,))


@pytest.mark.parametrize("key, dim", [("aten::all.all_out", None), ("aten::any.all_out", None),
                                      ("aten::all.out", 1), ("aten::any.out", 0),
                                      ("aten::all.dims_out", [0, 1])])
def test_logical_reductions(key, dim):
    from opforge.kernels.portable.reduction import KERNELS as REDUCTION

    arena = np.zeros(3 * MAX, np.bool_)
    out = np.zeros(3 * MAX, np.bool_)
    kept = {None: lambda n: (), 1: lambda n: (3,), 0: lambda n: (n,)}.get(
        dim if not isinstance(dim, list) else None)

    def args(n):
        x = np.ndarray((3, n), np.bool_, arena)
        x[...] = RNG.standard_normal((3, n)) > -1.5  # mostly True: both answers occur
        x.flags.writeable = False  # _check leaves it as drawn
        y = np.ndarray(kept(n), np.bool_, out)
        return (x, y) if dim is None else (x, dim, False, y)

    _check(REDUCTION[key], args, outs=(len(args(1)) - 1,))


@pytest.mark.parametrize("key, make", [
    ("aten::select_copy.int_out", lambda s, n: (s.view(0, (2, n, 3)), 1, -1, s.view(1, (2, 3)))),
    ("aten::select_copy.int_out", lambda s, n: (s.view(0, (n, 3)), 1, 2, s.view(1, (n,)))),
    ("aten::squeeze_copy.dims_out", lambda s, n: (s.view(0, (2, 1, n)), [1],
                                                  s.view(1, (2, n)))),
])
def test_more_copies(key, make):
    slots = Slots((2, MAX, 4), (2, MAX, 4))
    _check(VIEW_COPY[key], lambda n: make(slots, n), outs=(len(make(slots, 1)) - 1,))
