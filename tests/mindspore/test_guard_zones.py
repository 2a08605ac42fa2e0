"""A kernel writing more than its declared output is caught in a guard zone (a KernelError
naming the op, every call; the heap is never corrupted), and one writing less leaves
zeros, never the memory the output had before. The overflow case runs in a child process:
before guard zones it corrupted the heap (``free(): invalid next size``)."""

import subprocess
import sys

import numpy as np
import pytest

from mindspore_support import KERNELS, needs_cxx

pytestmark = needs_cxx

CHILD = r"""
import sys
import numpy as np
from opforge.errors import KernelError
from opforge.mindspore import AotKernel, define
from opforge.mindspore.compile import compile_library
lib = compile_library([sys.argv[1]], "bad_writes", cache_root=sys.argv[2])
kernel = AotKernel(define(f"{lib}:OverCustom", lambda x: x, lambda x: x))
for call in range(3):
    x = np.ones(5, np.float32)  # heap neighbours
    y = np.empty(5, np.float32)
    try:
        kernel(x, y)
        print("no error")
    except KernelError as e:
        print("KernelError", "mindspore::OverCustom" in str(e), "past its end" in str(e))
"""


def test_a_kernel_writing_past_its_output_is_a_kernel_error_every_call(cache):
    result = subprocess.run([sys.executable, "-c", CHILD, str(KERNELS / "bad_writes.cc"),
                             str(cache)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split("\n")[:3] == ["KernelError True True"] * 3


def test_a_kernel_writing_less_leaves_zeros(cache):
    from opforge.mindspore import AotKernel, define
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:UnderCustom", lambda x: x, lambda x: x))
    x = np.arange(1, 7, dtype=np.float32)
    y = np.full(6, 7.0, np.float32)  # what the memory held before
    kernel(x, y)
    np.testing.assert_array_equal(y, [1, 2, 3, 0, 0, 0])


@pytest.mark.parametrize("shape", [(0,), (3,), (2, 3, 4)])
def test_a_correct_kernel_is_unaffected(add_lib, shape):
    from opforge.mindspore import AotKernel, define

    kernel = AotKernel(define(f"{add_lib}:AddCustom", lambda x, y: x, lambda x, y: x))
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    z = np.empty_like(x)
    for _ in range(2):
        kernel(x, x, z)
        np.testing.assert_array_equal(z, x + x)


# y[i] for a 5-float output: its guard zones are 64 bytes before it (16 floats) and 256
# after it (64 floats). Each side at its first and last element and one between: a check of
# part of a zone (its first byte, the first bytes after the output) misses some of them.
STRAY = {-1: "wrote 4 byte(s) before its start", -8: "wrote 32 byte(s) before its start",
         -16: "wrote 64 byte(s) before its start", 5: "wrote at least 4 byte(s) past its end",
         36: "wrote at least 128 byte(s) past its end", 68: "wrote at least 256 byte(s) past its end"}


@pytest.mark.parametrize("index", list(STRAY))
def test_one_stray_write_anywhere_in_either_guard_zone_is_a_kernel_error(cache, index):
    from opforge.errors import KernelError
    from opforge.mindspore import AotKernel, define
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:StrayCustom", lambda x: x, lambda x: x))
    x = np.array([index, 1, 2, 3, 4], np.float32)
    y = np.full(5, -1.0, np.float32)
    call, _ = kernel.bind((x, y))  # as the executor calls it: bound once, called again
    side = "before its start" if index < 0 else "past its end"
    try:
        call()
    except KernelError as e:
        assert STRAY[index] in str(e), (
            f"a write to y[{index}] ({side}) was not reported as {STRAY[index]!r}: {e}")
    else:
        pytest.fail(f"a write to y[{index}] of a 5-float output ({side}, in its guard zone) "
                    "went unnoticed")
    assert (y == -1).all()  # the results were discarded
    # the zones are whole again: a write inside the output is no error, every call
    x[0] = 2
    for _ in range(2):
        call()
        np.testing.assert_array_equal(y, [2, 1, 7, 3, 4])


def test_every_guard_zone_is_whole_and_every_output_64_byte_aligned():
    """Whatever address NumPy hands out, the output starts 64-byte aligned and both zones
    have their full size (8 spare bytes were too few for the alignment: the zone after the
    output came out short, and a write at its far end went past the buffer, unseen)."""
    from opforge.mindspore.op import _GuardedBuffer

    for size in [1, 5, 7, 16, 63, 64, 65, 300, 1000, 5000]:
        for _ in range(8):  # other addresses
            zone = _GuardedBuffer((size,), np.dtype(np.float32), "output")
            assert zone.body_address % 64 == 0
            assert zone.head_zone.size == zone.HEAD and zone.tail_zone.size == zone.tail, (
                f"a {size}-float output's zones are {zone.head_zone.size} and "
                f"{zone.tail_zone.size} bytes, not {zone.HEAD} and {zone.tail}")
            assert (zone.head_zone == zone.FILL).all() and (zone.tail_zone == zone.FILL).all()


def test_a_kernel_writing_less_on_a_later_call_leaves_zeros_not_the_earlier_output(cache):
    """Each call's output starts as zeros: what a call does not write is 0, never what an
    earlier call of the same kernel wrote there."""
    from opforge.mindspore import AotKernel, define
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:PrefixCustom", lambda x: x, lambda x: x))
    x, y = np.array([6, 5, 4, 3, 2, 1], np.float32), np.empty(6, np.float32)
    call, _ = kernel.bind((x, y))  # as the executor calls it: bound once, called again
    call()
    np.testing.assert_array_equal(y, [6, 5, 4, 3, 2, 1])
    x[:] = [2, 9, 9, 9, 9, 9]
    call()
    np.testing.assert_array_equal(y, [2, 9, 0, 0, 0, 0], err_msg="the earlier call's output "
                                  "showed through where this call wrote nothing")


def test_a_kernel_writing_past_its_workspace_is_a_kernel_error(cache):
    from opforge.errors import KernelError
    from opforge.mindspore import AotKernel, define
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:OverWorkspaceCustom", lambda x: x, lambda x: x))
    x = np.arange(10, dtype=np.float32)
    y = np.zeros_like(x)
    call, _ = kernel.bind((x, y))
    for _ in range(2):
        with pytest.raises(KernelError, match="past its end of workspace 0 "):
            call()
    assert not y.any()  # the results were discarded


def test_a_write_at_the_far_end_of_a_large_zone_is_caught_whatever_the_output_holds(cache):
    """Each call compares the zone before the output, the first 4 KiB of the zone after it
    and that zone's last 64 bytes (the whole zones only when one of those changed). An
    8 KiB output has an 8 KiB zone after it: a write at its far end is seen by the last
    comparison alone, even when the output's own last bytes hold the zones' fill pattern."""
    from opforge.errors import KernelError
    from opforge.mindspore import AotKernel, define
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:StrayCustom", lambda x: x, lambda x: x))
    n = 2048
    x = np.full(n, 0xA5, np.uint8).repeat(4).view(np.float32)  # the fill pattern, as floats
    x[0] = n + n - 1  # y's last float of the 8 KiB zone after it
    y = np.zeros(n, np.float32)
    with pytest.raises(KernelError, match="wrote at least 8192 byte"):
        kernel(x, y)
