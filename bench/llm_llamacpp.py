"""llama.cpp as a peer of bench/llm.py: its GGUF files, llama-bench and a greedy tokens check.

The binaries come from ``bench/setup_llamacpp.sh`` (the llama-cpp-python sdist's bundled
llama.cpp, built for this machine under ``bench/work/llamacpp/build``). Per config:

- ``prepare(config, precision, workdir)``: the F32 GGUF from ``TinyDecoder(seed=0)``
  (bench/llm_gguf.py), Q8_0 / Q4_0 from it with ``llama-quantize --pure`` (every matrix at
  the type, the embedding and output projection included: llama-quantize otherwise keeps
  ``output.weight`` at Q6_K for Q4_0); then greedy tokens through libllama (the sdist's own
  ctypes bindings over our build) from the benchmark's prompt ids, and for F32 the
  prompt's last logits against eager PyTorch;
- ``measure(...)``: ``llama-bench`` at one thread count, ``-p 128 -n 0`` (prompt
  processing, the prompt's 128 tokens in one batch) and ``-p 0 -n 128 -d 128`` (128
  one-token decode steps at positions 128..255, the positions opforge's decode runs at;
  the depth is filled before the clock starts), ``-r`` repetitions each after llama-bench's
  warm-up; the peak RSS is the largest VmHWM of the two llama-bench processes.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import pathlib
import resource
import subprocess
import sys
import time
import types

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
WORK = HERE / "work" / "llamacpp"
BIN = WORK / "build" / "bin"
PRECISIONS = {"f32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0"}

__all__ = ["PRECISIONS", "gguf_path", "reference_path", "prepare", "measure", "greedy"]


def _require(path: pathlib.Path) -> pathlib.Path:
    if not path.exists():
        raise FileNotFoundError(f"llama.cpp peer: {path} — not found — built by "
                                "bench/setup_llamacpp.sh — run `bash bench/setup_llamacpp.sh`")
    return path


def gguf_path(workdir: pathlib.Path, config: str, precision: str) -> pathlib.Path:
    return pathlib.Path(workdir) / f"{config}-llamacpp-{precision}.gguf"


def reference_path(workdir: pathlib.Path, config: str) -> pathlib.Path:
    return pathlib.Path(workdir) / f"{config}-eager-tokens.json"


def prepare(config: str, precision: str, workdir: pathlib.Path, new_tokens: int,
            threads: int = 2) -> dict:
    """Write (or quantize) the GGUF for ``precision`` and check its greedy tokens against
    eager PyTorch's (computed with the F32 file, kept beside it as JSON)."""
    from llm_gguf import write_gguf
    from llm_models import CONFIGS, build, prompt

    path, ids = gguf_path(workdir, config, precision), prompt(config)
    start = time.perf_counter()
    record: dict = {"precision": PRECISIONS[precision]}
    eager_logits = None
    if precision == "f32":
        from opforge.examples.decoder import greedy_decode

        model = build(config)
        write_gguf(model, CONFIGS[config], path)
        record["export_s"] = time.perf_counter() - start
        eager_logits = _logits_reference(model, ids)
        with _inference():
            reference = greedy_decode(lambda t, p: model(t, p), ids, new_tokens)
        reference_path(workdir, config).write_text(json.dumps(reference))
        del model
    else:
        source = gguf_path(workdir, config, "f32")
        if not source.exists():
            raise FileNotFoundError(f"llama.cpp peer: {source} — not found — the F32 GGUF is "
                                    "quantized — prepare precision f32 first")
        done = subprocess.run([str(_require(BIN / "llama-quantize")), "--pure", str(source),
                               str(path), PRECISIONS[precision]],
                              capture_output=True, text=True, check=True)
        record["export_s"] = time.perf_counter() - start
        record["quantize_types"] = _quantized_types(done.stdout + done.stderr)
        reference = json.loads(reference_path(workdir, config).read_text())
    record["file_bytes"] = path.stat().st_size
    tokens, last_logits = greedy(path, ids, new_tokens, threads)
    record["tokens"], record["reference"] = tokens, reference
    if eager_logits is not None:
        record["prompt_logits_max_abs_diff"] = float(np.abs(last_logits - eager_logits).max())
        record["prompt_logits_max_abs"] = float(np.abs(eager_logits).max())
    record["same_as_eager"] = next((i for i, (a, b) in enumerate(zip(tokens, reference))
                                    if a != b), min(len(tokens), len(reference)))
    path.with_name(path.name + ".json").write_text(json.dumps(record))
    return record


def _inference():
    import torch

    return torch.inference_mode()


def _logits_reference(model, ids: list[int]) -> list[float]:
    import torch

    with torch.inference_mode():
        return model(torch.tensor(ids), torch.arange(len(ids)))[-1].numpy()


def _quantized_types(log: str) -> dict[str, int]:
    """How many tensors llama-quantize wrote at each type (from its per-tensor log lines)."""
    counts: dict[str, int] = {}
    for line in log.splitlines():
        if "converting to" in line:
            kind = line.split("converting to", 1)[1].split()[0].strip(" .")
        elif "size =" in line and "type" in line:
            kind = line.split("type", 1)[1].split(",")[0].strip(" =")
        else:
            continue
        counts[kind] = counts.get(kind, 0) + 1
    return counts


# --- greedy tokens through libllama -----------------------------------------------------

def _bindings():
    """The sdist's ``llama_cpp/llama_cpp.py`` ctypes bindings (they match its llama.h), over
    our libllama.so; loaded without the package's ``__init__`` (which imports its
    high-level API and its dependencies)."""
    if "llama_cpp.llama_cpp" in sys.modules:
        return sys.modules["llama_cpp.llama_cpp"]
    source = next(WORK.glob("llama_cpp_python-*/llama_cpp"), None)
    if source is None:
        _require(WORK / "llama_cpp_python-*/llama_cpp")
    os.environ["LLAMA_CPP_LIB_PATH"] = str(_require(BIN / "libllama.so").parent)
    package = types.ModuleType("llama_cpp")
    package.__path__ = [str(source)]
    sys.modules["llama_cpp"] = package
    for name in ("_ctypes_extensions", "llama_cpp"):
        spec = importlib.util.spec_from_file_location(f"llama_cpp.{name}", source / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return sys.modules["llama_cpp.llama_cpp"]


def greedy(path: pathlib.Path, ids: list[int], new_tokens: int, threads: int,
           cache_type: int = 0, flash_attn: int = 0) -> tuple[list[int], np.ndarray]:
    """Prefill ``ids`` in one batch, then ``new_tokens - 1`` one-token steps feeding back the
    argmax; the KV cache at ``cache_type`` (0: F32, as the decoder's; llama.cpp's default is
    1, F16), flash attention ``flash_attn`` (0 off, 1 on, -1 auto: llama.cpp's default).
    Returns the tokens and the prompt's last logits."""
    ll = _bindings()
    ll.llama_backend_init()
    model_params = ll.llama_model_default_params()
    model = ll.llama_model_load_from_file(str(path).encode(), model_params)
    if not model:
        raise RuntimeError(f"llama.cpp peer: {path} — libllama could not load it")
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    params = ll.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = len(ids) + new_tokens
    params.n_threads = params.n_threads_batch = threads
    params.type_k = params.type_v = cache_type
    # flash attention off: llama.cpp's CPU flash-attention kernel rounds through F16 (the
    # prompt's logits of the base config part from eager by ~3e-4 relative with it, ~1e-6
    # without); llama-bench's speed runs use its own default (recorded in the results)
    params.flash_attn_type = flash_attn
    params.no_perf = True
    context = ll.llama_init_from_model(model, params)
    if not context:
        raise RuntimeError(f"llama.cpp peer: {path} — llama_init_from_model failed")

    def step(tokens: list[int]) -> np.ndarray:
        array = (ll.llama_token * len(tokens))(*tokens)
        status = ll.llama_decode(context, ll.llama_batch_get_one(array, len(tokens)))
        if status:
            raise RuntimeError(f"llama.cpp peer: llama_decode returned {status}")
        pointer = ll.llama_get_logits_ith(context, -1)
        return np.ctypeslib.as_array(ctypes.cast(pointer, ctypes.POINTER(ctypes.c_float)),
                                     shape=(n_vocab,)).copy()

    try:
        logits = step(list(ids))
        tokens = [int(logits.argmax())]
        while len(tokens) < new_tokens:
            tokens.append(int(step(tokens[-1:]).argmax()))
    finally:
        ll.llama_free(context)
        ll.llama_model_free(model)
    return tokens, logits


# --- speed ------------------------------------------------------------------------------

def measure(config: str, precision: str, workdir: pathlib.Path, threads: int,
            repetitions: int, prompt_tokens: int, new_tokens: int) -> dict:
    """llama-bench's prompt and decode tests at ``threads``; per-repetition tokens/s."""
    path = _require(gguf_path(workdir, config, precision))
    bench = str(_require(BIN / "llama-bench"))
    common = ["-m", str(path), "-t", str(threads), "-r", str(repetitions), "-o", "json"]
    results = {}
    for phase, extra in (("prefill", ["-p", str(prompt_tokens), "-n", "0"]),
                         ("decode", ["-p", "0", "-n", str(new_tokens),
                                     "-d", str(prompt_tokens)])):
        done = subprocess.run([bench, *common, *extra], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"llama-bench {' '.join(extra)} — exit {done.returncode} — "
                               f"{done.stderr[-800:]}")
        (row,) = json.loads(done.stdout)
        results[phase] = row
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "samples": [{"prefill_tok_s": p, "decode_tok_s": d} for p, d in
                    zip(results["prefill"]["samples_ts"], results["decode"]["samples_ts"])],
        "peak_rss_mb": children.ru_maxrss / 1024,  # kB on Linux: the larger llama-bench's VmHWM
        "n_ctx": {phase: row["n_prompt"] + row["n_gen"] + row.get("n_depth", 0)
                  for phase, row in results.items()},
        "llama_bench": {k: results["decode"].get(k) for k in (
            "build_commit", "cpu_info", "model_type", "model_size", "type_k", "type_v",
            "flash_attn", "n_batch", "n_ubatch", "use_mmap", "poll")},
    }
