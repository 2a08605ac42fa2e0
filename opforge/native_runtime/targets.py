"""Cross-compilation targets: the machines the native runtime, kernel libraries and bundles
can be built for besides the build machine itself.

    target name → its CMake toolchain file (cmake/<name>.cmake) → the cross compiler found on
    PATH (part of every cache key) → the build report: which kernels take another path on the
    target than on x86-64, and which of those are slower

One target today, ``aarch64-linux-gnu`` (64-bit ARM Linux with glibc; Debian's
``g++-aarch64-linux-gnu``, run under ``qemu-aarch64`` on x86-64: docs/arm.md).

# The build report
#
# The runtime's kernels are portable C++; a few x86-64 loops are written with intrinsics or
# compiled per instruction set and picked at run time. Each such place has a portable path the
# preprocessor chooses on other targets. ``FALLBACKS`` lists them, so that no kernel falls
# back to a slower path silently: the runtime's and the bundle's build report print the
# target's rows, and a test checks that every source file holding x86-only code is listed.

>>> from opforge.native_runtime.targets import find_target      # doctest: +SKIP
>>> find_target("aarch64-linux-gnu").emulator()                  # doctest: +SKIP
['/usr/bin/qemu-aarch64', '-L', '/usr/aarch64-linux-gnu']
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from opforge.errors import BuildError
from opforge.native.cache import file_sha256

__all__ = ["FALLBACKS", "Fallback", "TARGETS", "Target", "find_target", "report_lines"]

_CMAKE_DIR = Path(__file__).resolve().parent / "cmake"


@dataclass(frozen=True)
class Fallback:
    """One place whose x86-64 path the target replaces: the source file (relative to
    opforge/native_runtime), what x86-64 runs, what the target runs, and whether that is
    slower than the target could do with its own intrinsics."""

    source: str
    x86_64: str
    portable: str
    slower: bool

    def line(self) -> str:
        mark = "SLOWER" if self.slower else "same width"
        return f"[{mark}] {self.source}: {self.portable} (x86-64: {self.x86_64})"


FALLBACKS = (
    Fallback("kernels/gemm.cpp", "AVX-512 8x32 or AVX2 6x16 float tiles picked at run time",
             "one 16-byte-vector copy (NEON through GCC vector extensions, 6x8 float tiles)",
             False),
    Fallback("kernels/vector_math.cpp", "softmax/norm loops in AVX-512 or AVX2 copies",
             "one 16-byte-vector copy (NEON through GCC vector extensions)", False),
    Fallback("kernels/elementwise.h", "hot loops cloned for avx512f/avx2/default (target_clones)",
             "hot loops compiled once for the ARMv8-A baseline (NEON by auto-vectorization)",
             False),
    Fallback("kernels/copy.cpp", "4-byte transposes as SSE 4x4 register transposes",
             "4-byte transposes as a scalar 16x16-tiled loop", True),
    Fallback("kernels/ops/quantized_common.h", "float32 -> 8-bit quantize 16 values at a time (SSE2)",
             "float32 -> 8-bit quantize in the branchless loop GCC vectorizes (NEON on aarch64)", True),
    Fallback("src/thread_pool.cpp", "spin-wait with the x86 pause hint",
             "spin-wait without a hint", False),
)


@dataclass(frozen=True)
class Target:
    """A cross target: its name (a GNU triplet), the prefix of its compiler driver, the
    sysroot holding its C library, and the emulator that runs its binaries here."""

    name: str
    prefix: str
    sysroot: Path
    emulator_name: str

    @property
    def toolchain_file(self) -> Path:
        return _CMAKE_DIR / f"{self.name}.cmake"

    def compiler(self) -> str:
        """The C++ cross compiler's path; ``BuildError`` naming the package when absent."""
        found = shutil.which(self.prefix + "g++")
        if found is None:
            raise BuildError(f"target {self.name}: the cross compiler {self.prefix}g++ — not on "
                             f"PATH — valid: Debian/Ubuntu's g++-{self.name.replace('_', '-')} — "
                             "fix: run scripts/setup-cross.sh (or apt-get install "
                             f"g++-{self.name.replace('_', '-')})")
        return found

    def tool(self, name: str) -> str | None:
        """A binutils program of the target (``strip``, ``nm``, ``readelf``) or None."""
        return shutil.which(self.prefix + name)

    def emulator(self) -> list[str] | None:
        """The command prefix that runs a target binary here, or None without qemu."""
        found = shutil.which(self.emulator_name)
        return [found, "-L", str(self.sysroot)] if found else None

    def missing(self) -> str | None:
        """Why binaries for this target cannot be built and run here (None: they can)."""
        lacking = [p for p in (self.prefix + "g++", self.prefix + "gcc", self.emulator_name)
                   if shutil.which(p) is None]
        if not self.sysroot.is_dir():
            lacking.append(str(self.sysroot))
        if lacking:
            return (f"{', '.join(lacking)} not installed (Debian: apt-get install "
                    "g++-aarch64-linux-gnu qemu-user; scripts/setup-cross.sh does it)")
        return None

    def identity(self) -> dict:
        """What of the target affects build outputs (for cache keys)."""
        from opforge.native.toolchain import find_toolchain

        return {"target": self.name, "cxx": find_toolchain(self.compiler()).identity(),
                "toolchain_file": file_sha256(self.toolchain_file),
                "report": [f.line() for f in self.fallbacks()]}  # written beside the outputs

    def fallbacks(self) -> tuple[Fallback, ...]:
        return FALLBACKS


TARGETS = {
    "aarch64-linux-gnu": Target("aarch64-linux-gnu", "aarch64-linux-gnu-",
                                Path("/usr/aarch64-linux-gnu"), "qemu-aarch64"),
}


def find_target(name: str, api: str = "opforge") -> Target:
    """The target called ``name``; ``BuildError`` listing the valid ones otherwise."""
    if name not in TARGETS:
        raise BuildError(f"`{api}`: target {name!r} — unknown — valid: {', '.join(TARGETS)} "
                         "(or none: the build machine) — fix: pass one of those to --target")
    return TARGETS[name]


def report_lines(target: Target | None) -> list[str]:
    """The build report's lines: the target and each kernel path it takes instead of the
    x86-64 one (the slower ones marked)."""
    if target is None:
        return ["target: the build machine (x86-64 paths picked at run time where it is x86-64)"]
    lines = [f"target: {target.name} (toolchain file {target.toolchain_file.name})"]
    lines += [f.line() for f in target.fallbacks()]
    slower = [f.source for f in target.fallbacks() if f.slower]
    if slower:
        lines.append(f"slower than on x86-64 for lack of a NEON path: {', '.join(slower)}")
    return lines
