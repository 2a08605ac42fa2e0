"""bench/results/llm.md from the events of bench/llm.py: tokens/s, ratios, memory, exports,
the cpu backend's delegation and the lean runtime's per-op profile."""

from __future__ import annotations

import statistics

__all__ = ["markdown", "markdown_llamacpp", "cells"]

BASELINE = "opforge-lean"


def cells(events: list[dict]) -> dict[tuple[str, str, int], dict]:
    """Per (config, runtime, threads): the pooled generations' medians and spreads."""
    pooled: dict[tuple[str, str, int], list[dict]] = {}
    for event in events:
        if event.get("event") == "measure":
            pooled.setdefault((event["config"], event["runtime"], event["threads"]),
                              []).append(event)
    eager = {(c, t): e[0]["tokens"] for (c, r, t), e in pooled.items() if r == "eager"}
    for event in events:  # eager's tokens computed beside an export (llama.cpp's F32 GGUF)
        if event.get("event") == "reference":
            eager.setdefault((event["config"], 0), event["tokens"])
    out = {}
    for key, runs in pooled.items():
        samples = [s for run in runs for s in run["samples"]]
        prefill = sorted(s["prefill_tok_s"] for s in samples)
        decode = sorted(s["decode_tok_s"] for s in samples)
        tokens = runs[0]["tokens"]
        reference = eager.get((key[0], key[2])) or next(
            (v for (c, _), v in eager.items() if c == key[0]), None)
        same = None
        if reference is not None:
            same = next((i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b),
                        min(len(tokens), len(reference)))
        out[key] = {"prefill": statistics.median(prefill), "prefill_range": (prefill[0], prefill[-1]),
                    "decode": statistics.median(decode), "decode_range": (decode[0], decode[-1]),
                    "n": len(samples), "processes": len(runs),
                    "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                    "cache_bytes": runs[0]["cache_bytes"], "tokens": len(tokens),
                    "token_ids": tokens,
                    "same_as_eager": same, "load_s": statistics.median(r["load_s"] for r in runs),
                    "torch_imported": any(r["torch_imported"] for r in runs),
                    "load": statistics.median(r.get("load_average", float("nan")) for r in runs)}
    return out


def markdown(setup: dict, events: list[dict]) -> str:
    table = cells(events)
    m = setup["machine"]
    lines = [
        "# Language-model generation: prefill and decode tokens/s",
        "",
        f"Measured on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, **shared with "
        f"other engineers' jobs** (load average {setup['load_start']:.2f} at the start, "
        f"{setup['load_end']:.2f} at the end); opforge {setup['opforge_source']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v != "not installed")
        + f". `{setup['command']}`, {setup['wall_s'] / 60:.1f} min.",
        "",
        f"Prompt {setup['prompt_tokens']} tokens, {setup['new_tokens']} new tokens (greedy), "
        f"{setup['rounds']} round(s) × {setup['repeats']} generation(s) per process after a "
        "warm-up, one process per cell and round, in one shuffled order reversed every "
        "other round. " + _last_row(setup).replace("opforge program and eager", "runtime")
        + "**prefill** = prompt "
        "tokens / seconds of the prompt's call (and the first token's argmax); **decode** = "
        f"the {setup['new_tokens'] - 1} tokens after the first / seconds of their one-token "
        "calls. Medians of all generations, [min–max] beside; ratios against opforge lean in "
        "the same config and thread count (above 1: faster than lean). Peak RSS: the "
        "worker's VmHWM (the whole process: interpreter, libraries, weights, caches). KV "
        "cache: the bytes a runtime holds for it (ONNX Runtime: two sets, read and written). "
        "tokens = eager: how many of the greedy tokens equal eager PyTorch's, from the first "
        "(float rounding may flip a near tie and the sequences part from there). load avg: "
        "the machine's 1-minute load average when the cell's workers ended (2 cores).",
        "",
    ]
    for config, spec in setup["configs"].items():
        lines += [f"## {config}: " + ", ".join(f"{k} {v}" for k, v in spec.items()), "",
                  "| runtime | threads | prefill tok/s | × lean | decode tok/s | × lean | "
                  "peak RSS MB | KV cache MB | tokens = eager | load s | load avg |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for (c, runtime, threads), cell in sorted(table.items(), key=_order):
            if c != config:
                continue
            base = table.get((c, BASELINE, threads))
            ratio = lambda k: f"{cell[k] / base[k]:.2f}" if base else "–"  # noqa: E731
            same = "–" if cell["same_as_eager"] is None else \
                f"{cell['same_as_eager']}/{cell['tokens']}"
            lines.append(
                f"| {runtime} | {threads} | {cell['prefill']:.1f} [{_range(cell['prefill_range'])}]"
                f" | {ratio('prefill')} | {cell['decode']:.1f} [{_range(cell['decode_range'])}]"
                f" | {ratio('decode')} | {cell['peak_rss_mb']:.0f} | "
                f"{cell['cache_bytes'] / 2**20:.2f} | {same} | {cell['load_s']:.2f} | "
                f"{cell['load']:.1f} |")
        lines.append("")
    lines += _exports(events) + _profiles(events) + _errors(events)
    return "\n".join(lines) + "\n"


def _order(item):
    (config, runtime, threads), _ = item
    order = ["opforge-lean", "opforge-cpu", "eager", "ort"]
    return config, threads, order.index(runtime) if runtime in order else 9


def _range(pair) -> str:
    return f"{pair[0]:.0f}–{pair[1]:.0f}" if pair[1] >= 100 else f"{pair[0]:.1f}–{pair[1]:.1f}"


def _exports(events: list[dict]) -> list[str]:
    rows = [e for e in events if e.get("event") == "prepared"]
    if not rows:
        return []
    lines = ["## Exports", "", "| config | runtime | export s | file MB | export peak RSS MB "
             "| cpu backend |", "| --- | --- | ---: | ---: | ---: | --- |"]
    for e in rows:
        delegated = ""
        for method, d in (e.get("delegation") or {}).items():
            reasons = "; ".join(f"{n}× {r}" for r, n in d["reasons"].items())
            delegated += (f"{method}: {d['delegates']} delegate(s), {d['delegated_nodes']} "
                          f"node(s) delegated, {d['rejected']} left on the kernels ({reasons})")
        if e.get("kinds"):  # the int-weight programs: the engine's op kinds
            delegated = "engine ops: " + ", ".join(f"{n}× {k}" for k, n in sorted(
                e["kinds"].items(), key=lambda kv: -kv[1])[:6])
        if e["runtime"] == "opforge-cpu" and not e.get("delegation"):
            delegated = "no delegation report: nothing was delegated"
        peak = e.get("export_peak_rss_mb")
        lines.append(f"| {e['config']} | {e['runtime']} | {e['export_s']:.1f} | "
                     f"{e['file_bytes'] / 2**20:.1f} | {'–' if peak is None else f'{peak:.0f}'} "
                     f"| {delegated} |")
    return lines + [""]


def _profiles(events: list[dict]) -> list[str]:
    rows = [e for e in events if e.get("event") == "profile"]
    lines = []
    for e in rows:
        lines += [f"## Where the lean runtime's time goes: {e['config']}, {e['phase']} "
                  f"(1 thread, every instruction timed; {e['total_ms_per_call']:.2f} ms per "
                  f"call over {e['calls']} call(s))", "",
                  "| op | calls per call | ms per call | share |", "| --- | ---: | ---: | ---: |"]
        for op in e["ops"]:
            lines.append(f"| {op['op']} | {op['calls_per_step']:.0f} | {op['ms_per_step']:.3f} "
                         f"| {100 * op['share']:.1f}% |")
        lines.append("")
    return lines


def _errors(events: list[dict]) -> list[str]:
    errors = [e for e in events if e.get("event") == "error"]
    if not errors:
        return []
    lines = ["## Failures", ""]
    for e in errors:
        spec = e.get("spec", {})
        lines.append(f"- {spec.get('mode')} {spec.get('config')} {spec.get('runtime')} "
                     f"threads {spec.get('threads')}: {e['error'][:500]}")
    return lines + [""]


# --- opforge beside llama.cpp (bench/llm.py --llamacpp) ---------------------------------

# runtime -> (precision, the llama.cpp runtime it is compared with), in the table's order:
# each llama.cpp row after the opforge rows of its precision; opforge-generate* runs the
# opforge-cpu* program in the native runtime's C++ tool
_PRECISIONS = {"": ("float32", "llamacpp-f32"),
               "-8da8w": ("8da8w (int8 act. + weights, g32)", "llamacpp-q8_0"),
               "-int8": ("int8 weight-only", "llamacpp-q8_0"),
               "-8da4w": ("8da4w (int8 act., int4 weights, g32)", "llamacpp-q4_0"),
               "-int4": ("int4 weight-only (g128)", "llamacpp-q4_0")}
PEERS: dict[str, tuple[str, str | None]] = {}
for _peer, _label in (("llamacpp-f32", "F32"), ("llamacpp-q8_0", "Q8_0"), ("llamacpp-q4_0", "Q4_0")):
    for _suffix, (_precision, _of) in _PRECISIONS.items():
        if _of == _peer:
            PEERS["opforge-cpu" + _suffix] = (_precision, _peer)
            PEERS["opforge-generate" + _suffix] = (_precision, _peer)
    PEERS[_peer] = (_label, None)


def markdown_llamacpp(setup: dict, events: list[dict]) -> str:
    """One table per config: opforge's cpu-backend programs and llama.cpp at the same
    weight precision, side by side, with the machine they ran on."""
    table = cells(events)
    m = setup["machine"]
    lines = [
        "# Language-model generation: opforge beside llama.cpp", "",
        f"Machine: **{m['cpu']}** (CPU family {m.get('cpu_family') or '?'}), {m['cores']} cores, "
        f"{m['memory_gib']} GiB; ISA flags: {', '.join(m.get('flags', [])) or 'not recorded'}. "
        f"**Shared with other engineers' jobs**: load average {setup['load_start']:.2f} at the "
        f"start, {setup['load_end']:.2f} at the end (per cell below). opforge "
        f"{setup['opforge_source']}; " + ", ".join(
            f"{k} {v}" for k, v in m["versions"].items() if v != "not installed")
        + f". `{setup['command']}`, {setup['wall_s'] / 60:.1f} min.", "",
        f"Prompt {setup['prompt_tokens']} tokens, {setup['new_tokens']} new tokens. opforge: "
        "the cpu backend's programs (a dynamic prefill and a one-token decode method) with "
        "float32 weights; weight-only int8 (16a8w's, per output channel) and int4 "
        "(16a4w_block's, blocks of 128 along K: its default) with float activations; and the dynamic schemes "
        "8da8w / 8da4w (`opforge quantize --scheme`: activations quantized to int8 per "
        "block of 32 at run time, int8 / int4 weights in the same blocks, integer dot "
        "products: llama.cpp's Q8_0 / Q4_0 arithmetic), all from bench/int_weights.py. "
        + _last_row(setup) +
        "`opforge-cpu*` rows run the program in a Python worker (opforge.runtime's "
        "Generator); `opforge-generate*` rows run the same file in the native runtime's C++ "
        "tool (`opforge-generate --warmup 1 --repeat N --json`, no Python: its rates per "
        "generation and its own VmHWM). Each "
        f"measurement a process: {setup['repeats']} generations after a warm-up, prefill = "
        "prompt tokens / seconds of the prompt's call, decode = the tokens after the first / "
        "seconds of their one-token calls (positions 128..255). llama.cpp: `llama-bench` "
        "`-p 128 -n 0` (prompt processing) and `-p 0 -n 128 -d 128` (decode at positions "
        f"128..255), `-r {setup['repeats']}`, its own warm-up, the model file mmap-ed, its "
        "default KV cache (F16) and batch; the same random weights "
        "(`TinyDecoder(seed=0)`) written as GGUF by bench/llm_gguf.py, quantized with "
        "`llama-quantize --pure`. Threads pinned (`-t`, OMP_NUM_THREADS). Medians over "
        f"{setup['rounds']} round(s) (the cells one after another in one shuffled order, "
        "reversed every other round) [min–max]; "
        "× llama.cpp: against llama.cpp at the same weight precision and threads (above 1: "
        "opforge faster / larger). Peak RSS: VmHWM of the measuring process (opforge-cpu: "
        "the Python worker, interpreter and NumPy included; opforge-generate: the C++ "
        "tool's process; llama.cpp: the llama-bench process; mmap-ed weights included). tokens = eager: how many of the greedy tokens equal "
        "eager PyTorch's float32 ones, from the first (llama.cpp's through libllama with an "
        "F32 KV cache, bench/llm_llamacpp.py); quantized weights part from float32 "
        "where a near tie flips.", ""]
    lines += _modes(setup) + ([""] if _modes(setup) else [])
    for config, spec in setup["configs"].items():
        lines += [f"## {config}: " + ", ".join(f"{k} {v}" for k, v in spec.items()), "",
                  f"Machine: {m['cpu']}, {', '.join(m.get('flags', []))}.", "",
                  "| runtime | precision | threads | prefill tok/s | × llama.cpp | "
                  "decode tok/s | × llama.cpp | peak RSS MB | × llama.cpp | tokens = eager "
                  "| load avg |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        order = list(PEERS)
        rows = sorted(((k, v) for k, v in table.items() if k[0] == config and k[1] in PEERS),
                      key=lambda kv: (kv[0][2], order.index(kv[0][1])))
        for (c, runtime, threads), cell in rows:
            precision, peer = PEERS[runtime]
            base = table.get((c, peer, threads)) if peer else None
            ratio = lambda k: f"{cell[k] / base[k]:.2f}" if base else "–"  # noqa: E731
            same = "–" if cell["same_as_eager"] is None else \
                f"{cell['same_as_eager']}/{cell['tokens']}"
            lines.append(
                f"| {runtime} | {precision} | {threads} | {cell['prefill']:.1f} "
                f"[{_range(cell['prefill_range'])}] | {ratio('prefill')} | {cell['decode']:.1f} "
                f"[{_range(cell['decode_range'])}] | {ratio('decode')} | "
                f"{cell['peak_rss_mb']:.0f} | {ratio('peak_rss_mb')} | {same} | "
                f"{cell['load']:.1f} |")
        lines += [""] + _llamacpp_files(events, config)
    lines += _exports(events) + _errors(events)
    return "\n".join(lines) + "\n"


def _last_row(setup: dict) -> str:
    keep = setup.get("logits_to_keep", 0)
    if keep != 1:
        return (f"Every opforge program and eager computes the logits of "
                f"{'every prompt row' if keep == 0 else f'the last {keep} prompt rows'} "
                "(llama-bench's prompt processing: the last one only). ")
    return ("Every opforge program and eager computes the logits of the last prompt row "
            "only (`TinyDecoder(logits_to_keep=1)`, what generation reads), as llama-bench's "
            "prompt processing does (its batch marks only the last token as an output); "
            "llama.cpp also skips the last layer's MLP for the other rows, which opforge's "
            "programs still compute (1/layers of the prompt's MLP work). ")


def _modes(setup: dict) -> list[str]:
    return [f"Config {c} ran {mode}." for c, mode in
            (setup.get("large_config_modes") or {}).items()]


def _llamacpp_files(events: list[dict], config: str) -> list[str]:
    rows = [e for e in events if e.get("event") == "prepared" and e["config"] == config
            and e["runtime"].startswith("llamacpp-")]
    if not rows:
        return []
    lines = ["| llama.cpp file | MB | tensor types (llama-quantize --pure) | tokens = eager "
             "(F32 KV cache) | prompt logits max abs diff vs eager |",
             "| --- | ---: | --- | ---: | --- |"]
    for e in rows:
        types = ", ".join(f"{n}× {t}" for t, n in (e.get("quantize_types") or {}).items()) \
            or "all F32 (written by bench/llm_gguf.py)"
        diff = (f"{e['prompt_logits_max_abs_diff']:.2e} (logits up to "
                f"{e['prompt_logits_max_abs']:.1f})") if "prompt_logits_max_abs_diff" in e else "–"
        lines.append(f"| {e['precision']} | {e['file_bytes'] / 2**20:.0f} | {types} | "
                     f"{e['same_as_eager']}/{len(e['tokens'])} | {diff} |")
    bench = next((e for e in events if e.get("event") == "measure" and e["config"] == config
                  and e.get("llama_bench")), None)
    if bench:
        info = bench["llama_bench"]
        lines += ["", "llama-bench: " + ", ".join(f"{k} {v}" for k, v in info.items())
                  + f"; context {bench['n_ctx']}."]
    return lines + [""]
