"""AddressSanitizer for the cpu blob fuzzer's workers (``cpu_blob_fuzz.py --asan DIR``).

A blob that makes the engine read or write out of bounds does not always crash: the write
lands in some other allocation and a later, innocent case dies for it (or nothing ever
does). With ``--asan`` each worker starts with libasan preloaded and runs the engine's
sanitizer build (``OPFORGE_CPU_SANITIZE=1``: AddressSanitizer and UBSan, the build
tests/backends/test_cpu_sanitized.py runs; one cache entry for both), so the first bad
access or undefined operation aborts that very case, and the supervisor adds the
sanitizer's verdict (what, read or write, where in the engine) to the finding. The
supervisor compiles that build before it starts a worker (``engine.sanitized_library``):
a worker that compiled it itself, under libasan, took more than the 15 minutes its start
may take on a 2-core AMD EPYC.

ASan reserves terabytes of address space for its shadow memory, so the worker's RLIMIT_AS
is replaced by ASan's own limits (``hard_rss_limit_mb``, ``max_allocation_size_mb``,
with ``allocator_may_return_null`` so that an oversized allocation is an error the engine
reports, not an abort).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

# ASan's verdicts on an allocation over its limits: its operator new aborts where the
# uninstrumented one throws std::bad_alloc, which the engine catches and reports
OUT_OF_MEMORY = ("ASan: out-of-memory", "ASan: allocation-size-too-big", "ASan: allocator")


def runtime() -> str:
    """The compiler's libasan and libstdc++, to preload (Python itself is not instrumented;
    libstdc++ must be there before ASan looks for the __cxa_throw it intercepts)."""
    paths = []
    for lib in ("libasan.so", "libstdc++.so"):
        out = subprocess.run(["gcc", f"-print-file-name={lib}"], capture_output=True, text=True,
                             check=True).stdout.strip()
        paths.append(str(Path(out).resolve()))
    return " ".join(paths)


def environment(log_dir: Path) -> dict[str, str]:
    log_dir.mkdir(parents=True, exist_ok=True)
    options = ["detect_leaks=0", "abort_on_error=1", "allocator_may_return_null=1",
               "hard_rss_limit_mb=4096", "max_allocation_size_mb=4096",
               "detect_odr_violation=0", "handle_segv=0", f"log_path={log_dir / 'asan'}"]
    from opforge.backends.cpu.engine import SANITIZE_ENV

    return {"LD_PRELOAD": runtime(), "ASAN_OPTIONS": ":".join(options),
            "UBSAN_OPTIONS": f"print_stacktrace=1:halt_on_error=1:log_path={log_dir / 'asan'}",
            SANITIZE_ENV: "1"}


def verdict(log_dir: Path, pid: int) -> str | None:
    """UBSan's first runtime error, or ASan's one-line summary with the first engine frame,
    for worker ``pid``; None when neither wrote anything (the crash was not theirs)."""
    path = log_dir / f"asan.{pid}"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    ub = re.search(r"(\S+:\d+:\d+: runtime error: [^\n]*)", text)
    if ub:
        return "UBSan: " + ub.group(1)
    head = re.search(r"ERROR: AddressSanitizer: (\S+).*?\n(\S+ of size \d+)?", text)
    frame = re.search(r"#\d+ 0x[0-9a-f]+ in (\S+) (\S*opforge[^\s]*\.(?:cpp|h):\d+)", text)
    what = head.group(1) if head else "report"
    if head and head.group(2):
        what += f" {head.group(2)}"
    if frame:
        what += f" in {frame.group(1)} ({Path(frame.group(2)).name})"
    return f"ASan: {what}"
