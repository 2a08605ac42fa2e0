"""Convolution and pooling refuse hostile padding, dilation and stride before allocating.

Their workspaces are sized by parameters the program file sets: a padding of 2**40 would
have NumPy allocate petabytes. The kernels (called directly), their binders and a bound
``Method`` in lean mode all raise KernelError instead, naming the op and the values.
"""

from __future__ import annotations

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import KernelError
from opforge.kernels.portable import portable_kernels
from opforge.runtime import load
from opforge.runtime.limits import memory_limit

F32, I64 = P.ScalarType.FLOAT32, P.ScalarType.INT64
BIG = 2**40
KERNELS = portable_kernels()
conv = KERNELS["aten::convolution.out"]
max_pool2d = KERNELS["aten::max_pool2d_with_indices.out"]


def _conv_args(padding=(0, 0), dilation=(1, 1), stride=(1, 1), out_hw=(2, 2)):
    x = np.ones((1, 1, 4, 4), np.float32)
    w = np.ones((1, 1, 3, 3), np.float32)
    out = np.zeros((1, 1) + tuple(out_hw), np.float32)
    return (x, w, None, stride, padding, dilation, False, (0, 0), 1, out)


def _pool_args(padding=(0, 0), dilation=(1, 1), kernel=(2, 2), stride=(2, 2), out_hw=(2, 2)):
    x = np.ones((1, 1, 4, 4), np.float32)
    out = np.zeros((1, 1) + tuple(out_hw), np.float32)
    return (x, kernel, stride, padding, dilation, False, out, np.zeros(out.shape, np.int64))


HOSTILE_CONV = [
    dict(padding=(BIG, BIG)),  # the output shape it implies is not the output's
    dict(dilation=(BIG, BIG)),  # a window larger than the padded input
    dict(padding=(BIG, 0), stride=(2 * BIG, 1)),  # consistent with the output, but huge
]
HOSTILE_POOL = [
    dict(padding=(BIG, BIG)),  # more than half the window
    dict(dilation=(BIG, BIG)),  # no window fits: the output would be empty
    dict(dilation=(BIG, 1), padding=(BIG // 2, 0), stride=(1, 2), out_hw=(4, 2)),  # huge
]


@pytest.mark.parametrize("params", HOSTILE_CONV)
def test_conv_kernel_and_binder_refuse(params):
    args = _conv_args(**params)
    if params.get("stride"):  # the consistent case: an output of 2 rows, then 2 columns
        args = args[:-1] + (np.zeros((1, 1, 2, 2), np.float32),)
    with pytest.raises(KernelError, match=r"aten::convolution\.out"):
        conv(*args)
    with pytest.raises(KernelError, match=r"aten::convolution\.out"):
        conv.bind(args)


@pytest.mark.parametrize("params", HOSTILE_POOL)
def test_max_pool2d_kernel_and_binder_refuse(params):
    args = _pool_args(**params)
    with pytest.raises(KernelError, match=r"aten::max_pool2d_with_indices\.out"):
        max_pool2d(*args)
    with pytest.raises(KernelError, match=r"aten::max_pool2d_with_indices\.out"):
        max_pool2d.bind(args)


def test_the_messages_name_the_values():
    with pytest.raises(KernelError) as info:
        conv(*_conv_args(padding=(BIG, BIG)))
    assert f"padding=({BIG}, {BIG})" in str(info.value)
    assert "output of spatial shape (2, 2)" in str(info.value)
    with pytest.raises(KernelError, match="more than half the effective kernel size"):
        max_pool2d(*_pool_args(padding=(BIG, BIG)))
    with pytest.raises(KernelError, match=r"needs \d+ bytes .* at most the memory limit"):
        max_pool2d(*_pool_args(**HOSTILE_POOL[2]))
    with pytest.raises(KernelError, match=r"needs \d+ bytes .* at most the memory limit"):
        conv(*_conv_args(padding=(BIG, 0), stride=(2 * BIG, 1)))


def test_bad_ranges_are_refused():
    with pytest.raises(KernelError, match="stride=.*below 1"):
        conv(*_conv_args(stride=(0, 1)))
    with pytest.raises(KernelError, match="padding=.*below 0"):
        conv(*_conv_args(padding=(-1, 0)))
    with pytest.raises(KernelError, match="dilation=.*below 1"):
        max_pool2d(*_pool_args(dilation=(0, 1)))


def test_other_pools_refuse_too():
    x = np.ones((1, 1, 4, 4, 4), np.float32)
    out = np.zeros((1, 1, 2, 2, 2), np.float32)
    with pytest.raises(KernelError, match="max_pool3d"):
        KERNELS["aten::max_pool3d_with_indices.out"](
            x, (2, 2, 2), (2, 2, 2), (BIG,) * 3, (1, 1, 1), False, out, out.astype(np.int64))
    with pytest.raises(KernelError, match="avg_pool2d"):
        KERNELS["aten::avg_pool2d.out"](x[0], (2, 2), (2, 2), (BIG, BIG), False, True, None,
                                         np.zeros((1, 1, 2, 2), np.float32))
    with pytest.raises(KernelError, match="output_size"):
        KERNELS["aten::_adaptive_avg_pool2d.out"](x[0], (BIG, BIG),
                                                  np.zeros((1, 1, 2, 2), np.float32))
    with pytest.raises(KernelError, match="output_size"):
        KERNELS["aten::adaptive_max_pool2d.out"](x[0], (BIG, 2), out[0], out[0].astype(np.int64))


def test_a_workspace_over_a_small_limit_is_refused_and_a_real_one_runs():
    args = _conv_args(padding=(1, 1), out_hw=(4, 4))
    conv(*args)
    np.testing.assert_array_equal(args[-1][0, 0, 1:3, 1:3], 9.0)
    with memory_limit(256), pytest.raises(KernelError, match="memory limit, 256 bytes"):
        conv(*_conv_args(padding=(1, 1), out_hw=(4, 4)))
    with memory_limit(256), pytest.raises(KernelError, match="memory limit, 256 bytes"):
        max_pool2d(*_pool_args(padding=(1, 1), out_hw=(3, 3)))


# --- a bound Method in lean mode -----------------------------------------------------------

def _conv_program(padding, dilation, stride=(1, 1)) -> P.Program:
    values = (
        P.TensorValue(F32, (1, 1, 4, 4), storage=P.ArenaStorage(0, 0)),
        P.TensorValue(F32, (1, 1, 3, 3), storage=P.ArenaStorage(0, 64)),
        P.NoneValue(), P.IntListValue(stride), P.IntListValue(padding),
        P.IntListValue(dilation), P.BoolValue(False), P.IntListValue((0, 0)), P.IntValue(1),
        P.TensorValue(F32, (1, 1, 2, 2), storage=P.ArenaStorage(0, 128)),
    )
    return P.Program(methods=(P.Method(
        "forward", values, (0, 1), (9,), (P.KernelCall(0, tuple(range(10))),),
        (P.Operator("aten::convolution", "out"),), P.MemoryPlan((192,))),))


def _pool_program(padding, dilation) -> P.Program:
    values = (
        P.TensorValue(F32, (1, 1, 4, 4), storage=P.ArenaStorage(0, 0)),
        P.IntListValue((2, 2)), P.IntListValue((2, 2)), P.IntListValue(padding),
        P.IntListValue(dilation), P.BoolValue(False),
        P.TensorValue(F32, (1, 1, 2, 2), storage=P.ArenaStorage(0, 64)),
        P.TensorValue(I64, (1, 1, 2, 2), storage=P.ArenaStorage(0, 128)),
    )
    return P.Program(methods=(P.Method(
        "forward", values, (0,), (6,), (P.KernelCall(0, tuple(range(8))),),
        (P.Operator("aten::max_pool2d_with_indices", "out"),), P.MemoryPlan((192,))),))


@pytest.mark.parametrize("padding, dilation", [((BIG, BIG), (1, 1)), ((0, 0), (BIG, BIG))])
def test_a_bound_method_refuses_at_load(padding, dilation):
    for program, key in ((_conv_program(padding, dilation), "aten::convolution.out"),
                         (_pool_program(padding, dilation),
                          "aten::max_pool2d_with_indices.out")):
        loaded = load(P.from_bytes(P.to_bytes(program)))
        # the binder's own KernelError (not a MemoryError the executor wrapped)
        with pytest.raises(KernelError, match=rf"instruction 0 \({key}.*cannot bind its "
                                              rf"arguments: KernelError: `{key}`"):
            loaded.method()


def test_a_sane_bound_method_still_runs():
    x, w = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4), np.ones((1, 1, 3, 3),
                                                                         np.float32)
    (y,) = load(_conv_program((0, 0), (1, 1))).method()(x, w)
    assert y.tolist() == [[[[45.0, 54.0], [81.0, 90.0]]]]
    (y,) = load(_pool_program((0, 0), (1, 1))).method()(x)
    assert y.tolist() == [[[[5.0, 7.0], [13.0, 15.0]]]]


@pytest.mark.parametrize("groups, weight_shape, out_channels", [
    (2**31, (4, 3, 3, 3), 4),   # found by fuzz/exec_fuzz.py: sized a 13.5 TiB columns buffer
    (2, (4, 3, 3, 3), 4),       # C_in 3 is not weight's 3 * groups
    (1, (4, 3, 3, 3), 5),       # out channels disagree with the weight
])
def test_convolution_groups_and_channels_follow_aten(groups, weight_shape, out_channels):
    from opforge.kernels.portable.convolution import _bind_convolution, convolution_out

    x = np.ones((1, 3, 8, 8), np.float32)
    w = np.ones(weight_shape, np.float32)
    out = np.zeros((1, out_channels, 6, 6), np.float32)
    args = (x, w, None, (1, 1), (0, 0), (1, 1), False, (0, 0), groups, out)
    with pytest.raises(KernelError, match="channels"):
        _bind_convolution(args)
    with pytest.raises(KernelError, match="channels"):
        convolution_out(*args)
