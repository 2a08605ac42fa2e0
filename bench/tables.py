"""Rebuild the markdown tables of committed results, and a README section from them.

    python bench/tables.py bench/results/perf-1thread.jsonl bench/results/perf-2threads.jsonl \
        --readme perf

Reads each ``.jsonl`` that ``bench/run.py --out`` wrote (its ``setup`` line and its
``summary`` lines), writes the tables beside it (``X.jsonl`` → ``X.md``, as run.py writes
them), and with ``--readme NAME`` replaces the text of bench/README.md between
``<!-- NAME:begin -->`` and ``<!-- NAME:end -->`` with all of them, in the order given. The
tables come from the committed numbers alone: nothing is measured again.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from report import markdown  # noqa: E402


def tables(path: pathlib.Path) -> tuple[str, dict]:
    setup, table, workloads, runtimes = None, {}, [], []
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event.get("event") == "setup":
            setup = event
        elif event.get("event") == "summary":
            workload, runtime = event.pop("workload"), event.pop("runtime")
            event.pop("event")
            table.setdefault(workload, {})[runtime] = event
            workloads += [workload] if workload not in workloads else []
            runtimes += [runtime] if runtime not in runtimes else []
    if setup is None or not table:
        raise SystemExit(f"bench/tables.py: {path}: no setup or summary lines — fix: give a "
                         "results file bench/run.py wrote (not a --micro-only run)")
    return markdown(table, workloads, runtimes, setup, []), setup


def replace_section(readme: pathlib.Path, name: str, body: str) -> None:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = readme.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"bench/tables.py --readme {name}: {readme} has no {begin} … {end} "
                         "markers — fix: add them where the tables belong")
    head, rest = text.split(begin, 1)
    readme.write_text(f"{head}{begin}\n{body.strip()}\n{end}{rest.split(end, 1)[1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", type=pathlib.Path, help="results .jsonl files")
    parser.add_argument("--readme", metavar="NAME", help="README section to replace")
    args = parser.parse_args(argv)
    parts = []
    for path in args.results:
        text, setup = tables(path)
        path.with_suffix(".md").write_text(text)
        # Demote the headings one level, as run.py does for the README's own section.
        body = text.split("\n", 1)[1].replace("\n### ", "\n#### ").replace("\n## ", "\n### ")
        threads, commit = setup["threads"], setup["machine"]["opforge_commit"]
        parts.append(f"### {threads} thread{'s' if threads > 1 else ''}, opforge {commit}\n{body}")
    if args.readme:
        replace_section(HERE / "README.md", args.readme, "\n".join(parts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
