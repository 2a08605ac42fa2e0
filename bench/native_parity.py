"""The native runtime against the lean one: every zoo model, the bundled decoder (static and
dynamic), the 8a8w and 16a4w programs, and (with transformers) the hold-out-style decoders of
bench/transformers_decoders.py, each run by ``executor="lean"`` and ``executor="native"`` on
portable kernels and on cpu delegates.

    OMP_NUM_THREADS=1 .venv/bin/python bench/native_parity.py
    OMP_NUM_THREADS=1 bench/.venv-external/bin/python bench/native_parity.py --transformers
    .venv/bin/python bench/native_parity.py --only zoo:mlp,decoder:dynamic --rounds 3

One row per (program, executor): the largest absolute and relative (over the lean output's
largest magnitude) difference of every output, whether they are the same bits, whether the
greedy tokens are equal (decoders: ``opforge.runtime.generate.Generator`` on each program),
and the native time over the lean time (median of ``--rounds`` calls or generations, both
measured in this process, interleaved). ``portable`` rows hold the C++ kernels to the NumPy
ones (matmuls and reductions sum in another order: docs/native-runtime.md's tolerance);
``cpu`` rows run the same engine from C and from Python, so they must be the same bits.
Writes ``bench/results/native_parity.md`` with ``--write`` (``--write NAME``: another file in
bench/results/, e.g. native_parity_transformers.md for the transformers run).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

PROMPT = [1, 17, 5, 42, 9, 3]
NEW_TOKENS = 12


@dataclass
class Case:
    """A program to hold the two executors to: ``build(backends)`` exports it; ``inputs``
    (a forward call) or ``decoder`` (greedy generation from ``PROMPT``)."""

    name: str
    build: Callable[[list], object]
    inputs: tuple = ()
    decoder: bool = False


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*args, **kwargs)


def zoo_cases() -> list[Case]:
    from opforge.examples.zoo import ZOO
    from opforge.export import export

    cases = []
    for name, factory in ZOO.items():
        model, example = factory()
        cases.append(Case(f"zoo:{name}", lambda b, m=model, e=example: _quiet(export, m, e, backends=b),
                          tuple(t.numpy() for t in example)))
    return cases


def _tiny(layers: int = 2):
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(vocab=64, dim=64, heads=4, kv_heads=2, hidden=128, layers=layers,
                       max_len=48, seed=3).eval()


def decoder_cases() -> list[Case]:
    """The bundled decoder exported with a dynamic sequence (one method for prefill and
    decode) and with a static one-token call (the prompt goes in token by token)."""
    import torch

    from opforge.examples.decoder import export_decoder
    from opforge.export import export

    model = _tiny()
    static = lambda b: _quiet(export, model, (torch.tensor([1]), torch.tensor([0])), backends=b)  # noqa: E731
    dynamic = lambda b: _quiet(export_decoder, model, backends=b)  # noqa: E731
    return [Case("decoder:static", static, decoder=True), Case("decoder:dynamic", dynamic, decoder=True)]


def quantized_cases() -> list[Case]:
    """8a8w and 16a4w: zoo models (static) and the bundled decoder with a dynamic sequence."""
    import torch

    from opforge.quantize import quantize
    from tests.quantize.quantize_support import quantized_zoo
    from opforge.examples.zoo import ZOO

    cases = []
    for scheme in ("8a8w", "16a4w"):
        for name in ("mlp", "cnn", "transformer_layer"):
            inputs = tuple(x.numpy() for x in ZOO[name]()[1])
            converted = _quiet(quantized_zoo, name, scheme)
            cases.append(Case(f"{scheme}:{name}", lambda b, c=converted: _quiet(c.export, backends=b), inputs))
        model = _tiny(layers=1)
        seq = torch.export.Dim("seq", min=1, max=model.max_len)
        g = torch.Generator().manual_seed(1)
        calibration = [(torch.randint(0, 64, (n,), generator=g), torch.arange(n)) for n in (16, 32)]
        converted = _quiet(quantize, model, calibration[0], scheme, calibration=calibration,
                           dynamic_shapes=({0: seq}, {0: seq}))
        cases.append(Case(f"{scheme}:decoder:dynamic", lambda b, c=converted: _quiet(c.export, backends=b),
                          decoder=True))
    return cases


def transformers_cases() -> list[Case]:
    """bench/transformers_decoders.py's configurations, exported by transformers' recipe."""
    import torch
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    import transformers_decoders as T
    from opforge.export import export

    cases = []
    for name, build in T._configs().items():
        torch.manual_seed(0)
        model = build().eval()
        T._randomize(model, 1234)
        model.generation_config.cache_implementation = "static"
        model.generation_config.use_cache = True
        wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=T.CACHE)
        seq = torch.export.Dim("seq", min=1, max=T.CACHE - 1)
        exported = _quiet(wrapper.export, input_ids=torch.tensor([PROMPT]),
                          cache_position=torch.arange(len(PROMPT)),
                          dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
        cases.append(Case(f"hf:{name}", lambda b, e=exported: _quiet(export, e, backends=b), decoder=True))
    return cases


def _diff(lean: list, native: list) -> tuple[float, float, bool]:
    abs_err = rel_err = 0.0
    same = True
    for a, b in zip(lean, native):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
        same = same and a.tobytes() == b.tobytes()
        if a.dtype.kind == "f":
            d = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))
            abs_err = max(abs_err, d)
            rel_err = max(rel_err, d / max(float(np.max(np.abs(a), initial=0.0)), 1e-30))
        elif not np.array_equal(a, b):
            abs_err = rel_err = float("inf")
    return abs_err, rel_err, same


def _batch(call) -> int:
    """How many calls make a timed round of about 20 ms (after a warm-up call)."""
    call()
    start = time.perf_counter()
    call()
    return max(1, min(1000, int(0.02 / max(time.perf_counter() - start, 1e-7))))


def _seconds_per_call(call, batch: int) -> float:
    start = time.perf_counter()
    for _ in range(batch):
        call()
    return (time.perf_counter() - start) / batch


def compare(case: Case, executor: str, rounds: int) -> dict:
    from opforge.program import from_bytes, to_bytes
    from opforge.runtime import load
    from opforge.runtime.generate import Generator

    backends = ["cpu"] if executor == "cpu" else []
    program = from_bytes(to_bytes(case.build(backends)))
    delegated = sum(type(i).__name__ == "DelegateCall" for m in program.methods for i in m.instructions)
    row = {"program": case.name, "executor": executor, "delegates": delegated}
    lean, native = load(program), load(program, executor="native")
    if case.decoder:
        runs = {}
        for label, loaded in (("lean", lean), ("native", native)):
            generator = Generator(loaded)
            sig = generator.signature
            first = generator.generate(PROMPT, NEW_TOKENS)
            loaded.reset_state()
            step = loaded.method(sig.prefill.name)
            prompt = PROMPT[:sig.prefill.seq_max] if sig.prefill.seq_min <= len(PROMPT) else PROMPT[:1]
            logits = _call_decoder(step, sig.prefill, prompt)
            runs[label] = (first.tokens, logits, generator)
        row["tokens_equal"] = runs["lean"][0] == runs["native"][0]
        row["tokens"] = list(runs["lean"][0]), list(runs["native"][0])
        row["abs"], row["rel"], row["same_bits"] = _diff(runs["lean"][1], runs["native"][1])
        timed = {label: (lambda g=runs[label][2]: g.generate(PROMPT, NEW_TOKENS)) for label in runs}
    else:
        want = lean.method("forward")(*case.inputs)
        got = native.method("forward")(*case.inputs)
        row["abs"], row["rel"], row["same_bits"] = _diff(want, got)
        row["tokens_equal"] = None
        timed = {"lean": lambda m=lean.method("forward"): m(*case.inputs),
                 "native": lambda m=native.method("forward"): m(*case.inputs)}
    seconds = {label: [] for label in timed}
    batch = _batch(timed["lean"])
    for _ in range(rounds):  # interleaved, so a slow moment of the machine hits both
        for label, call in timed.items():
            seconds[label].append(_seconds_per_call(call, batch))
    row["lean_ms"] = 1e3 * statistics.median(seconds["lean"])
    row["native_ms"] = 1e3 * statistics.median(seconds["native"])
    row["ratio"] = row["native_ms"] / row["lean_ms"]
    return row


def _call_decoder(step, call, prompt: list[int]) -> list:
    """One call of a decoder method on ``prompt`` (in its layout): its outputs, copied."""
    return [np.array(o) for o in step(*call.arrays(np.array(prompt, np.int64), 0))]


def _cell(value: float) -> str:
    return "0" if value == 0 else ("inf" if value == float("inf") else f"{value:.1e}")


def table(rows: list[dict]) -> list[str]:
    lines = ["| program | executor | delegates | max abs diff | max rel diff | same bits | "
             "greedy tokens equal | lean ms | native ms | native / lean |",
             "| --- | --- | ---: | ---: | ---: | --- | --- | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['program']} | {r['executor']} | | ERROR: {r['error']} | | | | | | |")
            continue
        tokens = "" if r["tokens_equal"] is None else ("yes" if r["tokens_equal"] else "**NO**")
        lines.append(f"| {r['program']} | {r['executor']} | {r['delegates']} | {_cell(r['abs'])} | "
                     f"{_cell(r['rel'])} | {'yes' if r['same_bits'] else 'no'} | {tokens} | "
                     f"{r['lean_ms']:.3f} | {r['native_ms']:.3f} | {r['ratio']:.2f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="timed calls per executor (7)")
    parser.add_argument("--executors", nargs="+", default=["portable", "cpu"], choices=["portable", "cpu"])
    parser.add_argument("--transformers", action="store_true",
                        help="add bench/transformers_decoders.py's models (needs transformers)")
    parser.add_argument("--only", default="", help="comma-separated program names or prefixes")
    parser.add_argument("--write", nargs="?", const="native_parity.md", default=None, metavar="NAME",
                        help="write the table to bench/results/NAME (native_parity.md)")
    args = parser.parse_args(argv)
    import torch

    from machine import describe_machine

    machine = describe_machine(HERE.parent)
    torch.set_num_threads(1)
    makers = {"zoo": zoo_cases, "decoder": decoder_cases, "8a8w": quantized_cases,
              "16a4w": quantized_cases, "hf": transformers_cases}
    wanted = [w for w in args.only.split(",") if w]
    chosen = []  # each maker once, only those --only names (its imports are heavy: torchao, transformers)
    for prefix, maker in makers.items():
        if (wanted and any(w.startswith(prefix) or prefix.startswith(w) for w in wanted)) or \
                (not wanted and (prefix != "hf" or args.transformers)):
            if maker not in chosen:
                chosen.append(maker)
    rows = []
    for maker in chosen:
        for case in maker():
            if wanted and not any(case.name == w or case.name.startswith(w) for w in wanted):
                continue
            for executor in args.executors:
                try:
                    row = compare(case, executor, args.rounds)
                except Exception as e:  # recorded as the row, with the error's first line
                    row = {"program": case.name, "executor": executor,
                           "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                rows.append(row)
                print(table([row])[-1], flush=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    lines = [f"# The native runtime against the lean one ({stamp})", "",
             f"Machine: {machine['cpu']}, {machine['cores']} cores, load average "
             f"{machine['load_average'][0]:.1f}, opforge {machine['opforge_commit']}; 1 thread (torch and OMP); median of {args.rounds} "
             "interleaved rounds of ~20 ms of calls (decoders: a whole greedy generation of "
             f"{NEW_TOKENS} tokens after a {len(PROMPT)}-token prompt).", "",
             *table(rows)]
    print("\n".join(lines))
    if args.write:
        (HERE / "results" / args.write).write_text("\n".join(lines) + "\n")
    bad = [r for r in rows if "error" in r or r.get("tokens_equal") is False
           or (r["executor"] == "cpu" and not r["same_bits"])]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
