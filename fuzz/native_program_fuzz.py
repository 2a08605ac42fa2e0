"""Fuzzer for the native program reader and verifier (opf_program_verify), under ASan+UBSan.

    python fuzz/native_program_fuzz.py --count 20000             # fixed seed
    python fuzz/native_program_fuzz.py --count 100000 --seed 3 --crash-dir /tmp/crashes

Inputs come from fuzz/program_fuzz.py's mutators (structure-aware rewrites of indices, size
expressions, growing symbols, the debug table and named data, plus byte-level truncations,
flips, interesting integers and header rewrites, 80% resealed so they reach the parser),
and 5% character-level edits of the debug table's JSON text (the native JSON reader).
Each input goes to the sanitizer build of the runtime and to ``opforge.program.from_bytes``;
findings: a crash (ASan/UBSan report or any signal), a hang (no answer within --timeout
seconds), a leak (LeakSanitizer at a driver's exit), a disagreement (one reader accepts
what the other refuses), or a status other than OPF_OK / OPF_ERR_PROGRAM. Counted apart,
not a finding: a file Python accepts whose size expression leaves int64 at an inner node,
which the native verifier refuses by design (``intermediate_overflow``).

Why a driver executable rather than the .so under LD_PRELOAD=libasan in Python: the driver
is linked with the sanitizers from the start, so no interposition order or Python allocator
noise muddles ASan's reports, LeakSanitizer sees only the runtime's allocations, and a crash
kills a small process that is restarted, not the fuzzer. It reads length-prefixed cases on
stdin and answers one line per case, so thousands of cases cost one process each batch
(``--batch``; leaks are reported at a batch's exit: rerun with ``--batch 1`` to pin one).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import os
import random
import select
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "fuzz"))

import opforge.program as P  # noqa: E402
from opforge.errors import ProgramError  # noqa: E402

import program_fuzz as PF  # noqa: E402

OPF_OK, OPF_ERR_PROGRAM = 0, 3

DRIVER = r"""
// Reads cases (u32 little-endian length, then the bytes) from stdin until EOF and answers
// each with one line: the opf_program_verify status, a tab, the last error's first line.
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>
#include "opforge/runtime.h"

int main() {
  std::vector<unsigned char> buf;
  for (;;) {
    unsigned char head[4];
    if (std::fread(head, 1, 4, stdin) != 4) return 0;
    uint32_t n = uint32_t(head[0]) | uint32_t(head[1]) << 8 | uint32_t(head[2]) << 16 |
                 uint32_t(head[3]) << 24;
    // an exact-size heap copy: ASan sees any read past the end of the case
    std::vector<unsigned char> data(n);
    if (n && std::fread(data.data(), 1, n, stdin) != n) return 2;
    opf_status rc = opf_program_verify(n ? data.data() : nullptr, n);
    std::string message = opf_last_error();
    for (char& c : message) if (c == '\n' || c == '\r') c = ' ';
    if (message.size() > 300) message.resize(300);
    std::printf("%d\t%s\n", int(rc), message.c_str());
    std::fflush(stdout);
  }
}
"""


_JSON_PIECES = ['"', '\\', '\\u', '\\ud83d', '\\ude00', '\\u00e9', 'é', '😀', '\x00', '\x1f',
                '1e5', '1.0', '-0', '01', '1.', 'NaN', 'Infinity', '-Infinity', 'true', 'null',
                '[', ']', '{', '}', ',', ':', ' ', '\n', '9' * 30, '4294967296', '\ufeff']


def _json_text_mutation(rng: random.Random) -> bytes:
    """Character-level edits of the debug table's JSON text (the native JSON reader against
    Python's json), deep nesting included."""
    import dataclasses

    from opforge.program._sample import unverified_bytes

    program = PF.debug_program()
    text = list(dict(program.user_metadata)["opforge.debug"])
    for _ in range(rng.randint(1, 3)):
        k = rng.randrange(len(text) + 1)
        piece = rng.choice(_JSON_PIECES) if rng.random() < 0.7 else chr(rng.randrange(32, 127))
        r = rng.random()
        if r < 0.3 and text:
            del text[k % len(text)]
        elif r < 0.7:
            text.insert(k, piece)
        elif text:
            text[k % len(text)] = piece
    out = "".join(text)
    if rng.random() < 0.05:
        depth = rng.choice([10, 300, 511])
        out = out.replace('"version":1', '"version":1,"x":' + "[" * depth + "]" * depth)
    meta = tuple((k, out if k == "opforge.debug" else v) for k, v in program.user_metadata)
    return unverified_bytes(dataclasses.replace(program, user_metadata=meta))


def mutate(rng: random.Random, corpus: list[bytes]) -> bytes:
    """program_fuzz's mutations, and 5% character-level debug-table JSON edits."""
    if rng.random() < 0.05:
        return _json_text_mutation(rng)
    return PF.mutate(rng, corpus)


def build_driver() -> Path:
    """The driver linked against the ASan+UBSan static runtime (cached by content)."""
    from opforge.native_runtime.build import build_runtime

    built = build_runtime(sanitize=True)
    lib = Path(built.static_library)
    include = ROOT / "opforge" / "native_runtime" / "include"
    abi = ROOT / "opforge" / "native" / "include"
    key = hashlib.sha256(DRIVER.encode() + lib.read_bytes()).hexdigest()[:16]
    out_dir = lib.parent / "verify-fuzz"
    exe = out_dir / f"opforge-verify-driver-{key}"
    if not exe.exists():
        out_dir.mkdir(parents=True, exist_ok=True)
        src = out_dir / f"driver-{key}.cpp"
        src.write_text(DRIVER)
        tmp = exe.with_suffix(".tmp")
        subprocess.run(["g++", "-std=c++17", "-O1", "-g", "-fsanitize=address,undefined",
                        "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
                        f"-I{include}", f"-I{abi}", str(src), str(lib), "-lpthread", "-ldl",
                        "-o", str(tmp)], check=True)
        os.replace(tmp, exe)
    return exe


class Driver:
    """One running driver process: send a case, read its answer within a deadline."""

    def __init__(self, exe: Path) -> None:
        env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0:exitcode=86",
                   UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:exitcode=87")
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env)
        self.pending = b""

    def ask_many(self, cases: list[bytes], timeout: float) -> list[tuple[str, int, str, float]]:
        """An answer per case, ('ok', status, message, seconds since the previous answer),
        until the driver dies ('dead') or
        gives no answer within ``timeout`` seconds of the previous one ('hang'): that
        answer is the last. The cases are written while the answers are read (select on
        both pipes), so neither side waits on a full pipe, and one exchange costs the two
        processes one wake-up each per batch, not per case."""
        out = memoryview(b"".join(struct.pack("<I", len(d)) + d for d in cases))
        stdin, stdout = self.proc.stdin.fileno(), self.proc.stdout.fileno()
        os.set_blocking(stdin, False)
        answers: list[tuple[str, int, str, float]] = []
        last = time.monotonic()
        deadline = last + timeout
        while len(answers) < len(cases):
            while b"\n" in self.pending and len(answers) < len(cases):
                line, self.pending = self.pending.split(b"\n", 1)
                rc, _, message = line.decode("utf-8", "replace").partition("\t")
                now = time.monotonic()
                answers.append(("ok", int(rc), message, now - last))
                last, deadline = now, now + timeout
            if len(answers) == len(cases):
                break
            left = deadline - time.monotonic()
            if left <= 0:
                answers.append(("hang", -1, "", timeout))
                break
            readable, writable, _ = select.select([stdout], [stdin] if out else [], [], left)
            if writable:
                try:
                    out = out[os.write(stdin, out[:65536]):]
                except BrokenPipeError:
                    out = memoryview(b"")
            if readable:
                chunk = os.read(stdout, 65536)
                if not chunk:
                    answers.append(("dead", -1, "", time.monotonic() - last))
                    break
                self.pending += chunk
        return answers

    def close(self) -> tuple[int, str]:
        """Exit status and stderr (LeakSanitizer reports at exit)."""
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass
        self.proc.stdin = None  # closed: communicate() must not flush it
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err.decode("utf-8", "replace")


def python_accepts(data: bytes) -> tuple[bool, str]:
    try:
        P.from_bytes(data)
        return True, ""
    except ProgramError as e:
        return False, str(e)


def intermediate_overflow(data: bytes) -> bool:
    """Whether a program Python accepts has a size expression whose interval leaves int64 at
    an inner node: the native verifier refuses it on purpose (what it accepts evaluates in
    int64 without overflow), Python's big ints check only the final bounds. The one
    disagreement the fuzzer reaches that is by design."""
    program = P.from_bytes(data)
    for method in program.methods:
        ranges = {s.name: (s.min, s.max) for s in method.symbols}
        stack = [e for sv in method.symbolic_values for e in sv.exprs]
        stack += [e for g in method.guards for e in (g.lhs, g.rhs)]
        while stack:
            node = stack.pop()
            if node.op in ("int", "sym"):
                continue
            stack.extend(node.args)
            low, high = node.bounds(ranges)
            if low < -(2**63) or high > 2**63 - 1:
                return True
    return False


def _subject(message: str) -> str:
    return message.split("`: ", 1)[-1].split(" — ")[0]


def run(count: int, seed: int = 0, crash_dir: Path | None = None, batch: int = 2000,
        timeout: float = 10.0, verbose: bool = False, start_at: int = 0,
        exchange: int = 64) -> dict:
    """Fuzz cases ``start_at`` .. ``start_at + count - 1`` of seed ``seed`` (case n is the
    n-th draw), ``exchange`` of them per write to the driver; the report as a dict (the
    test and main print it)."""
    exe = build_driver()
    rng = random.Random(seed)
    corpus = PF.seeds()
    crash_dir = Path(crash_dir) if crash_dir else None
    report = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    findings: list[str] = []
    slowest = (0.0, -1)
    driver, in_batch = Driver(exe), 0
    start = time.perf_counter()

    def save(kind: str, n: int, data: bytes, detail: str) -> None:
        findings.append(f"{kind} at case {n}: {detail[:400]}")
        if crash_dir:
            crash_dir.mkdir(parents=True, exist_ok=True)
            (crash_dir / f"{kind}-{seed}-{n}.opf").write_bytes(data)

    def finish(d: Driver, n: int, data: bytes | None) -> None:
        rc, err = d.close()
        if "LeakSanitizer" in err:
            report["leaks"] += 1
            findings.append(f"leak in the batch ending at case {n}: {err[-1500:]}")
        elif rc not in (0, None) and data is not None:
            kind = "crash"
            report["crashes"] += 1
            save(kind, n, data, err[-3000:] or f"exit status {rc}")
        elif rc not in (0, None):
            report["crashes"] += 1
            findings.append(f"driver exit {rc} at a batch end: {err[-1500:]}")

    def check(n: int, data: bytes, state: str, rc: int, message: str,
              elapsed: float) -> None:
        """One answer: counted, saved if a finding; a new driver after a crash or a hang,
        and after ``batch`` cases (LeakSanitizer reports at a driver's exit)."""
        nonlocal slowest, driver, in_batch
        if elapsed > slowest[0]:
            slowest = (elapsed, n)
        report["cases"] += 1
        if state != "ok":
            if state == "hang":
                report["hangs"] += 1
                save("hang", n, data, f"no answer within {timeout} s")
                driver.proc.kill()
                finish(driver, n, None)
            else:
                finish(driver, n, data)
            driver, in_batch = Driver(exe), 0
            return
        ok, expected = python_accepts(data)
        if rc not in (OPF_OK, OPF_ERR_PROGRAM):
            report["bad_status"] += 1
            save("status", n, data, f"status {rc}: {message}")
        elif ok and rc == OPF_ERR_PROGRAM and intermediate_overflow(data):
            report["by_design_int64_bounds"] += 1
        elif ok != (rc == OPF_OK):
            report["disagreements"] += 1
            save("disagree", n, data, f"python {'accepts' if ok else expected!r}; native "
                 f"{'accepts' if rc == OPF_OK else message!r}")
        else:
            report["accepted" if ok else "refused"] += 1
            if not ok:
                report["same_subject"] += _subject(message) == _subject(expected)
                reasons[_subject(message)[:50]] += 1
        in_batch += 1
        if in_batch >= batch:
            finish(driver, n, None)
            driver, in_batch = Driver(exe), 0
        if verbose and (n + 1) % 5000 == 0:
            print(f"  {n + 1} cases, {dict(report)}", flush=True)

    for _ in range(start_at):  # chunks and --only: the same draws, skipped
        mutate(rng, corpus)
    queue: list[tuple[int, bytes]] = []
    n, end = start_at, start_at + count
    while n < end or queue:
        while len(queue) < exchange and n < end:
            queue.append((n, mutate(rng, corpus)))
            n += 1
        # never past the driver's last case (its leak check at exit)
        group = queue[:max(1, min(exchange, batch - in_batch))]
        answers = driver.ask_many([data for _, data in group], timeout)
        for (m, data), answer in zip(group, answers):
            check(m, data, *answer)
        queue = queue[len(answers):]  # after a crash or a hang: the rest asked again
    finish(driver, end, None)
    out = {k: report[k] for k in ("cases", "accepted", "refused", "same_subject",
                                  "by_design_int64_bounds", "crashes", "hangs", "leaks",
                                  "disagreements", "bad_status")}
    out["seconds"] = round(time.perf_counter() - start, 1)
    out["slowest_case_s"] = round(slowest[0], 4)
    out["top_reasons"] = reasons.most_common(8)
    out["findings"] = findings[:20]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--start-at", type=int, default=0, help="skip this many cases")
    parser.add_argument("--only", type=int, default=None, metavar="N",
                        help="case N alone (--start-at N --count 1), saved to --crash-dir")
    parser.add_argument("--batch", type=int, default=2000, help="cases per driver process")
    parser.add_argument("--exchange", type=int, default=64,
                        help="cases per write to the driver (answered one by one)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per case")
    parser.add_argument("--crash-dir", type=Path, default=None)
    args = parser.parse_args()
    start_at, count = (args.only, 1) if args.only is not None else (args.start_at, args.count)
    report = run(count, args.seed, args.crash_dir, args.batch, args.timeout, verbose=True,
                 start_at=start_at, exchange=args.exchange)
    for key, value in report.items():
        if key != "findings":
            print(f"{key}: {value}")
    for finding in report["findings"]:
        print("FINDING:", finding)
    bad = report["crashes"] + report["hangs"] + report["leaks"] + report["disagreements"] + \
        report["bad_status"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
