"""AddressSanitizer for the cpu blob fuzzer's workers (``cpu_blob_fuzz.py --asan DIR``).

A blob that makes the engine read or write out of bounds does not always crash: the write
lands in some other allocation and a later, innocent case dies for it (or nothing ever
does). With ``--asan`` each worker starts with libasan preloaded and builds the engine
with ``-fsanitize=address`` (``opforge.native.shared_library.compile_shared`` wrapped in
the worker only: the engine's own build code is unchanged and the instrumented library has
its own cache entry), so the first bad access aborts that very case, and the supervisor
adds ASan's verdict (what, read or write, where in the engine) to the finding.

ASan reserves terabytes of address space for its shadow memory, so the worker's RLIMIT_AS
is replaced by ASan's own limits (``hard_rss_limit_mb``, ``max_allocation_size_mb``,
with ``allocator_may_return_null`` so that an oversized allocation is an error the engine
reports, not an abort).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

FLAGS = ["-fsanitize=address", "-fno-omit-frame-pointer", "-g"]
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
    return {"LD_PRELOAD": runtime(), "ASAN_OPTIONS": ":".join(options)}


def instrument() -> None:
    """In a worker: build the engine library with ASan from now on."""
    import opforge.native.shared_library as shared

    original = shared.compile_shared

    def compile_shared(sources, name, *, flags, extra=None, **kwargs):
        if name.startswith("opforge_cpu"):
            flags = list(flags) + FLAGS
            extra = dict(extra or {}, sanitizer="address")
            name = name + "_asan"
        return original(sources, name, flags=flags, extra=extra, **kwargs)

    shared.compile_shared = compile_shared
    import opforge.backends.cpu.engine as engine

    if hasattr(engine, "installed_library"):  # an engine installed with the package: not it
        engine.installed_library = lambda: None


def verdict(log_dir: Path, pid: int) -> str | None:
    """ASan's one-line summary for worker ``pid``, with the first engine frame; None when
    it wrote nothing (the crash was not a bad access it saw)."""
    path = log_dir / f"asan.{pid}"
    if not path.exists():
        return None
    text = path.read_text(errors="replace")
    head = re.search(r"ERROR: AddressSanitizer: (\S+).*?\n(\S+ of size \d+)?", text)
    frame = re.search(r"#\d+ 0x[0-9a-f]+ in (\S+) (\S*opforge[^\s]*\.(?:cpp|h):\d+)", text)
    what = head.group(1) if head else "report"
    if head and head.group(2):
        what += f" {head.group(2)}"
    if frame:
        what += f" in {frame.group(1)} ({Path(frame.group(2)).name})"
    return f"ASan: {what}"
