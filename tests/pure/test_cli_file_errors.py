"""`opforge run` / `opforge inspect` on paths that are not regular files or cannot be
written: a clean error naming the path, exit status 1, no traceback, never blocking on a
FIFO (issue 11). NumPy only: the lean runtime's own verbs."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from opforge.program import (ArenaStorage, KernelCall, MemoryPlan, Method, Operator, Program,
                             ScalarType, TensorValue, save)

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


@pytest.fixture
def relu(tmp_path):
    """A one-instruction program the lean runtime runs, and an input for it."""
    x = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 0))
    y = TensorValue(ScalarType.FLOAT32, (3,), storage=ArenaStorage(0, 64))
    forward = Method("forward", (x, y), (0,), (1,), (KernelCall(0, (0, 1)),),
                     (Operator("aten::relu", "out"),), MemoryPlan((128,)))
    save(Program(methods=(forward,)), tmp_path / "relu.opf")
    np.save(tmp_path / "x.npy", np.array([-1.0, 0.0, 2.0], np.float32))
    return tmp_path / "relu.opf"


def _opforge(*args) -> subprocess.CompletedProcess:
    # A child with a timeout: a regression that opens a FIFO would block forever.
    return subprocess.run([sys.executable, "-m", "opforge", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def _clean_failure(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    return " ".join(proc.stderr.split())  # rich/click may wrap long lines


def test_the_fixture_program_runs(relu, tmp_path):
    proc = _opforge("run", relu, "--input", tmp_path / "x.npy", "--output-dir", tmp_path / "o")
    assert proc.returncode == 0, proc.stderr
    assert np.load(tmp_path / "o" / "output_0.npy").tolist() == [0.0, 0.0, 2.0]


@needs_fifo
@pytest.mark.parametrize("verb", ["run", "inspect"])
def test_a_fifo_as_the_program_is_refused_without_blocking(tmp_path, verb):
    fifo = tmp_path / "model.opf"
    os.mkfifo(fifo)
    err = _clean_failure(_opforge(verb, fifo))
    assert err.startswith(f"error: ProgramError: `opforge.program.load({str(fifo)!r})`: file")
    assert f"{fifo} is a FIFO (named pipe) — valid: a regular file" in err


@needs_fifo
def test_a_fifo_as_an_input_is_refused_without_blocking(relu, tmp_path):
    fifo = tmp_path / "x_fifo.npy"
    os.mkfifo(fifo)
    err = _clean_failure(_opforge("run", relu, "--input", fifo))
    assert f"`opforge run --input`: input {str(fifo)!r} — is a FIFO (named pipe)" in err


@needs_fifo
def test_a_fifo_as_the_input_list_is_refused_without_blocking(relu, tmp_path):
    fifo = tmp_path / "list.txt"
    os.mkfifo(fifo)
    err = _clean_failure(_opforge("run", relu, "--input-list", fifo))
    assert f"`opforge run --input-list`: input {str(fifo)!r} — is a FIFO" in err


def test_an_output_dir_under_a_regular_file_is_a_clean_error(relu, tmp_path):
    (tmp_path / "file").write_text("")
    err = _clean_failure(_opforge("run", relu, "--input", tmp_path / "x.npy",
                                  "--output-dir", tmp_path / "file" / "out"))
    assert (f"`opforge run --output-dir`: {tmp_path / 'file' / 'out'} — cannot write it "
            "(Not a directory, ENOTDIR)") in err
    assert f"a component of {tmp_path / 'file'} is a regular file" in err


def test_a_trace_in_a_missing_directory_is_a_clean_error(relu, tmp_path):
    trace = tmp_path / "nodir" / "trace.json"
    err = _clean_failure(_opforge("run", relu, "--input", tmp_path / "x.npy", "--trace", trace))
    assert (f"`opforge run --trace`: {trace} — cannot write it (No such file or directory, "
            "ENOENT)") in err
    assert f"mkdir -p {trace.parent}" in err


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
@pytest.mark.parametrize("option", ["--input", "--input-list"])
def test_an_npy_header_declaring_terabytes_is_refused_before_allocating(relu, tmp_path, version,
                                                                        option):
    huge = tmp_path / "huge.npy"
    with open(huge, "wb") as f:
        header = {"descr": "<f4", "fortran_order": False, "shape": (1 << 40,)}
        write = (np.lib.format.write_array_header_1_0 if version == (1, 0)
                 else np.lib.format.write_array_header_2_0)
        write(f, header)
        f.write(bytes(12))
    (tmp_path / "list.txt").write_text(f"{huge}\n")
    given = huge if option == "--input" else tmp_path / "list.txt"
    err = _clean_failure(_opforge("run", relu, option, given))
    assert (f"input {str(huge)!r} — cannot read it as .npy (its header declares "
            f"float32[{1 << 40}], {4 << 40} bytes, and only 12 bytes follow it)") in err
    assert "MemoryError" not in err
