"""Text generation on the lean runtime: prefill a prompt in one call, then decode a token
per call, with the KV cache kept as program state between calls.

    Generator(program) → describe_decoder (methods, layout, vocabulary, cache capacity)
    generate(prompt):  reset the state → prefill (one call; chunks when the prompt is longer
                       than a call takes) → sample → decode one token per call until
                       max_new_tokens, an end token, or the cache's capacity → Generation

NumPy only: nothing here imports torch (``tests/torch/test_generate_notorch.py`` checks it
in a subprocess). Timing: the prefill rate is prompt tokens / prefill seconds (the calls
that take the prompt and the first token's sampling); the decode rate is the tokens the
decode calls produced / their seconds. The first new token comes from the prefill call, so
``n`` new tokens take ``n - 1`` decode calls.

Capacity: a cache of ``C`` positions holds the prompt (``P`` positions) and every token fed
back; the last new token is never fed back, so at most ``C - P + 1`` new tokens fit. Asked
for more, the runner generates what fits and says so (``Generation.stop_reason ==
"capacity"`` and ``Generation.message``).

>>> from opforge.runtime import load                            # doctest: +SKIP
>>> from opforge.runtime.generate import Generator              # doctest: +SKIP
>>> generator = Generator(load("decoder.opf"))                  # doctest: +SKIP
>>> result = generator.generate([5, 9, 1, 3], max_new_tokens=8) # doctest: +SKIP
>>> result.tokens, round(result.decode_tokens_per_s)            # doctest: +SKIP
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from opforge.errors import GenerationError, shown
from opforge.runtime.decoder_signature import DecoderSignature, describe_decoder
from opforge.runtime.sampling import Sampler

__all__ = ["Generator", "Generation", "generate"]

_API = "opforge.runtime.generate"


@dataclass(frozen=True)
class Generation:
    """The result of one ``Generator.generate`` call.

    ``tokens`` are the new tokens (an end token that stopped generation included), ``text``
    their decoded text when the generator has a tokenizer;
    ``stop_reason`` is ``"length"`` (``max_new_tokens`` reached), ``"eos"`` or
    ``"capacity"`` (the cache is full; ``message`` says how many tokens fit)."""

    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    stop_reason: str
    message: str
    prefill_seconds: float
    decode_seconds: float
    decode_steps: int
    capacity: int
    text: str | None = None

    @property
    def prefill_tokens_per_s(self) -> float:
        return len(self.prompt) / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_seconds if self.decode_seconds > 0 else 0.0


class Generator:
    """Drives a decoder program (``LoadedProgram``, a path, or a file's bytes) token by
    token. ``method``/``decode_method``/``layout`` override what ``describe_decoder``
    finds; ``mode`` and ``num_threads`` are ``opforge.runtime.load``'s when a path is given.
    ``tokenizer`` (a ``tokenizer.json`` path or an ``opforge.runtime.tokenizer.TextTokenizer``;
    the optional ``tokenizers`` library) lets ``generate`` take text, adds the tokenizer's
    end tokens and fills ``Generation.text``.

    One instance holds one method instance per call kind (their arenas): generate from one
    thread at a time. Each ``generate`` starts from a fresh cache (``reset_state``).
    """

    def __init__(self, program: object, *, method: str | None = None,
                 decode_method: str | None = None, layout: str | None = None,
                 mode: str = "lean", num_threads: int | None = None,
                 tokenizer: object = None) -> None:
        from opforge.runtime.loader import LoadedProgram, load
        from opforge.runtime.native_executor import NativeProgram
        from opforge.runtime.tokenizer import TextTokenizer

        if tokenizer is not None and not isinstance(tokenizer, TextTokenizer):
            tokenizer = TextTokenizer.from_file(tokenizer)  # a tokenizer.json path
        self.tokenizer = tokenizer

        if not isinstance(program, (LoadedProgram, NativeProgram)):  # load(..., executor=)
            program = load(program, mode=mode, num_threads=num_threads)
        self.program = program
        self.signature: DecoderSignature = describe_decoder(
            program.program, method=method, decode_method=decode_method, layout=layout)
        sig = self.signature
        self._prefill = program.method(sig.prefill.name)
        self._decode = self._prefill if sig.decode is sig.prefill else \
            program.method(sig.decode.name)

    @property
    def vocab(self) -> int:
        return self.signature.vocab

    @property
    def capacity(self) -> int:
        return self.signature.capacity

    def generate(self, prompt: Sequence[int] | str, max_new_tokens: int, *,
                 temperature: float = 0.0, top_k: int | None = None,
                 seed: int | None = None, eos_ids: Iterable[int] = (),
                 on_token: Callable[[int], None] | None = None,
                 tracer=None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (token ids, or text
        with a tokenizer).

        Greedy by default; ``temperature > 0`` samples (``top_k``, ``seed``: see
        ``opforge.runtime.sampling.Sampler``). Stops early at any of ``eos_ids`` or when
        the cache is full. ``on_token(id)`` is called with each new token as it comes;
        ``tracer`` (an ``opforge.runtime.Tracer``) records every instruction of every call
        (slower: each instruction is timed)."""
        sampler = Sampler(temperature, top_k, seed)
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise GenerationError(
                    f"`{_API}`: prompt — found text — valid: token ids, or text with a "
                    "tokenizer — fix: Generator(..., tokenizer='tokenizer.json'), or encode "
                    "it yourself")
            prompt = self.tokenizer.encode(prompt)
        prompt_array = self._check_prompt(prompt)
        eos = set(self._check_ids("eos_ids", eos_ids))
        if self.tokenizer is not None:
            eos.update(i for i in self.tokenizer.eos_ids if 0 <= i < self.vocab)
        if type(max_new_tokens) is not int or max_new_tokens < 0:
            raise GenerationError(f"`{_API}(max_new_tokens=...)`: found "
                                  f"{shown(max_new_tokens)} — valid: an integer >= 0")
        n_prompt, capacity = len(prompt_array), self.capacity
        if n_prompt > capacity:
            raise GenerationError(
                f"`{_API}`: prompt — {n_prompt} tokens — valid: at most the cache's capacity, "
                f"{capacity} positions ({self.signature.capacity_source}) — fix: shorten the "
                "prompt, or export the model with a longer cache (max_len)")
        fits = capacity - n_prompt + 1
        wanted = min(max_new_tokens, fits)
        self.program.reset_state()

        start = time.perf_counter()
        logits = self._prefill_prompt(prompt_array, tracer)
        tokens: list[int] = []
        stop = "length"
        if wanted:
            tokens.append(sampler.choose(logits))
        prefill_seconds = time.perf_counter() - start
        if tokens and on_token is not None:
            on_token(tokens[0])

        decode, call = self.signature.decode, self._decode
        position = n_prompt
        steps = 0
        start = time.perf_counter()
        while tokens and tokens[-1] not in eos and len(tokens) < wanted:
            inputs = decode.arrays(np.array(tokens[-1:], np.int64), position)
            outputs = call(*inputs, views=True) if tracer is None else \
                call.run(inputs, views=True, tracer=tracer)
            row = outputs[0].reshape(-1, self.vocab)[-1]
            tokens.append(sampler.choose(row))
            position += 1
            steps += 1
            if on_token is not None:
                on_token(tokens[-1])
        decode_seconds = time.perf_counter() - start

        if tokens and tokens[-1] in eos:
            stop, message = "eos", f"stopped at end token {tokens[-1]}"
        elif wanted < max_new_tokens:
            stop = "capacity"
            message = (f"stopped at the cache's capacity: {capacity} positions "
                       f"({self.signature.capacity_source}) hold the {n_prompt}-token prompt "
                       f"and {fits} new token(s), fewer than the {max_new_tokens} asked for")
        else:
            message = f"generated {len(tokens)} token(s)"
        text = self.tokenizer.decode(tokens) if self.tokenizer is not None else None
        return Generation(tuple(int(t) for t in prompt_array), tuple(tokens), stop, message,
                          prefill_seconds, decode_seconds, steps, capacity, text)

    # --- the calls ----------------------------------------------------------------------

    def _prefill_prompt(self, prompt: np.ndarray, tracer=None) -> np.ndarray:
        """Run the prompt through the cache; the last position's logits (a copy).

        One call when the prompt fits one (the usual case); longer prompts go in chunks of
        the most tokens a call takes, and a tail shorter than the prefill method's minimum
        goes through the decode method one token at a time."""
        prefill, decode = self.signature.prefill, self.signature.decode
        done, n = 0, len(prompt)
        row = None
        while done < n:
            size = min(n - done, prefill.seq_max)
            spec, call = (prefill, self._prefill) if size >= prefill.seq_min else \
                (decode, self._decode)
            size = size if spec is prefill else 1
            inputs = spec.arrays(prompt[done:done + size], done)
            outputs = call(*inputs, views=True) if tracer is None else \
                call.run(inputs, views=True, tracer=tracer)
            row = outputs[0].reshape(-1, self.vocab)[-1]
            done += size
        return np.array(row)

    # --- checks -------------------------------------------------------------------------

    def _check_prompt(self, prompt: Sequence[int]) -> np.ndarray:
        ids = self._check_ids("prompt", prompt)
        if not ids:
            raise GenerationError(f"`{_API}`: prompt — found no tokens — valid: at least one "
                                  "token id — fix: pass --prompt-ids 1,2,3 (or --prompt TEXT "
                                  "with --tokenizer)")
        return np.array(ids, np.int64)

    def _check_ids(self, what: str, ids: Iterable[int]) -> list[int]:
        try:
            items = list(ids)
        except TypeError:
            items = [ids]
        values = [int(i) for i in items
                  if isinstance(i, (int, np.integer)) and not isinstance(i, (bool, np.bool_))]
        bad = [v for v in values if not 0 <= v < self.vocab]
        if len(values) != len(items) or bad:
            found = bad if len(values) == len(items) else items
            raise GenerationError(
                f"`{_API}`: {what} — found {shown(found)} — valid: token ids, integers in "
                f"[0, {self.vocab}) (the logits' vocabulary) — fix: check the ids, or that the "
                "tokenizer belongs to this model")
        return values


def generate(program: object, prompt: Sequence[int], max_new_tokens: int,
             **options) -> Generation:
    """One-shot ``Generator(program).generate(prompt, max_new_tokens, **options)``;
    ``method``, ``decode_method``, ``layout``, ``mode`` and ``num_threads`` go to the
    ``Generator``, the rest to ``generate``."""
    keys = ("method", "decode_method", "layout", "mode", "num_threads", "tokenizer")
    made = {k: options.pop(k) for k in keys if k in options}
    if isinstance(program, (str, os.PathLike)):
        program = os.fspath(program)
    return Generator(program, **made).generate(prompt, max_new_tokens, **options)
