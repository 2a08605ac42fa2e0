"""The native runtime's cpu backend repeats two of the Python cpu backend's lists in C++: the
op kinds a blob may hold (blob.py OP_KINDS, backend_cpu_blob_ops.cpp kOpKinds) and the op
kinds whose weights the engine copies at init (file_pages.py COPIED_AT_INIT,
backend_cpu.cpp kCopiedAtInit). A kind added on one side only drifts silently: the C++
runtime refused every 8da program when OP_KINDS gained int_dot_matmul alone. Read from the
C++ sources, so the check needs no compiler."""

from __future__ import annotations

import re
from pathlib import Path

from opforge.backends.cpu.blob import OP_KINDS
from opforge.backends.cpu.file_pages import COPIED_AT_INIT

SRC = Path(__file__).resolve().parents[2] / "opforge" / "native_runtime" / "src"


def _cpp_list(file: str, name: str) -> list[str]:
    text = (SRC / file).read_text()
    match = re.search(name + r"\[\]\s*=\s*\{(.*?)\};", text, re.S)
    assert match, f"{name} not found in {file}"
    return re.findall(r'"([^"]*)"', match.group(1))


def test_op_kinds_match_blob_py_in_order():
    assert _cpp_list("backend_cpu_blob_ops.cpp", "kOpKinds") == list(OP_KINDS)


def test_copied_at_init_matches_file_pages_py():
    kinds = _cpp_list("backend_cpu.cpp", "kCopiedAtInit")
    assert len(kinds) == len(set(kinds)) and set(kinds) == set(COPIED_AT_INIT)
