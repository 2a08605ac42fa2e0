"""Calls whose arrays are not what the kernel takes as they are: dtypes no reg_info row has
run on a row they convert to (as MindSpore inserts Casts), the inputs converted in and the
results converted back, whether the arrays are contiguous or not; a workspace is passed as
uint8 after the tensors."""

import numpy as np
import pytest

from mindspore_support import KERNELS, needs_cxx
from opforge.mindspore import AotKernel, define

pytestmark = needs_cxx

F32_ONLY = {"op_name": "AddCustom", "inputs": ["x", "y"], "outputs": ["z"],
            "dtype_format": [[["float32", "DefaultFormat"]] * 3]}


@pytest.mark.parametrize("layout", ["contiguous", "strided"])
def test_float16_arrays_run_on_a_float32_only_kernel_converted_both_ways(add_lib, layout):
    kernel = AotKernel(define(f"{add_lib}:AddCustom", reg_info=F32_ONLY))
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 6)) * 10).astype(np.float16)
    y = (rng.standard_normal((4, 6)) * 10).astype(np.float16)
    z = np.zeros((4, 6), np.float16)
    if layout == "strided":
        x, y = np.repeat(x, 2, axis=1)[:, ::2], y.T.copy().T
    call, _ = kernel.bind((x, y, z))
    for _ in range(2):
        call()
        want = (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16)
        np.testing.assert_array_equal(z, want, err_msg=f"float16 {layout} arrays through the "
                                      "float32 kernel: not converted in, or not back")


def test_a_workspace_is_passed_as_uint8_after_the_tensors(cache):
    from opforge.mindspore.compile import compile_library

    lib = compile_library([KERNELS / "bad_writes.cc"], "bad_writes", cache_root=cache)
    kernel = AotKernel(define(f"{lib}:WorkspaceDtypesCustom", lambda x: x, lambda x: x))
    x = np.arange(5, dtype=np.float32)
    y = np.zeros_like(x)
    kernel(x, y)  # status 3 (a KernelError) unless the dtypes are float32, float32, uint8
    np.testing.assert_array_equal(y, x)
