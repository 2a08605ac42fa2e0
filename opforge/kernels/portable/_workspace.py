"""Window geometry checks and workspace bounds for the convolution and pooling kernels.

# Design
#
# Convolution and pooling allocate workspaces sized by their *parameters*, not only by
# their tensors: a padded copy of the input (``N*C*prod(in + 2p)``), a column matrix
# (``positions * taps``), a transposed convolution's canvas (``(in - 1) * stride + reach``).
# Padding, dilation and stride come from the program file, so a hostile one with a padding
# of 2**40 would have NumPy try to allocate petabytes (a raw ``MemoryError``, or worse, a
# machine swapping). Two checks run before any allocation, in the general kernels and in
# their binders alike:
#
# 1. geometry: each parameter in range (stride, dilation, kernel size >= 1, padding >= 0;
#    pooling's padding at most half its effective window, as ATen requires) and the output
#    tensor's spatial shape equal to the one the parameters give (ATen's formulas). A
#    padding larger than the output needs changes that shape, so it is refused here.
# 2. size: what the kernel is about to allocate, computed exactly in Python integers,
#    against the memory limit (``opforge.runtime.limits``: ``load(max_memory=...)``,
#    ``OPFORGE_MAX_MEMORY``, 8 GiB). Parameters that agree with the output can still ask
#    for a huge workspace (a dilation of 2**40 balanced by a padding of 2**39).
#
# Both raise ``KernelError`` naming the op, the argument and the values.
"""

from __future__ import annotations

import math
from typing import Sequence

from opforge.errors import KernelError

__all__ = ["check_workspace", "check_convolution", "check_pooling", "check_output_size"]


def check_workspace(api: str, what: str, nbytes: int) -> None:
    """``KernelError`` unless ``nbytes`` fits the memory limit."""
    from opforge.runtime.limits import MAX_MEMORY_ENV, check_memory

    check_memory(api, what, nbytes, error=KernelError,
                 fix="1. check the op's padding, dilation, stride and kernel size (a corrupt "
                     "or hostile program asks for absurd ones); 2. if the model really needs "
                     f"it, raise the limit: load(..., max_memory=N) or {MAX_MEMORY_ENV}=N")


def _at_least(api: str, name: str, values: Sequence[int], low: int) -> None:
    if any(v < low for v in values):
        raise KernelError(
            f"`{api}`: {name}={tuple(values)} — an entry below {low} — valid: every entry "
            f">= {low} — fix: re-export the model; the program was altered or corrupted")


def _shape_mismatch(api: str, out_shape, expected, parameters: str) -> KernelError:
    return KernelError(
        f"`{api}`: output of spatial shape {tuple(out_shape)} — the input and {parameters} "
        f"give {tuple(expected)} — valid: the output shape ATen computes from them — fix: "
        "re-export the model; the program's parameters and tensors disagree")


def check_convolution(api: str, x_shape, weight_shape, stride, padding, dilation,
                      transposed: bool, output_padding, groups: int, out_shape) -> None:
    """Refuse convolution parameters out of range or disagreeing with the output shape
    (``x_shape`` batched: (N, C, *spatial); ``out_shape`` likewise)."""
    _at_least(api, "stride", stride, 1)
    _at_least(api, "dilation", dilation, 1)
    _at_least(api, "padding", padding, 0)
    _at_least(api, "groups", (groups,), 1)
    _check_channels(api, x_shape, weight_shape, transposed, groups, out_shape)
    kernel = tuple(weight_shape[2:])
    spatial = tuple(x_shape[2:])
    if transposed:
        _at_least(api, "output_padding", output_padding, 0)
        expected = tuple((i - 1) * s - 2 * p + d * (k - 1) + op + 1 for i, s, p, d, k, op
                         in zip(spatial, stride, padding, dilation, kernel, output_padding))
    else:
        expected = tuple((i + 2 * p - d * (k - 1) - 1) // s + 1 for i, s, p, d, k
                         in zip(spatial, stride, padding, dilation, kernel))
    if len(out_shape) != len(x_shape) or tuple(out_shape[2:]) != expected or \
            any(e < 0 for e in expected):
        raise _shape_mismatch(api, out_shape[2:], expected,
                              f"stride={tuple(stride)}, padding={tuple(padding)}, "
                              f"dilation={tuple(dilation)}, kernel {kernel}")


def _check_channels(api: str, x_shape, weight_shape, transposed: bool, groups: int,
                    out_shape) -> None:
    """ATen's channel rules: they bound ``groups`` by the tensors (a groups of 2**31 would
    otherwise size the columns buffer), and the batch is the input's."""
    if len(weight_shape) < 2 or len(x_shape) < 2 or len(out_shape) < 2:
        return  # the rank rule is the shape check's
    c, out_c = x_shape[1], out_shape[1]
    if transposed:  # weight (C_in, C_out / groups, *kernel)
        ok = weight_shape[0] == c and c % groups == 0 and out_c == weight_shape[1] * groups
        rule = "weight (C_in, C_out/groups, *k) with C_in % groups == 0"
    else:  # weight (C_out, C_in / groups, *kernel)
        ok = c == weight_shape[1] * groups and weight_shape[0] == out_c and out_c % groups == 0
        rule = "weight (C_out, C_in/groups, *k) with C_out % groups == 0"
    if not ok or out_shape[0] != x_shape[0]:
        raise KernelError(
            f"`{api}`: channels — input {tuple(x_shape)}, weight {tuple(weight_shape)}, "
            f"groups={groups}, out {tuple(out_shape)} — valid: {rule}, and the out's batch "
            "and channels from them — fix: re-export the model; the program's parameters "
            "and tensors disagree")


def convolution_workspace(x_shape, weight_shape, stride, padding, dilation, transposed: bool,
                          output_padding, groups: int, out_shape, itemsize: int) -> int:
    """Bytes the general convolution kernel allocates (padded input, columns, result;
    transposed: columns and canvas), an upper bound for its binder's buffers too."""
    n, c = x_shape[:2]
    out_c = out_shape[1]
    kernel = tuple(weight_shape[2:])
    spatial = tuple(x_shape[2:])
    taps = math.prod(kernel)
    if transposed:
        full = [(i - 1) * s + d * (k - 1) + 1 + op for i, s, d, k, op
                in zip(spatial, stride, dilation, kernel, output_padding)]
        columns = n * out_c * taps * math.prod(spatial)
        return (columns + n * out_c * math.prod(full)) * itemsize
    padded = n * c * math.prod(i + 2 * p for i, p in zip(spatial, padding))
    positions = math.prod(out_shape[2:])
    columns = n * positions * (c // max(groups, 1)) * taps * max(groups, 1)
    return (padded + columns + n * out_c * positions) * itemsize


def check_pooling(api: str, sizes, k, s, p, d, out_size, output_shape, *,
                  average: bool) -> tuple[int, ...]:
    """Refuse pooling parameters out of range (ATen's rules) or an output of spatial shape
    ``out_size`` other than ``output_shape(sizes, k, s, p, d)`` gives; return that shape."""
    _at_least(api, "kernel_size", k, 1)
    _at_least(api, "stride", s, 1)
    _at_least(api, "dilation", d, 1)
    _at_least(api, "padding", p, 0)
    for ki, pi, di in zip(k, p, d):
        half = ki // 2 if average else (di * (ki - 1) + 1) // 2
        if pi > half:
            raise KernelError(
                f"`{api}`: padding={tuple(p)} — more than half the effective kernel size "
                f"(kernel_size={tuple(k)}, dilation={tuple(d)}: at most {half}) — valid: "
                "pad <= half the window, as ATen requires — fix: re-export the model; the "
                "program was altered or corrupted")
    expected = tuple(output_shape(sizes, k, s, p, d))
    if tuple(out_size) != expected or any(e < 1 for e in expected):
        raise _shape_mismatch(api, out_size, expected,
                              f"kernel_size={tuple(k)}, stride={tuple(s)}, "
                              f"padding={tuple(p)}, dilation={tuple(d)}")
    return expected


def padded_elements(lead: int, sizes, k, s, p, d, out_size) -> int:
    """Elements of the pooling kernels' padded input: ``p`` on the left, on the right what
    the last window needs (at least ``p``), as ``pooling._windows`` pads."""
    total = lead
    for size, ki, si, pi, di, o in zip(sizes, k, s, p, d, out_size):
        need = (o - 1) * si + di * (ki - 1) + 1
        total *= size + pi + max(need - size - pi, pi)
    return total


def check_output_size(api: str, output_size, out_size) -> None:
    """An adaptive pool's ``output_size`` argument must be its output's spatial shape."""
    if tuple(output_size) != tuple(out_size):
        raise KernelError(
            f"`{api}`: output_size={tuple(output_size)} — the output tensor's spatial shape "
            f"is {tuple(out_size)} — valid: the two equal — fix: re-export the model; the "
            "program's parameters and tensors disagree")
