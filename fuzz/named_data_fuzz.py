"""On-demand fuzzer for named data at run time: a cpu-delegated program whose named-data
table, segment table and the blobs' references to named data are mutated, then loaded
(``opforge.runtime.load``: reader, verifier, the cpu backend's init) and called.

    python fuzz/named_data_fuzz.py --count 2000            # fixed seed; report on stdout

Every case must run or end in an ``OpforgeError``; anything else is a finding: another
exception, or a crash (each case runs in a worker process; a worker that dies is restarted
after the case that killed it). ``program_fuzz.py`` mutates the same table for the reader
and verifier alone; this one reaches the engines that read what the table points at.

Mutations (structure-aware, the file resealed so they reach the checks past its CRC):

- the table: an entry's segment index out of range (-1 as u32, the segment count, 2**32-1)
  or pointing at another segment (a delegate blob, another entry's, the constants); keys
  swapped, emptied, duplicated, made unprintable or 300 characters long; an entry dropped;
- the segment table, in place in the file's metadata: an offset past the file's end,
  unaligned, negative or 2**62; a size past the end or 2**62; a segment moved onto another
  one (overlap: the same bytes twice) or half onto it, or grown over its neighbour;
- a blob's named tensor: another key (of another size or layout), its byte count changed,
  its dtype or dims changed at the same byte count (two readers, two layouts).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

INTERESTING_SEGMENTS = [-1, 2**32 - 1, 2**31]
INTERESTING_OFFSETS = [-64, 1, 63, 2**62, 2**63 - 1]


def seed_program():
    """Two methods, two cpu delegates sharing two named weights (the test's ``_Mlp``)."""
    import warnings

    import torch

    from opforge.export import export

    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.a = torch.nn.Parameter(torch.randn(64, 48, generator=g) / 8)
            self.b = torch.nn.Parameter(torch.randn(32, 64, generator=g) / 8)
            self.scale = torch.nn.Parameter(torch.randn(5, 32 * 40, generator=g))

        def forward(self, x):
            y = torch.nn.functional.linear(torch.relu(x @ self.a.T), self.b)
            return y, (y.repeat(1, 40) * self.scale)  # scale: named, read in place per call

    class Doubled(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, x):
            y, z = self.inner(x)
            return 2 * y + 1, z

    model = Mlp().eval()
    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(None, methods={"forward": (model, (x,)), "doubled": (Doubled(model), (x,))},
                      kernels="portable", backends=["cpu"])


# --- mutations ---------------------------------------------------------------------------------

def _reseal_blob(data: bytes, edit) -> bytes:
    """The blob with its plan edited, written back whole (CRC made valid again)."""
    from fuzz.cpu_blob_write import write_blob
    from opforge.backends.cpu import blob

    _, version, plan_len, data_len, _, reserved = blob.HEADER.unpack_from(data, 0)
    plan = json.loads(data[blob.HEADER.size:blob.HEADER.size + plan_len])
    edit(plan)
    return write_blob(plan, data[-data_len:] if data_len else b"", version=version,
                      reserved=reserved)


def _table(rng: random.Random, program):
    from opforge.program import NamedData

    named = list(program.named_data)
    i = rng.randrange(len(named))
    choice = rng.randrange(6)
    if choice == 0:
        named[i] = _unchecked(named[i].key, rng.choice(
            INTERESTING_SEGMENTS + [len(program.segments), len(program.segments) + 1]))
    elif choice == 1:  # another segment: a blob, another entry's, the constants
        named[i] = NamedData(named[i].key, rng.randrange(len(program.segments)))
    elif choice == 2 and len(named) > 1:
        j = (i + 1) % len(named)
        named[i], named[j] = NamedData(named[j].key, named[i].segment), NamedData(named[i].key, named[j].segment)
    elif choice == 3:
        named[i] = _unchecked(rng.choice(["", "k" * 300, "\x00\x01", named[(i + 1) % len(named)].key]),
                              named[i].segment)
    elif choice == 4:
        del named[i]
    else:
        named.append(named[i])
    return dataclasses.replace(program, named_data=tuple(named))


def _unchecked(key, segment):
    from opforge.program import NamedData

    entry = object.__new__(NamedData)
    object.__setattr__(entry, "key", key)
    object.__setattr__(entry, "segment", segment)
    return entry


def _blob_refs(rng: random.Random, program):
    from opforge.program import Segment

    keys = [n.key for n in program.named_data]
    d = rng.randrange(len(program.delegates))
    seg = program.delegates[d].segment
    choice = rng.randrange(4)

    def edit(plan):
        named = [t for t in plan["tensors"] if "named" in t]
        t = rng.choice(named)
        if choice == 0:
            t["named"][0] = rng.choice(keys + ["sha256:" + "0" * 64])
        elif choice == 1:
            t["named"][1] = rng.choice([0, 1, t["named"][1] - 4, t["named"][1] + 64, 2**40])
        elif choice == 2:  # the same bytes as another dtype of its itemsize
            t["dtype"] = {6: 3, 3: 6, 7: 4, 4: 7}.get(t["dtype"], t["dtype"])
        else:  # the same bytes as another shape
            dims = list(reversed(t["dims"])) if len(t["dims"]) > 1 else [1, *t["dims"]]
            t["dims"] = dims
            t["strides"] = [int(__import__("math").prod(dims[k + 1:])) for k in range(len(dims))]
    segments = list(program.segments)
    segments[seg] = Segment(_reseal_blob(bytes(segments[seg].data), edit))
    return dataclasses.replace(program, segments=tuple(segments))


def _segment_table(rng: random.Random, data: bytes) -> bytes:
    """Rewrite one (offset, size) pair of the segment table where it lies in the metadata."""
    from opforge.program import _format as F
    from opforge.program._sample import reseal

    import numpy as np

    from opforge.program import from_bytes

    head = F.HEADER.unpack_from(data, 0)
    meta_off, meta_size, data_off = head[4], head[5], head[8]
    meta = data[meta_off:meta_off + meta_size]
    buffer = memoryview(data)
    base = np.frombuffer(buffer, np.uint8).ctypes.data
    pairs = []  # (file position of the pair, offset, size) of each segment's table entry
    for seg in from_bytes(buffer).segments:
        if not seg.data.nbytes:
            continue
        start = np.frombuffer(seg.data, np.uint8).ctypes.data - base  # its file offset
        where = meta.find(struct.pack("<qq", start - data_off, seg.data.nbytes))
        if where >= 0:
            pairs.append((meta_off + where, start - data_off, seg.data.nbytes))
    if not pairs:
        return data
    position, offset, size = rng.choice(pairs)
    other = rng.choice(pairs)
    choice = rng.randrange(6)
    if choice == 0:
        offset = rng.choice(INTERESTING_OFFSETS + [len(data) - data_off, len(data) - data_off + 64])
    elif choice == 1:
        size = rng.choice([len(data), 2**62, -1, size + 64, 0])
    elif choice == 2:  # onto another segment: the same bytes twice
        offset, size = other[1], other[2]
    elif choice == 3:  # half onto another one
        offset = max(0, other[1] - (size // 128) * 64)
    elif choice == 4:  # grown over its neighbour
        size = size + other[2] + 64
    else:
        offset = offset + 64 * rng.randint(-2, 2)
    out = bytearray(data)
    struct.pack_into("<qq", out, position, offset, size)
    return reseal(out, fix_file_size=True)


def mutate(rng: random.Random, program, seed_bytes: bytes) -> tuple[str, bytes]:
    from opforge.errors import OpforgeError
    from opforge.program._sample import unverified_bytes

    kind = rng.choice(["table", "table", "segments", "segments", "refs", "refs"])
    if kind == "segments":
        return kind, _segment_table(rng, seed_bytes)
    try:
        mutated = _table(rng, program) if kind == "table" else _blob_refs(rng, program)
        return kind, unverified_bytes(mutated)
    except OpforgeError:
        return kind, seed_bytes


# --- running -----------------------------------------------------------------------------------

def run_one(data: bytes, path: Path) -> str:
    import numpy as np

    from opforge.errors import OpforgeError
    from opforge.runtime import load

    path.write_bytes(data)  # from a file: named data read through its mapping
    try:
        loaded = load(path)
        x = np.ones((5, 48), np.float32)
        for name in ("forward", "doubled"):
            loaded.method(name)(x)
        return "ran"
    except OpforgeError as e:
        return f"refused: {type(e).__name__}"
    except Exception as e:  # noqa: BLE001 - a finding
        return f"FINDING: {type(e).__name__}: {str(e)[:300]}"


def worker(seed_path: Path, seed: int, start: int, count: int, tmp: Path) -> None:
    """Cases [start, start+count) of the run seeded ``seed``, one line each on stdout."""
    from opforge.program import from_bytes

    seed_bytes = seed_path.read_bytes()
    program = from_bytes(seed_bytes)
    for i in range(start, start + count):
        rng = random.Random(seed * 1_000_003 + i)
        kind, data = mutate(rng, program, seed_bytes)
        print(json.dumps({"case": i, "start": True}), flush=True)
        outcome = run_one(data, tmp / f"case{os.getpid()}.opf")
        print(json.dumps({"case": i, "kind": kind, "outcome": outcome}), flush=True)


def run(count: int, seed: int, tmp: Path, seed_path: Path | None = None) -> dict:
    """Run ``count`` cases in worker processes; the outcomes and the findings."""
    from opforge.program import save

    tmp.mkdir(parents=True, exist_ok=True)
    if seed_path is None:
        seed_path = tmp / "seed.opf"
        save(seed_program(), seed_path)
    outcomes: collections.Counter = collections.Counter()
    findings: list[dict] = []
    i = 0
    while i < count:
        proc = subprocess.run([sys.executable, __file__, "--worker", str(seed_path), "--seed",
                               str(seed), "--start", str(i), "--count", str(count - i),
                               "--tmp", str(tmp)], capture_output=True, text=True, timeout=3600)
        last = i
        for line in proc.stdout.splitlines():
            row = json.loads(line)
            last = row["case"]
            if "outcome" in row:
                outcomes[f"{row['kind']}: {row['outcome']}"] += 1
                if row["outcome"].startswith("FINDING"):
                    findings.append(row)
                last += 1
        if proc.returncode != 0:  # the case after the last finished one killed the worker
            findings.append({"case": last, "outcome": f"worker died: {proc.returncode}",
                             "stderr": proc.stderr[-1500:]})
            outcomes["crash"] += 1
            last += 1
        i = last
    return {"cases": count, "outcomes": dict(outcomes), "findings": findings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=43)
    parser.add_argument("--tmp", type=Path, default=Path("/tmp/opforge-named-fuzz"))
    parser.add_argument("--worker", type=Path)
    parser.add_argument("--start", type=int, default=0)
    args = parser.parse_args()
    if args.worker is not None:
        worker(args.worker, args.seed, args.start, args.count, args.tmp)
        return 0
    report = run(args.count, args.seed, args.tmp)
    print(json.dumps(report, indent=1))
    return 1 if report["findings"] else 0


if __name__ == "__main__":
    sys.exit(main())
