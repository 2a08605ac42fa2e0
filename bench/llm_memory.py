"""Where a decoder's resident memory goes: opforge's native tool (and Python worker)
beside llama-bench.

    .venv/bin/python bench/llm_memory.py                       # base: int4, 8da4w vs Q4_0
    .venv/bin/python bench/llm_memory.py --runtimes opforge-generate llamacpp-f32

Each runtime runs once in its own process, as bench/llm.py measures it (opforge-generate:
the prompt's 128 tokens and 128 new tokens, one warm-up and one counted generation;
llama-bench: its prompt test ``-p 128 -n 0`` and its decode test ``-p 0 -n 128 -d 128``,
one repetition each). While it runs this process reads ``/proc/<pid>/smaps`` every few
milliseconds and keeps the reading at the child's largest VmRSS: the peak's resident bytes
by mapping, grouped as

- the model file (the ``.opf`` / ``.gguf`` mapping: weights read in place),
- anonymous memory (heap and anonymous mappings: arenas, KV caches, scratch, allocator),
- the compute libraries (oneDNN, opforge's cpu engine; llama.cpp's ggml and llama),
- everything else (the executable, the C/C++ runtime libraries).

For an opforge program it also lists what the file holds (the cpu delegates' constants by
kind, each named constant once, and the program's other segments: the KV caches' initial
values). Writes ``results/llm_llamacpp-<machine kind>-<config>-memory.md`` (+ ``.jsonl``).
A sampled peak may miss a spike shorter than the period; VmHWM (the kernel's own peak) is
reported beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from llm_models import CONFIGS, NEW_TOKENS, PROMPT_TOKENS  # noqa: E402
from llm_report import PEERS  # noqa: E402
from llm_worker import NATIVE, artifact, native_command  # noqa: E402
from machine import describe_machine, machine_slug  # noqa: E402

DEFAULT = ("opforge-generate-int4", "opforge-generate-8da4w", "llamacpp-q4_0")
GROUPS = ("model file", "anonymous", "compute libraries", "other")
LIBRARIES = ("libdnnl", "libggml", "libllama", "libopforge_cpu")


def _status_kb(pid: int, field: str) -> int:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _smaps(pid: int) -> dict[str, int] | None:
    """Resident kB per mapping name (anonymous mappings merged), or None once it is gone."""
    rows: dict[str, int] = {}
    name = "[anon]"
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(maxsplit=6)
                if "-" in head[0] and not head[0].endswith(":"):
                    name = head[5].strip() if len(head) > 5 else "[anon]"
                elif head[0] == "Rss:":
                    rows[name] = rows.get(name, 0) + int(head[1])
    except (OSError, IndexError, ValueError):
        return None
    return rows


def _group(name: str, model: pathlib.Path) -> str:
    if name == str(model):
        return "model file"
    if name in ("[anon]", "[heap]", "[stack]") or name.startswith("[anon:"):
        return "anonymous"
    if any(lib in pathlib.Path(name).name for lib in LIBRARIES):
        return "compute libraries"
    return "other"


def peak_of(command: list[str], env: dict, model: pathlib.Path, stdin: str | None = None,
            period: float = 0.005) -> dict:
    """Run ``command``; its resident memory by group at its largest sampled VmRSS."""
    # output to files: a pipe nobody reads while the child runs could fill and stall it
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err, env=env,
                             text=True)
    child.stdin.write(stdin or "")
    child.stdin.close()
    best, best_rss, hwm = {}, -1, 0
    while child.poll() is None:
        rss = _status_kb(child.pid, "VmRSS")
        hwm = max(hwm, _status_kb(child.pid, "VmHWM"))
        if rss > best_rss:
            rows = _smaps(child.pid)
            if rows:
                best, best_rss = rows, rss
        time.sleep(period)
    child.wait()
    out.seek(0), err.seek(0)
    out, err = out.read(), err.read()
    if child.returncode:
        raise RuntimeError(f"{command[0]} — exit {child.returncode} — {err[-800:]}")
    groups = dict.fromkeys(GROUPS, 0)
    for name, kb in best.items():
        groups[_group(name, model)] += kb
    top = sorted(best.items(), key=lambda kv: -kv[1])[:8]
    return {"peak_rss_mb": best_rss / 1024, "vm_hwm_mb": hwm / 1024, "stdout": out,
            "groups_mb": {g: kb / 1024 for g, kb in groups.items()},
            "mappings_mb": {name: kb / 1024 for name, kb in top}}


def composition(path: pathlib.Path) -> dict[str, float]:
    """MB of the program file by what it holds: each cpu delegate constant (a named one
    once) by the op kind that reads it and its dtype, and the other segments."""
    from opforge.backends.cpu import blob
    from opforge.program import load

    program = load(str(path))
    names = {1: "int8", 3: "int32", 6: "float32", 0: "uint8", 5: "float16", 15: "bfloat16"}
    kinds: dict[str, float] = {}
    seen: set[str] = set()
    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        reader = {}
        for op in plan["ops"]:
            for position, t in enumerate(op["in"]):
                reader.setdefault(t, f"{op['kind']} input {position}")
        for tid, t in enumerate(plan["tensors"]):
            if not isinstance(t, dict) or t.get("role") != "const" or "named" not in t:
                continue
            key, nbytes = t["named"]
            if key in seen:
                continue
            seen.add(key)
            label = f"{reader.get(tid, 'no op')} ({names.get(t['dtype'], t['dtype'])})"
            kinds[label] = kinds.get(label, 0.0) + nbytes / 2**20
    named = sum(kinds.values())
    kinds["other segments (state initial values, unnamed constants) and the rest"] = \
        path.stat().st_size / 2**20 - named
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def measure(config: str, runtime: str, workdir: pathlib.Path, threads: int) -> dict:
    spec = {"workdir": str(workdir), "config": config, "runtime": runtime}
    path = artifact(spec)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if runtime.startswith(NATIVE):
        command, env = native_command({**spec, "threads": threads, "new_tokens": NEW_TOKENS}, 1)
        record = peak_of(command, env, path)
        result = json.loads(record.pop("stdout").splitlines()[-1])
        record["tool_vm_hwm_mb"] = result["memory_end"]["vm_hwm_kb"] / 1024
        record["composition_mb"] = composition(path)
        return record
    if runtime.startswith("opforge-"):  # a Python worker (bench/llm_worker.py) as llm.py runs it
        env.update(PYTHONPATH=os.pathsep.join((str(HERE.parent), str(HERE))),
                   PYTHONWARNINGS="ignore")
        spec.update(mode="measure", threads=threads, repeats=1, new_tokens=NEW_TOKENS)
        record = peak_of([sys.executable, str(HERE / "llm_worker.py")], env, path,
                         json.dumps(spec))
        record.pop("stdout")
        return record
    from llm_llamacpp import BIN

    records = []
    for extra in (["-p", str(PROMPT_TOKENS), "-n", "0"],
                  ["-p", "0", "-n", str(NEW_TOKENS), "-d", str(PROMPT_TOKENS)]):
        command = [str(BIN / "llama-bench"), "-m", str(path), "-t", str(threads), "-r", "1",
                   "-o", "json", *extra]
        record = peak_of(command, env, path)
        record.pop("stdout")
        records.append(record)
    return max(records, key=lambda r: r["peak_rss_mb"])


def markdown(setup: dict, rows: dict[str, dict]) -> str:
    m = setup["machine"]
    lines = [f"# Resident memory at the peak: {setup['config']}, {setup['threads']} thread(s)", "",
             f"{setup['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, load "
             f"{setup['load']:.1f}; opforge {m['opforge_commit']}. `{setup['command']}` "
             "(bench/llm_memory.py says how it is measured).", "",
             "| MB at the peak | " + " | ".join(rows) + " |",
             "| --- |" + " ---: |" * len(rows)]
    for group in GROUPS:
        lines.append(f"| {group} | " + " | ".join(
            f"{r['groups_mb'][group]:.1f}" for r in rows.values()) + " |")
    lines.append("| **sampled peak VmRSS** | " + " | ".join(
        f"**{r['peak_rss_mb']:.1f}**" for r in rows.values()) + " |")
    lines.append("| VmHWM | " + " | ".join(f"{r['vm_hwm_mb']:.1f}" for r in rows.values()) + " |")
    # each row against llama.cpp at its own precision (llm_report.PEERS: F32, Q8_0, Q4_0)
    def ratio(name: str, r: dict) -> str:
        peer = rows.get(PEERS.get(name, ("", None))[1] or "")
        return f"{r['vm_hwm_mb'] / peer['vm_hwm_mb']:.2f}" if peer else "–"
    if any(PEERS.get(name, ("", None))[1] in rows for name in rows):
        lines.append("| × llama.cpp at its precision (VmHWM) | " + " | ".join(
            ratio(name, r) for name, r in rows.items()) + " |")
    for name, r in rows.items():
        lines += ["", f"## {name}", "", "| mapping | MB resident at the peak |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.1f} |" for k, v in r["mappings_mb"].items()]
        if r.get("composition_mb"):
            lines += ["", "| the program file holds | MB |", "| --- | ---: |"]
            lines += [f"| {k} | {v:.1f} |" for k, v in r["composition_mb"].items()]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="base", choices=list(CONFIGS))
    parser.add_argument("--runtimes", nargs="+", default=list(DEFAULT))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work" / "llm")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = parser.parse_args(argv)
    rows = {r: measure(args.config, r, args.workdir.resolve(), args.threads) for r in args.runtimes}
    machine = describe_machine(HERE.parent)
    setup = {"config": args.config, "threads": args.threads, "machine": machine,
             "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
             "load": os.getloadavg()[0],
             "command": "bench/llm_memory.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    name = f"llm_llamacpp-{machine_slug(machine)}-{args.config}-memory"
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / f"{name}.jsonl", "w") as out:
        out.write(json.dumps({"event": "setup", **setup}) + "\n")
        for runtime, row in rows.items():
            out.write(json.dumps({"event": "memory", "runtime": runtime, **row}) + "\n")
    text = markdown(setup, rows)
    (args.out / f"{name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
