"""The native program reader and verifier (opf_program_verify) against opforge.program.

The C++ reader must accept exactly the files ``opforge.program.from_bytes`` accepts and
refuse the rest, naming the same field. Held to that on valid programs (hand-built ones with
symbolic sizes, state, growing symbols, int4 and splat constants, named data and a debug
table; zoo models when torch is importable), on every malformed case of
tests/pure/test_program_bad_inputs.py, and on a few thousand fuzzed files (the mutators of
fuzz/program_fuzz.py, resealed so most reach the metadata parser and the verifier).

Where the two may legitimately disagree (none of it reachable from an exporter):

* size-expression bounds: the native verifier refuses an expression whose interval leaves
  int64 at any node; Python's big ints check only the final bounds. So whatever the native
  verifier accepts evaluates without overflow. ``NF.intermediate_overflow`` recognizes it.
* JSON nesting in the debug table: native caps it at 512 levels; Python stops at its
  recursion limit (about 990 levels, fewer under a deeper call stack).
* ``NamedData`` keys: printable is CPython 3.11's table (Unicode 14); another Python's
  ``str.isprintable`` may differ on code points assigned since.
"""

from __future__ import annotations

import dataclasses
import importlib
import random
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

import opforge.program as P
from opforge.errors import ProgramError
from opforge.program._sample import (
    chain_program, growing_program, reseal, sample_program, splat_state_program, symbolic_program,
    unverified_bytes,
)
from opforge.program.symbolic import SizeExpr

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "fuzz"))
import native_program_fuzz as NF  # noqa: E402
import program_fuzz as PF  # noqa: E402

OPF_OK, OPF_ERR_PROGRAM = 0, 3


def python(data: bytes) -> str | None:
    """None when from_bytes accepts ``data``, else its message."""
    try:
        P.from_bytes(data)
        return None
    except ProgramError as e:
        return str(e)


def subject(message: str) -> str:
    """The field a message names: what comes after the API prefix, before ' — '."""
    return message.split("`: ", 1)[-1].split(" — ")[0]


# --- valid programs ------------------------------------------------------------------------

def _int4_program() -> P.Program:
    values = (P.TensorValue(P.ScalarType.INT8, (5,), storage=P.ConstantStorage(0, 0, 1)),
              P.TensorValue(P.ScalarType.INT8, (5,), storage=P.ArenaStorage(0, 0)))
    method = P.Method("forward", values, (), (1,), (P.KernelCall(0, (0, 1)),),
                      (P.Operator("aten::clone", "out"),), P.MemoryPlan((64,)))
    return P.Program(methods=(method,), segments=(P.Segment(bytes(3)),))


VALID = {
    "sample": sample_program, "chain": lambda: chain_program(4), "empty": lambda: P.Program(()),
    "symbolic": symbolic_program, "growing": growing_program, "splat_state": splat_state_program,
    "debug_table": PF.debug_program, "named_data": PF.named_program, "int4": _int4_program,
}


@pytest.mark.parametrize("name", sorted(VALID))
def test_valid_programs_are_accepted(verify, name):
    data = P.to_bytes(VALID[name]())
    assert python(data) is None
    rc, message = verify(data)
    assert rc == OPF_OK, message
    assert message == ""  # OPF_OK clears the last error


def _export_zoo(names: tuple[str, ...]) -> dict[str, bytes]:
    torch = pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    files = {}
    for name in names:
        torch.manual_seed(0)
        model, args = ZOO[name]()
        files[name] = P.to_bytes(export(model.eval(), args))
    return files


@pytest.fixture(scope="session")
def zoo_files():
    return _export_zoo(("mlp",))  # one export keeps the default run fast


def _check_zoo(verify, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert python(data) is None, name
        rc, message = verify(data)
        assert rc == OPF_OK, f"{name}: {message}"
    rng = random.Random(7)
    corpus = list(files.values())
    for _ in range(300):
        _assert_agree(verify, _byte_mutation(rng, corpus))


def test_zoo_model_is_accepted_and_its_mutations_agree(verify, zoo_files):
    _check_zoo(verify, zoo_files)


@pytest.mark.slow
def test_more_zoo_models(verify):
    """cnn, transformer_layer and gpt_decoder (about a minute of exporting)."""
    _check_zoo(verify, _export_zoo(("cnn", "transformer_layer", "gpt_decoder")))


# --- the malformed cases of tests/pure/test_program_bad_inputs.py -------------------------

BAD = importlib.import_module("tests.pure.test_program_bad_inputs")
BAD_CASES = sorted(name for name in dir(BAD) if name.startswith("test_") and name not in (
    "test_the_fixture_is_valid", "test_missing_file"))


@pytest.mark.parametrize("name", BAD_CASES)
def test_bad_inputs_are_refused_naming_the_same_field(verify, name, monkeypatch, tmp_path):
    seen = []

    def rejected(data: bytes) -> str:
        expected = python(data)
        assert expected is not None
        rc, message = verify(data)
        assert rc == OPF_ERR_PROGRAM, f"native accepted what Python refuses: {expected}"
        assert subject(message) == subject(expected), (message, expected)
        seen.append(message)
        return expected  # the case's own asserts then check Python's message, as before

    monkeypatch.setattr(BAD, "rejected", rejected)
    fn = getattr(BAD, name)
    fn(tmp_path) if "tmp_path" in fn.__code__.co_varnames[:fn.__code__.co_argcount] else fn()
    assert seen, "the case built no file"


def _tiny(**changes) -> P.Program:
    return BAD.tiny(**changes)


MORE_BAD = {
    # field the messages must both name → a malformed file
    "named_data[0] ('k').segment": lambda: unverified_bytes(dataclasses.replace(
        PF.named_program(), named_data=(P.NamedData("k", 9),))),
    "method 'forward' inputs[0]": lambda: unverified_bytes(_tiny(inputs=(1,))),
    "method 'forward' memory_plan.arena_sizes[0]": lambda: unverified_bytes(
        _tiny(memory_plan=P.MemoryPlan((1 << 30,)))),
    "method 'forward' values[1].storage.offset": lambda: unverified_bytes(_tiny(values=(
        BAD.tiny().methods[0].values[0], P.TensorValue(P.ScalarType.FLOAT32, (1,),
                                                       storage=P.ConstantStorage(0, 2)),
        P.IntValue(7)))),
    "method 'forward' operators[1]": lambda: unverified_bytes(_tiny(operators=(
        P.Operator("my_ops::scale", "out"), P.Operator("my_ops::scale", "out")))),
    "method 'forward' instructions[0] (Free).value": lambda: unverified_bytes(
        _tiny(instructions=(P.Free(2),))),
    "method 'forward' instructions[0] (Move).dst": lambda: unverified_bytes(
        _tiny(instructions=(P.Move(0, 1),))),
    "method 'forward' values[1].storage": lambda: unverified_bytes(_tiny(values=(
        BAD.tiny().methods[0].values[0], P.TensorValue(P.ScalarType.FLOAT32, (3,),
                                                       storage=P.ConstantStorage(0, 0)),
        P.IntValue(7)))),
}


def _state_bad() -> dict:
    base = splat_state_program()
    m = base.methods[0]
    cases = {
        # a splat constant that is no state's initial value (state dropped; the Move into
        # the constant is then refused too, after the values)
        "method 'forward' values[1].storage": dataclasses.replace(m, state=()),
        "method 'forward' state[1].value": dataclasses.replace(
            m, state=(P.StateSlot("last", 1), P.StateSlot("x", 0))),
        "method 'forward' state[1].name": dataclasses.replace(
            m, state=(P.StateSlot("last", 1), P.StateSlot("last", 1))),
    }
    return {f"{k} #state": (lambda mm=mm: unverified_bytes(dataclasses.replace(base, methods=(mm,))))
            for k, mm in cases.items()}


MORE_BAD.update(_state_bad())


def _symbolic_bad():
    base = symbolic_program()
    m = base.methods[0]
    sv = m.symbolic_values[0]
    cases = {}
    s0 = m.symbols[0].name
    wide = dataclasses.replace(sv, exprs=(SizeExpr.parse(f"({s0} + 100000)"),) + sv.exprs[1:])
    cases[f"method '{m.name}' symbolic_values[0].exprs[0]"] = dataclasses.replace(
        base, methods=(dataclasses.replace(m, symbolic_values=(wide,) + m.symbolic_values[1:]),))
    divide = dataclasses.replace(sv, exprs=(SizeExpr.parse(f"floordiv({s0}, ({s0} - 1))"),)
                                 + sv.exprs[1:])
    cases[f"method '{m.name}' symbolic_values[0].exprs[0] #divisor"] = dataclasses.replace(
        base, methods=(dataclasses.replace(m, symbolic_values=(divide,) + m.symbolic_values[1:]),))
    unbound = dataclasses.replace(m, symbols=m.symbols + (P.Symbol("zz", 1, 4),))
    cases[f"method '{m.name}' symbols"] = dataclasses.replace(base, methods=(unbound,))
    undeclared = dataclasses.replace(sv, exprs=(SizeExpr.parse("zz"),) + sv.exprs[1:])
    cases[f"method '{m.name}' symbolic_values[0].exprs[0] #undeclared"] = dataclasses.replace(
        base, methods=(dataclasses.replace(m, symbolic_values=(undeclared,)
                                           + m.symbolic_values[1:]),))
    return {k: (lambda p=p: unverified_bytes(p)) for k, p in cases.items()}


@pytest.mark.parametrize("field", sorted(MORE_BAD) + sorted(_symbolic_bad()))
def test_more_verifier_rules_name_the_same_field(verify, field):
    data = {**MORE_BAD, **_symbolic_bad()}[field]()
    expected = python(data)
    assert expected is not None
    rc, message = verify(data)
    assert rc == OPF_ERR_PROGRAM
    assert subject(message) == subject(expected) == field.split(" #")[0], (message, expected)


def test_debug_table_rules(verify):
    """Each kind of broken debug table: both refuse, naming the same part."""
    import json
    program = PF.debug_program()
    doc = json.loads(dict(program.user_metadata)["opforge.debug"])
    name = program.methods[0].name
    edits = [
        lambda d: d.update(version=2),
        lambda d: d["methods"][name].update(captures=[0, 0, 0]),
        lambda d: d["methods"][name]["captures"].__setitem__(1, 10**30),
        lambda d: d["methods"][name]["captures"].__setitem__(0, True),
        lambda d: d["methods"][name].update(ops=["x" * 4097]),
        lambda d: d["methods"][name].pop("delegates"),
        lambda d: d["methods"].update(nope={}),
        lambda d: d["methods"][name].update(delegates=[[99, []]]),
    ]
    for i, edit in enumerate(edits):
        d = json.loads(json.dumps(doc))
        edit(d)
        meta = tuple((k, json.dumps(d) if k == "opforge.debug" else v)
                     for k, v in program.user_metadata)
        data = unverified_bytes(dataclasses.replace(program, user_metadata=meta))
        expected = python(data)
        assert expected is not None, i
        rc, message = verify(data)
        assert rc == OPF_ERR_PROGRAM, (i, expected)
        assert subject(message) == subject(expected), (i, message, expected)
    # the Python-isms the native JSON reader keeps: version 1.0 and true equal 1, the last
    # of two equal keys wins, NaN is JSON, a surrogate pair is one character
    text = dict(program.user_metadata)["opforge.debug"]
    for variant in (text.replace('"version":1', '"version":1.0'),
                    text.replace('"version":1', '"version":true'),
                    text.replace('"version":1', '"version":7,"version":1'),
                    text.replace('"version":1', '"version":1,"x":[NaN,-Infinity,"\\ud83d\\ude00"]'),
                    text.replace('"version":1', '"version":1.5')):
        meta = tuple((k, variant if k == "opforge.debug" else v) for k, v in program.user_metadata)
        _assert_agree(verify, unverified_bytes(dataclasses.replace(program, user_metadata=meta)))


# --- fuzzed files --------------------------------------------------------------------------

def _byte_mutation(rng: random.Random, corpus: list[bytes]) -> bytes:
    seed = rng.choice(corpus)
    head, buf = seed[:64], bytearray(seed[64:])
    for _ in range(rng.choice([1, 1, 2])):
        buf = rng.choice(PF.MUTATORS)(rng, buf)
    return reseal(head + bytes(buf), fix_file_size=rng.random() < 0.8)


def _assert_agree(verify, data: bytes) -> tuple[bool, bool]:
    expected = python(data)
    rc, message = verify(data)
    assert rc in (OPF_OK, OPF_ERR_PROGRAM), message
    if (expected is None) != (rc == OPF_OK):
        if expected is None and NF.intermediate_overflow(data):
            return True, False  # the documented bounds difference (module docstring)
        pytest.fail(f"disagree: python {'accepts' if expected is None else expected!r}; "
                    f"native {'accepts' if rc == OPF_OK else message!r}")
    return expected is None, expected is not None and subject(message) == subject(expected)


def test_fuzzed_files_agree(verify):
    """3000 files from fuzz/program_fuzz.py's mutators (structure-aware and byte-level)."""
    rng = random.Random(2026)
    corpus = PF.seeds()
    accepted = same_subject = 0
    for _ in range(3000):
        ok, same = _assert_agree(verify, PF.mutate(rng, corpus))
        accepted += ok
        same_subject += same
    # both outcomes must be exercised, or the comparison proves nothing
    assert 200 < accepted < 2800, accepted
    assert same_subject > 0.9 * (3000 - accepted), same_subject


def test_expression_bounds_agree(verify):
    """Random size expressions in a symbolic program: parse, bounds, binding."""
    rng = random.Random(5)
    base = symbolic_program()
    m = base.methods[0]
    for _ in range(400):
        sv = m.symbolic_values[rng.randrange(len(m.symbolic_values))]
        exprs = list(sv.exprs)
        exprs[rng.randrange(len(exprs))] = PF._random_expr(rng, 0) if rng.random() < 0.7 else \
            SizeExpr.parse(rng.choice(["s0", "(2 * s0)", "((s0 * 2) + 1)", "(s0 - 1)"]))
        new = dataclasses.replace(sv, exprs=tuple(exprs))
        svs = tuple(new if x is sv else x for x in m.symbolic_values)
        data = unverified_bytes(dataclasses.replace(
            base, methods=(dataclasses.replace(m, symbolic_values=svs),) + base.methods[1:]))
        _assert_agree(verify, data)


def test_hostile_lengths_never_crash(verify):
    """Counts, sizes and offsets at every interesting value, each resealed: refused or
    accepted in agreement, never a crash (the sanitizer test below checks memory too)."""
    data = P.to_bytes(sample_program())
    for at in range(64, min(len(data), 600), 4):
        for value in (0xFFFF_FFFF, 0x8000_0000, 1 << 16):
            mutated = data[:at] + struct.pack("<I", value) + data[at + 4:]
            _assert_agree(verify, reseal(mutated))


def test_int64_bounds_difference_is_the_documented_one(verify):
    """An expression whose inner interval leaves int64 though its final bounds do not:
    Python accepts it, the native verifier refuses it by design (module docstring)."""
    base = symbolic_program()
    m = base.methods[0]
    s = m.symbols[0].name
    guard = P.Guard(SizeExpr.parse(f"min(({s} * 9223372036854775807), 0)"), "<=",
                    SizeExpr.parse(s))
    data = unverified_bytes(dataclasses.replace(
        base, methods=(dataclasses.replace(m, guards=m.guards + (guard,)),) + base.methods[1:]))
    assert python(data) is None
    rc, message = verify(data)
    assert rc == OPF_ERR_PROGRAM and "guards[" in message and "int64" in message
    assert NF.intermediate_overflow(data)


def test_null_and_empty_arguments(verify):
    assert verify(b"")[0] == OPF_ERR_PROGRAM and "empty file" in verify(b"")[1]
    lib_rc = verify(b"\x89OPF")
    assert lib_rc[0] == OPF_ERR_PROGRAM and "header" in lib_rc[1]


# --- the sanitizer build -------------------------------------------------------------------

@pytest.mark.slow
def test_sanitizer_build_fuzz_smoke(tmp_path):
    """A few hundred fuzzed files through the ASan+UBSan build (fuzz/native_program_fuzz.py's
    driver): no crash, no leak, no disagreement with Python. Slow only the first time: the
    sanitizer variant's first build takes minutes (later ones recompile what changed); the
    300 cases themselves take about a second."""
    report = NF.run(count=300, seed=11, crash_dir=tmp_path)
    assert report["cases"] == 300
    assert report["crashes"] == 0 and report["hangs"] == 0 and report["leaks"] == 0, report
    assert report["disagreements"] == 0 and report["bad_status"] == 0, report
