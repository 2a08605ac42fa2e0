"""Integer weights on the cpu backend: decode tokens/s and resident memory of one decoder as
float32, with int8 weights, with int4 block weights, and quantized 16a4w_block, 1 thread.

    OMP_NUM_THREADS=1 .venv/bin/python bench/int_weights.py                 # base (125M)
    .venv/bin/python bench/int_weights.py --config tiny --rounds 1          # a smoke run

Programs (each exported once, a prefill at any prompt length and a one-token decode step,
``backends=["cpu"]``, as ``bench/llm.py`` exports its float one):

- ``float32``: the model as it is;
- ``int8 weights``: 16a8w's weights with float activations (``opforge.quantize.weights_only``):
  int8 per output channel, what llama.cpp's Q8_0 and torchao's int8 weight-only mean;
- ``int4 weights``: 16a4w_block's weights, float activations: int4 in blocks of 32 along K;
- ``16a4w_block``: the whole scheme (16-bit activations quantized and dequantized around
  every linear, int4 block weights);
- ``16a4w_block float path``: the same program exported with
  ``OPFORGE_CPU_INT16_ACTIVATIONS=0``: no ``int_matmul`` told its activations' 16-bit grid,
  so none takes the int16 mode (integer sums by AVX512-VNNI or AVX2, native/int_matmul16.cpp): the
  activations stay float in the kernel, the 4-bit weights dequantized in registers;
- ``16a4w_block every rounding``: the same program exported with
  ``OPFORGE_CPU_FUSED_ROUNDINGS=0``: every 16-bit activation rounding an op of its own,
  none left inside the fused RMSNorm, rotation and attention ops (lowering/fused_roundings.py);
- ``16a4w_block folded``: the same program exported with ``OPFORGE_CPU_INT_WEIGHTS=0``,
  weights folded to float32 at export (the cpu backend before ``int_matmul``);
- ``8da8w`` / ``8da4w``: llama.cpp's Q8_0 / Q4_0 arithmetic (``opforge.quantize.dynamic``):
  activations quantized at run time to int8 per block of 32, weights int8 / int4 in the
  same blocks (the embedding too), every linear one ``int_dot_matmul`` (integer dot
  products, AVX512-VNNI where the CPU has it).

Every linear (the output projection included) and the embedding are quantized by the
schemes; the embedding table is int8 per row, which the cpu backend still folds to float32.
Each measurement is a process per program and round (rounds interleaved, the order
reversed every other round): load, a short warm-up generation, then ``--repeats``
generations of the prompt (128 tokens) and ``--new-tokens`` greedy tokens; decode tokens/s
by the wall clock and by the process's CPU time (the decode's CPU seconds: a generation's
less that of the prompt and its first token; on a shared machine it leaves out the time
other processes held the core), VmRSS after the generations and the peak (VmHWM). Writes
``results/int_weights.jsonl`` and ``results/int_weights.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from llm_models import CONFIGS, build, prompt  # noqa: E402
from machine import describe_machine  # noqa: E402

VARIANTS = ("float32", "int8 weights", "int4 weights", "16a4w_block", "16a4w_block float path",
            "16a4w_block every rounding", "16a4w_block folded", "8da8w", "8da4w")


def _slug(variant: str) -> str:
    return variant.replace(" ", "-")


def prepare(config: str, variant: str, workdir: pathlib.Path, logits_to_keep: int = 0) -> dict:
    """Export one variant to ``workdir/<variant>/<config>-opforge-cpu.opf`` (the path
    ``llm_worker.py`` measures); ``logits_to_keep`` is TinyDecoder's (bench/llm.py: 1)."""
    import torch

    from opforge.export import export
    from opforge.program import save
    from opforge.quantize import quantize
    from opforge.quantize.memory import graph_copy
    from opforge.quantize.packing import pack_4bit_weights
    from opforge.quantize.weights_only import weights_only

    model = build(config, logits_to_keep)
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    dynamic = ({0: seq}, {0: seq})
    ids = prompt(config)
    example = (torch.tensor(ids[:3]), torch.arange(3))
    start = time.perf_counter()
    # The float weights are held once: the model is quantized in place or let go once
    # converted (what `opforge quantize` does). A converted PT2E graph's decode method
    # exports a copy that shares its weights (memory.graph_copy; its KV cache its own, as
    # a deep copy's was: export switches a graph's mode by rewriting it in place); the
    # dynamic schemes' swapped modules export as they are for both methods, as float32's.
    if variant in ("8da8w", "8da4w"):
        from opforge.quantize.dynamic import quantize_dynamic

        converted = quantize_dynamic(model, variant, inplace=True)
    elif variant != "float32":
        scheme = "16a8w" if variant.startswith("int8") else "16a4w_block"
        calibration = [(torch.tensor(ids[:64]), torch.arange(64))]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = quantize(model, example, scheme, calibration=calibration,
                              dynamic_shapes=dynamic, keep_float_model=False)
        converted = weights_only(result.model) if variant.endswith("weights") else result.model
        del result
    else:
        converted = model
    del model
    prefill = decode = converted
    if isinstance(converted, torch.fx.GraphModule):
        decode = graph_copy(converted)
    del converted
    quantized_s = time.perf_counter() - start
    if variant.endswith("folded"):
        os.environ["OPFORGE_CPU_INT_WEIGHTS"] = "0"
    if variant.endswith("every rounding"):
        os.environ["OPFORGE_CPU_FUSED_ROUNDINGS"] = "0"
    if variant.endswith("float path"):
        os.environ["OPFORGE_CPU_INT16_ACTIVATIONS"] = "0"
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(None, methods={
            "prefill": (prefill, example, dynamic),
            "decode": (decode, (torch.tensor([0]), torch.tensor([0])))},
            kernels="portable", backends=["cpu"])
    del prefill, decode  # the program holds what it needs: the modules' weights can go
    program = pack_4bit_weights(program)
    path = workdir / _slug(variant) / f"{config}-opforge-cpu.opf"
    path.parent.mkdir(parents=True, exist_ok=True)
    save(program, path)
    kinds: dict[str, int] = {}
    from opforge.backends.cpu import blob

    for d in program.delegates:
        plan, _ = blob.parse(program.segments[d.segment].data)
        for op in plan["ops"]:
            kinds[op["kind"]] = kinds.get(op["kind"], 0) + 1
    record = {"variant": variant, "quantize_s": quantized_s, "export_s": time.perf_counter() - start,
              "file_mb": path.stat().st_size / 2**20, "kinds": kinds}
    (path.parent / "prepared.json").write_text(json.dumps(record))
    return record


def measure(config: str, workdir: pathlib.Path, repeats: int, new_tokens: int) -> dict:
    """Load one program, warm up, then ``repeats`` generations: decode tokens/s by the wall
    clock and by this process's CPU time (on a shared machine the CPU time leaves out the
    time other processes held the core), resident memory."""
    from worker import _status_mb, peak_rss_mb

    from opforge.runtime import load
    from opforge.runtime.generate import Generator

    generator = Generator(load(workdir / f"{config}-opforge-cpu.opf", num_threads=1))
    ids = prompt(config)
    generator.generate(ids[:8], 4)  # both call shapes bound, pools started
    wall, cpu, prefill, prefill_cpu, tokens = [], [], [], [], None
    for _ in range(repeats):
        start = time.process_time()
        result = generator.generate(ids, 1)  # the prompt and its first token
        first = time.process_time() - start
        start = time.process_time()
        result = generator.generate(ids, new_tokens)
        total = time.process_time() - start
        tokens = tokens or list(result.tokens)
        wall.append((len(result.tokens) - 1) / result.decode_seconds)
        cpu.append((len(result.tokens) - 1) / max(total - first, 1e-9))
        prefill.append(len(ids) / result.prefill_seconds)
        prefill_cpu.append(len(ids) / max(first, 1e-9))  # the prompt and its first token
    return {"decode_tok_s": statistics.median(wall), "decode_cpu_tok_s": statistics.median(cpu),
            "prefill_tok_s": statistics.median(prefill),
            "prefill_cpu_tok_s": statistics.median(prefill_cpu), "rss_mb": _status_mb("VmRSS"),
            "peak_rss_mb": peak_rss_mb(), "tokens": tokens, "load_average": os.getloadavg()[0]}


def _worker(args: list[str], stdin: str | None = None, env_extra: dict | None = None) -> list[dict]:
    env = dict(os.environ)
    env.update({k: "1" for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")})
    env.update(env_extra or {})
    env.setdefault("PYTHONWARNINGS", "ignore")
    done = subprocess.run([sys.executable, *args], input=stdin, text=True, capture_output=True,
                          env=env, timeout=3600)
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise RuntimeError(f"worker {args} failed:\n{done.stderr[-3000:]}")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="base", choices=list(CONFIGS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--skip-prepare", action="store_true", help="reuse the exported programs")
    parser.add_argument("--workdir", type=pathlib.Path, default=HERE / "work" / "int_weights")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    parser.add_argument("--prepare-one", help=argparse.SUPPRESS)
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.prepare_one:  # (the export worker: one process per variant)
        print(json.dumps(prepare(args.config, args.prepare_one, args.workdir)), flush=True)
        return 0
    if args.measure_one:  # (a measuring worker: one process per variant and round)
        print(json.dumps(measure(args.config, args.workdir / _slug(args.measure_one),
                                 args.repeats, args.new_tokens)), flush=True)
        return 0
    prepared = {}
    for variant in args.variants:
        if args.skip_prepare:
            saved = args.workdir / _slug(variant) / "prepared.json"
            program = args.workdir / _slug(variant) / f"{args.config}-opforge-cpu.opf"
            prepared[variant] = json.loads(saved.read_text()) if saved.exists() else \
                {"file_mb": program.stat().st_size / 2**20}
            continue
        print(f"exporting {variant} ...", file=sys.stderr, flush=True)
        prepared[variant] = _worker([__file__, "--config", args.config, "--workdir",
                                     str(args.workdir), "--prepare-one", variant])[0]
    samples: dict[str, list[dict]] = {v: [] for v in args.variants}
    for round_ in range(args.rounds):
        for variant in (args.variants if round_ % 2 == 0 else reversed(args.variants)):
            print(f"round {round_}: {variant}", file=sys.stderr, flush=True)
            samples[variant] += _worker([__file__, "--config", args.config, "--workdir",
                                         str(args.workdir), "--repeats", str(args.repeats),
                                         "--new-tokens", str(args.new_tokens),
                                         "--measure-one", variant])
    rows = []
    for variant in args.variants:
        runs = samples[variant]
        rows.append({"variant": variant, **{key: statistics.median(r[key] for r in runs) for key in (
            "decode_tok_s", "decode_cpu_tok_s", "prefill_tok_s", "prefill_cpu_tok_s", "rss_mb",
            "peak_rss_mb")},
            "tokens": runs[0]["tokens"][:16], **prepared.get(variant, {})})
    machine = describe_machine(HERE.parent)
    record = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": args.config,
              "threads": 1, "new_tokens": args.new_tokens, "machine": machine, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "int_weights.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
    (args.out / "int_weights.md").write_text(markdown(record))
    print(markdown(record))
    return 0


def markdown(record: dict) -> str:
    m = record["machine"]
    rows = {r["variant"]: r for r in record["rows"]}
    base = rows.get("float32")
    lines = [f"# Integer weights on the cpu backend ({record['config']}, {record['threads']} thread)",
             "", f"{record['date']}; {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, "
             f"load average {m['load_average'][0]:.2f} at the end; opforge {m['opforge_commit']}. "
             f"Prompt 128 tokens, {record['new_tokens']} new tokens; medians over the rounds "
             "(`bench/int_weights.py`, which says what each program is).", "",
             "| program | decode tok/s (wall) | × float32 | decode tok/s (CPU time) | × float32 | "
             "prefill tok/s (wall) | prefill tok/s (CPU time) | RSS MB | × float32 | peak MB | file MB |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for variant, r in rows.items():
        speed = f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}" if base else "-"
        cpu = f"{r['decode_cpu_tok_s'] / base['decode_cpu_tok_s']:.2f}" if base else "-"
        memory = f"{r['rss_mb'] / base['rss_mb']:.2f}" if base else "-"
        lines.append(f"| {variant} | {r['decode_tok_s']:.1f} | {speed} | {r['decode_cpu_tok_s']:.1f} | "
                     f"{cpu} | {r['prefill_tok_s']:.0f} | {r.get('prefill_cpu_tok_s', float('nan')):.0f} | "
                     f"{r['rss_mb']:.0f} | {memory} | {r['peak_rss_mb']:.0f} | "
                     f"{r.get('file_mb', float('nan')):.0f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
