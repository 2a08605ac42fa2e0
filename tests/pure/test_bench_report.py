"""bench/report.py marks a (workload, runtime) whose outputs differ from eager beyond the
tolerance as failed: in the summary cell (what latest.jsonl records), in the markdown
tables, out of the ratios, and in ``failed_cells`` (bench/run.py's exit status 1). Fake
measurements only: nothing is run or timed."""

from __future__ import annotations

import math
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
report = pytest.importorskip("report")  # bench/report.py (NumPy only)


def measurement(median_s: float, error: float) -> dict:
    return {"ok": True, "samples_s": [median_s] * 5, "median_s": median_s,
            "max_abs_error": error, "peak_rss_mb": 30.0, "rss_imported_mb": 25.0,
            "import_s": 0.1, "load_s": 0.01, "torch_imported": False}


SETUP = {"machine": {"cpu": "test", "cores": 2, "memory_gib": 1, "kernel": "k",
                     "python": "3", "versions": {}, "opforge_commit": "abc"},
         "load_start": 0.0, "load_end": 0.0, "threads": 2, "rounds": 1, "runs": 5,
         "command": "bench/run.py", "wall_s": 1.0, "tolerance": report.TOLERANCE}


def table(errors: dict[str, float], tolerance: float = report.TOLERANCE) -> dict:
    measured = {("mlp", "opforge-lean"): [measurement(1e-4, 1e-7)]}
    measured.update({("mlp", runtime): [measurement(2e-4, error)]
                     for runtime, error in errors.items()})
    return report.summarize_measurements(measured, {}, tolerance)


def test_within_tolerance_is_ok():
    cells = table({"ort": report.TOLERANCE, "eager": 0.0})["mlp"]
    assert all(c["ok"] and "failed" not in c for c in cells.values())
    assert report.failed_cells(table({"ort": report.TOLERANCE})) == []


@pytest.mark.parametrize("error", [report.TOLERANCE * 1.01, 0.5, math.inf, math.nan])
def test_beyond_tolerance_is_failed(error):
    result = table({"ort": error, "eager": 0.0})
    cell = result["mlp"]["ort"]
    assert cell["ok"] is False and "output differs from eager" in cell["failed"]
    assert cell["median_s"] == 2e-4  # the measurement is kept, marked
    assert [(w, r) for w, r, _ in report.failed_cells(result)] == [("mlp", "ort")]
    text = report.markdown(result, ["mlp"], ["opforge-lean", "eager", "ort"], SETUP, [])
    assert "### Failed: output differs from eager" in text and "**mlp on ort**" in text
    assert "**failed** (200.0 µs)" in text  # latency table
    ratio_row = next(line for line in text.splitlines()
                     if line.startswith("| mlp | 1.00× |"))
    assert ratio_row.endswith("| 2.00× | n/a |")  # eager's ratio, then ort: none


def test_the_tolerance_is_a_parameter():
    assert report.failed_cells(table({"ort": 1e-5}, tolerance=1e-6))
    assert not report.failed_cells(table({"ort": 1e-5}, tolerance=1e-4))


def test_a_failed_baseline_gives_no_ratios():
    measured = {("mlp", "opforge-lean"): [measurement(1e-4, 1.0)],
                ("mlp", "ort"): [measurement(2e-4, 0.0)]}
    result = report.summarize_measurements(measured, {})
    text = report.markdown(result, ["mlp"], ["opforge-lean", "ort"], SETUP, [])
    assert "| mlp | n/a | n/a |" in text
    assert report.failed_cells(result) == [("mlp", "opforge-lean", result["mlp"][
        "opforge-lean"]["failed"])]


def test_a_workload_can_have_its_own_tolerance():
    # quantized workloads (bench/quantized_workloads.py) are checked against their own
    measured = {("q", "opforge-lean"): [measurement(1e-4, 0.01)],
                ("q", "ort"): [measurement(2e-4, 0.2)],
                ("mlp", "opforge-lean"): [measurement(1e-4, 0.01)]}
    result = report.summarize_measurements(measured, {}, report.TOLERANCE, {"q": 0.1})
    assert result["q"]["opforge-lean"]["ok"] and result["q"]["opforge-lean"]["tolerance"] == 0.1
    assert "1.0e-01" in result["q"]["ort"]["failed"]
    assert not result["mlp"]["opforge-lean"]["ok"]  # the default still holds elsewhere


def test_the_cpu_backend_gets_its_own_ratio_table():
    measured = {("mlp", "opforge-lean"): [measurement(3e-4, 0.0)],
                ("mlp", "opforge-cpu"): [measurement(1e-4, 0.0)],
                ("mlp", "ort"): [measurement(2e-4, 0.0)]}
    result = report.summarize_measurements(measured, {})
    text = report.markdown(result, ["mlp"], ["opforge-lean", "opforge-cpu", "ort"], SETUP, [])
    assert "### Ratio: runtime's median / opforge cpu's median" in text
    cpu = text.split("opforge cpu's median")[1]
    assert "| mlp | 3.00× | 1.00× | 2.00× |" in cpu
    no_cpu = report.markdown(result, ["mlp"], ["opforge-lean", "ort"], SETUP, [])
    assert "opforge cpu's median" not in no_cpu


def test_tables_are_rebuilt_from_a_results_file(tmp_path):
    import json

    tables = pytest.importorskip("tables")  # bench/tables.py
    result = table({"ort": 0.0})
    lines = [{"event": "setup", **SETUP}] + [
        {"event": "summary", "workload": w, "runtime": r, **cell}
        for w, cells in result.items() for r, cell in cells.items()]
    results = tmp_path / "latest.jsonl"
    results.write_text("".join(json.dumps(line) + "\n" for line in lines))
    text, setup = tables.tables(results)
    assert text == report.markdown(result, ["mlp"], ["opforge-lean", "ort"], SETUP, [])
    readme = tmp_path / "README.md"
    readme.write_text("head\n<!-- x:begin -->\nold\n<!-- x:end -->\ntail\n")
    tables.replace_section(readme, "x", "new")
    assert readme.read_text() == "head\n<!-- x:begin -->\nnew\n<!-- x:end -->\ntail\n"
    with pytest.raises(SystemExit, match="no <!-- y:begin -->"):
        tables.replace_section(readme, "y", "new")
