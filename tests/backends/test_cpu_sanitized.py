"""The cpu engine built with AddressSanitizer and UndefinedBehaviorSanitizer
(OPFORGE_CPU_SANITIZE=1, a separate build-cache entry), running the hostile plans of
test_cpu_hostile_plans.py and normal plans of every op family, and the state and indexing
plans of test_cpu_state_plans.py, the RMS norm and rotary plans of test_cpu_rms_norm.py and
test_cpu_rope.py, and the broadcast matmul plans of test_cpu_matmul_broadcast_plans.py, in
child processes.

Python is not built with ASan, so the child preloads the compiler's libasan (ASan must be
the first library loaded). A sanitizer report aborts the child, which fails the test with
the report. Skipped only when the compiler has no sanitizer runtime.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from opforge.backends.cpu import engine as cpu_engine

HERE = Path(__file__).resolve().parent


def runtime_library(name: str) -> str | None:
    """The path of one of the compiler's runtime libraries, or None when it has none."""
    if cpu_engine.missing() is not None:
        return None
    from opforge.native.toolchain import find_toolchain

    try:
        out = subprocess.run([find_toolchain().cxx, f"-print-file-name={name}"],
                             capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return str(Path(out).resolve()) if os.path.isabs(out) and os.path.exists(out) else None


LIBASAN = runtime_library("libasan.so")
# preloaded after libasan: ASan intercepts C++ exceptions (__cxa_throw), and finds the real
# one only if libstdc++ is loaded when ASan starts (CPython does not link it)
LIBSTDCXX = runtime_library("libstdc++.so")
pytestmark = pytest.mark.skipif(LIBASAN is None, reason="no ASan runtime (libasan.so) for the "
                                "compiler, or no cpu backend")


def sanitized_env() -> dict:
    cpu_engine.sanitized_library()  # compiled here, not inside a child's time limit
    env = dict(os.environ)
    env.update({
        cpu_engine.SANITIZE_ENV: "1",
        "LD_PRELOAD": ":".join(lib for lib in (LIBASAN, LIBSTDCXX) if lib),
        # CPython and NumPy keep allocations alive at exit: leaks are not what this checks
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
        "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
    })
    return env


def _run_clean(module: str, names=None) -> None:
    """A case file's cases (all, or ``names``) in a sanitized child: no sanitizer report,
    and every case's outcome the file expects."""
    import importlib
    import sys

    sys.path.insert(0, str(HERE))
    import test_cpu_hostile_plans as hostile

    cases = importlib.import_module(module)
    names = list(cases.CASES) if names is None else names
    proc = hostile.run_case_file(cases.__file__, names, env=sanitized_env(), timeout=900)
    for report in ("AddressSanitizer", "runtime error:", "UndefinedBehaviorSanitizer"):
        assert report not in proc.stderr, proc.stderr[-6000:]
    hostile.check_output(names, proc, cases.EXPECT)


def test_hostile_and_normal_plans_run_clean_under_asan_and_ubsan():
    import sys

    sys.path.insert(0, str(HERE))
    import test_cpu_hostile_plans as cases

    # the torch export (call_after_close) and RSS measurement stay in the plain run
    _run_clean("test_cpu_hostile_plans", [
        n for n in cases.NORMAL + cases.HOSTILE
        if n not in ("call_after_close", "stride0_weight_memory")])


@pytest.mark.parametrize("module", ["test_cpu_state_plans", "test_cpu_rms_norm", "test_cpu_rope",
                                    "test_cpu_matmul_broadcast_plans", "test_cpu_qdepthwise",
                                    "test_cpu_copy_walks", "test_cpu_quantize_rows",
                                    "test_cpu_small_matmul", "test_cpu_matmul_avx2", "test_cpu_int_matmul16",
                                    "test_cpu_winograd", "test_cpu_depthwise", "test_cpu_small_conv"])
def test_case_file_plans_run_clean_under_asan_and_ubsan(module):
    _run_clean(module)


_FILE_CHILD = """
import sys, numpy as np
from opforge.runtime import load
forward = load(sys.argv[1]).method("forward")
ids = np.array([0, 4095, 17, 2048, 4095], np.int64)
got = forward(ids)[0]
np.save(sys.argv[2], got)
try:
    forward(np.array([4096], np.int64))
except Exception as e:
    print("refused:", type(e).__name__)
"""


def test_constants_read_from_the_program_file_run_clean(tmp_path):
    """The engine's reads of a program file (an embedding table's rows with pread, a large
    weight reordered in chunks whose pages are dropped) under ASan and UBSan, with an index
    one past the table refused; the rows and products eager's."""
    import sys

    import numpy as np
    import torch
    from torch import nn

    from opforge.export import export
    from opforge.program import save

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(4096, 1024), nn.Linear(1024, 4096)).eval()  # 16+16 MiB
    ids = torch.tensor([0, 4095, 17, 2048, 4095])
    path = tmp_path / "model.opf"
    save(export(model, (ids,), backends=["cpu"]), path)
    proc = subprocess.run([sys.executable, "-c", _FILE_CHILD, str(path), str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=900, env=sanitized_env())
    for report in ("AddressSanitizer", "runtime error:", "UndefinedBehaviorSanitizer"):
        assert report not in proc.stderr, proc.stderr[-6000:]
    assert proc.returncode == 0 and "refused:" in proc.stdout, proc.stderr[-3000:]
    with torch.no_grad():
        want = model.double()(ids).numpy()
    # float32 sums of 1024 products: rtol 1e-4 is far below a misplaced row or block
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)
