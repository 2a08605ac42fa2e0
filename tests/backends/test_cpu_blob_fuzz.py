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
                                    plant=plant, log=lambda s: None, only=["custom-kernel"])
    got = report.finding_cases
    assert got[1][0] == "crash" and got[1][1].startswith("signal SIGSEGV"), got
    assert got[3][0] == "hang", got
    assert got[4][0] == "raw" and "ValueError: planted" in got[4][1], got
    assert got[5][0] == "memory", got
    assert got[6][0] == "opened" and "/dev/null" in got[6][1], got
    assert sum(report.counts.values()) == 8  # the worker came back after the crash and hang
    saved = sorted(p.name for p in tmp_path.glob("crash-*.json"))
    assert saved and all((tmp_path / n).with_suffix(".program").exists() for n in saved)


def test_the_fuzzer_writes_an_unmutated_plan_back_byte_for_byte():
    """Its blob writer is blob.encode's format: an unchanged plan gives the seed's bytes, so
    every difference a case has is a mutation's."""
    from cpu_blob_minimize import Pair
    from cpu_blob_mutate import ParsedSeed, program_with_blob, write_blob
    from cpu_blob_seeds import load_seeds

    seeds, _ = load_seeds(log=lambda s: None)
    assert {"zoo-mlp", "conv", "8a8w-cnn", "custom-kernel", "oppackage"} <= {s.name for s in seeds}
    for seed in seeds:
        parsed = ParsedSeed.of(seed.name, seed.data)
        for index, plan, data in parsed.plans:
            delegate = parsed.program.delegates[index]
            original = bytes(parsed.program.segments[delegate.segment].data)
            assert write_blob(plan, data) == original, seed.name
            again = program_with_blob(parsed.program, index, original,
                                      list(delegate.compile_specs))
            assert again == seed.data, seed.name
        if parsed.plans:  # the shrinker finds nothing to shrink in an unmutated program
            index, plan, data = parsed.plans[0]
            changed = program_with_blob(parsed.program, index, write_blob(plan, data, reserved=1),
                                        list(parsed.program.delegates[index].compile_specs))
            assert [u.where for u in Pair.of(parsed, changed).units()] == [("header",)]


def test_the_saved_reproductions_are_refused_cleanly():
    """fuzz/corpus/cpu_blob: programs that crashed the engine before it was hardened."""
    corpus = Path(__file__).resolve().parents[2] / "fuzz" / "corpus" / "cpu_blob"
    paths = sorted(corpus.glob("*.json"))
    assert len(paths) >= 10
    outcomes = cpu_blob_fuzz.replay_cases(paths, timeout=30)
    bad = {name: o for name, o in outcomes.items() if o[0] not in ("ok", "refused")}
    assert not bad, bad


def test_a_campaign_and_the_corpus_run_clean_under_asan(tmp_path, monkeypatch):
    """The CI run under the sanitizer build (issue 21): the workers preload libasan and use
    an engine built with -fsanitize=address, so an out-of-bounds access aborts the very case
    that made it instead of corrupting a later one."""
    import shutil
    import subprocess

    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("needs gcc for the ASan runtime")
    libasan = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True,
                             text=True).stdout.strip()
    if not Path(libasan).is_absolute() or not Path(libasan).exists():
        pytest.skip("no ASan runtime (libasan.so) for the compiler")
    from cpu_blob_worker import Worker

    monkeypatch.setattr(Worker, "asan_dir", tmp_path / "asan")
    (tmp_path / "asan").mkdir()
    report = cpu_blob_fuzz.campaign(150, seed=2027, jobs=1, timeout=60, crash_dir=tmp_path,
                                    log=lambda s: None)
    lines: list[str] = []
    cpu_blob_fuzz.print_report(report, 150, 2027, out=lines.append)
    for cls in cpu_blob_fuzz.FINDINGS:
        assert report.counts[cls] == 0, "\n".join(lines)
    corpus = Path(__file__).resolve().parents[2] / "fuzz" / "corpus" / "cpu_blob"
    outcomes = cpu_blob_fuzz.replay_cases(sorted(corpus.glob("*.json")), timeout=60)
    bad = {name: o for name, o in outcomes.items() if o[0] not in ("ok", "refused")}
    assert not bad, bad
