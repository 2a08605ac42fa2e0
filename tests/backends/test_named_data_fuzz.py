"""A bounded run of fuzz/named_data_fuzz.py: cpu-delegated programs whose named-data table,
segment table (offsets past the file, overlaps) and blob references to named data are
mutated must load and run or end in an OpforgeError; every case in a worker process, so a
crash is a finding, not a dead test run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from opforge.backends import get_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
import named_data_fuzz  # noqa: E402

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend cannot run here")


def test_mutated_named_data_loads_and_runs_or_is_refused(tmp_path):
    report = named_data_fuzz.run(400, seed=43, tmp=tmp_path)
    assert report["findings"] == [], report["findings"]
    outcomes = report["outcomes"]
    for kind in ("table", "segments", "refs"):  # each mutation reaches a refusal, some run
        assert sum(n for k, n in outcomes.items() if k.startswith(f"{kind}: refused")) > 20, outcomes
    assert sum(n for k, n in outcomes.items() if k.endswith(": ran")) > 10, outcomes
    # the backend's own checks are reached, not only the reader's
    assert sum(n for k, n in outcomes.items() if k.endswith("refused: BackendError")) > 50, outcomes
