"""Language-model generation: prefill and decode tokens/s of opforge beside torch eager and
ONNX Runtime, at 1 and 2 threads, for a tiny decoder and a 125M-parameter one.

    bench/.venv-peers/bin/python bench/llm.py                      # both configs (~25 min)
    bench/.venv-peers/bin/python bench/llm.py --configs tiny --rounds 1 --repeats 3
    .venv/bin/python bench/llm.py --llamacpp --configs base        # beside llama.cpp
    .venv/bin/python bench/llm.py --llamacpp --configs 1b --threads 1  # 1b, interleaved

Steps: one export process per (config, runtime) → interleaved rounds of measuring workers
(one process per config × runtime × threads × round; one shuffled order, reversed every
other round) → a profile of the lean runtime's prefill and decode per op →
bench/results/llm.jsonl and llm.md. What each number means is in bench/README.md
("Language-model generation").

Every runtime's model returns the last prompt row's logits only (``TinyDecoder(
logits_to_keep=1)``, ``--logits-to-keep``; 0: every row's): what generation reads, and what
llama-bench's prompt processing computes (its batch asks for the last token's logits only).
The export record beside each file keeps the option; ``--reuse`` exports again a file made
with another.

``--llamacpp``: opforge's cpu-backend programs with float32 weights, int8 / int4 weights
(weight-only: float activations) and the dynamic schemes 8da8w / 8da4w (int8 activations
per block of 32, llama.cpp's Q8_0 / Q4_0 arithmetic), each measured in a Python worker
(``opforge-cpu*``) and in the native runtime's C++ tool (``opforge-generate*``, the same
program file), beside llama.cpp (built by bench/setup_llamacpp.sh) at F32, Q8_0 and Q4_0
from the same weights (bench/llm_llamacpp.py); results in
bench/results/llm_llamacpp-<machine kind>.md. Configs in ``LARGE`` (1b: files of several
GB) are prepared one export at a time and measured in interleaved rounds when the disk holds
all their files (``_disk_fits``), else (or with ``--one-at-a-time``) file by file, each
deleted after its measurement; the results name the mode that ran.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shlex
import shutil
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import THREAD_VARIABLES  # noqa: E402
from llm_models import CONFIGS, NEW_TOKENS, PROMPT_TOKENS  # noqa: E402
from llm_report import markdown, markdown_llamacpp  # noqa: E402
from llm_worker import NATIVE, artifact, program_runtime  # noqa: E402
from machine import describe_machine, machine_slug  # noqa: E402
from run import snapshot_opforge  # noqa: E402

LLAMACPP = ("llamacpp-f32", "llamacpp-q8_0", "llamacpp-q4_0")
OPFORGE_CPU = ("opforge-cpu", "opforge-cpu-int8", "opforge-cpu-int4", "opforge-cpu-8da8w",
               "opforge-cpu-8da4w")
PEER_SET = OPFORGE_CPU + tuple(NATIVE + r[len("opforge-cpu"):] for r in OPFORGE_CPU) + LLAMACPP
RUNTIMES = ("opforge-lean", "opforge-cpu", "eager", "ort") + PEER_SET[1:]
EXPORTED = ("opforge-lean", "opforge-cpu", "ort") + OPFORGE_CPU[1:] + LLAMACPP
LARGE = ("1b",)  # files of several GB: interleaved when the disk holds them all
DEFAULT_CONFIGS = ("tiny", "base")


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", nargs="+", default=None, choices=list(CONFIGS),
                        help=f"(default {' '.join(DEFAULT_CONFIGS)}; --llamacpp: base)")
    parser.add_argument("--runtimes", nargs="+", default=None, choices=RUNTIMES,
                        help="(default: opforge-lean, opforge-cpu, eager, ort; --llamacpp: "
                             f"{' '.join(PEER_SET)})")
    parser.add_argument("--llamacpp", action="store_true",
                        help="opforge-cpu (Python and the native tool) at float32, int8/int4 "
                             "weight-only, 8da8w/8da4w beside llama.cpp at F32/Q8_0/Q4_0 → "
                             "results/llm_llamacpp-<machine>.md")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (2)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="generations per worker after the warm-up (3)")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--logits-to-keep", type=int, default=1,
                        help="prompt rows whose logits the models return (1: the last, "
                             "llama-bench's work; 0: every row)")
    parser.add_argument("--one-at-a-time", action="store_true",
                        help="large configs (1b): prepare, measure and delete one file at a "
                             "time even when the disk would hold them all")
    parser.add_argument("--profile-steps", type=int, default=32,
                        help="decode steps the lean profile traces (32; 0: no profile)")
    parser.add_argument("--live", action="store_true",
                        help="run this checkout's opforge/ as it is (first on the workers' "
                             "PYTHONPATH), not a snapshot of its last commit")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a file an earlier run prepared in --workdir (its export "
                             "record beside it) instead of exporting again")
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work" / "llm")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = parser.parse_args(argv)
    args.configs = args.configs or (["base"] if args.llamacpp else list(DEFAULT_CONFIGS))
    args.runtimes = args.runtimes or list(PEER_SET if args.llamacpp else RUNTIMES[:4])
    # llama.cpp's quantized files are made from its F32 one: prepare that first
    args.runtimes.sort(key=lambda r: LLAMACPP.index(r) if r in LLAMACPP else -1)
    return args


class Workers:
    def __init__(self, workdir: pathlib.Path, opforge_path: str | None, log) -> None:
        self.workdir, self.opforge_path, self.log = workdir, opforge_path, log
        self.events: list[dict] = []

    def run(self, spec: dict, threads: int = 1, timeout: float = 1800.0) -> list[dict]:
        spec = {"workdir": str(self.workdir), "threads": threads, **spec}
        threads = spec["threads"]
        env = dict(os.environ)
        env.update({name: str(threads) for name in THREAD_VARIABLES})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (self.opforge_path, str(HERE)) if p)
        env.setdefault("PYTHONWARNINGS", "ignore")
        env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        self.log.write(f"\n=== {json.dumps(spec)}\n")
        self.log.flush()
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, str(HERE / "llm_worker.py")],
                                  input=json.dumps(spec), text=True, capture_output=True,
                                  env=env, timeout=timeout, cwd=self.workdir)
            self.log.write(done.stderr)
            lines = [json.loads(line) for line in done.stdout.splitlines()
                     if line.startswith("{")]
            if done.returncode and not any(e.get("event") == "error" for e in lines):
                lines.append({"event": "error", "spec": spec, "ok": False,
                              "error": f"exit {done.returncode}: {done.stderr[-500:]}"})
        except subprocess.TimeoutExpired:
            lines = [{"event": "error", "spec": spec, "ok": False,
                      "error": f"timed out after {timeout:.0f} s"}]
        for event in lines:
            event["wall_s"] = time.perf_counter() - start
            if event.get("event") == "error":
                say(f"  ! {spec['mode']} {spec.get('config')} {spec.get('runtime')}: "
                    f"{event['error'][:400]}")
        self.events.extend(lines)
        return lines


def _prepare(workers: Workers, config: str, runtime: str, args) -> bool:
    """Export (or, with --reuse, keep) ``runtime``'s file for ``config``; whether it is
    ready to measure."""
    path = artifact({"workdir": str(args.workdir), "config": config, "runtime": runtime})
    saved = path.with_name(path.name + ".prepared.jsonl")
    if args.reuse and path.exists() and saved.exists():
        events = [json.loads(line) for line in saved.read_text().splitlines()]
        kept = {e.get("logits_to_keep", 0) for e in events if e.get("event") == "prepared"}
        # a GGUF file does not depend on it (llama.cpp computes the rows it is asked for)
        if runtime in LLAMACPP or kept == {args.logits_to_keep}:
            say(f"reuse {path.name}")
            workers.events.extend(events)
            return True
        say(f"not reused: {path.name} was exported with logits_to_keep {sorted(kept)}, "
            f"this run asks for {args.logits_to_keep}")
    if config in LARGE and not _fits(workers, config, runtime):
        return False  # its export would not fit in the memory available now (said why)
    say(f"export {config} for {runtime}")
    # llama.cpp's tokens check runs at 2 threads (its speed is not measured there)
    events = workers.run({"mode": "prepare", "config": config, "runtime": runtime,
                          "new_tokens": args.new_tokens,
                          "logits_to_keep": args.logits_to_keep},
                         2 if runtime in LLAMACPP else 1, 3600.0)
    ok = path.exists() and not any(e.get("event") == "error" for e in events)
    if ok:
        saved.write_text("".join(json.dumps(e) + "\n" for e in events))
    return ok


def _rounds(workers: Workers, cells: list, args) -> None:
    """Interleaved rounds over ``cells`` (config, runtime, threads): one shuffled order,
    reversed every other round (a drift in the machine's load then weighs on every cell
    alike over a pair of rounds)."""
    order = list(cells)
    random.Random(0).shuffle(order)
    for round_ in range(args.rounds if cells else 0):
        start = time.perf_counter()
        for config, runtime, threads in order if round_ % 2 == 0 else order[::-1]:
            workers.run({"mode": "measure", "config": config, "runtime": runtime,
                         "round": round_, "repeats": args.repeats,
                         "new_tokens": args.new_tokens,
                         "logits_to_keep": args.logits_to_keep}, threads)
        say(f"round {round_ + 1}/{args.rounds}: {len(order)} workers in "
            f"{time.perf_counter() - start:.0f} s (load {os.getloadavg()[0]:.2f})")


def _large(workers: Workers, config: str, args) -> str:
    """A config whose files are several GB (1b): when the disk holds all of them, each
    prepared in turn (one export at a time, each gated by ``_fits`` in ``_prepare``: a file
    --reuse keeps is not) and then measured in
    interleaved rounds; else file by file (``_one_at_a_time``). Returns the mode that ran."""
    programs = _programs(args.runtimes)
    if args.one_at_a_time or not _disk_fits(config, programs, args.workdir):
        _one_at_a_time(workers, config, args)
        return "one at a time (each file prepared, measured and deleted in turn)"
    ready = []
    for runtime in programs:  # llama.cpp's F32 file before the quantized ones made from it
        if _prepare(workers, config, runtime, args):  # gated by _fits where it exports
            ready.append(runtime)
    _rounds(workers, [(config, r, t) for r in args.runtimes if program_runtime(r) in ready
                      for t in args.threads], args)
    return "interleaved (every file on disk, the cells measured in rounds)"


def _one_at_a_time(workers: Workers, config: str, args) -> None:
    """llama.cpp's three GGUF files first (the quantized ones are made from the F32 one,
    ~8.5 GB together at 1b), each deleted after its measurement, then opforge's programs
    one by one (at most one on disk)."""
    def measure_and_delete(runtime):
        measured = [r for r in args.runtimes if program_runtime(r) == runtime]
        _rounds(workers, [(config, r, t) for r in measured for t in args.threads], args)
        path = artifact({"workdir": str(args.workdir), "config": config, "runtime": runtime})
        path.unlink(missing_ok=True)
        path.with_name(path.name + ".prepared.jsonl").unlink(missing_ok=True)

    gguf = [r for r in args.runtimes if r in LLAMACPP]
    ready = [r for r in gguf if _prepare(workers, config, r, args)]
    for runtime in ready:
        measure_and_delete(runtime)
    for runtime in _programs(args.runtimes):
        if runtime not in LLAMACPP and _prepare(workers, config, runtime, args):
            measure_and_delete(runtime)


# An export's peak resident memory (the worker's VmHWM, torch and the model included) as
# GiB fixed + a multiple of the model's float32 weights, fitted to the peaks measured on the
# AMD EPYC at base (476 MiB of weights) and 1b (5,716 MiB; bench/results/
# llm_llamacpp-amd-epyc-zen4-1b.md, "Exports"): float32 1,311 MB and 11,200 MB (1.96x);
# 8da8w / 8da4w 986 MB at base and 8,053 MB at 1b (1.41x, TinyDecoder's construction: the
# model quantized in place, bench/results/export_memory-amd-epyc-zen4.md); the weight-only
# programs (PT2E calibration and convert, the float model let go once converted, the decode
# method a graph_copy sharing the weights) int4 1,337 MB at base, int8 / int4 8,719 /
# 8,775 MB at 1b (1.50x; 4.5x was taken before, when bench/int_weights.py kept the float
# model and deep-copied the converted one per method);
# llama.cpp's F32 GGUF 7,965 MB at 1b (the model built, its tensors written), Q4_0 1,528
# MB (quantized from it, its tokens checked through libllama). An export that
# would not fit in the memory available now is skipped and says so, rather than pushing a
# shared machine into the OOM killer.
EXPORT_PEAK = {"opforge-cpu": (0.4, 1.9), "opforge-cpu-int8": (0.7, 1.6),
               "opforge-cpu-int4": (0.7, 1.6), "opforge-cpu-8da8w": (0.5, 1.5),
               "opforge-cpu-8da4w": (0.5, 1.5), "llamacpp-f32": (0.3, 1.4),
               "llamacpp-q8_0": (0.3, 0.4), "llamacpp-q4_0": (0.3, 0.3)}
# A prepared file's size over the float32 weights', measured at base (the Exports table of
# llm_llamacpp-amd-epyc-zen4-base.md; 1b's 8da4w file is 0.156x), for the disk check.
FILE_SIZE = {"opforge-cpu": 1.0, "opforge-cpu-int8": 0.27, "opforge-cpu-int4": 0.17,
             "opforge-cpu-8da8w": 0.27, "opforge-cpu-8da4w": 0.16, "opforge-lean": 1.0,
             "ort": 1.0, "llamacpp-f32": 1.0, "llamacpp-q8_0": 0.27, "llamacpp-q4_0": 0.15}


def _programs(runtimes) -> list[str]:
    """The runtimes whose files ``runtimes`` measure, each once, in their order."""
    return [r for r in dict.fromkeys(program_runtime(r) for r in runtimes) if r in EXPORTED]


def _weights_gib(config: str) -> float:
    c = CONFIGS[config]
    head_dim = c["dim"] // c["heads"]
    return 4 * (2 * c["vocab"] * c["dim"] + c["dim"] + c["layers"] * (
        2 * c["dim"] * head_dim * (c["heads"] + c["kv_heads"]) + 3 * c["dim"] * c["hidden"]
        + 2 * c["dim"])) / 2**30


def _disk_fits(config: str, programs: list[str], workdir: pathlib.Path) -> bool:
    """Whether the files of ``programs`` not yet in ``workdir`` fit on its disk (20% over
    FILE_SIZE's estimate, 4 GiB kept free)."""
    missing = [r for r in programs if not artifact(
        {"workdir": str(workdir), "config": config, "runtime": r}).exists()]
    need = 1.2 * _weights_gib(config) * sum(FILE_SIZE.get(r, 1.0) for r in missing)
    free = shutil.disk_usage(workdir).free / 2**30
    say(f"{config}: {len(missing)} file(s) to prepare, ~{need:.1f} GiB; {free:.1f} GiB free "
        "on the disk (4 GiB kept free)")
    return need <= free - 4.0


def _fits(workers: Workers, config: str, runtime: str) -> bool:
    fixed, ratio = EXPORT_PEAK.get(runtime, (0.3, 1.0))
    weights = _weights_gib(config)
    need = fixed + ratio * weights
    available = next(int(line.split()[1]) for line in open("/proc/meminfo")
                     if line.startswith("MemAvailable:")) / 2**20
    if need <= available - 2.0:
        return True
    error = (f"skipped: its export would need ~{need:.0f} GiB ({fixed} GiB + {ratio}x the "
             f"{weights:.1f} GiB of float32 weights, the peaks measured at base and 1b) and "
             f"{available:.0f} GiB are available (2 GiB kept free)")
    say(f"  ! {config} {runtime}: {error}")
    workers.events.append({"event": "error", "ok": False, "error": error,
                           "spec": {"mode": "prepare", "config": config, "runtime": runtime}})
    return False


def _dirty() -> bool:
    # tracked files only: the results this run is about to replace are not a change
    done = subprocess.run(["git", "-C", str(HERE.parent), "status", "--porcelain",
                           "--untracked-files=no", "--", "opforge", "bench"],
                          capture_output=True, text=True)
    return bool(done.stdout.strip())


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    args.workdir = args.workdir.resolve()
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine(HERE.parent)
    # --live: this checkout first on the workers' PYTHONPATH (without it they imported
    # whatever opforge the interpreter has installed: another worktree's editable install)
    snapshot = str(HERE.parent) if args.live else snapshot_opforge(args.workdir)
    with open(args.workdir / "workers.log", "w") as log:
        workers = Workers(args.workdir, snapshot, log)
        together = [c for c in args.configs if c not in LARGE]
        for config in together:
            for runtime in _programs(args.runtimes):
                _prepare(workers, config, runtime, args)
        _rounds(workers, [(c, r, t) for c in together for r in args.runtimes
                          for t in args.threads], args)
        modes = {c: _large(workers, c, args) for c in args.configs if c in LARGE}
        if "opforge-lean" in args.runtimes and args.profile_steps > 0:
            for config in args.configs:
                say(f"profile {config} on opforge-lean")
                workers.run({"mode": "profile", "config": config, "runtime": "opforge-lean",
                             "steps": args.profile_steps}, 1)
    setup = {"machine": machine, "configs": {c: CONFIGS[c] for c in args.configs},
             "prompt_tokens": PROMPT_TOKENS, "new_tokens": args.new_tokens,
             "rounds": args.rounds, "repeats": args.repeats, "threads": args.threads,
             "logits_to_keep": args.logits_to_keep, "large_config_modes": modes,
             "opforge_source": (f"the working tree at commit {machine['opforge_commit']}"
                                + (", with uncommitted changes" if _dirty() else "")
                                + " (--live)") if args.live else
             f"a snapshot of commit {machine['opforge_commit']}",
             "load_start": load_start, "load_end": os.getloadavg()[0],
             "wall_s": time.perf_counter() - started,
             "command": "bench/llm.py " + shlex.join(sys.argv[1:] if argv is None else argv)}
    name = f"llm_llamacpp-{machine_slug(machine)}" if args.llamacpp else "llm"
    if args.llamacpp and len(args.configs) == 1:
        name += f"-{args.configs[0]}"  # one config per run: the other's file stays
    with open(args.out / f"{name}.jsonl", "w") as out:
        out.write(json.dumps({"event": "setup", **setup}) + "\n")
        for event in workers.events:
            out.write(json.dumps(event) + "\n")
    report = markdown_llamacpp if args.llamacpp else markdown
    (args.out / f"{name}.md").write_text(report(setup, workers.events))
    say(f"llm: done in {setup['wall_s'] / 60:.1f} min → {args.out / (name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
