"""opforge-generate on a cpu-backend program of TinyDecoder(logits_to_keep=1) (the prefill
returns the last row's logits only, as bench/llm.py's programs do): the full model's
eager greedy tokens."""

from __future__ import annotations

import json
import subprocess

import pytest

from opforge.program import save

torch = pytest.importorskip("torch")

from tests.torch.test_decoder_logits_to_keep import (  # noqa: E402
    NEW, PROMPT, _expected_tokens, export_last_row,
)


def test_the_native_tool_generates_the_full_models_tokens(tmp_path, native_runtime):
    from opforge.backends.cpu import engine

    tool = native_runtime.tool("opforge-generate")
    # the engine the Python backend runs (built for these sources), as bench/llm.py's
    # opforge-generate rows name it
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1",
           "OPFORGE_CPU_ENGINE": engine.library()._name,
           "LD_LIBRARY_PATH": str(engine.onednn_prefix() / "lib")}
    save(export_last_row(["cpu"]), tmp_path / "decoder.opf")
    done = subprocess.run([str(tool), str(tmp_path / "decoder.opf"), "--tokens",
                           ",".join(map(str, PROMPT)), "--max-new-tokens", str(NEW), "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["tokens"] == _expected_tokens()
