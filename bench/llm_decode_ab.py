"""Decode-step time of two exports of one language-model config, in one process on one
runtime: each program's prompt call (bench/llm_models.py's prompt), then ``--steps``
one-token ``decode`` calls timed one by one; the programs alternate in ``--rounds`` blocks
(the order flipped every round), so load drifts on a shared machine touch both alike.

    bench/llm_decode_ab.py base A.opf B.opf --rounds 6 --steps 24

Programs from ``bench/llm.py``'s workdir (``<config>-opforge-cpu.opf``) of two commits
compare the delegation of those commits with the runtime of this one.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from llm_models import CONFIGS, prompt  # noqa: E402


def decode_seconds(program, ids: np.ndarray, steps: int) -> list[float]:
    program.reset_state()
    prefill, decode = program.method("prefill"), program.method("decode")
    token = int(prefill(ids, np.arange(len(ids), dtype=np.int64))[0][-1].argmax())
    position, seconds = len(ids), []
    for _ in range(steps):
        start = time.perf_counter()
        logits = decode(np.array([token], np.int64), np.array([position], np.int64))[0]
        seconds.append(time.perf_counter() - start)
        token, position = int(logits[-1].argmax()), position + 1
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", choices=list(CONFIGS))
    parser.add_argument("programs", nargs=2, type=pathlib.Path)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=24)
    args = parser.parse_args(argv)
    from opforge.runtime import load

    loaded = [(str(p), load(str(p))) for p in args.programs]
    ids = np.array(prompt(args.config), np.int64)
    seconds: dict[str, list[float]] = {name: [] for name, _ in loaded}
    for round_ in range(args.rounds):
        for name, program in (loaded if round_ % 2 == 0 else loaded[::-1]):
            seconds[name] += decode_seconds(program, ids, args.steps)
    medians = [statistics.median(seconds[name]) for name, _ in loaded]
    for (name, _), median in zip(loaded, medians):
        print(f"{name}: median {median * 1e3:.3f} ms per token ({1 / median:.1f} tokens/s), "
              f"{len(seconds[name])} calls")
    print(f"second / first speed: {medians[0] / medians[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
