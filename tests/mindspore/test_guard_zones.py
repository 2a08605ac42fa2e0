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
