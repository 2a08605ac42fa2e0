"""``opforge example``: the main job on the bundled example, end to end.

    1. define   — load opforge/examples/my_ops.yaml (four ops, ExecuTorch format)
    2. build    — compile their C++ kernels into one library (cached)
    3. register — functional/out/fake in torch.library; the C++ library is the eager kernel
    4. export   — a model using the ops → a verified program file
    5. run      — the lean runtime (NumPy + the C++ library, no torch) vs eager PyTorch
    6. cpu      — the same model exported with ``--backend cpu`` (oneDNN; the custom ops
                  inside the delegate call their C++ kernels natively) vs eager PyTorch
    7. profile  — the runtime's tracer: top ops by time

Every artifact lands in ``--workdir`` (default ``out/example``).
"""

from __future__ import annotations

from pathlib import Path

import click


@click.command("example")
@click.option("--workdir", type=click.Path(file_okay=False, path_type=Path),
              default=Path("out/example"), show_default=True, help="Where artifacts are written.")
@click.option("--iterations", default=200, show_default=True, help="Profiled runs.")
@click.option("--seed", default=0, show_default=True, help="Seed of the example inputs.")
def example(workdir: Path, iterations: int, seed: int) -> None:
    """Define → build → export → run the bundled my_ops example, checking every stage."""
    import numpy as np
    import torch
    from rich.markup import escape
    from rich.table import Table

    from opforge.cli.tables import table_console
    from opforge.native import build_library
    from opforge.cli.run_cmd import profile_table
    from opforge.examples.custom_model import custom_op_model
    from opforge.examples.my_ops import manifest_path, register_examples
    from opforge.export import export
    from opforge.manifest import load_manifest
    from opforge.program import save
    from opforge.runtime import Tracer, load
    from opforge.torch_bridge.native_eager import use_native_library

    console = table_console()
    workdir.mkdir(parents=True, exist_ok=True)
    failures: list[str] = []

    def check(name: str, got, want, rtol: float, atol: float) -> None:
        got, want = np.asarray(got), np.asarray(want)
        err = float(np.max(np.abs(got - want))) if got.size else 0.0
        ok = got.shape == want.shape and np.allclose(got, want, rtol=rtol, atol=atol)
        if not ok:
            failures.append(name)
        results.add_row(name, str(got.shape), f"{err:.3g}", "[green]yes" if ok else "[red]NO")

    console.rule("[bold]1. define")
    path = manifest_path()
    defs = load_manifest(path)
    for d in defs:
        console.print(f"  {escape(str(d.out))}", soft_wrap=True)
        console.print(f"    kernel {escape(d.kernels[0].cpp_name)}  [dim]({escape(d.source)})[/dim]",
                      soft_wrap=True)

    console.rule("[bold]2. build the C++ kernels")
    sources = sorted((path.parent / "kernels").glob("*.cpp"))
    with console.status("compiling (cached after the first run)..."):
        built = build_library(path, sources, workdir / "libmy_ops.so")
    how = "cache hit" if built.cached else "compiled"
    console.print(f"  {built.path}: {len(built.kernels)} kernel(s), {built.size:,} bytes, "
                  f"{how} in {built.seconds:.2f} s")

    console.rule("[bold]3. register with PyTorch; the C++ library is the eager kernel")
    register_examples()
    use_native_library(built.path, manifest=defs)
    results = Table("check", "shape", "max |error|", "ok")
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(seed))
    ops = torch.ops.my_ops
    # Multiplying by 3 or 4 and taking min/max are exact in float32; a sum of 5 terms
    # rounds differently depending on order: 1e-6 relative covers it.
    check("eager my_ops::mul3 (C++) vs x*3", ops.mul3(x), x * 3, 0, 0)
    check("eager my_ops::mul4 (C++) vs x*4", ops.mul4(x), x * 4, 0, 0)
    lo, hi = ops.minmax(x, 1)
    check("eager my_ops::minmax (C++) vs amin/amax", torch.stack([lo, hi]),
          torch.stack([x.amin(1), x.amax(1)]), 0, 0)
    check("eager my_ops::scaled_sum (C++) vs sum*0.5", ops.scaled_sum(x, 0.5, [1]),
          x.sum(1) * 0.5, 1e-6, 1e-6)
    console.print(f"  registered: {', '.join(d.name for d in defs)}")

    console.rule("[bold]4. export")
    model, inputs = custom_op_model(seed)
    program = export(model, inputs, kernels=["portable", set(built.ops)])
    program_path = workdir / "model.opf"
    save(program, program_path)
    forward = program.method("forward")
    console.print(f"  {program_path}: {len(forward.instructions)} instructions, "
                  f"{program_path.stat().st_size:,} bytes; ops: "
                  + ", ".join(sorted({op.key for op in forward.operators})), soft_wrap=True)

    console.rule("[bold]5. run on the lean runtime (NumPy + libmy_ops.so)")
    runtime = load(program_path, kernels=[built.path])
    method = runtime.method("forward")
    (got,) = method(inputs[0].numpy())
    with torch.inference_mode():
        want = model(*inputs).numpy()
    # float32 through a Linear (BLAS, different summation order) then ×3 and sums of 8:
    # a few ulp of the largest intermediate; 1e-5 relative / 1e-5 absolute is ample.
    check("lean runtime vs eager PyTorch", got, want, 1e-5, 1e-5)

    console.rule("[bold]6. export and run on the cpu backend (oneDNN + libmy_ops.so)")
    from opforge.cli.delegation_view import print_delegation
    from opforge.export import delegation_report

    custom = sorted({op.rsplit(".", 1)[0] for op in built.ops})
    cpu_program = export(model, inputs, kernels=["portable", set(built.ops)],
                         backends=[("cpu", {"custom_ops": custom})])
    cpu_path = workdir / "model_cpu.opf"
    save(cpu_program, cpu_path)
    print_delegation(console, delegation_report(cpu_program), explain=True)
    cpu_method = load(cpu_path, kernels=[built.path]).method("forward")
    (got_cpu,) = cpu_method(inputs[0].numpy())
    # oneDNN's Linear sums in another order than eager's BLAS: the same few ulp as above
    check("cpu backend vs eager PyTorch", got_cpu, want, 1e-5, 1e-5)
    console.print(results)
    x = inputs[0].numpy()
    lean_us, cpu_us = (_median_us(lambda m=m: m(x), iterations) for m in (method, cpu_method))
    console.print(f"  per call (median of {iterations}): lean {lean_us:.1f} µs, cpu backend "
                  f"{cpu_us:.1f} µs (×{lean_us / cpu_us:.1f})")

    console.rule("[bold]7. profile")
    tracer = Tracer()
    for _ in range(iterations):
        method.run([inputs[0].numpy()], tracer=tracer)
    console.print(profile_table(tracer, top=10))

    console.rule("[bold]8. a decoder with a KV cache: dynamic sequence, state, greedy decoding")
    from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode

    decoder = TinyDecoder(seed=seed).eval()
    decoder_program = export_decoder(TinyDecoder(seed=seed).eval(), kernels="portable")
    decoder_path = workdir / "decoder.opf"
    save(decoder_program, decoder_path)
    decoder_runtime = load(decoder_path)
    step = decoder_runtime.method("forward")
    symbol = decoder_program.method("forward").symbols[0]
    console.print(f"  {decoder_path}: sequence {symbol.name} in [{symbol.min}, {symbol.max}], "
                  f"state: {', '.join(decoder_runtime.state_names)}", soft_wrap=True)
    prompt = [5, 9, 1, 3]
    with torch.inference_mode():
        want_tokens = greedy_decode(lambda t, p: decoder(t, p), prompt, 32)
    got_tokens = greedy_decode(lambda t, p: step(t.numpy(), p.numpy(), views=True)[0], prompt, 32)
    # the same through the generation runner (what `opforge generate` runs), which times
    # the prompt's call and the one-token calls apart
    from opforge.runtime.generate import Generator

    generated = Generator(decoder_runtime).generate(prompt, 32)
    ok = got_tokens == want_tokens == list(generated.tokens)
    if not ok:
        failures.append("decoder tokens")
    console.print(f"  prefill {len(prompt)} tokens, decode 32: {'[green]' if ok else '[red]'}"
                  f"{'same tokens as eager' if ok else 'tokens differ from eager'}[/] "
                  f"(lean runtime: prefill {generated.prefill_tokens_per_s:.0f} tokens/s, "
                  f"decode {generated.decode_tokens_per_s:.0f} tokens/s; `opforge generate "
                  f"{decoder_path} --prompt-ids {','.join(map(str, prompt))}`)", soft_wrap=True)

    if failures:
        raise click.ClickException(f"{len(failures)} check(s) failed: {', '.join(failures)}")
    console.print("[bold green]example: define → build → export → run: all stages passed")


def _median_us(call, runs: int) -> float:
    import statistics
    import time

    call()
    times = []
    for _ in range(max(runs, 1)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6
