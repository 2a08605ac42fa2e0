"""The cpu backend's engine built for aarch64 runs the zoo's delegated programs under
qemu-aarch64 with the x86 lean runtime's outputs (1e-5, the native runtime's parity
tolerance: the engines run other kernels), and the parity suite's decoder delegated gives
the lean runtime's greedy tokens through opforge-generate. Needs what scripts/engine_aarch64.py makes (a
Debian trixie arm64 sysroot with oneDNN 3, the cross-built engine, an aarch64
opforge-run): minutes of compiling and the network, so it runs only where
OPFORGE_AARCH64_WORK names that script's --work folder, and skips, saying so, elsewhere.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from opforge.backends import get_backend  # noqa: E402
from opforge.examples.zoo import ZOO  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from scripts import engine_aarch64 as script  # noqa: E402

WORK = os.environ.get("OPFORGE_AARCH64_WORK")


def _setup():
    """(sysroot, engine, opforge-run) or a skip naming what is missing."""
    if not WORK:
        pytest.skip("OPFORGE_AARCH64_WORK is not set — run `python scripts/engine_aarch64.py "
                    "--work DIR`, then set it to DIR")
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("qemu-aarch64 is not on PATH (scripts/setup-cross.sh installs qemu-user)")
    if get_backend("cpu").unavailable() is not None:
        pytest.skip("the cpu backend's engine cannot run here: no x86 lean outputs to compare")
    from opforge.backends.cpu.engine_build import source_hash

    work = Path(WORK)
    engine = work / f"libopforge_cpu.aarch64.{source_hash()}.so"
    # the script's build, else OPFORGE_AARCH64_RUN (an aarch64 opforge-run, as its --runtime)
    runs = [work / "runtime" / "opforge-run", Path(os.environ.get("OPFORGE_AARCH64_RUN", "/nonexistent"))]
    run = next((r for r in runs if r.is_file()), None)
    if not (work / "sysroot").is_dir() or not engine.is_file() or run is None:
        pytest.skip(f"{work} lacks the sysroot, the engine of these sources ({engine.name}) or "
                    "runtime/opforge-run — run scripts/engine_aarch64.py --work on it again")
    return work / "sysroot", engine, run


@pytest.mark.parametrize("name", [*ZOO, *script.QUANTIZED])
def test_zoo_program_on_the_aarch64_engine_under_qemu(name, tmp_path):
    root, engine, run = _setup()
    ok, line = script.check_program(name, tmp_path, root, engine, run)
    assert ok, line


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_delegated_decoder_greedy_tokens_under_qemu(kind, tmp_path):
    root, engine, run = _setup()
    if not (run.parent / "opforge-generate").is_file():
        pytest.skip(f"no opforge-generate beside {run}")
    ok, line = script.check_decoder(kind, tmp_path, root, engine, run)
    assert ok, line
