"""One language-model measurement in its own process: a JSON spec on stdin, JSON lines out.

    echo '{"mode": "measure", "config": "tiny", "runtime": "opforge-lean", ...}' \\
        | python bench/llm_worker.py

Modes:

- ``prepare``: export one config for one runtime (opforge-lean, opforge-cpu: the program
  file, and which nodes the cpu backend took; ort: the ONNX file with the cache as inputs
  and outputs); timed;
- ``measure``: load, warm up (one short generation: both call shapes bound), then
  ``repeats`` generations of the prompt (128 tokens) + ``new_tokens`` greedy tokens, each
  from an empty cache; per generation the prefill seconds (the prompt's call and the first
  token) and the decode seconds (the other tokens, one call each); resident memory; the
  tokens, to compare with eager's;
- ``profile``: opforge lean only: where a decode step's time goes, per op (Tracer).

``opforge-cpu-int8`` / ``opforge-cpu-int4`` are the cpu backend's programs with 16a8w's /
16a4w_block's weights and float activations (weight-only), ``opforge-cpu-8da8w`` /
``opforge-cpu-8da4w`` the dynamic schemes (activations quantized to int8 per block of 32 at
run time, int8 / int4 weights in the same blocks: llama.cpp's Q8_0 / Q4_0 arithmetic);
bench/int_weights.py exports them all. ``opforge-generate[-<precision>]`` measures the same
program as ``opforge-cpu[-<precision>]`` in the native runtime's C++ tool instead of
Python (``_measure_native``). ``llamacpp-f32`` / ``-q8_0`` / ``-q4_0`` are llama.cpp's GGUF
files and llama-bench (bench/llm_llamacpp.py).

A lean worker never imports torch: its resident memory is the lean runtime's own.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from llm_models import CONFIGS, build, cache_functional, empty_caches, prompt  # noqa: E402
from harness import THREAD_VARIABLES  # noqa: E402
from worker import _status_mb, peak_rss_mb  # noqa: E402


def emit(**fields) -> None:
    print(json.dumps(fields), flush=True)


NATIVE = "opforge-generate"  # the native runtime's tool, on opforge-cpu's programs


def program_runtime(runtime: str) -> str:
    """The runtime whose prepared file ``runtime`` measures: ``opforge-generate-int4`` runs
    ``opforge-cpu-int4``'s program."""
    return "opforge-cpu" + runtime[len(NATIVE):] if runtime.startswith(NATIVE) else runtime


def artifact(spec: dict) -> pathlib.Path:
    runtime = program_runtime(spec["runtime"])
    if runtime.startswith("llamacpp-"):
        from llm_llamacpp import gguf_path

        return gguf_path(spec["workdir"], spec["config"], runtime.split("-", 1)[1])
    suffix = ".onnx" if runtime == "ort" else ".opf"
    return pathlib.Path(spec["workdir"]) / f"{spec['config']}-{runtime}{suffix}"


# --- prepare ----------------------------------------------------------------------------

INT_WEIGHTS = {"opforge-cpu-int8": "int8 weights", "opforge-cpu-int4": "int4 weights",
               "opforge-cpu-8da8w": "8da8w", "opforge-cpu-8da4w": "8da4w"}


def prepare(spec: dict) -> None:
    runtime, path = spec["runtime"], artifact(spec)
    keep = spec.get("logits_to_keep", 0)  # recorded with the file: --reuse compares it
    if runtime.startswith("llamacpp-"):
        from llm_llamacpp import prepare as prepare_gguf

        record = prepare_gguf(spec["config"], runtime.split("-", 1)[1], path.parent,
                              spec["new_tokens"], spec["threads"])
        emit(event="prepared", config=spec["config"], runtime=runtime, ok=True,
             export_peak_rss_mb=peak_rss_mb(),
             **{k: v for k, v in record.items() if k != "reference"})
        emit(event="reference", config=spec["config"], tokens=record["reference"])
        return
    if runtime in INT_WEIGHTS:
        from int_weights import prepare as prepare_int

        # exported into a folder of its own, then moved where measure() loads it from
        start = time.perf_counter()
        scratch = path.parent / f"{path.stem}-export"
        record = prepare_int(spec["config"], INT_WEIGHTS[runtime], scratch, keep)
        exported = next(scratch.glob("*/*.opf"))
        exported.replace(path)
        for leftover in sorted(scratch.rglob("*"), reverse=True):
            leftover.rmdir() if leftover.is_dir() else leftover.unlink()
        scratch.rmdir()
        emit(event="prepared", config=spec["config"], runtime=runtime, ok=True, build_s=0.0,
             export_s=time.perf_counter() - start, file_bytes=_bytes(path),
             kinds=record.get("kinds"), export_peak_rss_mb=peak_rss_mb(), logits_to_keep=keep)
        return
    import torch

    start = time.perf_counter()
    model = build(spec["config"], keep)
    built = time.perf_counter() - start
    start = time.perf_counter()
    extra = {}
    if runtime in ("opforge-lean", "opforge-cpu"):
        from opforge.examples.decoder import export_decoder
        from opforge.export import delegation_report, export
        from opforge.program import save

        if runtime == "opforge-lean":
            program = export_decoder(model, kernels="portable")
        else:
            # a dynamic prefill (delegated with symbolic sizes: one engine per prompt
            # length, built at its first call) and a static one-token decode method
            seq = torch.export.Dim("seq", min=1, max=model.max_len)
            example = (torch.tensor(prompt(spec["config"])[:3]), torch.arange(3))
            program = export(None, methods={
                "prefill": (model, example, ({0: seq}, {0: seq})),
                "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
                kernels="portable", backends=["cpu"])
            extra["delegation"] = _delegation_summary(delegation_report(program))
        save(program, path)
    elif runtime == "ort":
        import warnings

        seq = torch.export.Dim("seq", min=1, max=CONFIGS[spec["config"]]["max_len"])
        caches = [torch.from_numpy(c) for c in empty_caches(spec["config"])]
        names = ["tokens", "positions"] + [f"cache_{i}" for i in range(len(caches))]
        outputs = ["logits"] + [f"new_cache_{i}" for i in range(len(caches))]
        example = (torch.tensor(prompt(spec["config"])[:3]), torch.arange(3), caches)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = torch.onnx.export(
                cache_functional(model), example, input_names=names, output_names=outputs,
                dynamic_shapes=({0: seq}, {0: seq}, [None] * len(caches)), dynamo=True,
                verbose=False)
            exported.save(str(path))
    emit(event="prepared", config=spec["config"], runtime=runtime, ok=True, build_s=built,
         export_s=time.perf_counter() - start, file_bytes=_bytes(path),
         export_peak_rss_mb=peak_rss_mb(), logits_to_keep=keep, **extra)


def _bytes(path: pathlib.Path) -> int:
    if not path.exists():
        return 0
    data = path.with_name(path.name + ".data")  # ONNX external data, when written
    return path.stat().st_size + (data.stat().st_size if data.exists() else 0)


def _delegation_summary(report: dict) -> dict:
    out = {}
    for method, data in report.items():
        reasons: dict[str, int] = {}
        for rejection in data.get("rejected", []):
            reason = rejection.get("reason") or rejection.get("detail") or str(rejection)
            reasons[reason] = reasons.get(reason, 0) + 1
        out[method] = {"delegates": len(data.get("delegates", [])),
                       "delegated_nodes": sum(d.get("nodes", 0) if isinstance(d.get("nodes"), int)
                                              else len(d.get("nodes", []))
                                              for d in data.get("delegates", [])),
                       "rejected": len(data.get("rejected", [])),
                       "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])[:5])}
    return out


# --- measure ----------------------------------------------------------------------------

def measure(spec: dict) -> None:
    runtime, config, threads = spec["runtime"], spec["config"], spec["threads"]
    if runtime.startswith("llamacpp-"):
        return _measure_llamacpp(spec)
    if runtime.startswith(NATIVE):
        return _measure_native(spec)
    ids = prompt(config)
    new_tokens = spec["new_tokens"]
    start = time.perf_counter()
    run, cache_bytes = _runner(runtime, spec, threads)
    load_s = time.perf_counter() - start
    run(ids[:8], 4)  # warm-up: both call shapes bound, pools started
    samples, tokens = [], None
    for _ in range(spec["repeats"]):
        out, prefill_s, decode_s = run(ids, new_tokens)
        tokens = tokens or out
        samples.append({"prefill_s": prefill_s, "decode_s": decode_s,
                        "prefill_tok_s": len(ids) / prefill_s,
                        "decode_tok_s": (len(out) - 1) / decode_s})
    emit(event="measure", config=config, runtime=runtime, threads=threads,
         round=spec.get("round", 0), ok=True, load_s=load_s, samples=samples, tokens=tokens,
         peak_rss_mb=peak_rss_mb(), rss_mb=_status_mb("VmRSS"), cache_bytes=cache_bytes,
         torch_imported="torch" in sys.modules, load_average=os.getloadavg()[0])


def _measure_llamacpp(spec: dict) -> None:
    """llama-bench in child processes: this worker's own memory is not measured."""
    from llm_llamacpp import measure as bench
    from llm_models import PROMPT_TOKENS

    path = artifact(spec)
    start = time.perf_counter()
    record = bench(spec["config"], spec["runtime"].split("-", 1)[1], path.parent,
                   spec["threads"], spec["repeats"], PROMPT_TOKENS, spec["new_tokens"])
    prepared = json.loads(path.with_name(path.name + ".json").read_text())
    emit(event="measure", config=spec["config"], runtime=spec["runtime"],
         threads=spec["threads"], round=spec.get("round", 0), ok=True,
         load_s=time.perf_counter() - start, samples=record["samples"],
         tokens=prepared["tokens"], peak_rss_mb=record["peak_rss_mb"], rss_mb=None,
         cache_bytes=0, torch_imported=False, load_average=os.getloadavg()[0],
         n_ctx=record["n_ctx"], llama_bench=record["llama_bench"])


def native_command(spec: dict, repeats: int) -> tuple[list[str], dict]:
    """The ``opforge-generate`` command line (one warm-up generation, then ``repeats``
    counted ones) and environment (the cpu engine and oneDNN) for ``spec``'s program.
    ``OPFORGE_GENERATE_TOOL`` names another build of the tool (recorded with each
    measurement)."""
    from opforge.backends.cpu import engine
    from opforge.native_runtime.build import build_runtime

    tool = os.environ.get("OPFORGE_GENERATE_TOOL") or build_runtime().tool("opforge-generate")
    env = dict(os.environ, OPFORGE_CPU_ENGINE=engine.library()._name,
               LD_LIBRARY_PATH=str(engine.onednn_prefix() / "lib"))
    env.update({name: str(spec["threads"]) for name in THREAD_VARIABLES})
    command = [str(tool), str(artifact(spec)), "--tokens",
               ",".join(map(str, prompt(spec["config"]))), "--max-new-tokens",
               str(spec["new_tokens"]), "--threads", str(spec["threads"]), "--warmup", "1",
               "--repeat", str(repeats), "--json"]
    return command, env


def _measure_native(spec: dict) -> None:
    """``opforge-generate`` (the native runtime's C++ tool, no Python) on the cpu-backend
    program, in a child process; the peak RSS is the tool's own VmHWM (its JSON), not this
    worker's."""
    import subprocess

    threads, ids = spec["threads"], prompt(spec["config"])
    command, env = native_command(spec, spec["repeats"])
    tool = command[0]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"opforge-generate — exit {done.returncode} — {done.stderr[-800:]}")
    result = json.loads(done.stdout.splitlines()[-1])
    steps = result["decode_steps"]
    samples = [{"prefill_s": p, "decode_s": d, "prefill_tok_s": len(ids) / p,
                "decode_tok_s": steps / d}
               for p, d in zip(result["prefill_seconds_each"], result["decode_seconds_each"])]
    memory = result["memory_end"]
    emit(event="measure", config=spec["config"], runtime=spec["runtime"], threads=threads,
         round=spec.get("round", 0), ok=True, load_s=wall - result["generation_seconds"],
         samples=samples, tokens=result["tokens"], peak_rss_mb=memory["vm_hwm_kb"] / 1024,
         rss_mb=memory["vm_rss_kb"] / 1024, memory_loaded=result["memory_loaded"],
         memory_end=memory, cache_bytes=None, torch_imported=False,
         load_average=os.getloadavg()[0], tool=str(tool))


def _runner(runtime: str, spec: dict, threads: int):
    """``(run(prompt, n) -> (tokens, prefill_s, decode_s), KV-cache bytes held)``."""
    if runtime.startswith("opforge"):
        from opforge.runtime import load
        from opforge.runtime.generate import Generator

        generator = Generator(load(artifact(spec), num_threads=threads))

        def run(ids, n):
            result = generator.generate(ids, n)
            return list(result.tokens), result.prefill_seconds, result.decode_seconds
        return run, generator.signature.cache_bytes
    if runtime == "eager":
        return _eager(spec, threads)
    if runtime == "ort":
        return _ort(spec, threads)
    raise ValueError(runtime)


def _eager(spec: dict, threads: int):
    import torch

    torch.set_num_threads(threads)
    model = build(spec["config"], spec.get("logits_to_keep", 0))
    caches = [b for name, b in model.named_buffers() if name.endswith("_cache")]

    @torch.inference_mode()
    def run(ids, n):
        for cache in caches:
            cache.zero_()
        start = time.perf_counter()
        logits = model(torch.tensor(ids), torch.arange(len(ids)))
        tokens = [int(logits[-1].argmax())]
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for position in range(len(ids), len(ids) + n - 1):
            logits = model(torch.tensor(tokens[-1:]), torch.tensor([position]))
            tokens.append(int(logits[-1].argmax()))
        return tokens, prefill_s, time.perf_counter() - start
    return run, sum(c.numel() * c.element_size() for c in caches)


def _ort(spec: dict, threads: int):
    """ONNX Runtime with I/O binding: the caches live in two sets of OrtValues, one read
    and one written per call, swapped after it (no copies through NumPy between calls)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(str(artifact(spec)), options,
                                   providers=["CPUExecutionProvider"])
    zeros = empty_caches(spec["config"])
    sets = [[ort.OrtValue.ortvalue_from_numpy(z.copy()) for z in zeros] for _ in range(2)]
    binding = session.io_binding()

    def call(tokens, start, read, write):
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        binding.bind_cpu_input("tokens", np.asarray(tokens, np.int64))
        binding.bind_cpu_input("positions", np.arange(start, start + len(tokens), dtype=np.int64))
        binding.bind_output("logits")  # first: get_outputs() lists them in binding order
        for i, (r, w) in enumerate(zip(read, write)):
            binding.bind_ortvalue_input(f"cache_{i}", r)
            binding.bind_ortvalue_output(f"new_cache_{i}", w)
        session.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()

    def run(ids, n):
        for value, z in zip(sets[0], zeros):
            value.update_inplace(z)
        read, write = sets
        start = time.perf_counter()
        tokens = [int(call(ids, 0, read, write)[-1].argmax())]
        read, write = write, read
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for position in range(len(ids), len(ids) + n - 1):
            tokens.append(int(call(tokens[-1:], position, read, write)[-1].argmax()))
            read, write = write, read
        return tokens, prefill_s, time.perf_counter() - start
    return run, 2 * sum(z.nbytes for z in zeros)


# --- profile ----------------------------------------------------------------------------

def profile(spec: dict) -> None:
    from opforge.runtime import Tracer, load
    from opforge.runtime.generate import Generator

    generator = Generator(load(artifact(spec), num_threads=spec["threads"]))
    ids = prompt(spec["config"])
    generator.generate(ids, 4)
    prefill, decode = Tracer(), Tracer()
    method = generator.program.method(generator.signature.decode.name)
    generator.program.reset_state()
    method.run([np.array(ids), np.arange(len(ids))], tracer=prefill)
    token = 1
    for position in range(len(ids), len(ids) + spec["steps"]):
        (logits,) = method.run([np.array([token]), np.array([position])], views=True,
                               tracer=decode)
        token = int(logits[-1].argmax())
    for phase, tracer, calls in (("prefill", prefill, 1), ("decode", decode, spec["steps"])):
        rows = [s for s in tracer.summary() if not s.op.startswith("method ")]
        total = sum(s.total_ms for s in rows)
        emit(event="profile", config=spec["config"], phase=phase, calls=calls,
             total_ms_per_call=total / calls,
             ops=[{"op": s.op, "calls_per_step": s.calls / calls,
                   "ms_per_step": s.total_ms / calls, "share": s.total_ms / total}
                  for s in rows[:12]])


def main() -> int:
    spec = json.loads(sys.stdin.read())
    try:
        {"prepare": prepare, "measure": measure, "profile": profile}[spec["mode"]](spec)
    except Exception as error:
        emit(event="error", ok=False, spec=spec, error=f"{type(error).__name__}: {error}",
             traceback=traceback.format_exc()[-3000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
