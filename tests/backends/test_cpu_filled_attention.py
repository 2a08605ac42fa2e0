"""Attention over what is filled (issue 46 item 4).

- the cpu backend's ``attention`` engine op (lowering/attention.py, native/attention.cpp):
  a static decode's masked attention reads only the slots up to each row's position; checked
  against eager, and by poisoning the slots after the position with NaN (the matmuls over
  the whole cache turn them into NaN logits; the op never reads them);
- the decoder recipe's ``attend="filled"`` (a data-dependent slice of the cache) on lean;
- the opt-in float16 cache on lean, and its accuracy against a float32 cache.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from opforge.backends.cpu import blob
from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.runtime import load

pytest.importorskip("opforge.backends.cpu.engine")


def _decode_program(model, switch: str, monkeypatch):
    monkeypatch.setenv("OPFORGE_CPU_FILLED_ATTENTION", switch)
    return export(None, methods={"decode": (model, (torch.tensor([1]), torch.tensor([0])))},
                  kernels="portable", backends=["cpu"])


def _attention_ops(program) -> int:
    return sum(1 for d in program.delegates
               for op in blob.parse(memoryview(bytes(program.segments[d.segment].data)))[0]["ops"]
               if op["kind"] == "attention")


def _with_and_without_the_op(model, example, monkeypatch):
    """(switch, loaded program, eager float32 copy, eager float64 copy) with the attention op
    on ("1": 2 ops in the program) and off ("0": none)."""
    for switch in ("1", "0"):
        monkeypatch.setenv("OPFORGE_CPU_FILLED_ATTENTION", switch)
        program = export(copy.deepcopy(model), example, kernels="portable", backends=["cpu"])
        assert _attention_ops(program) == (2 if switch == "1" else 0)
        yield switch, load(program), copy.deepcopy(model), copy.deepcopy(model).double()


def _close(got, ref64, ref32):
    # as tests/backends/test_cpu_grouped_attention.py: within 4x float32 eager's own error
    # against float64 (the op sums in another order than torch's matmuls), plus 1e-6 relative
    got, ref64, ref32 = (np.asarray(a, np.float64) for a in (got, ref64, ref32))
    tol = 4 * np.abs(ref32 - ref64).max() + 1e-6 * max(np.abs(ref64).max(), 1.0)
    err = np.abs(got - ref64).max()
    assert err <= tol, f"error {err:.3g} against float64, allowed {tol:.3g}"


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (4, 4)])
def test_engine_attention_against_float64(heads, kv_heads, monkeypatch):
    model = TinyDecoder(heads=heads, kv_heads=kv_heads, max_len=40).eval()
    program = _decode_program(copy.deepcopy(model), "1", monkeypatch)
    assert _attention_ops(program) == 2  # one per layer
    decode = load(program).method("decode")
    eager32, eager64 = copy.deepcopy(model), copy.deepcopy(model).double()
    with torch.no_grad():
        for position, token in enumerate([3, 1, 4, 1, 5, 9, 2, 6, 5, 3] + [7] * 29):
            t, p = torch.tensor([token]), torch.tensor([position])
            got = decode(t.numpy(), p.numpy())[0]
            _close(got, eager64(t, p).numpy(), eager32(t, p).numpy())


@pytest.mark.parametrize("switch", ["1", "0"])
def test_engine_attention_reads_only_filled_slots(switch, monkeypatch):
    """NaN in every value-cache slot after the position: the engine op never reads them
    (logits equal eager's, whose slots there hold zeros); the masked matmuls over the whole
    cache multiply them by a weight of 0 and give NaN — the check this test can fail on."""
    model = TinyDecoder(max_len=32).eval()
    loaded = load(_decode_program(copy.deepcopy(model), switch, monkeypatch))
    decode = loaded.method("decode")
    eager = copy.deepcopy(model)
    with torch.no_grad():
        for position in range(6):
            want = eager(torch.tensor([position + 2]), torch.tensor([position])).numpy()
            for name in loaded.state_names:
                if name.endswith("v_cache"):
                    cache = loaded.read_state(name)
                    cache[position + 1:] = np.nan
                    loaded.write_state(name, cache)
            got = decode(np.array([position + 2]), np.array([position]))[0]
            if switch == "1":
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            else:
                assert np.isnan(got).all()


def test_engine_attention_greedy_tokens_equal_eager(monkeypatch):
    model = TinyDecoder(heads=8, kv_heads=2, dim=64, max_len=48).eval()
    decode = load(_decode_program(copy.deepcopy(model), "1", monkeypatch)).method("decode")
    eager = copy.deepcopy(model)

    def one_at_a_time(step):  # the prompt token by token: the static decode takes one
        def run(tokens, positions):
            out = None
            for t, p in zip(tokens.tolist(), positions.tolist()):
                out = step(torch.tensor([t]), torch.tensor([p]))
            return out
        return run

    with torch.no_grad():
        want = greedy_decode(one_at_a_time(lambda t, p: eager(t, p)), [5, 9, 1, 3], 40)
    got = greedy_decode(one_at_a_time(lambda t, p: decode(t.numpy(), p.numpy())[0]),
                        [5, 9, 1, 3], 40)
    assert got == want


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float16])
def test_lean_filled_attention_equals_eager(cache_dtype):
    """``attend="filled"`` exported (a data-dependent slice of the cache, planned at its
    capacity): lean gives eager's logits and greedy tokens; a float16 cache the same
    model's eager logits with that cache."""
    model = TinyDecoder(attend="filled", cache_dtype=cache_dtype).eval()
    forward = load(export_decoder(copy.deepcopy(model), kernels="portable")).method("forward")
    eager = copy.deepcopy(model)
    prompt = [5, 9, 1, 3, 7]
    with torch.no_grad():
        want = eager(torch.tensor(prompt), torch.arange(5)).numpy()
        got = forward(np.array(prompt), np.arange(5))[0]
        # float32 math in both, NumPy's matmul against torch's: float rounding only
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        eager = copy.deepcopy(model)
        want_tokens = greedy_decode(lambda t, p: eager(t, p), prompt, 12)
    got_tokens = greedy_decode(lambda t, p: forward(t.numpy(), p.numpy())[0], prompt, 12)
    assert got_tokens == want_tokens


def test_filled_attention_equals_capacity_in_eager():
    """The recipe's two attention forms compute the same logits (a masked slot's weight is
    exactly 0), so ``attend="filled"`` changes what is read, not the result."""
    capacity, filled = TinyDecoder().eval(), TinyDecoder(attend="filled").eval()
    with torch.no_grad():
        for tokens, positions in [([1, 2, 3, 4], range(4)), ([5], [4]), ([6], [5])]:
            t, p = torch.tensor(tokens), torch.tensor(list(positions))
            torch.testing.assert_close(filled(t, p), capacity(t, p), rtol=1e-5, atol=1e-5)


def _sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10((ref ** 2).sum() / max(((ref - got) ** 2).sum(), 1e-30)))


@pytest.mark.parametrize("cache_dtype,floor_db", [(torch.float16, 40.0), (torch.bfloat16, 25.0)])
def test_half_cache_accuracy(cache_dtype, floor_db):
    """Logits of a half-precision cache against a float32 one, teacher-forced on the same
    tokens. Floors: float16 keeps 11 significant bits (relative rounding 2^-11, ~66 dB on
    the cached values), bfloat16 8 (2^-8, ~48 dB); attention and the layers after it amplify
    that by a few dB per layer on these random weights, so 40 and 25 dB leave room while a
    cache stored at lower precision (or converted wrongly) lands far below."""
    reference = TinyDecoder(max_len=64).eval()
    half = TinyDecoder(max_len=64, cache_dtype=cache_dtype).eval()
    tokens = [(7 * i + 3) % 64 for i in range(48)]
    with torch.no_grad():
        ref = reference(torch.tensor(tokens[:16]), torch.arange(16)).numpy()
        got = half(torch.tensor(tokens[:16]), torch.arange(16)).numpy()
        refs, gots = [ref], [got]
        for position in range(16, 48):
            t, p = torch.tensor([tokens[position]]), torch.tensor([position])
            refs.append(reference(t, p).numpy())
            gots.append(half(t, p).numpy())
    ref, got = np.concatenate(refs), np.concatenate(gots)
    assert _sqnr_db(ref, got) >= floor_db
    assert (ref.argmax(-1) == got.argmax(-1)).mean() >= 0.9


def test_engine_attention_in_dynamic_prefill():
    """A dynamic prefill (symbolic rows) gets the op too: chunks at later positions (each
    row its own bound) against float64, as the decode test."""
    model = TinyDecoder(max_len=40).eval()
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    program = export(copy.deepcopy(model), (torch.tensor([1, 2, 3]), torch.arange(3)),
                     dynamic_shapes=({0: seq}, {0: seq}), kernels="portable", backends=["cpu"])
    assert _attention_ops(program) == 2
    forward = load(program).method("forward")
    eager32, eager64 = copy.deepcopy(model), copy.deepcopy(model).double()
    with torch.no_grad():
        for tokens, start in [([3, 1, 4, 1, 5], 0), ([9, 2, 6], 5), ([5], 8), ([3, 5, 8, 9], 9)]:
            t, p = torch.tensor(tokens), torch.arange(start, start + len(tokens))
            got = forward(t.numpy(), p.numpy())[0]
            _close(got, eager64(t, p).numpy(), eager32(t, p).numpy())


class _StaticCacheAttention(torch.nn.Module):
    """Attention over a static cache as transformers' static-cache decoders write it (Llama
    and its kin): caches [1, Hkv, S, D] written with ``index_copy_`` at ``cache_position``,
    the KV heads repeated for their groups, and an additive float mask built from the
    positions, ``where(slots <= cache_position[:, None], 0, masked)``, either through
    ``scaled_dot_product_attention`` (transformers' "sdpa": torch decomposes it into scaled
    q and kᵀ, a bmm, the mask added and a safe softmax) or written out ("eager": the scores
    times a scale plus a mask of float32's lowest value, a plain softmax)."""

    def __init__(self, form: str, dim=32, heads=4, kv_heads=2, slots=24, layers=2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.form, self.heads, self.kv_heads, self.size = form, heads, kv_heads, dim // heads
        self.proj = torch.nn.ModuleList(torch.nn.Linear(dim, 3 * dim) for _ in range(layers))
        for i in range(layers):
            self.register_buffer(f"k{i}", torch.zeros(1, kv_heads, slots, self.size))
            self.register_buffer(f"v{i}", torch.zeros(1, kv_heads, slots, self.size))
        self.register_buffer("slots", torch.arange(slots))
        self.layers = layers

    def forward(self, x, cache_position):
        m = x.shape[1]
        masked = float("-inf") if self.form == "sdpa" else torch.finfo(torch.float32).min
        allowed = self.slots[None, None, None, :] <= cache_position[None, None, :, None]
        mask = torch.where(allowed, 0.0, masked)
        for i in range(self.layers):
            q, k, v = self.proj[i](x).view(1, m, 3, self.heads, self.size).unbind(2)
            q = q.transpose(1, 2)
            k_cache, v_cache = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            k_cache.index_copy_(2, cache_position, k[:, :, :self.kv_heads].transpose(1, 2))
            v_cache.index_copy_(2, cache_position, v[:, :, :self.kv_heads].transpose(1, 2))
            group = self.heads // self.kv_heads
            keys = k_cache.repeat_interleave(group, dim=1)
            values = v_cache.repeat_interleave(group, dim=1)
            if self.form == "sdpa":
                out = torch.nn.functional.scaled_dot_product_attention(q, keys, values,
                                                                       attn_mask=mask)
            else:
                scores = q @ keys.transpose(2, 3) * self.size ** -0.5 + mask
                out = torch.softmax(scores, -1) @ values
            x = x + out.transpose(1, 2).flatten(2)
        return x


@pytest.mark.parametrize("form", ["sdpa", "eager"])
def test_engine_attention_float_mask_static_cache(form, monkeypatch):
    """transformers' static-cache attention form (a float mask from the positions, a safe
    softmax under sdpa, float32's lowest as the masked value under eager) gets the op: one
    per layer, against float64 at every position of a decode, and the value-cache slots
    after the position filled with NaN are not read (with the op switched off the matmuls
    over the whole cache give NaN: the check this test can fail on)."""
    model = _StaticCacheAttention(form).eval()
    example = (torch.randn(1, 1, 32), torch.tensor([0]))
    for switch, loaded, eager32, eager64 in _with_and_without_the_op(model, example, monkeypatch):
        gen = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for position in range(20):
                x, p = torch.randn(1, 1, 32, generator=gen), torch.tensor([position])
                ref64, ref32 = eager64(x.double(), p).numpy(), eager32(x, p).numpy()
                for name in loaded.state_names:  # the slots not yet written: NaN
                    if name.split(".")[-1].startswith("v"):
                        cache = loaded.read_state(name)
                        cache[:, :, position + 1:] = np.nan
                        loaded.write_state(name, cache)
                got = loaded.method("forward")(x.numpy(), p.numpy())[0]
                if switch == "1":
                    _close(got, ref64, ref32)
                else:
                    assert np.isnan(got).all()


def test_engine_attention_float_mask_prefill_rows(monkeypatch):
    """A dynamic prefill of the float-mask form: each prompt row bounded by its own
    position (chunks at later positions), against float64."""
    monkeypatch.setenv("OPFORGE_CPU_FILLED_ATTENTION", "1")
    model = _StaticCacheAttention("sdpa").eval()
    seq = torch.export.Dim("seq", min=1, max=23)
    program = export(copy.deepcopy(model), (torch.randn(1, 3, 32), torch.arange(3)),
                     dynamic_shapes=({1: seq}, {0: seq}), kernels="portable", backends=["cpu"])
    assert _attention_ops(program) == 2
    forward = load(program).method("forward")
    eager32, eager64 = copy.deepcopy(model), copy.deepcopy(model).double()
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for count, start in [(5, 0), (3, 5), (1, 8), (4, 9)]:
            x, p = torch.randn(1, count, 32, generator=gen), torch.arange(start, start + count)
            got = forward(x.numpy(), p.numpy())[0]
            _close(got, eager64(x.double(), p).numpy(), eager32(x, p).numpy())


def test_engine_attention_transformers_llama_static_cache(monkeypatch):
    """transformers' own static-cache export of a tiny Llama (the recipe
    bench/transformers_decoders.py uses, one token a call): one ``attention`` op per layer,
    logits against the eager wrapper in float32 and float64 at every position, the value
    cache after the position filled with NaN (never read). transformers is not a test
    dependency: run with bench/.venv-external's python to include this."""
    tf = pytest.importorskip("transformers")
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    config = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64, use_cache=True)

    def wrapper(dtype):
        torch.manual_seed(0)
        model = tf.LlamaForCausalLM(config).eval()
        gen = torch.Generator().manual_seed(1234)  # away from the default init's near-ties
        with torch.no_grad():
            for name, p in model.named_parameters():
                norm = "norm" in name
                p.copy_((1.0 if norm else 0.0) + (0.3 if norm else 0.08) * torch.randn(
                    p.shape, generator=gen))
        model.generation_config.cache_implementation = "static"
        model.generation_config.use_cache = True
        return TorchExportableModuleForDecoderOnlyLM(model.to(dtype), batch_size=1,
                                                     max_cache_len=24)

    monkeypatch.setenv("OPFORGE_CPU_FILLED_ATTENTION", "1")
    exported = wrapper(torch.float32).export(input_ids=torch.tensor([[1]]),
                                             cache_position=torch.tensor([0]))
    program = export(exported, backends=["cpu"])
    assert _attention_ops(program) == 2
    loaded = load(program)
    eager32, eager64 = wrapper(torch.float32), wrapper(torch.float64)
    with torch.no_grad():
        for position, token in enumerate([1, 17, 5, 42, 9, 3, 77, 100, 31, 8, 64, 2]):
            t, p = torch.tensor([[token]]), torch.tensor([position])
            # (the wrapper's own forward drops cache_position; its static-cache module takes it)
            ref32 = eager32.model(input_ids=t, cache_position=p).numpy()
            ref64 = eager64.model(input_ids=t, cache_position=p).numpy()
            for name in loaded.state_names:
                if "value_cache" in name:
                    cache = loaded.read_state(name)
                    cache[..., position + 1:, :] = np.nan
                    loaded.write_state(name, cache)
            got = loaded.method("forward")(t.numpy(), p.numpy())[0]
            _close(got, ref64, ref32)


class _MaskInputAttention(_StaticCacheAttention):
    """The mask made outside the graph (as a delegate boundary leaves it: transformers'
    dynamic export splits its program, the later layers' delegates receive the mask): a
    float mask added to the scores, or a bool mask under ``where(mask, 0, -inf)``."""

    def forward(self, x, cache_position, mask):
        m = x.shape[1]
        if mask.dtype == torch.bool:
            mask = torch.where(mask, 0.0, float("-inf"))
        for i in range(self.layers):
            q, k, v = self.proj[i](x).view(1, m, 3, self.heads, self.size).unbind(2)
            k_cache, v_cache = getattr(self, f"k{i}"), getattr(self, f"v{i}")
            k_cache.index_copy_(2, cache_position, k[:, :, :self.kv_heads].transpose(1, 2))
            v_cache.index_copy_(2, cache_position, v[:, :, :self.kv_heads].transpose(1, 2))
            group = self.heads // self.kv_heads
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k_cache.repeat_interleave(group, dim=1),
                v_cache.repeat_interleave(group, dim=1), attn_mask=mask)
            x = x + out.transpose(1, 2).flatten(2)
        return x


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_engine_attention_reads_a_mask_input(dtype, monkeypatch):
    """A mask the graph cannot explain: the op reads it, stops at each row's last attended
    slot (the NaN after it never read; the masked matmuls give NaN) and applies it before
    that (a hole at slot 1: its score -inf, as eager's). Against float64 over a decode."""
    model = _MaskInputAttention("sdpa").eval()
    slots = model.slots.numel()

    def mask_at(position):
        allowed = torch.arange(slots)[None, None, None, :] <= position
        allowed[..., 1] &= position < 3  # a hole at slot 1 from position 3 on
        return allowed if dtype == torch.bool else torch.where(allowed, 0.0, float("-inf"))

    example = (torch.randn(1, 1, 32), torch.tensor([0]), mask_at(0))
    for switch, loaded, eager32, eager64 in _with_and_without_the_op(model, example, monkeypatch):
        gen = torch.Generator().manual_seed(3)
        with torch.no_grad():
            for position in range(12):
                x, p, mask = torch.randn(1, 1, 32, generator=gen), torch.tensor([position]), \
                    mask_at(position)
                ref32 = eager32(x, p, mask).numpy()
                ref64 = eager64(x.double(), p, mask if dtype == torch.bool else mask.double()).numpy()
                for name in loaded.state_names:
                    if name.split(".")[-1].startswith("v"):
                        cache = loaded.read_state(name)
                        cache[:, :, position + 1:] = np.nan
                        loaded.write_state(name, cache)
                got = loaded.method("forward")(x.numpy(), p.numpy(), mask.numpy())[0]
                if switch == "1":
                    _close(got, ref64, ref32)
                else:
                    assert np.isnan(got).all()


@pytest.mark.parametrize("empty", [0, 1, 2])
def test_engine_attention_empty_rows(empty):
    """A hand-built plan: rows whose bound leaves no slot (a negative position, a mask row
    with nothing attended) give what torch gives for that form — NaN (a softmax of -inf),
    zeros (the safe softmax), the mean of every value row (a mask of float32's lowest) —
    and the other rows the masked attention (float64 reference)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import test_cpu_hostile_plans as hostile

    H, Hkv, M, S, D = 4, 2, 3, 6, 5
    rng = np.random.default_rng(empty)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in
               ((H, M, D), (Hkv, S, D), (Hkv, S, D)))
    positions = np.array([-1, 2, 9], np.int64)  # none, slots 0..2, every slot
    mask = np.arange(S)[None, :] <= positions[:, None]
    rep = lambda a: np.repeat(a.astype(np.float64), H // Hkv, axis=0)  # noqa: E731
    scores = np.einsum("hmd,hsd->hms", q.astype(np.float64), rep(k)) / 2.0
    scores = np.where(mask[None], scores, -np.inf)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        want = (weights / weights.sum(-1, keepdims=True)) @ rep(v)
    want[:, 0] = {0: np.nan, 1: 0.0, 2: rep(v).mean(1)[:, None, :][:, 0]}[empty]
    for source in (0, 1):  # the positions, or the bool mask read at run time
        p = hostile.Plan()
        ins = [p.tensor(hostile.F32, (H, M, D), role="input"),
               p.tensor(hostile.F32, (Hkv, S, D), role="input"),
               p.tensor(hostile.F32, (Hkv, S, D), role="input"),
               p.tensor(hostile.I64 if source == 0 else hostile.BOOL,
                        (M,) if source == 0 else (M, S), role="input")]
        out = p.tensor(hostile.F32, (H, M, D), role="output")
        p.op("attention", ins, [out], ia=[0, empty, 1, source], fa=[2.0])
        got = hostile.run(p.handle(), q, k, v, positions if source == 0 else mask)[0]
        # float32 sums against float64: a few float32 roundings of values of order 1
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)
