"""``opforge generate PROGRAM.opf``: generate tokens with a decoder program and its KV cache.

    load → describe the decoder (methods, layout, capacity) → prompt (ids, or text through
    a tokenizer.json) → prefill in one call → decode token by token → tokens, text, rates

Never imports torch in lean mode (``opforge.runtime.generate``); text needs the optional
``tokenizers`` library (``pip install 'opforge[text]'``).
"""

from __future__ import annotations

import json
import re

import click

__all__ = ["generate"]


def _parse_ids(ctx, param, value: str | None) -> list[int] | None:
    if value is None:
        return None
    items = [item for item in re.split(r"[\s,]+", value.strip()) if item]
    try:
        return [int(item) for item in items]
    except ValueError:
        raise click.BadParameter(f"found {value!r} — valid: token ids separated by commas or "
                                 "spaces, e.g. 5,9,1,3") from None


@click.command("generate")
@click.argument("program", type=click.Path(exists=True, dir_okay=False))
@click.option("--prompt-ids", callback=_parse_ids, metavar="IDS",
              help="The prompt as token ids: '5,9,1,3' or '5 9 1 3'.")
@click.option("--prompt", "prompt_text", metavar="TEXT",
              help="The prompt as text (needs --tokenizer).")
@click.option("--tokenizer", "tokenizer_path", type=click.Path(exists=True, dir_okay=False),
              help="A tokenizer.json (the optional `tokenizers` library): encodes --prompt, "
                   "decodes the output; end tokens from the config files beside it.")
@click.option("--max-new-tokens", type=click.IntRange(min=1), default=32, show_default=True,
              help="At most this many new tokens (fewer at an end token or a full cache).")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
              help="0: greedy; above 0: sample from softmax(logits / temperature).")
@click.option("--top-k", type=click.IntRange(min=1), default=None,
              help="Sample only among the k most likely tokens.")
@click.option("--seed", type=int, default=None, help="Seed of the sampler (reproducible runs).")
@click.option("--eos-id", "eos_ids", type=int, multiple=True,
              help="An end token id; repeatable (added to the tokenizer's).")
@click.option("--method", "method_name", default=None,
              help="The method to call (default: forward, or a prefill/decode pair).")
@click.option("--decode-method", default=None,
              help="A separate method for one-token decode steps.")
@click.option("--layout", type=click.Choice(["flat", "batched"]), default=None,
              help="flat: (tokens[seq], positions[seq]); batched: (input_ids[1, seq], "
                   "cache_position[seq]). Default: detected from the inputs.")
@click.option("--mode", type=click.Choice(["lean", "aten"]), default="lean", show_default=True,
              help="lean: portable NumPy kernels (no torch); aten: PyTorch's own kernels.")
@click.option("--kernels", "libraries", multiple=True,
              help="A native kernel library or Python registrar 'pkg.module:function'; "
                   "repeatable (as for `opforge run`).")
@click.option("--threads", type=int, default=None,
              help="Threads per call (default: OPFORGE_NUM_THREADS, else 1).")
@click.option("--profile", is_flag=True, help="Time every instruction; print the top ops.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead.")
def generate(program: str, prompt_ids: list[int] | None, prompt_text: str | None,
             tokenizer_path: str | None, max_new_tokens: int, temperature: float,
             top_k: int | None, seed: int | None, eos_ids: tuple[int, ...],
             method_name: str | None, decode_method: str | None, layout: str | None,
             mode: str, libraries: tuple[str, ...], threads: int | None, profile: bool,
             as_json: bool) -> None:
    """Generate up to --max-new-tokens tokens after a prompt with PROGRAM (a decoder .opf
    whose KV cache is program state): prefill in one call, then one call per token."""
    from opforge.cli.tables import table_console
    from opforge.runtime import Tracer, load
    from opforge.runtime.generate import Generator
    from opforge.runtime.tokenizer import TextTokenizer

    if (prompt_ids is None) == (prompt_text is None):
        raise click.UsageError("pass the prompt as --prompt-ids IDS or as --prompt TEXT "
                               "(with --tokenizer), exactly one of them")
    if prompt_text is not None and tokenizer_path is None:
        raise click.UsageError("--prompt TEXT needs --tokenizer tokenizer.json (or pass "
                               "--prompt-ids)")
    console = table_console()
    tokenizer = TextTokenizer.from_file(tokenizer_path) if tokenizer_path else None
    loaded = load(program, mode=mode, kernels=libraries, num_threads=threads)
    generator = Generator(loaded, method=method_name, decode_method=decode_method,
                          layout=layout, tokenizer=tokenizer)
    prompt = prompt_ids if prompt_ids is not None else prompt_text
    tracer = Tracer() if profile else None
    result = generator.generate(prompt, max_new_tokens, temperature=temperature, top_k=top_k,
                                seed=seed, eos_ids=eos_ids, tracer=tracer)
    text = result.text

    sig = generator.signature
    if as_json:
        click.echo(json.dumps({
            "prompt_ids": list(result.prompt), "tokens": list(result.tokens), "text": text,
            "stop_reason": result.stop_reason, "message": result.message,
            "prefill_tokens_per_s": result.prefill_tokens_per_s,
            "decode_tokens_per_s": result.decode_tokens_per_s,
            "prefill_seconds": result.prefill_seconds, "decode_seconds": result.decode_seconds,
            "decode_steps": result.decode_steps, "capacity": result.capacity,
            "cache_bytes": sig.cache_bytes}))
        return
    methods = sig.prefill.name if sig.decode is sig.prefill else \
        f"{sig.prefill.name} + {sig.decode.name}"
    console.print(f"[bold]{program}[/bold]: method {methods}, {sig.layout} layout, vocabulary "
                  f"{sig.vocab}, cache {sig.capacity} positions ({len(sig.caches)} state "
                  f"tensor(s), {sig.cache_bytes / 2**20:.2f} MiB), mode {mode}", soft_wrap=True)
    console.print(f"prompt ({len(result.prompt)} tokens): {_ids(result.prompt)}", soft_wrap=True)
    if prompt_text is not None:
        console.print(f"prompt text: {prompt_text!r}", soft_wrap=True)
    console.print(f"generated ({len(result.tokens)} tokens): {_ids(result.tokens)}",
                  soft_wrap=True)
    if text is not None:
        console.print(f"text: {text!r}", soft_wrap=True)
    style = "yellow" if result.stop_reason == "capacity" else "green"
    console.print(f"[{style}]{result.message}[/{style}]", soft_wrap=True)
    if result.decode_steps:
        decode = (f"decode: {result.decode_steps} tokens in {result.decode_seconds * 1e3:.1f} ms "
                  f"({result.decode_tokens_per_s:.1f} tokens/s)")
    elif result.stop_reason == "capacity":
        decode = (f"decode: none — the cache is full: the prompt filled its {result.capacity} "
                  "positions, so no token was decoded (the one new token is the prefill's)")
    else:
        decode = "decode: none — the prefill's token was the last one (no decode call ran)"
    console.print(f"prefill: {len(result.prompt)} tokens in {result.prefill_seconds * 1e3:.1f} "
                  f"ms ({result.prefill_tokens_per_s:.1f} tokens/s); {decode}"
                  + (" (profiling: every instruction timed)" if profile else ""),
                  soft_wrap=True)
    if profile:
        from opforge.cli.run_cmd import profile_table

        console.print(profile_table(tracer))


def _ids(ids) -> str:
    return " ".join(str(i) for i in ids) or "(none)"
