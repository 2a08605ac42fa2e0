"""A native kernel that crashes the process names itself before the process dies.

Python's faulthandler (turned on when a kernel library loads) prints each thread's stack;
the frame that enters a native kernel carries the op, the kernel symbol, the manifest
entry and, from the executor, the method and instruction, with the library as its file.
Each crash runs in a child process. Needs a C++ compiler; no torch.
"""

import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from opforge.native import build_library
from opforge.manifest import parse_manifest

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

MANIFEST = """
- func: crash_ops::segv.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::segv_out_impl
- func: crash_ops::abort.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::abort_out_impl
"""
SOURCE = """
#include <cstdlib>
#include "opforge/kernel.h"
namespace custom { namespace native {
opforge::Tensor& segv_out_impl(const opforge::Tensor& input, opforge::Tensor& output) {
  volatile float* p = nullptr;
  if (input.numel() > 0) *p = 1.0f;  // a null write: SIGSEGV
  return output;
}
opforge::Tensor& abort_out_impl(const opforge::Tensor& input, opforge::Tensor& output) {
  if (input.numel() > 0) std::abort();  // what "double free or corruption" ends in
  return output;
}
}}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    root = tmp_path_factory.mktemp("crash")
    (root / "crash.cpp").write_text(SOURCE)
    cache = tmp_path_factory.getbasetemp() / "opforge-cache"
    return str(build_library(parse_manifest(MANIFEST, "crash_ops.yaml"), [root / "crash.cpp"],
                             root / "libcrash.so", cache_root=cache).path)


PROGRAM_RUN = """
import numpy as np
from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator,
                             Program, ScalarType, TensorValue)
from opforge.runtime import load
f32 = ScalarType.FLOAT32
x = TensorValue(f32, (4,), storage=ArenaStorage(0, 0))
y = TensorValue(f32, (4,), storage=ArenaStorage(0, 64))
method = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                (Operator("crash_ops::{op}", "out"),), MemoryPlan((128,)))
forward = load(Program(methods=(method,)), kernels=[{library!r}]).method("forward")
forward(np.ones(4, np.float32))
"""

DIRECT_CALL = """
import numpy as np
from opforge.runtime.native import NativeLibrary
kernel = NativeLibrary({library!r}).kernel("crash_ops::{op}.out")
kernel(np.ones(4, np.float32), np.zeros(4, np.float32))
"""


def _crash(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("op, sig", [("segv", signal.SIGSEGV), ("abort", signal.SIGABRT)])
def test_a_crash_inside_a_program_names_op_kernel_instruction_and_library(library, op, sig):
    done = _crash(PROGRAM_RUN.format(op=op, library=library))
    assert done.returncode == -sig, done.stderr
    report = done.stderr
    assert f"native kernel custom::native::{op}_out_impl for crash_ops::{op}.out" in report
    assert "instruction 0 of method 'forward'" in report
    assert library in report


def test_a_crash_in_a_direct_call_names_the_kernel(library):
    done = _crash(DIRECT_CALL.format(op="segv", library=library))
    assert done.returncode == -signal.SIGSEGV
    assert "native kernel custom::native::segv_out_impl for crash_ops::segv.out" in done.stderr


def test_crash_reports_can_be_turned_off(library):
    import os

    env = dict(os.environ, OPFORGE_FAULTHANDLER="0")
    done = subprocess.run([sys.executable, "-c", DIRECT_CALL.format(op="segv", library=library)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == -signal.SIGSEGV
    assert "native kernel" not in done.stderr
