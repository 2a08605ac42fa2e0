"""Shrinks a finding of ``cpu_blob_fuzz.py`` to the fields it needs.

A finding is a seed program with some fields of one delegate's plan changed. The
difference between the two is cut into units — one tensor entry, one op entry, the plan's
inputs/outputs/impls, a changed run of constant bytes, one compile spec, the blob header —
and each unit is put back to the seed's value in turn; a unit stays mutated only when the
case stops failing the same way without it (same class; same signal, exit status or
exception type). What is left is the culprit, and the report dedupes findings by it: the
classes, the op kinds its units touch and the fields that differ inside them.
"""

from __future__ import annotations

import copy
import dataclasses
import json

from opforge.backends.cpu import blob as B
from opforge.program import DelegateBlob, Segment, from_bytes

from cpu_blob_mutate import ParsedSeed, write_blob


def read_blob(raw: bytes) -> tuple[dict, dict, bytes]:
    """(header fields, plan, data) of a blob, without the checks of ``blob.parse``."""
    magic, version, plan_len, data_len, crc, reserved = B.HEADER.unpack_from(raw, 0)
    text = raw[B.HEADER.size:B.HEADER.size + plan_len]
    data = raw[B._align(B.HEADER.size + plan_len):]
    return {"version": version, "reserved": reserved}, json.loads(text), bytes(data)


@dataclasses.dataclass(frozen=True)
class Unit:
    where: tuple          # ("tensor", i), ("op", i), ("plan", key), ("data", start, end), ...
    fields: tuple = ()    # the keys that differ inside it
    kinds: tuple = ()     # op kinds it touches

    def __str__(self) -> str:
        return "/".join(map(str, self.where)) + (f" {{{','.join(self.fields)}}}" if self.fields else "")


@dataclasses.dataclass
class Pair:
    """A seed's delegate and the mutated program's: what differs, and how to mix them."""
    seed: ParsedSeed
    index: int            # the delegate
    plan: dict
    data: bytes
    m_header: dict
    m_plan: dict
    m_data: bytes
    m_specs: dict

    @classmethod
    def of(cls, seed: ParsedSeed, program_bytes: bytes) -> "Pair":
        program = from_bytes(program_bytes)
        for index, plan, data in seed.plans:
            d = program.delegates[index]
            raw = bytes(program.segments[d.segment].data)
            if raw != bytes(seed.program.segments[seed.program.delegates[index].segment].data) \
                    or d.compile_specs != seed.program.delegates[index].compile_specs:
                header, m_plan, m_data = read_blob(raw)
                return cls(seed, index, plan, data, header, m_plan, m_data, dict(d.compile_specs))
        raise ValueError("the program does not differ from its seed")

    def _seed_header(self) -> dict:
        seed = self.seed.program
        return read_blob(bytes(seed.segments[seed.delegates[self.index].segment].data))[0]

    def units(self) -> list[Unit]:
        out = []
        specs = dict(self.seed.program.delegates[self.index].compile_specs)
        for key in sorted(set(specs) | set(self.m_specs)):
            if specs.get(key) != self.m_specs.get(key):
                out.append(Unit(("spec", key), (f"spec.{key}",)))
        if self.m_header != self._seed_header():
            out.append(Unit(("header",), ("blob.header",)))
        p, m = self.plan, self.m_plan
        for key in sorted(set(p) | set(m)):
            if key in ("tensors", "ops") and type(m.get(key)) is list and len(m[key]) == len(p[key]):
                for i, (a, b) in enumerate(zip(p[key], m[key])):
                    if a != b:
                        fields = tuple(sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)))
                        out.append(Unit((key[:-1], i), tuple(f"{key[:-1]}.{f}" for f in fields),
                                        self._kinds(key[:-1], i)))
            elif p.get(key) != m.get(key):
                out.append(Unit(("plan", key), (f"plan.{key}",)))
        if len(self.data) == len(self.m_data):
            start = None
            for k in range(0, len(self.data) + 64, 64):
                same = self.data[k:k + 64] == self.m_data[k:k + 64]
                if not same and start is None:
                    start = k
                elif same and start is not None:
                    out.append(Unit(("data", start, k), ("const.bytes",), self._data_kinds(start, k)))
                    start = None
        elif self.data != self.m_data:
            out.append(Unit(("data",), ("const.bytes",)))
        return out

    def _kinds(self, what: str, i: int) -> tuple:
        if what == "op":
            kinds = {self.plan["ops"][i]["kind"], self.m_plan["ops"][i].get("kind", "?")}
        else:
            kinds = {op["kind"] for op in self.plan["ops"] if i in op["in"] + op["out"]
                     or any(p[4] == i for p in op["post"] if p[0] == 1)}
        return tuple(sorted(map(str, kinds)))

    def _data_kinds(self, start: int, end: int) -> tuple:
        for i, t in enumerate(self.plan["tensors"]):
            if "data" in t and t["data"][0] < end and start < t["data"][0] + t["data"][1]:
                return self._kinds("tensor", i)
        return ()

    def build(self, keep: list[Unit]) -> bytes:
        """The seed program with only the ``keep`` units mutated."""
        plan, data = copy.deepcopy(self.plan), bytearray(self.data)
        header = self._seed_header()
        specs = dict(self.seed.program.delegates[self.index].compile_specs)
        for u in keep:
            kind = u.where[0]
            if kind == "spec":
                if u.where[1] in self.m_specs:
                    specs[u.where[1]] = self.m_specs[u.where[1]]
                else:
                    specs.pop(u.where[1], None)
            elif kind == "header":
                header = dict(self.m_header)
            elif kind in ("tensor", "op"):
                plan[kind + "s"][u.where[1]] = copy.deepcopy(self.m_plan[kind + "s"][u.where[1]])
            elif kind == "plan":
                if u.where[1] in self.m_plan:
                    plan[u.where[1]] = copy.deepcopy(self.m_plan[u.where[1]])
                else:
                    plan.pop(u.where[1], None)
            elif len(u.where) == 3:
                data[u.where[1]:u.where[2]] = self.m_data[u.where[1]:u.where[2]]
            else:
                data = bytearray(self.m_data)
        from cpu_blob_mutate import program_with_blob

        blob = write_blob(plan, data, version=header["version"], reserved=header["reserved"])
        return program_with_blob(self.seed.program, self.index, blob, sorted(specs.items()))

    def describe(self, keep: list[Unit]) -> list[str]:
        lines = []
        for u in keep:
            kind = u.where[0]
            if kind in ("tensor", "op"):
                a = self.plan[kind + "s"][u.where[1]]
                b = self.m_plan[kind + "s"][u.where[1]]
                for f in sorted(set(a) | set(b)):
                    if a.get(f) != b.get(f):
                        lines.append(f"{kind}s[{u.where[1]}].{f}: {_short(a.get(f))} -> "
                                     f"{_short(b.get(f))}   ({kind}: {_short(_brief(a))})")
            elif kind == "spec":
                specs = dict(self.seed.program.delegates[self.index].compile_specs)
                lines.append(f"compile spec {u.where[1]}: {specs.get(u.where[1])!r} -> "
                             f"{self.m_specs.get(u.where[1])!r}")
            elif kind == "plan":
                lines.append(f"plan.{u.where[1]}: {_short(self.plan.get(u.where[1]))} -> "
                             f"{_short(self.m_plan.get(u.where[1]))}")
            elif kind == "header":
                lines.append(f"blob header: {self.m_header}")
            else:
                lines.append(f"constant bytes {u.where[1:]} changed")
        return lines


def _brief(entry: dict) -> dict:
    return {k: v for k, v in entry.items() if k not in ("node", "args")}


def _short(v) -> str:
    text = json.dumps(v) if not isinstance(v, str) else v
    return text if len(text) <= 160 else text[:157] + "..."


def same_failure(a: tuple[str, str], b: tuple[str, str]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] in ("crash", "raw"):
        return a[1].split(":")[0] == b[1].split(":")[0]
    return True


def minimize(seed: ParsedSeed, program_bytes: bytes, target: tuple[str, str], run,
             rounds: int = 2) -> tuple[bytes, list[Unit], list[str]]:
    """(smallest program found, its units, their description); ``run(bytes)`` answers
    (class, detail)."""
    pair = Pair.of(seed, program_bytes)
    keep = pair.units()
    for _ in range(rounds):
        changed = False
        for u in list(keep):
            if len(keep) == 1:
                break
            trial = [k for k in keep if k != u]
            if same_failure(run(pair.build(trial)), target):
                keep, changed = trial, True
        if not changed:
            break
    return pair.build(keep), keep, pair.describe(keep)
