"""A bounded run of fuzz/exec_fuzz.py: mutated real programs, run with the example native
library loaded, in lean and ATen mode, must each end in a clean OpforgeError or a run —
never a crash, a hang, a raw MemoryError or a file opened. The on-demand fuzzer runs the
same loop for 100k+ inputs per mode; here a few hundred keep the file to seconds.
"""

import shutil
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
import exec_fuzz  # noqa: E402


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_mutated_programs_never_crash_the_runtime(tmp_path, mode):
    import torch

    # torch's OpenMP pool running in this process: forked workers hung on it (the fuzzer
    # spawns them instead)
    assert torch.ones(1 << 20).add(1).sum().item() == 2 * (1 << 20)
    lines = []
    findings = exec_fuzz.fuzz(250, seed=11, modes=[mode], crash_dir=tmp_path / "crashes",
                              timeout=60, workdir=tmp_path, report=lines.append)
    summary = "\n".join(lines)
    assert findings == 0, summary
    ran = int(summary.split(" ran ")[1].split(",")[0])
    assert ran > 25, summary  # the mutations must reach execution, not only the verifier


def test_field_mutations_reach_every_kind(tmp_path):
    # Each field-targeted mutation kind changes the program (a mutator that silently does
    # nothing would make the fuzzer look clean).
    import random

    import opforge.program as P

    seed = exec_fuzz.native_seeds()[0]
    program = P.from_bytes(seed)
    rng = random.Random(0)
    changed = sum(exec_fuzz.mutate_fields(rng, program) != seed for _ in range(200))
    assert changed > 150
