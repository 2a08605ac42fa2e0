"""The engine's x86 code stays optional: every source of the cpu engine that uses x86
intrinsics or CPU-feature checks compiles for aarch64 (docs/backend-cpu.md "aarch64"), so
each vector kernel keeps its build-time guard and its plain or oneDNN path. Syntax only,
with the cross compiler (skipped, saying so, without it) and the x86 oneDNN wheel's
headers (the same API on every CPU). scripts/engine_aarch64.py builds and runs the whole
engine on aarch64 under qemu; this is the quick check of the same property."""

from __future__ import annotations

import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from opforge.backends.cpu import engine_build

CROSS = "aarch64-linux-gnu-g++"
# what only compiles for x86: the intrinsics headers and the CPU-feature builtins
X86 = re.compile(rb"immintrin\.h|x86intrin\.h|__builtin_cpu_supports|_mm(512|256)?_")


def _x86_sources():
    return [p for p in engine_build.source_files() if p.suffix == ".cpp" and X86.search(p.read_bytes())]


@pytest.mark.slow
def test_engine_sources_with_x86_code_compile_for_aarch64():
    if shutil.which(CROSS) is None:
        pytest.skip(f"{CROSS} is not on PATH (scripts/setup-cross.sh installs it)")
    prefix = engine_build.find_onednn(headers=True)
    if prefix is None:
        pytest.skip("oneDNN's headers (the onednn-devel-cpu-gomp wheel) are not installed")
    sources = _x86_sources()
    assert len(sources) >= 10  # the vector kernels (a broken pattern would pass vacuously)
    flags = ["-std=c++17", "-fopenmp", "-fsyntax-only", f"-I{prefix / 'include'}",
             *(f"-I{d}" for d in engine_build.include_dirs())]

    def compile_one(path):
        proc = subprocess.run([CROSS, *flags, str(path)], capture_output=True, text=True)
        return path.name, proc.returncode, proc.stderr

    with ThreadPoolExecutor(2) as pool:
        failed = [(name, err) for name, rc, err in pool.map(compile_one, sources) if rc != 0]
    assert not failed, "\n".join(f"{name}:\n{err[-1500:]}" for name, err in failed)
