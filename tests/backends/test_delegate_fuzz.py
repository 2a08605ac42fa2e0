"""Delegate blobs and compile specs are untrusted input: mutated programs with delegates
(bytes of the whole file, resealed so they reach the parser; and field-level edits of the
DelegateBlob table, specs and DelegateCall args) must load and run or end in a clean
OpforgeError — never another exception.

The backend here is the toy one (its parser is Python); the compiled cpu backend's blob
parser has its own fuzz test in a subprocess (tests/backends/test_cpu_*.py).
"""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends import register_backend
from opforge.errors import OpforgeError
from opforge.export import export
from opforge.program import DelegateBlob, DelegateCall, Segment, from_bytes, to_bytes
from opforge.program._sample import reseal
from opforge.runtime import load

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
from toy_backend import ToyBackend  # noqa: E402
import program_fuzz  # noqa: E402

register_backend(ToyBackend, replace=True)

INTERESTING = [-1, 0, 1, 2, 3, 7, 2**31 - 1, 2**32 - 1, 2**63 - 1]


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4, 8))

    def forward(self, x):
        a = torch.relu(x + self.w)
        return torch.sin(a) * a, a


def _program():
    return export(Model(), (torch.randn(4, 8),), backends=["toy"])


def _run(data: bytes, x: np.ndarray) -> str:
    try:
        forward = load(data).method("forward")
        forward(x)
        return "ran"
    except OpforgeError as e:
        return f"refused: {type(e).__name__}"


def _field_mutation(rng: random.Random, program) -> bytes | None:
    """One edit of a delegate field, encoded without verification when it must be refused
    by the verifier, else through to_bytes."""
    from opforge.program.encode import encode

    try:
        return _field_mutation_unchecked(rng, program, encode)
    except OpforgeError:  # a field the dataclasses themselves refuse (e.g. a negative index)
        return None


def _field_mutation_unchecked(rng: random.Random, program, encode) -> bytes | None:
    choice = rng.randrange(6)
    delegates = list(program.delegates)
    i = rng.randrange(len(delegates))
    if choice == 0:
        delegates[i] = dataclasses.replace(delegates[i], segment=rng.choice(INTERESTING[:7]))
    elif choice == 1:
        specs = list(delegates[i].compile_specs)
        j = rng.randrange(len(specs))
        specs[j] = (specs[j][0], rng.choice([b"", b"i:", b"i:-1", b"i:99999999999", b"s:x",
                                             b"f:nan", b"b:2", rng.randbytes(rng.randrange(12))]))
        delegates[i] = dataclasses.replace(delegates[i], compile_specs=tuple(specs))
    elif choice == 2:
        specs = list(delegates[i].compile_specs)
        del specs[rng.randrange(len(specs))]
        delegates[i] = dataclasses.replace(delegates[i], compile_specs=tuple(specs))
    elif choice == 3:
        segments = list(program.segments)
        seg = delegates[i].segment
        blob = bytearray(segments[seg].data)
        for _ in range(rng.randint(1, 6)):
            blob[rng.randrange(len(blob))] = rng.randrange(256)
        segments[seg] = Segment(bytes(blob[:rng.randrange(len(blob) + 1)]))
        program = dataclasses.replace(program, segments=tuple(segments))
    else:
        method = program.method("forward")
        instructions = list(method.instructions)
        calls = [k for k, ins in enumerate(instructions) if type(ins) is DelegateCall]
        k = rng.choice(calls)
        args = list(instructions[k].args)
        if choice == 4 and args:
            args[rng.randrange(len(args))] = rng.choice(INTERESTING + [len(method.values) - 1])
        else:
            args = args[:rng.randrange(len(args) + 1)] + [rng.randrange(len(method.values))] * rng.randint(0, 2)
        instructions[k] = DelegateCall(rng.choice([instructions[k].delegate] * 4 + INTERESTING[:4]),
                                       tuple(args))
        program = dataclasses.replace(program, methods=(dataclasses.replace(
            method, instructions=tuple(instructions)),))
    program = dataclasses.replace(program, delegates=tuple(delegates))
    try:
        head, segments = encode(program)
    except OpforgeError:
        return None
    out = bytearray(head)
    for offset, data in segments:
        out += bytes(offset - len(out)) + bytes(data)
    return bytes(out)


def test_mutated_delegate_programs_load_or_refuse_cleanly():
    program = _program()
    seed = to_bytes(program)
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    rng = random.Random(5)
    outcomes: dict[str, int] = {}
    for n in range(600):
        if n % 2:
            data = _field_mutation(rng, program)
            if data is None:
                continue
        else:
            buf = bytearray(seed)
            for _ in range(rng.randint(1, 3)):
                buf = rng.choice(program_fuzz.MUTATORS)(rng, buf)
            data = reseal(buf, fix_file_size=rng.random() < 0.8)
        outcome = _run(data, x)  # anything but an OpforgeError propagates and fails here
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # the mutations must reach both ends: some programs still run, most are refused,
    # and the backend's own blob parser is among the refusers
    assert outcomes.get("ran", 0) > 20, outcomes
    assert outcomes.get("refused: BackendError", 0) > 20, outcomes
    assert outcomes.get("refused: ProgramError", 0) > 50, outcomes
