"""float16 / bfloat16 KV caches on the cpu backend (issue 46 item 4).

The engine stores a half-precision cache as it is (F16, BF16 state tensors): the cache write
rounds the float32 rows into it (native/indexing.cpp, half.h: to nearest even, as torch's
``.to()``), and the attention op reads the filled slots back as float32 (attention.cpp).

- the write's bits against torch's conversion of the same float32 values (ties, overflow,
  subnormals, signed zeros), with the engine's vector conversions and with its portable
  scalar ones (OPFORGE_CPU_CAPABILITY=default): both must give torch's bits;
- a TinyDecoder with a float16 cache (the Python runtime) and with either cache
  (``executor="native"``, the only runtime that holds bfloat16): prefill and decode logits
  against the same program without the backend, greedy tokens equal;
- NaN poisoned into the slots after the position: never read.
bfloat16 has no NumPy dtype: the native runtime hands its values over as raw uint16 bits.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from opforge.backends.cpu import blob
from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.runtime import load

pytest.importorskip("opforge.backends.cpu.engine")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_cpu_hostile_plans as hostile  # noqa: E402

from opforge.errors import BackendError  # noqa: E402

HALF = [torch.float16, torch.bfloat16]
F16, BF16 = 5, 15


def _bits(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array).view(np.uint16)


def _ops(program) -> list[str]:
    return [op["kind"] for d in program.delegates
            for op in blob.parse(memoryview(bytes(program.segments[d.segment].data)))[0]["ops"]]


def _load(program, dtype):
    # bfloat16 runs only in the native runtime (no NumPy dtype for the Python runtime's state)
    return load(program, executor="native") if dtype is torch.bfloat16 else load(program)


class _Write(torch.nn.Module):
    """The cache write alone: ``index_copy_`` of float32 rows converted to the cache's dtype."""

    def __init__(self, dtype) -> None:
        super().__init__()
        self.register_buffer("cache", torch.zeros(6, 64, dtype=dtype))

    def forward(self, x, positions):
        self.cache.index_copy_(0, positions, x.to(self.cache.dtype))
        return x + 1


def _rounding_cases(dtype) -> torch.Tensor:
    """float32 values where rounding decides: exact ties either way (to even), a bit above
    and below a tie, overflow to inf (float16), subnormals and their ties, ±0, ±inf, and
    random values over many magnitudes."""
    info = torch.finfo(dtype)
    ulp = info.eps  # at 1.0
    tiny = info.smallest_normal
    sub = tiny * ulp  # the smallest subnormal step
    values = [1 + ulp / 2, 1 + 3 * ulp / 2, 1 + ulp / 2 + 2 ** -23, 1 + ulp / 2 - 2 ** -23,
              -(1 + ulp / 2), 2 - ulp / 4, info.max, info.max * (1 + ulp / 4),
              info.max * (1 + ulp / 2), tiny, tiny * (1 - ulp / 2), sub / 2, 3 * sub / 2,
              sub * 0.49, sub * 0.51, -sub * 2.5, 0.0, -0.0, float("inf"), float("-inf")]
    rng = np.random.default_rng(7)
    spread = rng.standard_normal(256 - len(values)) * 10.0 ** rng.integers(-9, 6, 256 - len(values))
    out = torch.tensor([*values, *spread.tolist()], dtype=torch.float32)
    assert torch.isfinite(out[:6]).all()
    return out.reshape(4, 64)


@pytest.mark.parametrize("capability", ["native", "default"])
@pytest.mark.parametrize("dtype", HALF)
def test_cache_write_rounds_as_torch(dtype, capability, monkeypatch):
    """The engine's write stores torch's bits for every case (the vector conversion, and the
    portable scalar one with OPFORGE_CPU_CAPABILITY=default). Truncating instead of rounding
    to nearest even, or a wrong tie, overflow or subnormal, fails here."""
    if capability == "default":
        monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    model = _Write(dtype).eval()
    example = (torch.zeros(4, 64), torch.tensor([0, 1, 2, 3]))
    program = export(copy.deepcopy(model), example, kernels="portable", backends=["cpu"])
    assert "index_put" in _ops(program) or "index_copy" in _ops(program)
    assert len(program.delegates) == 1
    x = _rounding_cases(dtype)
    positions = np.array([4, 0, 5, 2])
    want = model.cache.clone()
    want.index_copy_(0, torch.from_numpy(positions), x.to(dtype))
    # bfloat16: the native runtime only; float16: the Python runtime and the native one
    runtimes = ["native"] if dtype is torch.bfloat16 else ["lean", "native"]
    for executor in runtimes:
        loaded = load(program, executor=executor)
        loaded.method("forward")(x.numpy(), positions)
        got = _bits(loaded.read_state("cache"))
        np.testing.assert_array_equal(got, want.view(torch.int16).numpy().view(np.uint16),
                                      err_msg=executor)


def test_other_readers_of_a_half_cache_stay_on_the_kernels():
    """The write goes to the engine; a reader of the float16 cache other than the attention
    op (here its cast to float32 for a sum) stays on the kernels, and the refusal says why."""
    from opforge.backends.report import delegation_report

    class Reader(_Write):
        def forward(self, x, positions):
            self.cache.index_copy_(0, positions, x.to(self.cache.dtype))
            return self.cache.float().sum(0) + x.sum(0)

    program = export(Reader(torch.float16).eval(), (torch.zeros(2, 64), torch.tensor([0, 1])),
                     kernels="portable", backends=["cpu"])
    report = delegation_report(program)["forward"]
    assert any("aten::index_put.default" in d["ops"] for d in report["delegates"])
    refused = [r for r in report["rejected"] if r["op"] == "aten::_to_copy.default"]
    assert refused and refused[0]["kind"] == "dtype" and "float16" in refused[0]["reason"]
    loaded = load(program)
    x = np.arange(128, dtype=np.float32).reshape(2, 64) / 7
    got = loaded.method("forward")(x, np.array([3, 1]))[0]
    want = Reader(torch.float16).eval()(torch.from_numpy(x), torch.tensor([3, 1]))
    np.testing.assert_allclose(got, want.detach().numpy(), rtol=1e-6)


@pytest.mark.parametrize("dtype", HALF)
def test_half_cache_decoder_on_the_engine(dtype):
    """Prefill and 24 decode steps: the cpu program's logits against the same model exported
    without the backend (its portable kernels convert with torch's rounding too), greedy
    tokens equal. Both store the same half-precision values except where a float32 key or
    value, computed in another summation order, lies within an ulp of a rounding tie and
    rounds to the neighbouring half value (seen once in ~20 steps): a difference of one
    half ulp in one slot. The bound is a tenth of what storing the cache at half precision
    moves the logits (against the same weights with a float32 cache): a cache read wrong
    (another slot, a truncated or unconverted value) moves them by that much or more."""
    model = TinyDecoder(max_len=48, cache_dtype=dtype).eval()
    program = export_decoder(copy.deepcopy(model), kernels="portable", backends=["cpu"])
    ops = _ops(program)
    assert len(program.delegates) == 1 and ops.count("attention") == 2, ops
    cpu = _load(program, dtype).method("forward")
    ref = _load(export_decoder(copy.deepcopy(model), kernels="portable"), dtype).method("forward")
    f32 = TinyDecoder(max_len=48).eval()
    f32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    steps = [([5, 9, 1, 3, 7], range(5))] + [([(7 * p) % 64], [p]) for p in range(5, 29)]
    errors, storage = [], []
    with torch.no_grad():
        for tokens, positions in steps:
            t, p = np.array(tokens), np.array(list(positions))
            got, want = cpu(t, p)[0], ref(t, p)[0]
            errors.append(np.abs(got - want).max())
            storage.append(np.abs(want - f32(torch.from_numpy(t), torch.from_numpy(p)).numpy()).max())
    assert max(storage) > 0  # (the half cache does round: the bound below means something)
    assert max(errors) <= 0.1 * max(storage), (max(errors), max(storage))
    cpu = _load(program, dtype).method("forward")
    ref = _load(export_decoder(copy.deepcopy(model), kernels="portable"), dtype).method("forward")
    want = greedy_decode(lambda t, p: ref(t.numpy(), p.numpy())[0], [5, 9, 1, 3], 24)
    assert greedy_decode(lambda t, p: cpu(t.numpy(), p.numpy())[0], [5, 9, 1, 3], 24) == want


@pytest.mark.parametrize("capability", ["native", "default"])
def test_half_cache_slots_after_the_position_unread(capability, monkeypatch):
    """NaN in every value-cache slot after the position (float16): the op reads only the
    filled slots, so the logits equal those of a run whose slots there hold zeros. Both of
    its ways to read a half-precision slot: converted in registers (AVX-512) and converted
    64 rows at a time (OPFORGE_CPU_CAPABILITY=default, or a CPU without AVX-512): the two
    runs' logits must agree with the float32-computed reference as well."""
    if capability == "default":
        monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    model = TinyDecoder(max_len=32, cache_dtype=torch.float16).eval()
    program = export(None, methods={"decode": (copy.deepcopy(model),
                                               (torch.tensor([1]), torch.tensor([0])))},
                     kernels="portable", backends=["cpu"])
    assert _ops(program).count("attention") == 2
    poisoned, clean = load(program), load(program)
    for position in range(6):
        t, p = np.array([position + 2]), np.array([position])
        for name in poisoned.state_names:
            if name.endswith("v_cache"):
                cache = poisoned.read_state(name)
                cache[position + 1:] = np.nan
                poisoned.write_state(name, cache)
        got = poisoned.method("decode")(t, p)[0]
        want = clean.method("decode")(t, p)[0]
        np.testing.assert_array_equal(got, want)  # the same program and values: same bits
        with torch.no_grad():  # eager, the same float16 cache: float32 summation order only
            eager = model(torch.from_numpy(t), torch.from_numpy(p)).numpy()
        np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("code", [F16, BF16])
def test_engine_refuses_half_tensors_outside_the_cache_ops(code):
    """Plans written by hand: a copy or an elementwise op on a float16/bfloat16 tensor is
    refused at load with the reason (their loops have no half-precision arithmetic, so
    they would compute zeros); so are a cache write of values neither the cache's dtype nor
    float32, and an attention whose K and V differ in dtype."""
    plan = hostile.Plan()
    x = plan.tensor(code, [4, 8], role="input")
    y = plan.tensor(hostile.F32, [4, 8], role="output")
    plan.op("copy", [x], [y], hostile.copy_ia([4, 8], [8, 1], 0, [8, 1], 0))
    with pytest.raises(BackendError, match="float16 or bfloat16 operand"):
        plan.handle()

    plan = hostile.Plan()  # values of a third dtype: refused by the write's contract
    cache = plan.tensor(code, [1, 6, 8], role="input")
    ix = plan.tensor(hostile.I64, [2], role="input")
    values = plan.tensor(hostile.I32, [1, 2, 8], role="input")
    out = plan.tensor(code, [1, 6, 8], role="output")
    plan.op("index_put", [cache, ix, values], [out])
    with pytest.raises(BackendError, match="one dtype"):
        plan.handle()

    plan = hostile.Plan()
    q = plan.tensor(hostile.F32, [2, 1, 8], role="input")
    k = plan.tensor(code, [1, 6, 8], role="input")
    v = plan.tensor(hostile.F32, [1, 6, 8], role="input")
    pos = plan.tensor(hostile.I64, [1], role="input")
    o = plan.tensor(hostile.F32, [2, 1, 8], role="output")
    plan.op("attention", [q, k, v, pos], [o], ia=[0], fa=[1.0])
    with pytest.raises(BackendError, match="k and v must be of one dtype"):
        plan.handle()
