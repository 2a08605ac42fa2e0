"""Models written elsewhere (torchvision, timm, transformers), exported by opforge and run on
the lean runtime and on the cpu backend (and, as the peer, on ONNX Runtime), each checked
against eager float64.

    bench/.venv-external/bin/python bench/external_models.py               # every model
    bench/.venv-external/bin/python bench/external_models.py --models tv/resnet18,timm/levit_128s
    bench/.venv-external/bin/python bench/external_models.py --list
    bench/.venv-external/bin/python bench/external_models.py --runtimes cpu,ort --time \
        --out bench/results/external_speed     # cpu backend against eager and ONNX Runtime,
                                               # 1 thread (issue 47)

Set up the environment once with ``bash bench/setup_external.sh``. Each model runs in its
own process (bench/external_check.py: how parameters are spread, the verdicts and the
criterion are in its docstring) with ``--timeout`` seconds, OMP_NUM_THREADS=1 and nice 10 (not with ``--time``);
``--jobs`` processes at a time. Writes ``bench/results/external_models.md`` (the table,
machine, versions, date, command) and ``external_models.json`` beside it. Rows of models not
run this time are kept from the previous JSON (with their own date and commit) unless
``--fresh``.

Each cpu row also records which implementation runs each engine op; the run exits 1 when a
model's delegates run a oneDNN reference kernel (``ref:``) that no op name explains
(bench/external_check.py, ``reference``), and the table's last section lists them with
the cpu backend's time against eager's and ONNX Runtime's (``--time``) at one thread.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from external_catalog import CATALOG  # noqa: E402
from machine import describe_machine  # noqa: E402

RESULTS = HERE / "results"
RUNTIMES = ("lean", "cpu", "ort")
VERSIONED = ("opforge", "torch", "torchvision", "timm", "transformers", "numpy",
             "onednn-cpu-gomp", "onnxruntime", "onnx", "onnxscript")


def _run_one(name: str, timeout: float, flags: tuple[str, ...] = ()) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "OPFORGE_NUM_THREADS": "1"}
    start = time.monotonic()
    # nice 10 leaves a shared machine to others; a timed check runs at the others' priority,
    # or its time would be theirs (eager and the cpu backend are timed interleaved either way)
    nice = [] if "--time" in flags else ["nice", "-n", "10"]
    try:
        done = subprocess.run([*nice, sys.executable, str(HERE / "external_check.py"), name, *flags],
                              capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"model": name, "skipped": f"timeout after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"model": name, "skipped": f"worker exited {done.returncode}: {tail[:300]}"}
    row = json.loads(lines[-1])
    row["wall_s"] = round(time.monotonic() - start, 1)
    row["load"] = round(os.getloadavg()[0], 1)  # the machine's 1-minute load as the model ends
    return row


def _cell(result: dict | None) -> str:
    if not result:
        return "—"
    verdict = result["verdict"]
    if verdict == "refused":
        return f"refused: {result['why']}"
    if "error" not in result:
        return f"{verdict}: {result['why']}"
    return f"{verdict} ({result['error']:.1e} ≤ {result['bound']:.1e})" if verdict == "right" \
        else f"**{verdict}** ({result['error']:.2g} > {result['bound']:.1e})"


def _delegated(row: dict) -> str:
    cpu = row.get("cpu") or {}
    return f"{100 * cpu['delegated']:.0f}%" if "delegated" in cpu else "—"


def _eager(row: dict) -> str:
    """Eager float32's own error relative to the output's scale: how tight the bound is."""
    lean = row.get("lean") or {}
    if "eager_error" not in lean or not lean["scale"]:
        return "—"
    return f"{lean['eager_error'] / lean['scale']:.1e}"


def _speed(row: dict) -> tuple[str, str, str, str, str]:
    """(cpu ms, eager ms, eager / cpu, ORT ms, ORT / cpu) of a row checked with --time; the
    ORT cells "—" where ONNX Runtime was not timed, its refusal where it was refused."""
    cpu, ort = row.get("cpu") or {}, row.get("ort") or {}
    if "ms" not in cpu:
        return "—", "—", "—", "—", "—"
    ort_ms, ort_ratio = "—", "—"
    if "ms" in ort:
        ort_ms, ort_ratio = f"{ort['ms']:.2f}", f"{ort['ms'] / cpu['ms']:.2f}"
    elif ort.get("verdict") == "refused":
        ort_ms = f"refused: {ort['why'][:120]}"
    if ort.get("verdict") == "wrong":
        ort_ms += f" (**wrong**: {ort.get('error', 0):.2g} > {ort.get('bound', 0):.1e})"
    return f"{cpu['ms']:.2f}", f"{cpu['eager_ms']:.2f}", f"{cpu['eager_ms'] / cpu['ms']:.2f}", ort_ms, ort_ratio


def _impls(row: dict) -> str:
    cpu = row.get("cpu") or {}
    if "impls" not in cpu:
        return cpu.get("impls_error", "—")
    text = ", ".join(f"{k} {v}" for k, v in cpu["impls"].items())
    if cpu.get("reference"):
        text = "**unexplained reference kernels: " + "; ".join(cpu["reference"]) + "** — " + text
    if cpu.get("reference_explained"):
        text += " (explained: " + "; ".join(cpu["reference_explained"]) + ")"
    return text


def _loads(rows: list[dict]) -> str:
    """The range of the 1-minute load average as the rows' models ended (rows that have it)."""
    loads = [row["load"] for row in rows if "load" in row]
    return f" Load average (1 min) as each model ended: {min(loads)} to {max(loads)}." if loads else ""


def unexplained_reference(rows: list[dict]) -> list[str]:
    """The models whose cpu delegates run a oneDNN reference kernel that no op name explains."""
    return [row["model"] for row in rows if (row.get("cpu") or {}).get("reference")]


def totals(rows: list[dict]) -> dict:
    counts = {rt: {"right": 0, "wrong": 0, "refused": 0} for rt in RUNTIMES}
    for row in rows:
        for rt in RUNTIMES:
            if rt in row:
                counts[rt][row[rt]["verdict"]] += 1
    counts["unexplained reference kernels"] = unexplained_reference(rows)
    counts["skipped"] = sum("skipped" in row for row in rows)
    counts["cpu wrong, lean right"] = [
        row["model"] for row in rows
        if row.get("lean", {}).get("verdict") == "right" and row.get("cpu", {}).get("verdict") == "wrong"]
    return counts


def markdown(rows: list[dict], setup: dict) -> str:
    count = totals(rows)
    command = setup["command"].split()
    if "--models" in command and len(command[command.index("--models") + 1].split(",")) > 8:
        shown = command[command.index("--models") + 1].split(",")
        command[command.index("--models") + 1] = f"<{len(shown)} models: {shown[0]}, ...>"
    runs = sorted({(row.get("date", "?"), row.get("commit", "?")) for row in rows})
    lines = [
        "# Models written elsewhere: lean runtime and cpu backend against eager float64",
        "",
        f"- Date: {setup['date']}; command of the last call: `{' '.join(command)}` (the JSON "
        "has it in full). Rows checked at: " + "; ".join(f"{d} (opforge {c})" for d, c in runs) + ".",
        f"- Machine: {setup['machine']['cpu']}, {setup['machine']['cores']} cores, "
        f"{setup['machine']['memory_gib']} GiB, Linux {setup['machine']['kernel']}, Python "
        f"{setup['machine']['python']}; opforge commit {setup['machine']['opforge_commit']}; "
        "shared with other jobs. One thread per model (OMP_NUM_THREADS=1), nice 10 unless timed (--time); "
        f"this run's niceness {setup.get('niceness', '?')}." + _loads(rows),
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in setup["versions"].items()) + ".",
        "- Criterion (tests/backends/test_cpu_models.py): right when max |got − float64| ≤ "
        "8 × max |eager float32 − float64| + 2 · eps(float32) · max |float64|; refused when "
        "export, load or the call raised. Parameters and BatchNorm statistics are moved away "
        "from their defaults first (bench/external_check.py says how). Cells: error ≤ bound.",
        "- delegated: the fraction of compute nodes that run inside cpu-backend delegates. "
        "eager f32 error / scale: how far float32 eager itself is from float64, relative to "
        "the output (the bound is 8× that plus 2 ulp; above ~1e-3 the check is loose).",
        "",
        "| runtime | right | wrong | refused |",
        "| --- | ---: | ---: | ---: |",
    ]
    for rt in RUNTIMES:
        lines.append(f"| {rt} | {count[rt]['right']} | {count[rt]['wrong']} | {count[rt]['refused']} |")
    lines += ["", f"{len(rows)} models; {count['skipped']} not checked (see the table). Wrong on the "
              "cpu backend while right on lean: " + (", ".join(count["cpu wrong, lean right"]) or "none") + ".",
              "", "| model | input | params (M) | eager f32 error / scale | lean | cpu | ort | delegated |",
              "| --- | --- | ---: | ---: | --- | --- | --- | ---: |"]
    for row in sorted(rows, key=lambda r: r["model"]):
        if "skipped" in row:
            lines.append(f"| {row['model']} | — | — | — | not checked: {row['skipped']} | | | |")
            continue
        lines.append(f"| {row['model']} | {row['input']} | {row['params_m']} | {_eager(row)} "
                     f"| {_cell(row.get('lean'))} | {_cell(row.get('cpu'))} | {_cell(row.get('ort'))} "
                     f"| {_delegated(row)} |")
    timed = [row for row in rows if "ms" in (row.get("cpu") or {})]
    checked = [row for row in rows if "impls" in (row.get("cpu") or {})]
    if checked:
        faster = sum(float(_speed(r)[2]) >= 1.0 for r in timed)
        with_ort = [r for r in timed if "ms" in (r.get("ort") or {})]
        beats_ort = sum(r["ort"]["ms"] >= r["cpu"]["ms"] for r in with_ort)
        lines += ["", "## Speed at one thread and the implementations that run (issue 47)", "",
                  f"{len(timed)} models timed (`--time`): eager float32 with torch.set_num_threads(1), "
                  "the cpu backend with OPENBLAS/MKL/OMP_NUM_THREADS=1 and OPFORGE_NUM_THREADS=1, and "
                  "ONNX Runtime (CPU provider, intra_op_num_threads=1, inter_op_num_threads=1, "
                  "sequential, the model from torch.onnx.export), in one process, interleaved call "
                  "by call, medians; the ratios are of medians from the same run. The cpu backend is "
                  f"at least as fast as eager on {faster} of them, and as ONNX Runtime on {beats_ort} of "
                  f"the {len(with_ort)} ONNX Runtime ran (ORT / cpu: above 1, the cpu backend is "
                  "faster). Unexplained oneDNN reference kernels "
                  f"(`ref:`) in {len(unexplained_reference(checked))} of the {len(checked)} models "
                  "whose implementations were recorded: "
                  + (", ".join(unexplained_reference(checked)) or "none") + ".", "",
                  "| model | input | cpu ms | eager ms | eager / cpu | ORT ms | ORT / cpu | implementations (engine ops) |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
        for row in sorted(checked, key=lambda r: r["model"]):
            cpu_ms, eager_ms, ratio, ort_ms, ort_ratio = _speed(row)
            lines.append(f"| {row['model']} | {row['input']} | {cpu_ms} | {eager_ms} | {ratio} | {ort_ms} "
                         f"| {ort_ratio} | {_impls(row)} |")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"


def _print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "input", "lean", "cpu", "delegated", title="external models")
    for row in sorted(rows, key=lambda r: r["model"]):
        if "skipped" in row:
            table.add_row(row["model"], "—", f"not checked: {row['skipped']}", "", "")
        else:
            table.add_row(row["model"], row["input"], _cell(row.get("lean")), _cell(row.get("cpu")),
                          _delegated(row))
    console = Console(width=200)
    console.print(table)
    count = totals(rows)
    for rt in RUNTIMES:
        console.print(f"{rt}: {count[rt]}")
    console.print(f"cpu wrong, lean right: {count['cpu wrong, lean right']}")


def _versions() -> dict:
    import importlib.metadata as md

    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", help="comma-separated names from --list (default: all)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per model")
    parser.add_argument("--jobs", type=int, default=1, help="models checked at a time")
    parser.add_argument("--fresh", action="store_true", help="drop rows from earlier runs")
    parser.add_argument("--list", action="store_true", help="print the model names and exit")
    parser.add_argument("--out", type=Path, default=RESULTS / "external_models")
    parser.add_argument("--time", action="store_true",
                        help="time the cpu backend (and ONNX Runtime) against eager at one thread (issue 47)")
    parser.add_argument("--runtimes", default="lean,cpu",
                        help="which runtimes to check: lean,cpu (default), any of lean, cpu and ort "
                             "(ONNX Runtime, where it is installed)")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CATALOG))
        return 0
    names = args.models.split(",") if args.models else list(CATALOG)
    unknown = [n for n in names if n not in CATALOG]
    if unknown:
        parser.error(f"unknown models {unknown}; --list shows the names")

    json_path = args.out.with_suffix(".json")
    previous = {}
    if json_path.exists() and not args.fresh:
        previous = {row["model"]: row for row in json.loads(json_path.read_text())["rows"]}
    machine = describe_machine(HERE.parent)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = dict(previous)

    def save() -> None:
        setup = {"date": stamp, "command": " ".join(["bench/external_models.py", *(argv or sys.argv[1:])]),
                 "machine": machine, "versions": _versions(), "niceness": os.nice(0)}
        ordered = [rows[n] for n in CATALOG if n in rows]
        args.out.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"setup": setup, "totals": totals(ordered), "rows": ordered},
                                        indent=1) + "\n")
        args.out.with_suffix(".md").write_text(markdown(ordered, setup))

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        flags = (f"--runtimes={args.runtimes}",) + (("--time",) if args.time else ())
        futures = {pool.submit(_run_one, name, args.timeout, flags): name for name in names}
        for future in concurrent.futures.as_completed(futures):
            row = future.result()
            row.update(date=stamp, commit=machine["opforge_commit"])
            rows[row["model"]] = row
            verdicts = "  ".join(f"{rt}={row[rt]['verdict']}" for rt in RUNTIMES if rt in row)
            print(f"{row['model']:40s} {verdicts or 'skipped: ' + row.get('skipped', '')}", flush=True)
            save()
    _print_table([rows[n] for n in CATALOG if n in rows])
    unexplained = unexplained_reference([rows[n] for n in names if n in rows])
    if unexplained:
        print(f"FAIL: unexplained oneDNN reference kernels in {', '.join(unexplained)} "
              "(the table's implementations column names them)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
