"""Check one model written elsewhere on opforge's lean runtime, its cpu backend and ONNX Runtime.

Run by bench/external_models.py as ``python bench/external_check.py MODEL [--time]
[--runtimes=lean,cpu,ort]`` in a process of its own; prints one JSON line (the model's row)
on stdout.

Steps:

1. Build the model (bench/external_catalog.py) and its input; seed 0; eval mode.
2. Move its parameters and buffers away from their defaults (``spread_parameters``), so a
   kernel that reads a BatchNorm statistic, a norm's affine or a bias at the wrong place
   changes the output, while the model stays numerically sane.
3. Reference: eager float64 (``copy.deepcopy(model).double()``); eager float32 gives the
   error a correct float32 computation makes.
4. For each runtime, ``lean`` (exported without backends) and ``cpu`` (``backends=["cpu"]``,
   the delegates run on the compiled oneDNN engine, the rest on portable kernels): export,
   load, call once. The verdict:

   - ``right``: max |got - float64| ≤ 8 × max |eager float32 - float64| + 2 ulp of the
     output's scale (2 · eps(float32) · max |float64|), for every output: the criterion of
     tests/backends/test_cpu_models.py;
   - ``wrong``: above it (or a shape/dtype mismatch, or a non-finite value where the
     reference has none);
   - ``refused``: export, load or the call raised; the reason's first line is kept.

   For ``cpu`` the row also says how much was delegated: the fraction of the program's
   compute nodes that run inside delegates (delegate nodes from
   ``opforge.export.delegation_report`` over those plus the kernel calls left outside),
   and which implementation runs each engine op (``impls``: oneDNN's names counted, the
   engine's own kernels as ``own``). ``reference`` lists the ops on one of oneDNN's
   reference kernels (``ref:...``, or an ISA of ``any``) whose op name does not say why
   (``reference_kernel_explained``: the lowering names such an op ``... (reference
   kernel: why)``): the check fails on any (issue 47).
   ``ort``: ONNX Runtime (the peer of issue 47), the model exported by ``torch.onnx.export``
   and run on the CPU execution provider (bench/runtimes/onnxruntime_cpu.py: one intra-op
   and one inter-op thread, sequential, ORT's default graph optimisations), judged by the
   same criterion. Only where ``onnxruntime`` imports (bench/setup_external.sh installs it).
5. With ``--time``: eager float32 and every runtime checked that is not ``lean`` (the cpu
   backend, ONNX Runtime) timed at one thread each (``torch.set_num_threads(1)``; the
   orchestrator sets ``OMP_NUM_THREADS=1`` and ``OPFORGE_NUM_THREADS=1``), interleaved: two
   warm-up calls each, then rounds of one call of each until ``ROUNDS`` rounds or
   ``TIME_BUDGET_S`` seconds; the medians (ms) are each runtime row's ``ms`` and, in each,
   ``eager_ms`` (the same eager median).
"""

from __future__ import annotations

import copy
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from external_catalog import CATALOG, build  # noqa: E402

# The spread: a design note.
#
# Default initialisations hide bugs: BatchNorm's running mean 0 / variance 1 / weight 1 /
# bias 0 make it the identity (up to eps), LayerNorm's affine is 1 / 0, many biases start
# at 0 and layer scales at 1e-5 or 1e-6 (so a residual branch contributes nothing). Random
# values are not enough either: with eval-mode statistics that do not match the data, a
# deep network's activations grow or vanish layer after layer and the comparison loses its
# meaning. So, seeded (torch.manual_seed(0)):
#
# - BatchNorm (every torch.nn.modules.batchnorm._BatchNorm, timm's BatchNormAct included):
#   the statistics are set from the data the layer sees, then moved: a forward pre-hook on
#   the first call measures the input's per-channel mean m and variance v (over batch and
#   space), takes w = max(v, m²/4, s/4, 1e-3), s the layer's mean of m² + v over channels,
#   and sets running_mean = m + 0.5·sqrt(w)·N(0, 1) and running_var = w · U(0.5, 2); affine
#   weight U(0.5, 1.5), bias U(-0.3, 0.3). Every BatchNorm output is then of order 1, as in
#   a trained network, with per-channel scale and shift far from 1/0. The floors matter
#   where a channel barely varies (few pixels left, or one): statistics fitted exactly to
#   it would make x - running_mean a cancellation that amplifies float32 rounding layer
#   after layer, eager float32 would drift from float64, and the criterion would accept
#   almost anything (torchvision's inception_v3 at 96×96 did: 1×1 pixels in Mixed_7).
#   The hooks run in one float32 forward, in model order, so each layer sees its input as
#   it is with the layers before it already moved; they are removed afterwards.
# - Norms with an affine weight (LayerNorm, GroupNorm, RMSNorm, timm's LayerNorm2d, the
#   transformers norms: every module whose class name has "Norm" and a 1-D weight): weight
#   U(0.5, 1.5), bias (if any) U(-0.3, 0.3).
# - Every other 1-D parameter named like a bias (conv, linear, attention): + U(-0.1, 0.1).
# - Every other 1-D parameter that is constant (a layer scale, a gain: the default's
#   sign): |c| → U(0.1, 1.0) with c's sign.
# - Weights (conv, linear, embeddings) keep the library's own initialisation, made to keep
#   activations of order 1, unless it is constant: a zero-initialised classifier head
#   (torchvision's ViT, timm's MLP-Mixers) would make the output its bias alone, and zero
#   attention-bias tables hide what indexes them. Those get U(-a, a), a = sqrt(3 / fan_in)
#   (fan_in: the elements per leading index), the variance of a fan-in-scaled init.

_BIAS_NAMES = ("bias", "b")


def spread_parameters(model: torch.nn.Module, inputs: tuple) -> None:
    """Move ``model``'s parameters and buffers away from their defaults (see the note above);
    ``inputs`` is one example input, used to set BatchNorm statistics from the data."""
    touched: set[int] = set()
    hooks = []
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            hooks.append(module.register_forward_pre_hook(_set_statistics_once()))
            _spread_affine(module, touched)
        elif "Norm" in type(module).__name__ and getattr(module, "weight", None) is not None \
                and isinstance(module.weight, torch.nn.Parameter) and module.weight.dim() == 1:
            _spread_affine(module, touched)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if id(param) in touched or param.dim() != 1 or not param.is_floating_point():
                continue
            leaf = name.rsplit(".", 1)[-1]
            if leaf in _BIAS_NAMES or leaf.endswith("_bias") or leaf.startswith("bias"):
                param.add_(torch.empty_like(param).uniform_(-0.1, 0.1))
            elif param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                sign = -1.0 if float(param.flatten()[0]) < 0 else 1.0
                param.copy_(sign * torch.empty_like(param).uniform_(0.1, 1.0))
        for param in model.parameters():
            if id(param) in touched or param.dim() < 2 or not param.is_floating_point():
                continue
            if param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                bound = (3.0 / max(1, param.numel() // param.shape[0])) ** 0.5
                param.uniform_(-bound, bound)
        model(*inputs)
    for hook in hooks:
        hook.remove()


def _spread_affine(module: torch.nn.Module, touched: set[int]) -> None:
    with torch.no_grad():
        weight = getattr(module, "weight", None)
        bias = getattr(module, "bias", None)
        if isinstance(weight, torch.nn.Parameter):
            weight.copy_(torch.empty_like(weight).uniform_(0.5, 1.5))
            touched.add(id(weight))
        if isinstance(bias, torch.nn.Parameter):
            bias.copy_(torch.empty_like(bias).uniform_(-0.3, 0.3))
            touched.add(id(bias))


def _set_statistics_once():
    done = []

    def hook(module, args):
        if done or module.running_mean is None:
            return
        x = args[0].detach().float()
        dims = [d for d in range(x.dim()) if d != 1]
        mean = x.mean(dim=dims)
        var = x.var(dim=dims, unbiased=False)
        layer = float((mean * mean + var).mean())
        var = torch.maximum(var, 0.25 * mean * mean).clamp_min(max(0.25 * layer, 1e-3))
        module.running_mean.copy_(mean + 0.5 * var.sqrt() * torch.randn_like(mean))
        module.running_var.copy_(var * torch.empty_like(var).uniform_(0.5, 2.0))
        done.append(True)

    return hook


def _outputs(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _outputs(item)]


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _judge(got: list[np.ndarray], want32: list[np.ndarray], want64: list[np.ndarray]) -> dict:
    if len(got) != len(want64):
        return {"verdict": "wrong", "why": f"{len(got)} outputs, eager has {len(want64)}"}
    worst = {"error": 0.0, "bound": 0.0, "eager_error": 0.0, "scale": 0.0}
    for i, (g, w32, w64) in enumerate(zip(got, want32, want64)):
        if g.shape != w32.shape or g.dtype != w32.dtype:
            return {"verdict": "wrong", "why": f"output {i}: {g.dtype}{list(g.shape)}, eager "
                                               f"{w32.dtype}{list(w32.shape)}"}
        if g.size == 0:
            continue
        diff = np.abs(g.astype(np.float64) - w64)
        if not np.isfinite(diff).all() and np.isfinite(w64).all():
            return {"verdict": "wrong", "why": f"output {i}: non-finite values"}
        eager_err = float(np.max(np.abs(w32.astype(np.float64) - w64)))
        scale = float(np.max(np.abs(w64)))
        err = float(np.nanmax(diff))
        bound = 8 * eager_err + 2 * float(np.finfo(np.float32).eps) * scale
        if err - bound > worst["error"] - worst["bound"] or i == 0:
            worst = {"error": err, "bound": bound, "eager_error": eager_err, "scale": scale}
    verdict = "right" if worst["error"] <= worst["bound"] else "wrong"
    return {"verdict": verdict, **worst}


def _delegated_fraction(program) -> float:
    from opforge.export import delegation_report
    from opforge.program import KernelCall

    report = delegation_report(program).get("forward", {})
    inside = sum(d["nodes"] for d in report.get("delegates", []))
    outside = sum(type(i) is KernelCall for i in program.method("forward").instructions)
    return inside / (inside + outside) if inside + outside else 0.0


def reference_kernel(impl: str) -> bool:
    """Whether oneDNN's implementation name ``impl`` is one of its reference kernels."""
    name, _, isa = impl.partition(":")
    return bool(impl) and (name.startswith("ref") or isa == "any")


def reference_kernel_explained(op: str) -> bool:
    """Whether the engine op's name says why it runs a reference kernel."""
    return "(reference kernel:" in op


def _implementations(program) -> dict:
    from collections import Counter

    from opforge.backends.cpu.engine import program_impls

    pairs = program_impls(program)
    return {"impls": dict(Counter(impl or "own" for _, impl in pairs).most_common()),
            "reference": [f"{op} [{impl}]" for op, impl in pairs
                          if reference_kernel(impl) and not reference_kernel_explained(op)],
            "reference_explained": [f"{op} [{impl}]" for op, impl in pairs
                                    if reference_kernel(impl) and reference_kernel_explained(op)]}


ROUNDS = 9
TIME_BUDGET_S = 60.0


def time_interleaved(calls: dict) -> dict[str, float]:
    """Each zero-argument call's median in ms over interleaved rounds (one call of each per
    round, in order), after two warm-up calls of each."""
    import statistics

    seconds: dict[str, list[float]] = {name: [] for name in calls}
    with torch.no_grad():
        for _ in range(2):
            for call in calls.values():
                call()
        start = time.perf_counter()
        rounds = 0
        while rounds < ROUNDS and (rounds < 3 or time.perf_counter() - start < TIME_BUDGET_S):
            for name, call in calls.items():
                t0 = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - t0)
            rounds += 1
    return {name: statistics.median(times) * 1e3 for name, times in seconds.items()}


def _run_runtime(model, inputs, backends, want32, want64) -> tuple[dict, object]:
    """The opforge runtime's row and a zero-argument call of its method (None if refused)."""
    from opforge.export import export
    from opforge.runtime import load

    row: dict = {}
    start = time.perf_counter()
    try:
        program = export(model, inputs, kernels="portable", backends=backends)
    except Exception as error:  # a refusal is a result, not a crash of the bench
        return {"verdict": "refused", "why": "export: " + _first_line(error),
                "export_s": round(time.perf_counter() - start, 2)}, None
    row["export_s"] = round(time.perf_counter() - start, 2)
    if backends:
        row["delegated"] = round(_delegated_fraction(program), 4)
        try:
            row.update(_implementations(program))
        except Exception as error:  # the engine refused to build: the run below says so too
            row["impls_error"] = _first_line(error)
    start = time.perf_counter()
    try:
        forward = load(program).method("forward")
        got = forward(*[t.numpy() for t in inputs])
    except Exception as error:
        return {**row, "verdict": "refused", "why": "load/run: " + _first_line(error)}, None
    row["run_s"] = round(time.perf_counter() - start, 2)
    row.update(_judge([np.asarray(g) for g in got], want32, want64))
    arrays = [t.numpy() for t in inputs]
    return row, lambda: forward(*arrays)


def _run_ort(model, inputs, want32, want64) -> tuple[dict, object]:
    """ONNX Runtime's row and a zero-argument call of its session (None if refused)."""
    import tempfile

    from runtimes import onnxruntime_cpu

    missing = onnxruntime_cpu.unavailable()
    if missing:
        return {"verdict": "refused", "why": missing}, None
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "model.onnx"
            onnxruntime_cpu.export(model, inputs, path, "")
            session = onnxruntime_cpu.Session(path, threads=1)  # it reads the file here
    except Exception as error:
        return {"verdict": "refused", "why": "export: " + _first_line(error),
                "export_s": round(time.perf_counter() - start, 2)}, None
    row: dict = {"export_s": round(time.perf_counter() - start, 2)}
    feed = session.feed([t.numpy() for t in inputs])
    try:
        got = session.outputs(session.run(feed))
    except Exception as error:
        return {**row, "verdict": "refused", "why": "run: " + _first_line(error)}, None
    row.update(_judge(got, want32, want64))
    return row, lambda: session.run(feed)


def check(name: str, runtimes: tuple[str, ...] = ("lean", "cpu"), timed: bool = False) -> dict:
    """The row for model ``name``: its verdict, errors and timings per runtime (``timed``:
    the cpu backend against eager at one thread, item 5 above)."""
    entry = CATALOG[name]
    torch.manual_seed(0)
    row: dict = {"model": name, "source": entry.source,
                 "input": f"tokens {entry.tokens}" if entry.tokens else f"{entry.image}x{entry.image}"}
    try:
        model, inputs = build(entry)
        spread_parameters(model, inputs)
        with torch.no_grad():
            want32 = [t.detach().numpy() for t in _outputs(model(*inputs))]
            model64 = copy.deepcopy(model).double()
            inputs64 = tuple(t.double() if t.is_floating_point() else t for t in inputs)
            want64 = [t.detach().numpy() for t in _outputs(model64(*inputs64))]
        del model64
    except Exception as error:
        row["skipped"] = "build/eager: " + _first_line(error)
        return row
    row["params_m"] = round(sum(p.numel() for p in model.parameters()) / 1e6, 2)
    row["output_scale"] = float(max(np.max(np.abs(w)) for w in want64 if w.size))
    calls = {}
    for runtime in [r for r in ("lean", "cpu", "ort") if r in runtimes]:
        if runtime == "ort":
            row[runtime], call = _run_ort(model, inputs, want32, want64)
        else:
            row[runtime], call = _run_runtime(model, inputs, ["cpu"] if runtime == "cpu" else None,
                                              want32, want64)
        if call is not None and runtime != "lean":
            calls[runtime] = call
    if timed and calls:
        medians = time_interleaved({"eager": lambda: model(*inputs), **calls})
        for runtime in calls:
            row[runtime].update(ms=round(medians[runtime], 3), eager_ms=round(medians["eager"], 3))
    return row


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    name = argv[0]
    runtimes = next((a.split("=", 1)[1].split(",") for a in argv[1:] if a.startswith("--runtimes=")),
                    ["lean", "cpu"])
    try:
        row = check(name, tuple(runtimes), timed="--time" in argv[1:])
    except Exception as error:  # print a row whatever happened
        row = {"model": name, "skipped": "check: " + _first_line(error),
               "traceback": traceback.format_exc()[-2000:]}
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
