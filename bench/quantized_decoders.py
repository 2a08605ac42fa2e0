"""Quantized decoders against float32: logits SQNR and greedy tokens on held-out prompts.

    OMP_NUM_THREADS=1 .venv/bin/python bench/quantized_decoders.py             # the table
    .venv/bin/python bench/quantized_decoders.py --layers 1 --schemes 16a16w --dim 128

The bundled ``TinyDecoder`` (opforge/examples/decoder.py) at issue 46's config: dim 512,
8 heads, 4 KV heads, MLP 1536, 256 positions, vocabulary 64, weights from its own seed
(0). Per scheme and layer count:

- quantized with ``opforge.quantize.quantize`` and a dynamic sequence (as
  docs/quantization.md exports decoders), calibrated on two prompts of 64 and 128 tokens
  (the weight-only schemes ``w8``, ``w8_block``, ``w4`` need no calibration: none is given;
  ``w4:128`` is ``w4`` with ``group_size=128``);
- **SQNR** (dB) of the prefill logits of 4 held-out 64-token prompts (other tokens than
  the calibration's) against the float32 model;
- **weights only**: the same with the activations left in float
  (``opforge.quantize.weights_only``), the best the scheme's weights allow;
- **greedy**: 32 new tokens from each held-out prompt, decoded by the converted model
  (prefill, then one-token steps through its KV cache) and by the float model: the share
  of the 128 positions where the tokens are equal (after a first difference the two
  continue from different tokens, so this counts how long they agree, not only errors);
- **top-1**: the share of the held-out prompts' 256 positions whose next-token argmax
  (prefill logits, teacher-forced) is float32's.

The converted model runs in eager PyTorch: the lean runtime's program of it gives the same
numbers (its kernels are bit-exact against torch's quantize/dequantize,
docs/quantization.md, "Quantized programs"). Writes ``results/quantized_decoders.md``.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import pathlib
import sys
import time
import warnings

HERE = pathlib.Path(__file__).resolve().parent
# a weight-only scheme may name its group size: "w4:128" is w4 in groups of 128 along K
SCHEMES = ("16a16w", "16a8w", "16a4w", "16a4w_block", "8a8w", "8a4w", "w8", "w8_block", "w4",
           "w4:128")


def decoder(layers: int, dim: int = 512):
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(vocab=64, dim=dim, heads=8, kv_heads=4, hidden=3 * dim, layers=layers,
                       max_len=256, seed=0).eval()


def prompts(lengths, seed: int, vocab: int = 64):
    import torch

    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (n,), generator=g), torch.arange(n)) for n in lengths]


def measure(model, scheme, calibration, held_out, new_tokens: int = 32) -> dict:
    import torch

    from opforge.examples.decoder import greedy_decode
    from opforge.quantize import quantize
    from opforge.quantize.report import sqnr_db
    from opforge.quantize.weights_only import weights_only

    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = quantize(model, calibration[0], scheme,
                          calibration=calibration if scheme.needs_calibration else None,
                          dynamic_shapes=({0: seq}, {0: seq}))
    seconds = time.perf_counter() - start
    bound = weights_only(result.model)
    with torch.no_grad():
        reference = [model(*p) for p in held_out]
        outputs = [result.model(*p) for p in held_out]
        weights = [bound(*p) for p in held_out]
        same = total = 0
        for tokens, _ in held_out:
            quantized = copy.deepcopy(result.model)  # its caches are state
            want = greedy_decode(lambda t, p: model(t, p), tokens.tolist(), new_tokens)
            got = greedy_decode(lambda t, p: quantized(t, p), tokens.tolist(), new_tokens)
            same += sum(a == b for a, b in zip(want, got))
            total += len(want)
    top1 = sum(int((r.argmax(-1) == o.argmax(-1)).sum()) for r, o in zip(reference, outputs))
    positions = sum(r.shape[0] for r in reference)
    name = scheme.scheme + (f":{scheme.group_size}" if scheme.group_size else "")
    return {"scheme": name, "sqnr_db": sqnr_db(reference, outputs), "top1_equal": top1 / positions,
            "weights_only_db": sqnr_db(reference, weights),
            "calibration_db": result.report.sqnr_db, "greedy_equal": same / total,
            "greedy_tokens": total, "quantize_s": seconds}


def _machine() -> str:
    import subprocess

    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        fields = dict(line.split(":", 1) for line in out.splitlines() if ":" in line)
        return f"{fields['Model name'].strip()}, {fields['CPU(s)'].strip()} CPUs"
    except (OSError, subprocess.CalledProcessError, KeyError):
        return "unknown"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--act-headroom", type=float, default=None,
                        help="QuantConfig(act_headroom=...): 1 gives the ranges as observed "
                             "(what opforge did before issue 46)")
    parser.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    args = parser.parse_args(argv)
    import torch

    from opforge.quantize import QuantConfig

    torch.set_num_threads(1)
    calibration = prompts([64, 128], seed=1)
    held_out = prompts([64] * 4, seed=2)
    rows = []
    for layers in args.layers:
        model = decoder(layers, args.dim)
        for scheme in args.schemes:
            name, _, group = scheme.partition(":")
            config = QuantConfig(name, act_headroom=args.act_headroom,
                                 group_size=int(group) if group else None)
            row = {"layers": layers, "act_headroom": config.headroom,
                   **measure(model, config, calibration, held_out)}
            rows.append(row)
            print(json.dumps(row), flush=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    load = os.getloadavg()[0]
    lines = [f"# Quantized decoders against float32 ({stamp}, {_machine()}, 1 thread, load "
             f"{load:.1f}: the numbers do not depend on time)", "",
             f"TinyDecoder dim {args.dim}, 8 heads, 4 KV heads, MLP {3 * args.dim}, 256 "
             "positions; calibrated on prompts of 64 and 128 tokens; 4 held-out 64-token "
             "prompts, 32 greedy tokens each"
             + (f"; act_headroom={args.act_headroom:g}" if args.act_headroom else "") + ".", "",
             "| layers | scheme | SQNR (dB) | weights only (dB) | greedy tokens equal | top-1 equal |",
             "| ---: | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['layers']} | {r['scheme']} | {r['sqnr_db']:.1f} | {r['weights_only_db']:.1f} "
              f"| {100 * r['greedy_equal']:.0f}% | {100 * r['top1_equal']:.0f}% |" for r in rows]
    args.out.mkdir(parents=True, exist_ok=True)
    name = "quantized_decoders" + (f"_headroom{args.act_headroom:g}" if args.act_headroom else "")
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
