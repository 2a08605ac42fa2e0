"""Hostile programs against native kernels: a clean error, never a crash or a write into
memory the program does not own (issue: programs are untrusted data).

Each program here is what a few changed bytes of a real exported program give: an output
operand pointing at a constant, an output smaller than the input, outputs larger than the
input. Needs a C++ compiler (skipped without one); no torch.
"""

import shutil

import numpy as np
import pytest

from opforge.errors import KernelError, ProgramError
from opforge.program import (
    ArenaStorage, ConstantStorage, IntValue, KernelCall, MemoryPlan, Method, Operator, Program,
    ScalarType, Segment, TensorValue, save, to_bytes,
)
from opforge.runtime import load
from opforge.runtime.native import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

F32 = ScalarType.FLOAT32


def _unary(op: str, input_shape, output_shape, *, output_constant=False) -> Program:
    """forward(x) -> y with one ``op`` instruction; y may be placed in a constant segment."""
    n_in = int(np.prod(input_shape)) * 4
    n_out = int(np.prod(output_shape)) * 4
    x = TensorValue(F32, tuple(input_shape), storage=ArenaStorage(0, 0))
    at = -(-n_in // 64) * 64
    storage = ConstantStorage(0, 0) if output_constant else ArenaStorage(0, at)
    y = TensorValue(F32, tuple(output_shape), storage=storage)
    segments = (Segment(np.full(max(n_out, 1) // 4, 7.0, np.float32)),) if output_constant else ()
    arena = at + (0 if output_constant else -(-n_out // 64) * 64)
    method = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                    (Operator(op, "out"),), MemoryPlan((max(arena, 64),)))
    return Program(methods=(method,), segments=segments)


def _minmax(input_shape, out_shape, dim) -> Program:
    n_in = int(np.prod(input_shape)) * 4
    n_out = -(-int(np.prod(out_shape)) * 4 // 64) * 64
    at = -(-n_in // 64) * 64
    values = (TensorValue(F32, tuple(input_shape), storage=ArenaStorage(0, 0)),
              IntValue(dim),
              TensorValue(F32, tuple(out_shape), storage=ArenaStorage(0, at)),
              TensorValue(F32, tuple(out_shape), storage=ArenaStorage(0, at + n_out)))
    method = Method("forward", values, (0,), (2, 3), (KernelCall(0, (0, 1, 2, 3)),),
                    (Operator("my_ops::minmax", "out"),), MemoryPlan((at + 2 * n_out,)))
    return Program(methods=(method,))


@pytest.mark.parametrize("op", ["my_ops::mul3", "my_ops::mul4"])
@pytest.mark.parametrize("source", ["path", "bytes", "program"])
def test_output_in_a_constant_is_refused_at_load(full, tmp_path, op, source):
    program = _unary(op, (4,), (4,), output_constant=True)
    data = to_bytes(program)
    frozen = bytes(data)
    if source == "path":
        save(program, tmp_path / "p.opf")
        given = tmp_path / "p.opf"
    else:
        given = data if source == "bytes" else program
    with pytest.raises(ProgramError, match="constant tensor, where the kernel writes"):
        load(given, kernels=[full.path])
    assert data == frozen  # the caller's bytes are untouched


def test_native_kernel_refuses_a_read_only_output(full):
    kernel = NativeLibrary(full.path).kernel("my_ops::mul3.out")
    x = np.arange(4, dtype=np.float32)
    out = np.zeros(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(KernelError, match="read-only array"):
        kernel(x, out)
    with pytest.raises(KernelError, match="read-only array"):
        kernel.bind((x, out))
    assert not out.any()
    backing = bytes(16)  # an immutable buffer: what a program loaded from bytes maps
    with pytest.raises(KernelError, match="read-only array"):
        kernel(x, np.frombuffer(backing, np.float32))
    assert backing == bytes(16)


@pytest.mark.parametrize("op", ["my_ops::mul3", "my_ops::mul4"])
@pytest.mark.parametrize("shapes", [((2**22,), (4,)), ((4,), (2**20,)), ((2, 3), (3, 2)),
                                    ((6,), (2, 3))])
def test_elementwise_output_of_another_shape_is_refused_before_the_kernel(full, op, shapes):
    # mul4's kernel takes no context and trusts its arguments: the generated glue checks the
    # default (elementwise) fake's rule before calling it.
    input_shape, output_shape = shapes
    forward = load(_unary(op, input_shape, output_shape), kernels=[full.path]).method("forward")
    x = np.ones(input_shape, np.float32)
    with pytest.raises(KernelError, match="first input's shape"):
        forward(x)
    kernel = NativeLibrary(full.path).kernel(f"{op}.out")
    out = np.zeros(output_shape, np.float32)
    with pytest.raises(KernelError, match="first input's shape"):
        kernel(x, out)
    assert not out.any()


def test_elementwise_output_of_another_dtype_is_refused(full):
    kernel = NativeLibrary(full.path).kernel("my_ops::mul4.out")
    with pytest.raises(KernelError, match="first input's dtype"):
        kernel(np.ones(8, np.float32), np.zeros(4, np.float64))


def test_elementwise_same_shape_still_runs(full):
    for op, factor in (("my_ops::mul3", 3), ("my_ops::mul4", 4)):
        forward = load(_unary(op, (5, 3), (5, 3)), kernels=[full.path]).method("forward")
        x = np.arange(15, dtype=np.float32).reshape(5, 3)
        np.testing.assert_array_equal(forward(x)[0], x * factor)


@pytest.mark.parametrize("input_shape, out_shape, dim", [
    ((2, 3), (100,), 0),      # outs larger than the input: the loop would read past it
    ((2, 3), (4,), 0),
    ((2, 3), (2,), 0),        # the right rank, the wrong extent
    ((4, 5, 6), (4, 7), 1),
    ((4, 5, 6), (5, 6), 1),
])
def test_minmax_outputs_of_the_wrong_shape_are_refused(full, input_shape, out_shape, dim):
    forward = load(_minmax(input_shape, out_shape, dim), kernels=[full.path]).method("forward")
    with pytest.raises(KernelError, match="input's shape without dim"):
        forward(np.ones(input_shape, np.float32))


def test_minmax_right_shape_runs(full):
    x = np.random.default_rng(0).standard_normal((4, 5, 6)).astype(np.float32)
    forward = load(_minmax((4, 5, 6), (4, 6), 1), kernels=[full.path]).method("forward")
    lo, hi = forward(x)
    np.testing.assert_array_equal(lo, x.min(1))
    np.testing.assert_array_equal(hi, x.max(1))


def test_a_fifo_as_a_kernel_library_is_refused_without_blocking(tmp_path):
    import os
    import subprocess
    import sys

    fifo = tmp_path / "lib.so"
    os.mkfifo(fifo)
    code = ("from opforge.runtime.native import NativeLibrary\n"
            f"NativeLibrary({str(fifo)!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert "BuildError" in done.stderr and "not a regular file" in done.stderr
