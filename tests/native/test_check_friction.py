"""`opforge check` output that does not hide failures (issue 26): failures are grouped by
kind with a cap per kind (32 crashes no longer hide the one wrong dtype), `--show-all`
lifts the cap, and a mistyped `--op` suggests the op's name. Needs a C++ compiler and torch."""

from __future__ import annotations

import shutil

import pytest
from click.testing import CliRunner

from opforge.check.opcheck import MAX_PER_KIND, OpReport
from opforge.cli import cli
from opforge.examples.my_ops import manifest_path

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")


def test_failures_are_grouped_by_kind_with_a_cap_per_kind():
    report = OpReport("my_ops::mul3.out")
    for i in range(32):
        report.fail("crash", f"crashed on sample {i}")
    report.fail("native", "sample 40: output dtype float64, expected float32")
    groups = report.grouped()
    assert groups["crash"] == (32, [f"crashed on sample {i}" for i in range(MAX_PER_KIND)])
    assert groups["native"] == (1, ["sample 40: output dtype float64, expected float32"])
    everything = OpReport("my_ops::mul3.out", max_per_kind=None)
    for i in range(32):
        everything.fail("crash", f"crashed on sample {i}")
    assert len(everything.grouped()["crash"][1]) == 32
    data = report.to_json()["failures_by_check"]
    assert data["crash"]["samples"] == 32 and len(data["crash"]["messages"]) == MAX_PER_KIND


def test_a_sample_failing_two_checks_counts_under_both():
    report = OpReport("my_ops::mul3.out")
    report.fail("fake", "sample 1: fake vs real, and kernel vs reference", also=("native",))
    assert report.counts == {"fake": 1, "native": 1} and set(report.failures) == {"fake", "native"}


def test_a_mistyped_op_suggests_the_name(full):
    result = CliRunner().invoke(cli, ["check", str(manifest_path()), "--kernels", str(full.path),
                                      "--op", "my_ops::mul33"])
    assert result.exit_code == 2
    assert "did you mean 'my_ops::mul3'" in result.output, result.output
