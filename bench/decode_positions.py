"""Decode step time at a few cache positions: does attention read only what is filled?

A decoder with a 2,048-position KV cache (``TinyDecoder``, dim 512, 8 heads, 4 KV heads,
MLP 1536, 4 layers, vocabulary 32000: issue 46's shape with a longer cache) is exported
for each executor, and one decode step (one token at position ``p``) is timed at each
position, all positions interleaved in every round, the median process CPU time reported
(on a shared machine the wall clock holds other processes' turns). A step at ``p``
writes cache slot ``p`` and attends to slots ``0..p``; what the other slots hold does not
change the time, so the cache is not filled first.

    OMP_NUM_THREADS=1 .venv/bin/python bench/decode_positions.py --threads 1
    OMP_NUM_THREADS=1 .venv/bin/python bench/decode_positions.py --config attention \
        --variants lean:capacity:float32 lean:filled:float32 cpu-matmuls:capacity:float32 \
        cpu:capacity:float32 --no-prefill --no-accuracy --out bench/results/decode_positions_attention

Writes bench/results/decode_positions.md (and .json) with the machine it ran on. The
``attention`` config (small weights, 8 KV heads) makes attention a large share of a step.

Kind ``native-cpu`` runs the cpu backend's program in the native runtime
(``executor="native"``): the only runtime that holds a bfloat16 cache (NumPy has no
bfloat16). The cache dtypes side by side on the engine, with their accuracy against the
float32 cache's program (``--engine-accuracy``):

    OMP_NUM_THREADS=1 .venv/bin/python bench/decode_positions.py --variants \
        native-cpu:capacity:float32 native-cpu:capacity:float16 native-cpu:capacity:bfloat16 \
        --no-prefill --no-accuracy --engine-accuracy --out bench/results/decode_positions_half

``--transformers llama`` times transformers' own static-cache export instead
(``TorchExportableModuleForDecoderOnlyLM``, one token a call, a 2,048-slot cache) of a
``LlamaForCausalLM`` of the same shape (random weights); it needs transformers
(``bench/.venv-external``). Its variants are ``cpu``, ``cpu-matmuls`` and ``lean``
(``attend`` and ``cache`` do not apply: write ``cpu:capacity:float32``):

    OMP_NUM_THREADS=1 bench/.venv-external/bin/python bench/decode_positions.py \
        --transformers llama --variants cpu-matmuls:capacity:float32 cpu:capacity:float32 \
        --no-prefill --no-accuracy --out bench/results/decode_positions_llama
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from machine import describe_machine  # noqa: E402

CONFIG = dict(vocab=32000, dim=512, heads=8, kv_heads=4, hidden=1536, layers=4, max_len=2048)
# attention's share made large: small weights (~38 MB) beside 8 KV heads' caches (32 MB full)
CONFIGS = {"base": CONFIG,
           "attention": dict(vocab=4096, dim=512, heads=8, kv_heads=8, hidden=512, layers=4,
                             max_len=2048)}
POSITIONS = (10, 1000, 2000)
ROUNDS = 30  # steps from each position (2000 + 30 < 2048)


# executor:attend:cache — "cpu-matmuls" is the cpu backend with its attention op switched off
# (OPFORGE_CPU_FILLED_ATTENTION=0 at export: the masked matmuls over the whole cache)
VARIANTS = ("lean:capacity:float32", "lean:filled:float32", "lean:filled:float16",
            "cpu-matmuls:capacity:float32", "cpu:capacity:float32", "cpu:filled:float32",
            "cpu:capacity:float16")


def export_program(kind: str, config: dict, attend: str, cache_dtype: str):
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.export import export

    model = TinyDecoder(**config, seed=0, attend=attend,
                        cache_dtype=getattr(torch, cache_dtype)).eval()
    one = (torch.tensor([1]), torch.tensor([0]))
    backends = ["cpu"] if "cpu" in kind else None
    previous = os.environ.get("OPFORGE_CPU_FILLED_ATTENTION")
    os.environ["OPFORGE_CPU_FILLED_ATTENTION"] = "0" if kind.endswith("cpu-matmuls") else "1"
    try:
        return export(None, methods={"decode": (model, one)}, kernels="portable",
                      backends=backends)
    finally:
        if previous is None:
            del os.environ["OPFORGE_CPU_FILLED_ATTENTION"]
        else:
            os.environ["OPFORGE_CPU_FILLED_ATTENTION"] = previous


def export_transformers(kind: str, family: str, config: dict):
    """transformers' static-cache export of ``family`` at ``config``'s shape: a one-token
    ``forward(input_ids [1, 1], cache_position [1])`` (cpu-matmuls: the attention op off)."""
    import torch
    import transformers as tf
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from opforge.export import export

    builders = {"llama": (tf.LlamaConfig, tf.LlamaForCausalLM)}
    config_class, model_class = builders[family]
    torch.manual_seed(0)
    model = model_class(config_class(
        vocab_size=config["vocab"], hidden_size=config["dim"], intermediate_size=config["hidden"],
        num_hidden_layers=config["layers"], num_attention_heads=config["heads"],
        num_key_value_heads=config["kv_heads"], max_position_embeddings=config["max_len"],
        use_cache=True)).eval()
    model.generation_config.cache_implementation = "static"
    model.generation_config.use_cache = True
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1,
                                                    max_cache_len=config["max_len"])
    exported = wrapper.export(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([0]))
    previous = os.environ.get("OPFORGE_CPU_FILLED_ATTENTION")
    os.environ["OPFORGE_CPU_FILLED_ATTENTION"] = "0" if kind == "cpu-matmuls" else "1"
    try:
        return export(exported, backends=["cpu"] if kind.startswith("cpu") else None)
    finally:
        if previous is None:
            del os.environ["OPFORGE_CPU_FILLED_ATTENTION"]
        else:
            os.environ["OPFORGE_CPU_FILLED_ATTENTION"] = previous


def time_positions(methods: dict, positions, rounds: int) -> dict[str, dict[int, float]]:
    """Median seconds of a step at ``p, p + 1, ..., p + rounds - 1`` for each ``p`` and
    method (a new position every step, as in generation: a size read from the positions is
    new too); every method and position in each round, so a busy machine's swings fall on
    all of them alike."""
    import numpy as np

    token = np.array([5], np.int64)
    samples = {name: {p: [] for p in positions} for name in methods}
    for method in methods.values():  # warm-up: every position once
        for p in positions:
            method(token, np.array([p], np.int64))
    for r in range(rounds):
        for name, method in methods.items():
            for p in positions:
                pos = np.array([p + r], np.int64)
                start = time.process_time()  # CPU time: the shared machine's waits left out
                method(token, pos)
                samples[name][p].append(time.process_time() - start)
    return {name: {p: statistics.median(s) for p, s in by.items()} for name, by in samples.items()}


PREFILL_TOKENS = (128, 1024)


def time_prefill(config: dict, threads: int, rounds: int = 5) -> list[dict]:
    """A dynamic prefill (one call, prompts of PREFILL_TOKENS at positions 0..P-1) on the
    cpu backend with its attention op and without (the masked matmuls over every slot),
    interleaved: the median ms of each."""
    import numpy as np
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.export import export
    from opforge.runtime import load

    methods = {}
    for kind, switch in (("cpu-matmuls", "0"), ("cpu", "1")):
        os.environ["OPFORGE_CPU_FILLED_ATTENTION"] = switch
        seq = torch.export.Dim("seq", min=1, max=config["max_len"])
        program = export(TinyDecoder(**config, seed=0).eval(),
                         (torch.tensor([1, 2, 3]), torch.arange(3)),
                         dynamic_shapes=({0: seq}, {0: seq}), kernels="portable", backends=["cpu"])
        methods[kind] = load(program, num_threads=threads).method("forward")
    os.environ.pop("OPFORGE_CPU_FILLED_ATTENTION")
    out = []
    for n in PREFILL_TOKENS:
        tokens, positions = np.arange(n, dtype=np.int64) % 100, np.arange(n, dtype=np.int64)
        samples = {kind: [] for kind in methods}
        for method in methods.values():
            method(tokens, positions)
        for _ in range(rounds):
            for kind, method in methods.items():
                start = time.process_time()
                method(tokens, positions)
                samples[kind].append(time.process_time() - start)
        out.append({"tokens": n, **{k: statistics.median(v) * 1e3 for k, v in samples.items()}})
        print("prefill", out[-1], flush=True)
    return out


def accuracy_record(dtype: str, ref, got, reference_tokens, free_tokens, prompt_tokens: int,
                    new_tokens: int) -> dict:
    """One cache dtype against float32: logits SQNR over every row, the share of the rows
    that pick a new token whose argmax is float32's, and how many free-running greedy
    tokens equal float32's before the first difference."""
    import numpy as np

    sqnr = 10 * np.log10((ref ** 2).sum() / max(((ref - got) ** 2).sum(), 1e-300))
    steps = slice(prompt_tokens - 1, None)  # the rows that pick each new token
    agree = float((ref[steps].argmax(-1) == got[steps].argmax(-1)).mean())
    same = next((k for k, (a, b) in enumerate(zip(free_tokens, reference_tokens)) if a != b),
                len(reference_tokens))
    return {"cache": dtype, "sqnr_db": float(sqnr), "greedy_agreement": agree,
            "free_running_equal": same, "new_tokens": new_tokens, "prompt_tokens": prompt_tokens}


def cache_accuracy(config: dict, dtypes=("float16", "bfloat16"), prompt_tokens: int = 64,
                   new_tokens: int = 64) -> list[dict]:
    """A half-precision cache against a float32 one (eager, the same weights): logits SQNR
    over the prompt and every decode step, teacher-forced on the float32 model's greedy
    tokens (both see the same inputs), the share of steps whose greedy token is float32's,
    and how many free-running greedy tokens equal float32's before the first difference."""
    import numpy as np
    import torch

    from opforge.examples.decoder import TinyDecoder, greedy_decode

    vocab = config["vocab"]
    prompt = [(7919 * i + 13) % vocab for i in range(prompt_tokens)]

    def teacher_forced(model, tokens):
        with torch.no_grad():
            rows = [model(torch.tensor(prompt), torch.arange(len(prompt))).numpy()]
            for k, token in enumerate(tokens[:-1]):
                rows.append(model(torch.tensor([token]), torch.tensor([len(prompt) + k])).numpy())
        return np.concatenate(rows)

    reference = TinyDecoder(**config, seed=0).eval()
    with torch.no_grad():
        tokens = greedy_decode(lambda t, p: reference(t, p), prompt, new_tokens)
    ref = teacher_forced(TinyDecoder(**config, seed=0).eval(), tokens).astype(np.float64)
    out = []
    for dtype in dtypes:
        def half(dtype=dtype):
            return TinyDecoder(**config, seed=0, cache_dtype=getattr(torch, dtype)).eval()
        got = teacher_forced(half(), tokens).astype(np.float64)
        model = half()
        with torch.no_grad():
            free = greedy_decode(lambda t, p: model(t, p), prompt, new_tokens)
        out.append(accuracy_record(dtype, ref, got, tokens, free, prompt_tokens, new_tokens))
        print("accuracy", out[-1], flush=True)
    return out


def engine_accuracy(config: dict, threads: int, dtypes=("float16", "bfloat16"),
                    prompt_tokens: int = 64, new_tokens: int = 64) -> list[dict]:
    """The cpu backend's half-precision-cache decode programs (the native runtime) against
    its float32-cache one, one token a call: logits SQNR teacher-forced on the float32
    program's greedy tokens, the share of those steps whose greedy token is float32's, and
    how many free-running greedy tokens equal float32's before the first difference."""
    import numpy as np

    from opforge.runtime import load

    vocab = config["vocab"]
    prompt = [(7919 * i + 13) % vocab for i in range(prompt_tokens)]

    def decoder(dtype):
        program = export_program("native-cpu", config, "capacity", dtype)
        return load(program, num_threads=threads, executor="native").method("decode")

    def run(step, tokens):  # the prompt, then `tokens` fed back: every step's logits
        rows = []
        for position, token in enumerate([*prompt, *tokens]):
            rows.append(np.array(step(np.array([token]), np.array([position]))[0], np.float64))
        return np.concatenate(rows)

    def free_running(step):
        tokens = []
        for position, token in enumerate(prompt):
            logits = step(np.array([token]), np.array([position]))[0]
        while len(tokens) < new_tokens:
            tokens.append(int(np.asarray(logits)[-1].argmax()))
            logits = step(np.array([tokens[-1]]), np.array([prompt_tokens + len(tokens) - 1]))[0]
        return tokens

    tokens = free_running(decoder("float32"))
    ref = run(decoder("float32"), tokens[:-1])
    out = []
    for dtype in dtypes:
        got = run(decoder(dtype), tokens[:-1])
        free = free_running(decoder(dtype))
        out.append(accuracy_record(dtype, ref, got, tokens, free, prompt_tokens, new_tokens))
        print("engine accuracy", out[-1], flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS),
                        help="executor:attend:cache, e.g. cpu:capacity:float32")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--config", choices=list(CONFIGS), default="base")
    parser.add_argument("--no-prefill", action="store_true", help="skip the prefill timing")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results" / "decode_positions")
    parser.add_argument("--label", default="", help="a note for the table (the code measured)")
    parser.add_argument("--transformers", choices=["llama"], default=None,
                        help="time transformers' static-cache export of this family instead")
    parser.add_argument("--no-accuracy", action="store_true",
                        help="skip the float16/bfloat16 cache accuracy against float32")
    parser.add_argument("--engine-accuracy", action="store_true",
                        help="the cpu backend's float16/bfloat16-cache programs against its "
                             "float32-cache one (native runtime)")
    args = parser.parse_args(argv)
    from opforge.runtime import load

    config = CONFIGS[args.config]
    if args.transformers:  # (the prefill and accuracy parts time the TinyDecoder)
        args.no_prefill = args.no_accuracy = True
    rows = []
    methods = {}
    for variant in args.variants:
        kind, attend, dtype = variant.split(":")
        if args.transformers:
            program = export_transformers(kind, args.transformers, config)
            forward = load(program, num_threads=args.threads).method("forward")
            methods[variant] = lambda t, p, f=forward: f(t.reshape(1, -1), p)
        else:
            program = export_program(kind, config, attend, dtype)
            executor = "native" if kind.startswith("native") else "lean"
            methods[variant] = load(program, num_threads=args.threads,
                                    executor=executor).method("decode")
    times = time_positions(methods, POSITIONS, min(args.rounds, ROUNDS))
    for variant, by in times.items():
        kind, attend, dtype = variant.split(":")
        rows.append({"kind": kind, "attend": attend, "cache": dtype,
                     "ms": {str(p): t * 1e3 for p, t in by.items()}})
        print(variant, {p: f"{t * 1e3:.2f} ms" for p, t in by.items()}, flush=True)
    machine = describe_machine(HERE.parent)
    prefill = [] if args.no_prefill else time_prefill(config, args.threads)
    accuracy = [] if args.no_accuracy else cache_accuracy(config)
    engine = engine_accuracy(config, args.threads) if args.engine_accuracy else []
    report = {"machine": machine, "threads": args.threads, "config": config,
              "model": f"transformers {args.transformers}" if args.transformers else "TinyDecoder",
              "label": args.label, "rows": rows, "prefill": prefill, "accuracy": accuracy,
              "engine_accuracy": engine}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    args.out.with_suffix(".md").write_text(markdown(report))
    return 0


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [f"# Decode step time by cache position ({report['label'] or 'this checkout'})", "",
             f"Machine: {m.get('cpu', m)} ({m.get('cores')} cores, shared), "
             f"{report['threads']} thread(s) (OMP_NUM_THREADS="
             f"{os.environ.get('OMP_NUM_THREADS', 'unset')}); load average "
             + " / ".join(f"{x:.1f}" for x in m.get("load_average", ())) + ". Model: "
             + report.get("model", "TinyDecoder") + " "
             + ", ".join(f"{k} {v}" for k, v in report["config"].items())
             + ". Median process CPU time of the rounds (the shared machine's waits left "
             "out), every variant and position in each round.", "",
             "| executor | attend | cache | " + " | ".join(f"pos {p} (ms)" for p in POSITIONS)
             + f" | pos {POSITIONS[1]} / pos {POSITIONS[0]} |",
             "| --- | --- | --- | " + " | ".join("---:" for _ in POSITIONS) + " | ---: |"]
    for row in report["rows"]:
        ms = row["ms"]
        ratio = ms[str(POSITIONS[1])] / ms[str(POSITIONS[0])]
        lines.append(f"| {row['kind']} | {row['attend']} | {row['cache']} | "
                     + " | ".join(f"{ms[str(p)]:.2f}" for p in POSITIONS) + f" | {ratio:.2f} |")
    lines += ["", "Rows: `capacity` attends over every cache slot under a mask (the default "
              "recipe); on `cpu` the engine's `attention` op reads only slots 0..position "
              "(`cpu-matmuls`: the same program with the op switched off, "
              "OPFORGE_CPU_FILLED_ATTENTION=0 — the masked matmuls over all 2,048 slots). "
              "`filled` is `TinyDecoder(attend=\"filled\")`: a data-dependent slice of the "
              "cache, run on the portable kernels (the cpu backend leaves data-dependent sizes "
              "on them). `float16`/`bfloat16` store the caches at half the bytes (on `cpu` "
              "the engine's cache write rounds the new rows into them and its attention op "
              "reads them, converting as it reads). `native-cpu`: the cpu backend's program "
              "in the native runtime (executor=\"native\"), the runtime that holds bfloat16."]
    if report.get("model", "TinyDecoder") != "TinyDecoder":
        lines += ["", f"Here the model is {report['model']}'s static-cache export "
                  "(`TorchExportableModuleForDecoderOnlyLM`, one token a call; attend and cache "
                  "do not apply): its scores take an additive float mask built from "
                  "`cache_position` and a safe softmax, which the attention op matches since "
                  "issue 46's follow-up; `cpu-matmuls` is what that program ran before it."]
    if report.get("prefill"):
        lines += ["", "Prefill on cpu (one dynamic call, the prompt at positions 0..P-1 of the "
                  "2,048-slot cache), median ms:", "",
                  "| prompt tokens | attention op | masked matmuls | speed-up |",
                  "| ---: | ---: | ---: | ---: |"]
        for r in report["prefill"]:
            lines.append(f"| {r['tokens']} | {r['cpu']:.1f} | {r['cpu-matmuls']:.1f} | "
                         f"{r['cpu-matmuls'] / r['cpu']:.2f}x |")
    if report.get("accuracy"):
        a = report["accuracy"][0]
        lines += ["", f"Half-precision caches against a float32 cache (eager, same weights; "
                  f"{a['prompt_tokens']}-token prompt, {a['new_tokens']} new tokens, logits "
                  "teacher-forced on float32's greedy tokens):", "",
                  "| cache | logits SQNR (dB) | greedy tokens equal (teacher-forced) | "
                  "free-running tokens equal before the first difference |",
                  "| --- | ---: | ---: | ---: |"]
        for a in report["accuracy"]:
            lines.append(f"| {a['cache']} | {a['sqnr_db']:.1f} | {a['greedy_agreement']:.1%} | "
                         f"{a['free_running_equal']} of {a['new_tokens']} |")
    if report.get("engine_accuracy"):
        a = report["engine_accuracy"][0]
        lines += ["", "On the engine: the cpu backend's half-precision-cache programs against its "
                  f"float32-cache one (native runtime, one token a call; {a['prompt_tokens']}-token "
                  f"prompt, {a['new_tokens']} new tokens, teacher-forced on float32's greedy "
                  "tokens):", "",
                  "| cache | logits SQNR (dB) | greedy tokens equal (teacher-forced) | "
                  "free-running tokens equal before the first difference |",
                  "| --- | ---: | ---: | ---: |"]
        for a in report["engine_accuracy"]:
            lines.append(f"| {a['cache']} | {a['sqnr_db']:.1f} | {a['greedy_agreement']:.1%} | "
                         f"{a['free_running_equal']} of {a['new_tokens']} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
