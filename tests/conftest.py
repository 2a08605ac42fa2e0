"""Shared test fixtures. Tests are split by what they need: pure/ (NumPy only), torch/,
native/ (a C++ compiler)."""

import os
import subprocess
import sys
import textwrap
import tracemalloc

import numpy as np
import pytest
import threadpoolctl

# Prepended to code run by `python_without_torch`: `import torch` fails, as on a device
# that has only NumPy (the lean runtime's promise).
_BLOCK_TORCH = textwrap.dedent("""
    import sys
    class _NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError("torch is not installed here")
            return None
    sys.meta_path.insert(0, _NoTorch())
""")


@pytest.fixture
def python_without_torch():
    """``run(code) -> CompletedProcess``: run ``code`` in a fresh interpreter where
    importing torch raises ImportError; the code should itself assert what it needs."""

    def run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        source = _BLOCK_TORCH + textwrap.dedent(code)
        return subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                              timeout=timeout)

    return run


# Not the calls' allocations: the measurement's own (tracemalloc's snapshots, this file's
# loop), and threadpoolctl's symbol names. threadpoolctl looks each get/set function up by
# a freshly built name, and CPython's type attribute cache keeps the last names looked up
# (a bounded cache, not a leak: 30,000 calls hold the same ~10 KB as 20).
_NOT_THE_CALLS = (tracemalloc.Filter(False, tracemalloc.__file__),
                  tracemalloc.Filter(False, __file__),
                  tracemalloc.Filter(False, threadpoolctl.__file__))


def _traced(call, repeats: int) -> tuple[int, int]:
    call()  # warm: lazily built tables and caches
    old = np.setbufsize(1024)  # a cast's buffer should not look like an array
    tracemalloc.start()
    try:
        start = tracemalloc.take_snapshot().filter_traces(_NOT_THE_CALLS)
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        for _ in range(repeats):
            call()
        _, peak = tracemalloc.get_traced_memory()
        end = tracemalloc.take_snapshot().filter_traces(_NOT_THE_CALLS)
    finally:
        tracemalloc.stop()
        np.setbufsize(old)
    retained = sum(stat.size_diff for stat in end.compare_to(start, "filename"))
    return peak - before, retained


@pytest.fixture
def allocations():
    """``measure(call, repeats=20) -> (peak, retained)``: the bytes tracemalloc saw
    allocated at the peak, and still held, over ``repeats`` calls after a warm-up call.

    tracemalloc counts every thread of the process, and a pytest-xdist worker's I/O thread
    allocates whenever it talks to the controller; so the measurement is taken up to three
    times and the cleanest is returned. An allocation the calls make shows in every try."""

    def measure(call, repeats: int = 20) -> tuple[int, int]:
        tries = []
        for _ in range(3):
            tries.append(_traced(call, repeats))
            if tries[-1][0] <= 512 and tries[-1][1] <= 0:
                break
        return min(tries)

    return measure


@pytest.fixture
def umask():
    """``set(mask)``: set the process umask for this test (restored afterwards)."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)
