"""The reference-kernel cliffs of issue 47, measured on the patterns of the models that hit them.

timm's ``coat_lite_tiny`` and torchvision's ``swin_t`` are not installed with opforge; their
patterns are (``tests/backends/test_cpu_reference_cliffs.py``), here at the models' stage-1
sizes for a 224x224 image:

- ``coat_factor_attention``: CoaT's factorized attention, [1, 3137, 64], 8 heads (softmax
  over the 3137 tokens of k [1, 8, 3137, 8], dim 2);
- ``swin_window_attention``: Swin-T's shifted-window attention on 64 windows of 7x7 tokens,
  96 channels, 3 heads (scores [64, 3, 49, 49] + bias [1, 3, 49, 49], viewed
  [1, 64, 3, 49, 49] + mask [1, 64, 1, 49, 49]);
- ``window_matmuls``: window attention's batched matmuls alone, q @ k^T ([192, 49, 32] x
  [192, 32, 49]) and attn @ v ([192, 49, 49] x [192, 49, 32]), against one matmul of about the
  same FLOPs (245 x 245 x 245), in GFLOP/s (issue 47, item 3). The batched matmuls' cpu times
  include a copy of the result into the delegate's output (the bmm's result reaches the
  output through a view, which the output redirection does not follow).

One thread everywhere: run it as ``OMP_NUM_THREADS=1 python bench/reference_cliffs.py``
(eager gets ``torch.set_num_threads(1)``, the engine ``OPFORGE_NUM_THREADS=1``). Each time is
the median of ``--rounds`` rounds, each the median of ``--calls`` calls after warm-up calls.
Prints a Markdown table, with each engine op's implementation name (oneDNN's ``ref:any`` is
its reference kernel), and the error against eager float64 relative to the output's scale.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OPFORGE_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "backends"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from opforge.backends.cpu import engine as cpu_engine  # noqa: E402
from opforge.export import export  # noqa: E402
from opforge.runtime import load  # noqa: E402
from test_cpu_reference_cliffs import CoatFactorAttention, SwinWindowAttention  # noqa: E402
from machine import describe_machine  # noqa: E402


class BatchedMatmul(nn.Module):
    def forward(self, a, b):
        return a @ b


def workloads() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "coat_factor_attention": (CoatFactorAttention(64, 8), (torch.randn(1, 3137, 64, generator=g),)),
        "swin_window_attention": (SwinWindowAttention(96, 3, 64, 7), (torch.randn(64, 49, 96, generator=g),)),
        "q @ k^T [192,49,32]x[192,32,49]": (BatchedMatmul(), (torch.randn(192, 49, 32, generator=g),
                                                             torch.randn(192, 32, 49, generator=g))),
        "attn @ v [192,49,49]x[192,49,32]": (BatchedMatmul(), (torch.randn(192, 49, 49, generator=g),
                                                              torch.randn(192, 49, 32, generator=g))),
        "one matmul [245,245]x[245,245]": (BatchedMatmul(), (torch.randn(245, 245, generator=g),
                                                            torch.randn(245, 245, generator=g))),
    }


def flops(name: str, inputs) -> float:
    if not isinstance(inputs[0], torch.Tensor) or len(inputs) != 2:
        return 0.0
    a, b = inputs
    return 2.0 * a.shape[:-1].numel() * a.shape[-1] * b.shape[-1]


def median_ms(call, rounds: int, calls: int) -> float:
    for _ in range(3):
        call()
    per_round = []
    for _ in range(rounds):
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        per_round.append(statistics.median(times))
    return statistics.median(per_round) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    machine = describe_machine(ROOT)
    print(f"machine: {machine.get('cpu')}, {machine.get('cores')} cores; threads: 1 (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, "
          f"torch.set_num_threads(1)); torch {torch.__version__}; commit {machine.get('opforge_commit')}; load {machine.get('load_average')}\n")
    print("| workload | cpu backend ms | eager ms | eager / cpu | GFLOP/s cpu | GFLOP/s eager "
          "| error (of scale) | engine ops [implementation] |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for name, (model, inputs) in workloads().items():
        if args.only and name not in args.only:
            continue
        model = model.eval()
        program = export(model, inputs, backends=["cpu"])
        method = load(program).method("forward")
        arrays = [t.numpy() for t in inputs]
        got = torch.as_tensor(method(*arrays)[0]).double()
        with torch.no_grad():
            want = copy_double(model)(*[t.double() for t in inputs])
            eager = median_ms(lambda: model(*inputs), args.rounds, args.calls)
        cpu = median_ms(lambda: method(*arrays), args.rounds, args.calls)
        error = float((got - want).abs().max() / want.abs().max())
        work = flops(name, inputs)
        rates = f"{work / cpu / 1e6:.1f} | {work / eager / 1e6:.1f}" if work else "– | –"
        ops = ", ".join(f"{op} [{impl}]" if impl else op for op, impl in cpu_engine.program_impls(program))
        print(f"| {name} | {cpu:.3f} | {eager:.3f} | {eager / cpu:.2f} | {rates} | {error:.1e} | {ops} |")


def copy_double(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).double()


if __name__ == "__main__":
    main()
