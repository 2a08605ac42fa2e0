"""transformers decoders exported with transformers' own ExecuTorch recipe, run by opforge.

    bench/.venv-external/bin/python bench/transformers_decoders.py
    bench/.venv-external/bin/python bench/transformers_decoders.py --models llama,qwen2

Each configuration (random weights, seeded) is wrapped in
``transformers.integrations.executorch.TorchExportableModuleForDecoderOnlyLM`` with a static
KV cache, exported by that module's own ``export(input_ids=..., cache_position=...,
dynamic_shapes=...)`` with a dynamic sequence length, and the resulting
``torch.export.ExportedProgram`` goes to ``opforge.export.export`` as it is. The program
then prefills a prompt in one call and greedy-decodes token by token on the lean runtime,
in ATen mode, and exported with ``backends=["cpu"]``; each run's tokens must equal
transformers' own ``generate(..., cache_implementation="static", do_sample=False)`` on the
eager model, and the prefill logits are compared with eager's.

For the cpu-backend run the row also records which implementation runs each engine op
(``impls``, ``reference``, ``reference_explained``: the same record as
bench/external_check.py, whose helpers it imports): an engine op on one of oneDNN's
reference kernels whose name does not say why fails the bench (issue 47). The record comes
from each delegate's engine as built from the program (dynamic methods at their export-time
shapes).

Needs ``bench/.venv-external`` (``bash bench/setup_external.sh``: transformers and torch
2.14.1 beside opforge). Writes ``bench/results/transformers_decoders.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from external_check import _implementations  # noqa: E402
from machine import describe_machine  # noqa: E402

RESULTS = HERE / "results"
PROMPT = [1, 17, 5, 42, 9, 3]
NEW_TOKENS = 16
CACHE = 48


def _configs() -> dict:
    import transformers as tf

    common = dict(vocab_size=256, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  use_cache=True)
    return {
        "llama": lambda: tf.LlamaForCausalLM(tf.LlamaConfig(**common)),
        "qwen2": lambda: tf.Qwen2ForCausalLM(tf.Qwen2Config(**common)),
        "qwen3": lambda: tf.Qwen3ForCausalLM(tf.Qwen3Config(**common, head_dim=16)),
        "gemma": lambda: tf.GemmaForCausalLM(tf.GemmaConfig(**common, head_dim=16)),
        "mistral": lambda: tf.MistralForCausalLM(tf.MistralConfig(**common, sliding_window=None)),
        "phi3": lambda: tf.Phi3ForCausalLM(tf.Phi3Config(**common, pad_token_id=0)),
        # mixture of experts: 4 experts, 2 per token (the router's top-k, the experts'
        # grouped matmul, its group boundaries read from the routing)
        "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2, sliding_window=None)),
        # transformers' other expert implementation that export can trace: each pair's
        # expert weights gathered, one bmm ("eager" loops over a data-dependent tensor of
        # hit experts, which torch.export itself refuses)
        "mixtral_batched_mm": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
            **common, num_local_experts=4, num_experts_per_tok=2, sliding_window=None,
            experts_implementation="batched_mm")),
        "qwen2_moe": lambda: tf.Qwen2MoeForCausalLM(tf.Qwen2MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48,
            shared_expert_intermediate_size=96, norm_topk_prob=False)),
        "qwen3_moe": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            **common, head_dim=16, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=48, norm_topk_prob=True)),
    }


def _randomize(model: torch.nn.Module, seed: int) -> None:
    """Draw every parameter away from its default (norm weights are ones by default)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.3 if "norm" in name else 0.08
            base = 1.0 if "norm" in name and p.dim() == 1 else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))


def _greedy(step, prompt: list[int], new_tokens: int) -> tuple[list[int], np.ndarray]:
    """Prefill ``prompt`` in one call, then decode one token per call."""
    (logits,) = step(np.array([prompt], np.int64), np.arange(len(prompt), dtype=np.int64))
    first = np.asarray(logits).copy()
    tokens = [int(np.asarray(logits)[0, -1].argmax())]
    for i in range(new_tokens - 1):
        position = len(prompt) + i
        (logits,) = step(np.array([[tokens[-1]]], np.int64), np.array([position], np.int64))
        tokens.append(int(np.asarray(logits)[0, -1].argmax()))
    return tokens, first


def check(name: str, build) -> dict:
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    from opforge.export import export
    from opforge.runtime import load

    torch.manual_seed(0)
    model = build().eval()
    _randomize(model, 1234)
    model.generation_config.cache_implementation = "static"
    model.generation_config.use_cache = True
    row: dict = {"model": name, "architecture": type(model).__name__}
    with torch.no_grad():
        want = model.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS,
                              do_sample=False, cache_implementation="static",
                              min_new_tokens=NEW_TOKENS)[0, len(PROMPT):].tolist()
        eager_logits = model(torch.tensor([PROMPT])).logits.numpy()
    row["eager"] = want
    wrapper = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=CACHE)
    seq = torch.export.Dim("seq", min=1, max=CACHE - 1)
    start = time.perf_counter()
    exported = wrapper.export(input_ids=torch.tensor([PROMPT]),
                              cache_position=torch.arange(len(PROMPT)),
                              dynamic_shapes={"input_ids": {1: seq}, "cache_position": {0: seq}})
    row["torch_export_s"] = round(time.perf_counter() - start, 2)
    for runtime, mode, backends in (("lean", "lean", None), ("aten", "aten", None),
                                    ("cpu", "lean", ["cpu"])):
        start = time.perf_counter()
        try:
            program = export(exported, backends=backends)
            if backends:
                row["cpu_impls"] = _implementations(program)
            loaded = load(program, mode=mode)
            tokens, logits = _greedy(loaded.method("forward"), PROMPT, NEW_TOKENS)
        except Exception as e:  # recorded as the row's verdict, with the error's first line
            row[runtime] = {"verdict": "error", "error": f"{type(e).__name__}: {e}"[:400]}
            continue
        error = float(np.abs(logits - eager_logits).max() / np.abs(eager_logits).max())
        delegated = sum(1 for m in program.methods for i in m.instructions
                        if type(i).__name__ == "DelegateCall")
        row[runtime] = {
            "verdict": "same tokens" if tokens == want else "different tokens",
            "tokens": tokens, "prefill_logits_rel_error": error,
            "state": list(loaded.state_names), "delegate_calls": delegated,
            "seconds": round(time.perf_counter() - start, 2),
        }
    return row


def _table(rows: list[dict]) -> str:
    lines = ["| model | lean | aten | cpu backend | prefill logits, max rel. error (lean) | "
             "state tensors | cpu engine ops' implementations | unexplained `ref:` |",
             "| --- | --- | --- | --- | ---: | ---: | --- | --- |"]
    for row in rows:
        cells = []
        for runtime in ("lean", "aten", "cpu"):
            r = row.get(runtime, {})
            cell = r.get("verdict", "-")
            if runtime == "cpu" and r.get("verdict") != "error":
                cell += f" ({r.get('delegate_calls', 0)} delegate calls)"
            cells.append(cell)
        lean = row.get("lean", {})
        error = lean.get("prefill_logits_rel_error")
        impls = row.get("cpu_impls", {})
        impl_cells = (", ".join(f"{k} {v}" for k, v in impls.get("impls", {}).items()) or "-",
                      "; ".join(impls.get("reference", [])) or ("none" if impls else "-"))
        lines.append((f"| {row['model']} ({row['architecture']}) | " + " | ".join(cells) +
                      f" | {error:.1e} | {len(lean.get('state', []))} |" if error is not None
                      else f"| {row['model']} | " + " | ".join(cells) + " | - | - |") +
                     f" {impl_cells[0]} | {impl_cells[1]} |")
    return "\n".join(lines)


def main() -> int:
    configs = _configs()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(configs),
                        help=f"comma-separated, from {', '.join(configs)}")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for name in args.models.split(","):
        row = check(name, configs[name])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "eager"}), flush=True)
    import transformers

    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "transformers_decoders.json").write_text(json.dumps(rows, indent=1) + "\n")
    wrong = [r["model"] for r in rows for k in ("lean", "aten", "cpu")
             if r.get(k, {}).get("verdict") != "same tokens"]
    unexplained = [r["model"] for r in rows if r.get("cpu_impls", {}).get("reference")]
    machine = describe_machine(HERE.parent)
    text = (
        "# transformers decoders through transformers' ExecuTorch recipe\n\n"
        f"Written by `bench/transformers_decoders.py` on {datetime.date.today()} "
        f"at commit {machine['opforge_commit']} ({machine['cpu']}, {machine['cores']} cores); "
        f"torch {torch.__version__}, transformers {transformers.__version__}.\n\n"
        f"Random weights (seeded, norms away from 1), `TorchExportableModuleForDecoderOnlyLM` "
        f"with a static cache of {CACHE}, exported with a dynamic sequence (1..{CACHE - 1}); "
        f"prompt of {len(PROMPT)} tokens prefilled in one call, then {NEW_TOKENS} greedy "
        "tokens one call each, against transformers' own static-cache `generate` on the "
        "eager model.\n\n" + _table(rows) + "\n\n"
        "With `backends=[\"cpu\"]` the dynamic methods are delegated (delegate calls per "
        "program in the cpu column); in the mixture-of-experts models (mixtral, qwen2_moe, "
        "qwen3_moe) the router's top-k, the grouping (sort, histc, cumsum) and "
        "`transformers::grouped_mm_fallback` run on the portable kernels between the "
        "delegates (docs/generation.md, \"Mixture-of-experts decoders\"). transformers' "
        "`experts_implementation=\"eager\"` loops over a data-dependent tensor of hit "
        "experts, which `torch.export` refuses before opforge sees the graph; the default "
        "(`grouped_mm`) and `batched_mm` export.\n\n"
        + ("Every run gave eager's tokens.\n" if not wrong else
           f"Runs that did not: {', '.join(sorted(set(wrong)))}.\n")
        + "\nImplementations: each cpu-backend program's engine ops by oneDNN implementation "
        "name (`own`: the engine's own kernels), from each delegate's engine as built "
        "(bench/external_check.py's record); an op on a oneDNN reference kernel (`ref:...` "
        "or ISA `any`) whose name does not say why fails the bench. "
        + ("No unexplained `ref:` implementation.\n" if not unexplained else
           f"Unexplained `ref:` in: {', '.join(unexplained)}.\n"))
    (RESULTS / "transformers_decoders.md").write_text(text)
    print(text)
    return 1 if wrong or unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
