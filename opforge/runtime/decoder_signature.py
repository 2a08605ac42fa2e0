"""How to call a decoder program: which methods, which inputs, how many cache positions.

    methods (forward, or prefill + decode) → each method's two integer inputs (tokens and
    positions, by name or position) → the layout (flat or batch-of-one) and the bounds of
    the sequence dimension → the logits' vocabulary → the KV caches among the state and
    their capacity

NumPy only, read from the program's data (nothing is run). Two calling conventions are
driven, told apart by the tokens input's rank:

- ``flat``: ``(tokens[int, seq], positions[int, seq]) -> logits[seq, vocab]`` — opforge's
  bundled decoder (``opforge.examples.decoder``);
- ``batched``: ``(input_ids[int, 1, seq], cache_position[int, seq]) -> logits[1, seq,
  vocab]`` — decoders exported from transformers with a static cache (positions may also
  be ``[1, seq]``).

The logits may have any leading dimensions; the runner reads the last row of the output
seen as ``[-1, vocab]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from opforge.errors import GenerationError
from opforge.program import Method as MethodDef, Program, TensorValue
from opforge.runtime.arena import tensor_dtype

__all__ = ["MethodCall", "DecoderSignature", "describe_decoder", "LAYOUTS"]

LAYOUTS = ("flat", "batched")
_TOKEN_NAMES = ("tokens", "input_ids", "token_ids", "ids", "input")
_POSITION_NAMES = ("positions", "cache_position", "position_ids", "input_pos", "pos",
                   "position")
_API = "opforge.runtime.generate"


@dataclass(frozen=True)
class MethodCall:
    """One method as the runner calls it: ``order`` is the position of (tokens, positions)
    in its inputs; the tokens' sequence dimension takes ``seq_min..seq_max`` tokens."""

    name: str
    layout: str
    order: tuple[int, int]
    token_dtype: np.dtype
    position_dtype: np.dtype
    position_rank: int
    seq_min: int
    seq_max: int
    vocab: int

    def arrays(self, tokens: "np.ndarray", start: int) -> tuple:
        """The method's inputs for ``tokens`` (1-D) at positions ``start, start+1, ...``."""
        n = len(tokens)
        ids = tokens.astype(self.token_dtype, copy=False)
        positions = np.arange(start, start + n, dtype=self.position_dtype)
        if self.layout == "batched":
            ids = ids.reshape(1, n)
            if self.position_rank == 2:
                positions = positions.reshape(1, n)
        pair = [None, None]
        pair[self.order[0]], pair[self.order[1]] = ids, positions
        return tuple(pair)


@dataclass(frozen=True)
class DecoderSignature:
    """What ``describe_decoder`` found: the prefill and decode calls (one method may be
    both), the vocabulary, the KV caches (state names and bytes) and the capacity in
    positions, with where that number came from."""

    prefill: MethodCall
    decode: MethodCall
    vocab: int
    capacity: int
    capacity_source: str
    caches: tuple[str, ...]
    cache_bytes: int

    @property
    def layout(self) -> str:
        return self.prefill.layout


def describe_decoder(program: Program, *, method: str | None = None,
                     decode_method: str | None = None,
                     layout: str | None = None) -> DecoderSignature:
    """Read how to drive ``program`` as a decoder (``GenerationError`` if it cannot be).

    ``method`` is the prefill method (and the decode one unless ``decode_method`` is
    given); without it: ``forward``, else a ``prefill``/``decode`` pair, else the only
    method. ``layout`` (``"flat"`` or ``"batched"``), when given, must be what the
    inputs' ranks say.
    """
    names = [m.name for m in program.methods]
    prefill_name, decode_name = _pick_methods(names, method, decode_method)
    if layout is not None and layout not in LAYOUTS:
        raise GenerationError(f"`{_API}(layout=...)`: found {layout!r} — valid: "
                              f"{', '.join(LAYOUTS)} — fix: leave it out to detect it")
    prefill = _method_call(program, program.method(prefill_name), layout)
    decode = prefill if decode_name == prefill_name else \
        _method_call(program, program.method(decode_name), layout)
    if not decode.seq_min <= 1 <= decode.seq_max:
        raise GenerationError(
            f"`{_API}`: method {decode_name!r} — takes {decode.seq_min}..{decode.seq_max} "
            "tokens per call — valid: a decode method taking one token — fix: export it "
            "with a dynamic sequence (Dim('seq', min=1, max=N)) or add a 'decode' method "
            "exported at one token")
    if prefill.vocab != decode.vocab:
        raise GenerationError(f"`{_API}`: methods {prefill_name!r} and {decode_name!r} — "
                              f"vocabularies {prefill.vocab} and {decode.vocab} differ — "
                              "valid: one model — fix: export both methods from one model")
    caches, cache_bytes, capacity, source = _caches(program, prefill, decode)
    return DecoderSignature(prefill, decode, prefill.vocab, capacity, source, caches,
                            cache_bytes)


def _pick_methods(names: list[str], method: str | None,
                  decode_method: str | None) -> tuple[str, str]:
    for given in (method, decode_method):
        if given is not None and given not in names:
            raise GenerationError(
                f"`{_API}`: method {given!r} — not in the program — valid: "
                f"{', '.join(map(repr, names)) or '(none)'} — fix: --method NAME")
    if method is not None:
        return method, decode_method or method
    if "forward" in names:
        return "forward", decode_method or "forward"
    if "prefill" in names and "decode" in names:
        return "prefill", decode_method or "decode"
    if len(names) == 1:
        return names[0], decode_method or names[0]
    raise GenerationError(
        f"`{_API}`: methods {', '.join(map(repr, names)) or '(none)'} — none is 'forward' "
        "and there is no 'prefill'/'decode' pair — valid: a decoder method "
        "(tokens, positions) -> logits — fix: name it with --method NAME "
        "(and --decode-method NAME)")


def _method_call(program: Program, method: MethodDef, layout: str | None) -> MethodCall:
    api = f"{_API}: method {method.name!r}"
    expected = ("valid: (tokens[int64, seq], positions[int64, seq]) -> logits[seq, vocab] "
                "or (input_ids[int64, 1, seq], cache_position[int64, seq]) -> "
                "logits[1, seq, vocab]")
    inputs = [method.values[i] for i in method.inputs]
    found = ", ".join(_describe(v) for v in inputs) or "no inputs"
    if len(inputs) != 2 or not all(_is_int_tensor(method, v) for v in inputs):
        raise GenerationError(f"`{api}`: inputs — found ({found}) — {expected} — fix: export "
                              "the decoder with a token and a position input (see "
                              "opforge.examples.decoder), or pick the method with --method")
    order = _input_order(program, method)
    tokens, positions = inputs[order[0]], inputs[order[1]]
    rank = len(tokens.sizes)
    detected = "flat" if rank == 1 else "batched" if rank == 2 and tokens.sizes[0] == 1 \
        else None
    position_ok = len(positions.sizes) == 1 or (
        detected == "batched" and len(positions.sizes) == 2 and positions.sizes[0] == 1)
    if detected is None or not position_ok:
        raise GenerationError(f"`{api}`: inputs — found ({found}) — {expected} — fix: "
                              "export with a batch of one, or reshape in a wrapper module")
    if layout is not None and layout != detected:
        raise GenerationError(
            f"`{api}`: layout {layout!r} — the tokens input {_describe(tokens)} is the "
            f"{detected!r} layout — valid: flat (tokens of rank 1) or batched (rank 2, batch "
            f"1) — fix: --layout {detected}, or leave it out")
    outputs = [method.values[i] for i in method.outputs]
    logits = outputs[0] if outputs else None
    if type(logits) is not TensorValue or not logits.sizes or \
            np.dtype(tensor_dtype(api, "logits", logits)).kind != "f":
        shown = ", ".join(_describe(v) for v in outputs) or "no outputs"
        raise GenerationError(f"`{api}`: outputs — found ({shown}) — valid: logits first, "
                              "a floating-point tensor [..., vocab] — fix: return the logits "
                              "as the method's first output")
    seq_dim = rank - 1
    low, high = _bounds(method, method.inputs[order[0]], seq_dim)
    return MethodCall(method.name, detected, order,
                      np.dtype(tensor_dtype(api, "tokens", tokens)),
                      np.dtype(tensor_dtype(api, "positions", positions)),
                      len(positions.sizes), low, high, logits.sizes[-1])


def _input_order(program: Program, method: MethodDef) -> tuple[int, int]:
    """(tokens, positions) input positions: from the input names export records
    (``opforge.input_names.<method>``), else the order (tokens first)."""
    names = program.metadata.get(f"opforge.input_names.{method.name}", "").split(",")
    if len(names) == 2:
        token = [i for i, n in enumerate(names) if n in _TOKEN_NAMES]
        position = [i for i, n in enumerate(names) if n in _POSITION_NAMES]
        if len(token) == 1 and len(position) == 1 and token != position:
            return token[0], position[0]
    return 0, 1


def _bounds(method: MethodDef, value: int, dim: int) -> tuple[int, int]:
    ranges = {s.name: (s.min, s.max) for s in method.symbols}
    for entry in method.symbolic_values:
        if entry.value == value:
            return entry.exprs[dim].bounds(ranges)
    size = method.values[value].sizes[dim]
    return size, size


def _caches(program: Program, prefill: MethodCall,
            decode: MethodCall) -> tuple[tuple[str, ...], int, int, str]:
    """The KV caches (floating-point state) and their capacity: per cache, the one
    dimension at least as large as a call's most tokens (the layout's usual position
    dimension when several are: 0 flat, -2 batched); without one, the sequence bound."""
    seen: dict[str, TensorValue] = {}
    for method in program.methods:
        if method.name in (prefill.name, decode.name):
            for slot in method.state:
                seen.setdefault(slot.name, method.values[slot.value])
    if not seen:
        raise GenerationError(
            f"`{_API}`: method {prefill.name!r} — has no state — valid: a decoder whose KV "
            "cache is program state (buffers updated in place, kept between calls) — fix: "
            "register the caches as buffers and update them in place (index_copy_), as "
            "opforge.examples.decoder does, then re-export")
    tokens_per_call = max(prefill.seq_max, decode.seq_max)
    usual = 0 if prefill.layout == "flat" else -2
    caches, nbytes, capacity, source = [], 0, None, ""
    for name, value in seen.items():
        if value.dtype.name.lower() not in ("float32", "float16", "bfloat16", "float64"):
            continue  # counters and positions are state too, not caches
        caches.append(name)
        nbytes += value.nbytes
        sizes = value.sizes
        candidates = [d for d, n in enumerate(sizes) if n >= tokens_per_call]
        if len(sizes) >= 2 and sizes[usual] >= tokens_per_call:
            dim = usual % len(sizes)
        elif len(candidates) == 1:
            dim = candidates[0]
        else:
            continue
        if capacity is None or sizes[dim] < capacity:
            capacity, source = sizes[dim], f"state {name!r} dim {dim}"
    if capacity is None:
        capacity = tokens_per_call
        source = f"the sequence bound of method {prefill.name!r}"
    return tuple(caches), nbytes, capacity, source


def _is_int_tensor(method: MethodDef, value: object) -> bool:
    return type(value) is TensorValue and value.dtype.name.lower() in (
        "int64", "int32", "int16", "uint8", "int8") and bool(value.sizes)


def _describe(value: object) -> str:
    if type(value) is TensorValue:
        return f"{value.dtype.name.lower()}{list(value.sizes)}"
    return type(value).__name__
