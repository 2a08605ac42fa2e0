"""bench/llm.py --reuse keys a prepared file on its export record: a file exported with
another ``logits_to_keep`` (or before the option existed: every row's logits) is exported
again, never silently measured as if it computed the last row only; llama.cpp's GGUF
files, which do not depend on it, are reused. No export runs: the worker is a stand-in."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
llm = pytest.importorskip("llm")  # bench/llm.py (the standard library at import)


class Workers:
    """Records the prepare specs it is asked to run; runs nothing."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.specs: list[dict] = []

    def run(self, spec, threads=1, timeout=0.0):
        self.specs.append(spec)
        return [{"event": "prepared", "logits_to_keep": spec["logits_to_keep"]}]


def _prepared(workdir: pathlib.Path, runtime: str, record: dict) -> None:
    path = llm.artifact({"workdir": str(workdir), "config": "tiny", "runtime": runtime})
    path.write_bytes(b"file")
    path.with_name(path.name + ".prepared.jsonl").write_text(
        json.dumps({"event": "prepared", "config": "tiny", "runtime": runtime, **record}) + "\n")


def _args(workdir, keep):
    return argparse.Namespace(workdir=workdir, reuse=True, logits_to_keep=keep, new_tokens=8)


@pytest.mark.parametrize("record, keep, exported", [
    ({"logits_to_keep": 1}, 1, False),
    ({"logits_to_keep": 0}, 1, True),
    ({}, 1, True),  # a file from before the option: every row's logits
    ({}, 0, False),
    ({"logits_to_keep": 1}, 0, True),
])
def test_reuse_compares_logits_to_keep(tmp_path, record, keep, exported):
    _prepared(tmp_path, "opforge-cpu", record)
    workers = Workers()
    llm._prepare(workers, "tiny", "opforge-cpu", _args(tmp_path, keep))
    assert [s["logits_to_keep"] for s in workers.specs] == ([keep] if exported else [])


def test_a_gguf_file_is_reused_whatever_the_option(tmp_path):
    _prepared(tmp_path, "llamacpp-f32", {})
    workers = Workers()
    llm._prepare(workers, "tiny", "llamacpp-f32", _args(tmp_path, 1))
    assert workers.specs == [] and workers.events[0]["runtime"] == "llamacpp-f32"


def test_a_kept_large_file_is_not_gated_by_the_export_memory_estimate(tmp_path, monkeypatch):
    """1b's exports are skipped when memory is short (``_fits``); a file --reuse keeps
    exports nothing and is measured whatever the memory available."""
    path = llm.artifact({"workdir": str(tmp_path), "config": "1b", "runtime": "opforge-cpu"})
    path.write_bytes(b"file")
    path.with_name(path.name + ".prepared.jsonl").write_text(
        json.dumps({"event": "prepared", "logits_to_keep": 1}) + "\n")
    monkeypatch.setattr(llm, "_fits", lambda *a: False)
    workers = Workers()
    assert llm._prepare(workers, "1b", "opforge-cpu", _args(tmp_path, 1))
    assert not llm._prepare(workers, "1b", "opforge-cpu", _args(tmp_path, 0))  # not kept
    assert workers.specs == []
