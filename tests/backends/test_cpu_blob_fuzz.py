"""The cpu blob fuzzer (fuzz/cpu_blob_fuzz.py): a small fixed-seed campaign against the
engine finds nothing, and the fuzzer's oracle sees what it must — a planted SIGSEGV is a
crash, a planted sleep a hang, a planted ValueError a raw exception, a planted 64 GiB
allocation a memory blow-up, a planted open() a file opened.

Needs torch (the seeds are exported once into fuzz/.cpu_blob_seeds), oneDNN and a C++
compiler (the engine, the example kernel library and op package)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchao")  # the 8a8w seeds

from opforge.backends import get_backend  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
import cpu_blob_fuzz  # noqa: E402

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend cannot run here")


def test_a_fixed_seed_campaign_finds_no_crash_hang_raw_exception_or_file_open(tmp_path):
    report = cpu_blob_fuzz.campaign(400, seed=2026, jobs=1, timeout=20, crash_dir=tmp_path,
                                    log=lambda s: None)
    lines: list[str] = []
    cpu_blob_fuzz.print_report(report, 400, 2026, out=lines.append)
    text = "\n".join(lines)
    assert sum(report.counts.values()) == 400, text
    for cls in cpu_blob_fuzz.FINDINGS:
        assert report.counts[cls] == 0, text
    # the mutations reach both ends: some programs still run, most are refused
    assert report.counts["ok"] >= 40, text
    assert report.counts["refused"] >= 200, text


def test_the_oracle_classifies_planted_misbehaviour(tmp_path):
    plant = {1: "crash", 3: "hang", 4: "raw", 5: "memory", 6: "open"}
    report = cpu_blob_fuzz.campaign(8, seed=7, jobs=1, timeout=4, crash_dir=tmp_path,
                                    plant=plant, log=lambda s: None)
    got = report.finding_cases
    assert got[1] == ("crash", "signal SIGSEGV"), got
    assert got[3][0] == "hang", got
    assert got[4][0] == "raw" and "ValueError: planted" in got[4][1], got
    assert got[5][0] == "memory", got
    assert got[6][0] == "opened" and "/dev/null" in got[6][1], got
    assert sum(report.counts.values()) == 8  # the worker came back after the crash and hang
    saved = sorted(p.name for p in tmp_path.glob("crash-*.json"))
    assert saved and all((tmp_path / n).with_suffix(".program").exists() for n in saved)
