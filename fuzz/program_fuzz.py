"""On-demand fuzzer for the program-file loader.

    python fuzz/program_fuzz.py --count 100000            # built-in mutator, fixed seed
    python fuzz/program_fuzz.py --atheris                 # libFuzzer via atheris, if installed

Every input must either load (and then verify and re-encode to a file that loads the same)
or raise ProgramError. Anything else — another exception type, an oracle mismatch — is a
crash: it is counted, written to --crash-dir, and makes the exit status 1. The report gives
inputs run, loaded, rejected, crashes, the slowest input, peak memory and the commonest
rejection reasons (so a mutator that only ever trips the checksum is easy to spot).

Mutations: truncation, bit flips, random byte-range overwrites, "interesting" integers
(huge counts, negative sizes, offsets past the end) written over any 1/4/8-byte window,
inserted and deleted bytes, header-field rewrites, index rewrites at the dataclass level
(dangling, self-referencing and out-of-range indices), and version-3 rewrites: random size
expressions (deep, huge, dividing by zero, reading undeclared symbols), symbol ranges,
guards and state slots; version-4 rewrites: grow flags flipped, growing tensors given
storage or planned ones none, huge or empty first sizes, growing symbols' ranges (seeded
with ``growing_program``); debug-table rewrites: any number, type, nesting or truncation in
the ``opforge.debug`` JSON (seeded with ``debug_program``); version-6 rewrites of the named
data table (dangling segments, duplicate, empty, long or unprintable keys; seeded with
``named_program``). A program with symbols that loads is also bound at a random input
shape (``ShapeBinder``): that must succeed or raise ProgramError too. Half of the byte mutations spare the
header, and 80% are resealed (the header CRC, and mostly file_size, recomputed) so that
they reach the parser and the verifier rather than stopping at the header checks.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import random
import re
import resource
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import opforge.program as P  # noqa: E402
from opforge.errors import ProgramError  # noqa: E402
from opforge.program import _format as F  # noqa: E402
from opforge.program._sample import (  # noqa: E402
    chain_program, growing_program, reseal, sample_program, splat_state_program, symbolic_program,
    unverified_bytes,
)
from opforge.program.symbolic import (  # noqa: E402
    Guard, SizeExpr, StateSlot, Symbol, SymbolicValue, growing_values,
)

INTERESTING = [0, 1, 7, 63, 64, 65, 255, 256, 4095, 2**16, 2**31 - 1, 2**31, 2**32 - 1,
               2**32, 2**48, 2**48 + 1, 2**62, 2**63 - 1, -1, -64, -(2**31), -(2**63)]


def _truncate(rng: random.Random, buf: bytearray) -> bytearray:
    return buf[:rng.randrange(len(buf))] if buf else buf


def _flip_bits(rng: random.Random, buf: bytearray) -> bytearray:
    for _ in range(rng.randint(1, 8)):
        if buf:
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
    return buf


def _overwrite_range(rng: random.Random, buf: bytearray) -> bytearray:
    if buf:
        start = rng.randrange(len(buf))
        buf[start:start + rng.randint(1, 32)] = rng.randbytes(rng.randint(1, 32))
    return buf


def _interesting_int(rng: random.Random, buf: bytearray) -> bytearray:
    fmt = rng.choice(["<B", "<I", "<i", "<q", "<Q"])
    width = struct.calcsize(fmt)
    if len(buf) < width:
        return buf
    value = rng.choice(INTERESTING)
    bits = width * 8
    value &= (1 << bits) - 1
    if fmt in ("<i", "<q") and value >= 1 << (bits - 1):
        value -= 1 << bits
    struct.pack_into(fmt, buf, rng.randrange(len(buf) - width + 1), value)
    return buf


def _insert_delete(rng: random.Random, buf: bytearray) -> bytearray:
    if not buf:
        return buf
    at = rng.randrange(len(buf))
    if rng.random() < 0.5:
        buf[at:at] = rng.randbytes(rng.randint(1, 16))
    else:
        del buf[at:at + rng.randint(1, 16)]
    return buf


def _header_field(rng: random.Random, buf: bytearray) -> bytearray:
    if len(buf) < F.HEADER_SIZE or buf[:len(F.MAGIC)] != F.MAGIC:
        return buf
    fields = list(F.HEADER.unpack_from(buf, 0))
    i = rng.randrange(1, len(fields))
    limit = 2**32 - 1 if i in (1, 2, 6, 7) else 2**64 - 1
    fields[i] = rng.choice([v for v in INTERESTING if 0 <= v <= limit] + [fields[i] + 64])
    fields[i] = min(fields[i], limit)
    F.HEADER.pack_into(buf, 0, *fields)
    return buf


MUTATORS = [_truncate, _flip_bits, _overwrite_range, _interesting_int, _interesting_int,
            _insert_delete, _header_field]


def _index_mutation(rng: random.Random) -> bytes:
    """A dataclass-level mutation: one index of the sample program set to anything."""
    program = sample_program()
    forward = program.methods[0]
    values, code = list(forward.values), list(forward.instructions)
    index = rng.choice([rng.randrange(40), rng.choice([2**31, 2**32 - 1, 20, 19, 14])])
    choice = rng.randrange(6)
    if choice == 0:
        args = list(code[0].args)
        args[rng.randrange(len(args))] = index
        code[0] = P.KernelCall(code[0].op, tuple(args))
    elif choice == 1:
        code[rng.randrange(len(code))] = rng.choice(
            [P.KernelCall(index, ()), P.DelegateCall(index, (0,)), P.Move(index, 5),
             P.Free(index)])
    elif choice == 2:
        values[14] = P.TensorListValue((index, 14))  # may refer to itself
    elif choice == 3:
        values[3] = P.TensorValue(P.ScalarType.FLOAT32, (2, 3),
                                  storage=P.ArenaStorage(index % 3, 4 * index))
    elif choice == 4:
        values[1] = P.TensorValue(P.ScalarType.FLOAT32, (3, 4),
                                  storage=P.ConstantStorage(index % 4, index))
    else:
        values[15] = P.OptionalTensorListValue((None, index))
    method = P.Method(forward.name, tuple(values), forward.inputs, forward.outputs, tuple(code),
                      forward.operators, forward.memory_plan)
    return unverified_bytes(P.Program((method,) + program.methods[1:], program.segments,
                                 program.delegates, program.user_metadata))


_EXPR_OPS = ("+", "-", "*", "floordiv", "mod", "min", "max")


def _random_expr(rng: random.Random, depth: int) -> SizeExpr:
    if depth <= 0 or rng.random() < 0.3:
        if rng.random() < 0.5:
            return SizeExpr.sym(rng.choice(["s", "s", "t", "s_1"]))
        return SizeExpr.const(rng.choice(INTERESTING + [2, 3, 16, 32]))
    return SizeExpr(rng.choice(_EXPR_OPS), (_random_expr(rng, depth - 1),
                                             _random_expr(rng, depth - 1)))


def _symbolic_mutation(rng: random.Random) -> bytes:
    """A dataclass-level rewrite of one version-3 field of ``symbolic_program``."""
    program = symbolic_program()
    m = program.methods[0]
    symbols, symbolic, guards, state = list(m.symbols), list(m.symbolic_values), list(m.guards), list(m.state)
    choice = rng.randrange(5)
    try:
        if choice == 0:
            i = rng.randrange(len(symbolic))
            exprs = list(symbolic[i].exprs)
            exprs[0] = _random_expr(rng, rng.randrange(1, 6))
            symbolic[i] = SymbolicValue(symbolic[i].value, tuple(exprs))
        elif choice == 1:
            low = rng.choice(INTERESTING[:13])
            symbols = [Symbol(rng.choice(["s", "t"]), low, max(low, rng.choice(INTERESTING[:14])))]
        elif choice == 2:
            guards.append(Guard(_random_expr(rng, 3), rng.choice(["==", "!=", "<=", "<"]),
                                _random_expr(rng, 3)))
        elif choice == 3:
            symbolic.append(SymbolicValue(rng.choice([0, 3, 4, 5, 40, 2**31]),
                                          (_random_expr(rng, 2),)))
        else:
            state.append(StateSlot(rng.choice(["count", "other"]), rng.choice([0, 4, 5, 40])))
        method = P.Method(m.name, m.values, m.inputs, m.outputs, m.instructions, m.operators,
                          m.memory_plan, symbols, symbolic, guards, state)
    except ProgramError:
        return P.to_bytes(program)  # the dataclasses refused it themselves: fine
    return unverified_bytes(P.Program((method,), program.segments))


def _growing_mutation(rng: random.Random) -> bytes:
    """A dataclass-level rewrite of a version-4 field of ``growing_program`` or of
    ``symbolic_program``: the grow flag, a growing tensor's storage and sizes."""
    program = rng.choice([growing_program, symbolic_program])()
    m = program.methods[0]
    symbols, values = list(m.symbols), list(m.values)
    choice = rng.randrange(4)
    try:
        if choice == 0:  # flip a symbol's grow flag
            i = rng.randrange(len(symbols))
            symbols[i] = Symbol(symbols[i].name, symbols[i].min, symbols[i].max, not symbols[i].grow)
        elif choice == 1:  # drop a tensor's storage (unplanned) or plan a growing one
            i = rng.randrange(len(values))
            if type(values[i]) is P.TensorValue:
                storage = None if values[i].storage is not None else P.ArenaStorage(
                    0, rng.choice([0, 64, 4096, 2**40]))
                values[i] = dataclasses.replace(values[i], storage=storage)
        elif choice == 2:  # a growing tensor's first sizes: empty, huge, another rank
            i = rng.randrange(len(values))
            if type(values[i]) is P.TensorValue:
                values[i] = dataclasses.replace(values[i], sizes=rng.choice(
                    [(0,), (2**40,), (2**24, 2**24), (1, 1), (4,)]))
        else:  # a growing symbol's range
            low = rng.choice(INTERESTING[:13])
            symbols = [Symbol(s.name, low, max(low, rng.choice(INTERESTING)), s.grow)
                       for s in symbols]
        method = dataclasses.replace(m, symbols=tuple(symbols), values=tuple(values))
    except (ProgramError, ValueError, TypeError):
        return P.to_bytes(program)  # the dataclasses refused it themselves: fine
    return unverified_bytes(P.Program((method,), program.segments))


def debug_program() -> P.Program:
    """``sample_program`` with a debug table (user metadata ``opforge.debug``): a node per
    kernel call, capturing its last (out) argument when that is a tensor."""
    from opforge.program.debug import DebugCapture, DebugInfo, DebugNode, MethodDebug, with_debug_handles

    program = sample_program()
    methods = {}
    for m in program.methods:
        nodes, captures = [], []
        for i, ins in enumerate(m.instructions):
            if type(ins) is P.KernelCall and ins.args and type(m.values[ins.args[-1]]) is P.TensorValue:
                nodes.append(DebugNode(f"node{i}", m.operators[ins.op].key, f"model.py:{i}"))
                captures.append(DebugCapture(i, ins.args[-1], len(nodes) - 1))
        delegates = {d: ((0,), ()) for d in range(len(program.delegates))} if nodes else {}
        methods[m.name] = MethodDebug(tuple(nodes), tuple(captures), delegates)
    return with_debug_handles(program, DebugInfo(methods))


def _debug_mutation(rng: random.Random) -> bytes:
    """A rewrite of the debug table's JSON text: any number, type, nesting or truncation."""
    import json

    program = debug_program()
    meta = dict(program.user_metadata)
    doc = json.loads(meta["opforge.debug"])
    forward = doc["methods"][program.methods[0].name]
    choice = rng.randrange(6)
    junk = rng.choice([rng.choice(INTERESTING), -1, 1.5, None, "x", [], {}, [[0]], True, "\u0000"])
    if choice == 0 and forward["captures"]:  # flat: 4 ints per capture
        forward["captures"][rng.randrange(len(forward["captures"]))] = junk
    elif choice == 1 and forward["nodes"]:  # flat: name, op index, source index per node
        nodes = forward["nodes"]
        if rng.random() < 0.2:
            nodes.append(junk)  # a count that is no multiple of 3
        else:
            nodes[rng.randrange(len(nodes))] = junk
    elif choice == 2:
        forward[rng.choice(["sources", "ops", "nodes", "captures", "delegates", "version"])] = junk
    elif choice == 3:
        doc[rng.choice(["version", "methods"])] = junk
    elif choice == 4:
        forward["delegates"] = [[junk, [[junk]]]]
    text = json.dumps(doc)
    if choice == 5:
        text = rng.choice([text[:rng.randrange(len(text))], "[" * rng.choice([10, 5000, 100000]),
                           text.replace("[", "{", 1), '{"version": 1, "methods": {"x": {}}}'])
    meta["opforge.debug"] = text
    return unverified_bytes(P.Program(program.methods, program.segments, program.delegates,
                                      tuple(meta.items())))


def named_program() -> P.Program:
    """``sample_program`` with two named data entries (format version 6): bytes delegate
    blobs refer to by key, each its own segment."""
    program = sample_program()
    first = len(program.segments)
    segments = program.segments + (P.Segment(bytes(range(200))), P.Segment(b"\x01" * 4096))
    named = (P.NamedData("sha256:" + "ab" * 32, first), P.NamedData("weights.q", first + 1))
    return dataclasses.replace(program, segments=segments, named_data=named)


def _named_mutation(rng: random.Random) -> bytes:
    """A rewrite of the named data table: dangling or huge segment indices, duplicate,
    empty, long or unprintable keys, entries added or dropped."""
    program = named_program()
    named = list(program.named_data)
    index = rng.choice([rng.randrange(8), 2**31, 2**32 - 1, len(program.segments)])
    key = rng.choice(["", "k", "x" * rng.choice([256, 257, 5000]), "a\nb", "\u0000",
                      named[0].key, "sha256:" + "0" * 64, "\ud7ff" * 3])
    choice = rng.randrange(4)
    if choice == 0:
        named[rng.randrange(len(named))] = _unchecked_named(key, named[0].segment)
    elif choice == 1:
        named[rng.randrange(len(named))] = _unchecked_named(named[0].key + "x", index)
    elif choice == 2:
        named.append(_unchecked_named(key, index))
    else:
        named = named[:rng.randrange(len(named) + 1)] * rng.choice([1, 2, 1000])
    return unverified_bytes(dataclasses.replace(program, named_data=tuple(named)))


def _unchecked_named(key: str, segment: int) -> P.NamedData:
    """A NamedData without its own checks (what a hostile file can hold; the decoder's
    reconstruction refuses what they refuse)."""
    named = object.__new__(P.NamedData)
    object.__setattr__(named, "key", key)
    object.__setattr__(named, "segment", segment)
    return named


def mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    if rng.random() < 0.1:
        return _index_mutation(rng)
    if rng.random() < 0.05:
        return _named_mutation(rng)
    if rng.random() < 0.1:
        return _debug_mutation(rng)
    if rng.random() < 0.1:
        return _symbolic_mutation(rng)
    if rng.random() < 0.1:
        return _growing_mutation(rng)
    seed = rng.choice(seeds)
    head, buf = b"", bytearray(seed)
    if rng.random() < 0.5:  # mutate the metadata and segments only: more inputs get past
        head, buf = seed[:F.HEADER_SIZE], bytearray(seed[F.HEADER_SIZE:])  # the header
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        buf = rng.choice(MUTATORS)(rng, buf)
    out = head + bytes(buf)
    if rng.random() < 0.8:
        return reseal(out, fix_file_size=rng.random() < 0.7)
    return out


def run_one(data: bytes) -> str:
    """'loaded' or 'rejected: <reason>'; raises on a crash."""
    try:
        program = P.from_bytes(data)
    except ProgramError as e:
        return "rejected: " + _reason(str(e))
    P.verify(program)
    again = P.to_bytes(program)
    if P.to_bytes(P.from_bytes(again)) != again:
        raise AssertionError("a loaded program does not re-encode stably")
    for method in program.methods:
        if method.symbols:
            _bind_somewhere(method, len(data))
    return "loaded"


def _bind_somewhere(method, salt: int) -> None:
    """Bind the symbols at one pseudo-random input shape: a ProgramError or a method whose
    every symbolic tensor fits its upper-bound sizes."""
    from opforge.runtime.shapes import ShapeBinder

    rng = random.Random(salt)
    binder = ShapeBinder("fuzz", method)
    shapes = {p: tuple(rng.choice([0, 1, 2, 3, 16, 17, 32]) for _ in method.values[i].sizes)
              for p, i in enumerate(method.inputs) if type(method.values[i]) is P.TensorValue}
    try:
        concrete = binder.concrete(binder.bind(shapes))
    except ProgramError:
        return
    growing = growing_values(method)  # no slot: any size the limit allows
    for sv in method.symbolic_values:
        if sv.value in growing:
            continue
        value, actual = method.values[sv.value], concrete.values[sv.value]
        if type(value) is P.TensorValue and any(a > b for a, b in zip(actual.sizes, value.sizes)):
            raise AssertionError(f"bound sizes {actual.sizes} exceed the slot {value.sizes}")


def _reason(message: str) -> str:
    """The subject of the innermost message part, with numbers and names blanked out."""
    body = message.split("`: ", 1)[-1].split(" — ")[0].split(": ")[-1]
    return re.sub(r"'[^']*'|\d+", "#", body)[:60]


def seeds() -> list[bytes]:
    return [P.to_bytes(sample_program()), P.to_bytes(chain_program(3)),
            P.to_bytes(P.Program(methods=())), P.to_bytes(symbolic_program()),
            P.to_bytes(growing_program()), P.to_bytes(splat_state_program()),
            P.to_bytes(debug_program()), P.to_bytes(named_program())]


def builtin(count: int, seed: int, crash_dir: Path) -> int:
    rng = random.Random(seed)
    corpus = seeds()
    stats: collections.Counter[str] = collections.Counter()
    reasons: collections.Counter[str] = collections.Counter()
    crashes, slowest = 0, (0.0, b"")
    start = time.perf_counter()
    for n in range(count):
        data = mutate(rng, corpus)
        t0 = time.perf_counter()
        try:
            outcome = run_one(data)
        except Exception as e:  # noqa: BLE001 -- anything but ProgramError is a finding
            crashes += 1
            crash_dir.mkdir(parents=True, exist_ok=True)
            (crash_dir / f"crash-{n}.opf").write_bytes(data)
            print(f"CRASH #{n}: {type(e).__name__}: {e}", file=sys.stderr)
            continue
        elapsed = time.perf_counter() - t0
        slowest = max(slowest, (elapsed, data))
        stats["loaded" if outcome == "loaded" else "rejected"] += 1
        if outcome != "loaded":
            reasons[outcome[len("rejected: "):]] += 1
    total = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"inputs run:   {count} (seed {seed}, {total:.1f} s, {count / total:.0f}/s)")
    print(f"loaded:       {stats['loaded']}")
    print(f"rejected:     {stats['rejected']} (ProgramError)")
    print(f"crashes:      {crashes}")
    print(f"slowest:      {slowest[0] * 1e3:.2f} ms ({len(slowest[1])}-byte input)")
    print(f"peak RSS:     {peak_mib:.0f} MiB")
    print("top rejection reasons:")
    for reason, k in reasons.most_common(12):
        print(f"  {k:7d}  {reason}")
    return 1 if crashes else 0


def with_atheris(argv: list[str]) -> int:
    import atheris  # only with --atheris

    corpus = seeds()

    def test_one_input(data: bytes) -> None:
        run_one(data)  # any exception but ProgramError propagates: atheris reports it

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        if rng.random() < 0.5:
            return atheris.Mutate(data, max_size)
        return mutate(rng, [data] + corpus)[:max_size]

    atheris.Setup(argv, test_one_input, custom_mutator=custom_mutator)
    atheris.Fuzz()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="inputs to run")
    parser.add_argument("--seed", type=int, default=0, help="random seed (fixed by default)")
    parser.add_argument("--crash-dir", type=Path,
                        default=Path(tempfile.gettempdir()) / "opforge-program-fuzz",
                        help="where crashing inputs are written")
    parser.add_argument("--atheris", action="store_true",
                        help="use atheris (libFuzzer) if installed; extra args go to it")
    args, rest = parser.parse_known_args()
    if args.atheris:
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed; using the built-in mutator", file=sys.stderr)
        else:
            return with_atheris([sys.argv[0], *rest])
    return builtin(args.count, args.seed, args.crash_dir)


if __name__ == "__main__":
    sys.exit(main())
