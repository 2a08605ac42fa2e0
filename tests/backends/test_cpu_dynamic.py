"""Dynamic shapes inside cpu delegates (docs/backend-cpu.md, "Dynamic shapes"): a dynamic
method's delegate is lowered once with symbolic sizes, its blob carries size expressions,
and the backend builds one engine per call shape, cached (least recently used evicted).

Sizes are swept over the classes that break lowerings: the minimum (1, where size-1 dims
get other strides), primes, and the maximum; one past the maximum is refused by the
runtime. Results are compared with float64 eager: the layers here sum at most 128 float32
products of values of order 1 (layer norm outputs, weights of order 0.1-0.3), so the error
bound is a few hundred float32 ulps of 1 (1e-4 absolute), and a wrong stride or offset
gives errors of order 1.
"""

from __future__ import annotations

import copy
import json
import struct
import zlib

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.errors import BackendError, KernelError, ProgramError
from opforge.export import delegation_report, export
from opforge.program import to_bytes
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

ATOL = 1e-4
MAX_SEQ = 37  # a prime maximum: no size class coincides with a power of two


@pytest.fixture(scope="module")
def layer():
    from opforge.examples.zoo import transformer_layer

    model, (x,) = transformer_layer()
    program = export(model, (x,), dynamic_shapes=({1: Dim("seq", min=1, max=MAX_SEQ)},),
                     backends=["cpu"])
    return model, program


def _eager64(model, x):
    with torch.no_grad():
        return copy.deepcopy(model).double()(torch.as_tensor(x).double()).numpy()


def test_transformer_layer_is_one_delegate(layer):
    report = delegation_report(layer[1])["forward"]
    assert report["rejected"] == []
    assert len(report["delegates"]) == 1


@pytest.mark.parametrize("seq", [1, 2, 13, 31, MAX_SEQ])
def test_transformer_layer_matches_float64_at_each_size(layer, seq):
    model, program = layer
    method = load(program).method("forward")
    x = torch.randn(2, seq, 64, generator=torch.Generator().manual_seed(seq)) * 1.7
    out = method(x.numpy())[0]
    assert out.shape == (2, seq, 64)
    np.testing.assert_allclose(out, _eager64(model, x), atol=ATOL, rtol=0)


def test_one_past_the_maximum_is_refused_by_the_runtime(layer):
    method = load(layer[1]).method("forward")
    with pytest.raises(ProgramError, match=rf"symbol seq in \[1, {MAX_SEQ}\]"):
        method(np.zeros((2, MAX_SEQ + 1, 64), np.float32))


def test_shapes_alternate_and_the_cache_evicts_least_recently_used(layer):
    model, program = layer
    loaded = load(program)
    method = loaded.method("forward")
    handle = next(h for h in loaded.delegates.handles if h is not None)
    assert handle.capacity == 8
    sizes = [3, 5, 7, 11, 13, 17, 19, 23, 29, 31]  # ten shapes: the first two are evicted
    xs = {s: torch.randn(2, s, 64, generator=torch.Generator().manual_seed(100 + s))
          for s in sizes}
    for s in sizes:
        method(xs[s].numpy())
    stats = handle.stats()
    assert (stats["shapes"], stats["misses"], stats["evictions"]) == (8, 10, 2)
    assert (("seq", 3),) not in handle.engines and (("seq", 31),) in handle.engines
    # the method still holds its binding at seq 3: its engine is rebuilt, not used freed
    out = method(xs[3].numpy())[0]
    np.testing.assert_allclose(out, _eager64(model, xs[3]), atol=ATOL, rtol=0)
    assert handle.stats()["misses"] == 11 and (("seq", 3),) in handle.engines
    assert (("seq", 5),) not in handle.engines  # now the least recently used one
    hits = handle.stats()["hits"]
    method(xs[31].numpy())
    assert handle.stats()["hits"] == hits + 1 and handle.stats()["misses"] == 11


def test_engines_of_all_shapes_share_the_reordered_weights(layer):
    """Each weight is reordered once per layout and delegate, not once per shape: the
    weight cache holds the layer's reordered weights after the first shape, and no more
    after four. (A shape of at most 8 rows, 2 × 2 here, multiplies on the engine's own
    kernel, whose layout of a small weight is a second one, small_matmul.cpp: it is held
    once too, whichever shapes come after it.)"""
    loaded = load(layer[1])
    method = loaded.method("forward")
    handle = next(h for h in loaded.delegates.handles if h is not None)
    method(np.ones((2, 6, 64), np.float32))
    shared = handle.stats()["shared_weight_bytes"]
    weights = 4 * (3 * 64 * 64 + 64 * 64 + 2 * 64 * 128)  # in_proj, out_proj, linear1/2
    assert 4 * 64 * 128 <= shared <= 2 * weights  # at least one FFN matrix
    for seq in (9, 30):
        method(np.ones((2, seq, 64), np.float32))
    assert handle.stats()["shapes"] == 3 and handle.stats()["shared_weight_bytes"] == shared
    method(np.ones((2, 2, 64), np.float32))  # 4 rows: the own kernel's layouts, once
    few_rows = handle.stats()["shared_weight_bytes"]
    assert few_rows <= shared + 2 * weights
    for seq in (3, 2, 4):
        method(np.ones((2, seq, 64), np.float32))
    assert handle.stats()["shapes"] == 6 and handle.stats()["shared_weight_bytes"] == few_rows


def test_profile_prints_the_cache_hit_rate(layer, monkeypatch, capfd):
    monkeypatch.setenv("OPFORGE_CPU_PROFILE", "1")
    loaded = load(layer[1])
    method = loaded.method("forward")
    for s in (4, 4, 4, 9):
        method(np.ones((2, s, 64), np.float32))
    loaded.delegates.close()
    err = capfd.readouterr().err
    assert "dynamic delegate shape cache: 2 hits, 2 misses (hit rate 50.0%), 0 evictions, " \
        "2/8 shapes cached" in err


def test_decoder_prefill_and_greedy_decode_match_eager():
    from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode

    model = TinyDecoder(max_len=29, seed=3).eval()
    program = export_decoder(model, backends=["cpu"])
    report = delegation_report(program)["forward"]
    # one delegate: the cache writes (index_put, in place in the state) and the rotary table
    # lookups (index.Tensor) take the prompt's length as a symbolic size too
    assert not report["rejected"], report["rejected"]
    assert len(report["delegates"]) == 1 and report["delegates"][0]["nodes"] > 150
    assert report["delegates"][0]["ops"].count("aten::index_put.default") == 4
    loaded = load(program)
    method = loaded.method("forward")
    for seq in (1, 2, 17, 29):
        loaded.reset_state()
        tokens = torch.randint(0, 64, (seq,), generator=torch.Generator().manual_seed(seq))
        positions = torch.arange(seq)
        fresh = copy.deepcopy(model).double()
        with torch.no_grad():
            ref = fresh(tokens, positions).numpy()
        out = method(tokens.numpy(), positions.numpy())[0]
        np.testing.assert_allclose(out, ref, atol=ATOL * 10, rtol=0)  # 2 layers, logits ~10
    with pytest.raises(ProgramError, match=r"symbol seq in \[1, 29\]"):
        method(np.zeros(30, np.int64), np.arange(30))
    # a prompt whose positions run past the cache: refused in the engine before any row of
    # any cache is written (the gather of the rotary tables checks them first)
    loaded.reset_state()
    method(np.arange(3), np.arange(3))
    before = {name: loaded.read_state(name) for name in loaded.state_names}
    with pytest.raises(KernelError, match=r"valid: \[-29, 28\]"):
        method(np.arange(4), np.array([26, 27, 28, 29]))
    for name, value in before.items():
        np.testing.assert_array_equal(loaded.read_state(name), value)
    for prompt in ([5, 1, 9], [7] * 11):
        loaded.reset_state()
        eager = greedy_decode(lambda t, p: copy.deepcopy(model)(t, p), prompt, 1)
        got = greedy_decode(lambda t, p: method(t.numpy(), p.numpy())[0], prompt, 1)
        assert got == eager
    loaded.reset_state()
    stepper = copy.deepcopy(model)
    expected = greedy_decode(lambda t, p: stepper(t, p), [3, 1, 4, 1, 5], 9)
    assert greedy_decode(lambda t, p: method(t.numpy(), p.numpy())[0], [3, 1, 4, 1, 5], 9) == expected


# --- hostile dynamic blobs: refused at load or bind, before an engine touches memory ----------

def _dynamic_blob():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    program = export(model, (torch.randn(5, 4),), dynamic_shapes=({0: Dim("rows", min=1, max=9)},),
                     backends=["cpu"])
    return bytes(program.segments[program.delegates[0].segment].data)


def _reseal(data: bytes, edit) -> bytes:
    magic, version, plan_len, data_len, _, reserved = blob.HEADER.unpack_from(data, 0)
    doc = json.loads(data[blob.HEADER.size:blob.HEADER.size + plan_len])
    edit(doc)
    start = (blob.HEADER.size + plan_len + 63) // 64 * 64
    consts = data[start:start + data_len]
    text = json.dumps(doc).encode()
    pad = bytes((blob.HEADER.size + len(text) + 63) // 64 * 64 - blob.HEADER.size - len(text))
    return blob.HEADER.pack(magic, version, len(text), len(consts),
                            zlib.crc32(text + consts), reserved) + text + pad + consts


def _first_symbolic_dim(doc):
    return next(t for t in doc["tensors"] if any(type(d) is str for d in t["dims"]))


def _set_dim(text):
    def edit(doc):
        t = _first_symbolic_dim(doc)
        t["dims"][[type(d) for d in t["dims"]].index(str)] = text
    return edit


HOSTILE = {
    "syntax": (_set_dim("((rows +"), "does not parse"),
    "deep": (_set_dim("(" * 20 + "rows" + " + 1)" * 20), "does not parse"),
    "undefined symbol": (_set_dim("(rows + zz)"), r"undefined symbol\(s\) \['zz'\]"),
    "overflowing size": (_set_dim("(((rows * rows) * rows) * 4611686018427387904)"), "outside"),
    "huge symbol range": (lambda doc: doc["symbols"][0].__setitem__(2, 1 << 41), "range"),
    "negative stride": (lambda doc: _first_symbolic_dim(doc)["strides"].__setitem__(0, "(0 - rows)"),
                        "outside"),
    "unbound symbol": (lambda doc: doc["symbols"].append(["extra", 1, 4])
                       or doc["ops"][0]["ia"].append("extra"), "no input dimension binds"),
    "no symbols": (lambda doc: doc.__setitem__("symbols", []), "symbols"),
    "symbol twice": (lambda doc: doc["symbols"].append(list(doc["symbols"][0])), "twice"),
    # found by the blob fuzzer: a rank change the plan is made concrete through
    "rank mismatch": (lambda doc: _first_symbolic_dim(doc)["strides"].append(1), "strides"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_dynamic_blob_is_refused_at_parse(case):
    edit, message = HOSTILE[case]
    with pytest.raises(BackendError, match=message):
        blob.parse(memoryview(_reseal(_dynamic_blob(), edit)))


def _handle(data, named=None):
    from opforge.backends.base import BackendContext
    from opforge.backends.cpu import CpuBackend

    backend = CpuBackend()
    specs = {"num_threads": 1, "custom_ops": [], "op_packages": [], "fuse": True, "min_ops": 1}
    return backend, backend.init(memoryview(data), specs,
                                 BackendContext(max_memory=1 << 30, named_data=named))


def test_symbol_values_outside_the_blob_bounds_are_refused_before_an_engine_exists():
    backend, handle = _handle(_dynamic_blob())
    out = np.zeros((10, 3), np.float32)
    with pytest.raises(BackendError, match=r"rows in \[1, 9\]"):
        backend.bind(handle, [np.zeros((10, 4), np.float32)], [out])
    assert handle.stats()["misses"] == 0 and not out.any()
    run = backend.bind(handle, [np.ones((9, 4), np.float32)], [np.zeros((9, 3), np.float32)])
    run()
    with pytest.raises(BackendError, match=r"output 0 is float32\[4, 3\]"):
        backend.bind(handle, [np.ones((9, 4), np.float32)], [np.zeros((4, 3), np.float32)])
    backend.destroy(handle)
    with pytest.raises(BackendError, match="closed"):
        run()


def test_an_alias_leaving_its_storage_at_some_size_is_refused_before_running():
    def edit(doc):  # an alias of the input reaching rows * (rows - 1) + 4 of its 4 * rows elements
        doc["tensors"].append({"dtype": 6, "dims": [1, 4], "strides": [4, 1], "role": "alias",
                               "base": doc["inputs"][0], "offset": "(rows * (rows - 1))"})
    backend, handle = _handle(_reseal(_dynamic_blob(), edit))
    for rows in (1, 4):  # inside its base: runs
        backend.bind(handle, [np.ones((rows, 4), np.float32)], [np.zeros((rows, 3), np.float32)])()
    out = np.zeros((9, 3), np.float32)
    with pytest.raises(BackendError, match="alias outside its base"):
        backend.bind(handle, [np.ones((9, 4), np.float32)], [out])
    assert not out.any()
    backend.destroy(handle)


# --- the lowering's symbolic sizes: decided for every value, or refused --------------------

def test_symdim_decides_only_what_holds_for_every_value():
    import random

    from opforge.backends.cpu.lowering import Unsupported
    from opforge.backends.cpu.lowering.symbolic import SymDim
    from opforge.program.symbolic import SizeExpr

    ranges = {"s": (1, 37), "t": (2, 5)}
    s, t = SymDim.symbol("s", ranges), SymDim.symbol("t", ranges)
    assert s * 64 == 64 * s and (s * t - t * s) == 0 and (s + 3) - s == 3
    assert (s != 0) and (t != 1) and (t > 1) and (s >= 1) and not (s < 1)
    assert (s * 6) // 3 == 2 * s and (s * 6) % 3 == 0 and s // s == 1
    for undecidable in (lambda: s == 1, lambda: s > 1, lambda: s < 37, lambda: s * t == 10,
                        lambda: int(s), lambda: float(s), lambda: s // 2, lambda: s % 5,
                        lambda: t <= 3, lambda: bool(s - 1)):
        with pytest.raises(Unsupported, match=r"the dynamic size .* \(in \["):
            undecidable()
    poly = (s * s * t) * 3 - s * 7 + 11
    expr = SizeExpr.parse(str(poly.expr()))
    assert expr.bounds(ranges) == poly.bounds()
    rng = random.Random(5)
    for _ in range(50):
        env = {"s": rng.randint(1, 37), "t": rng.randint(2, 5)}
        assert expr.evaluate(env) == 3 * env["s"] ** 2 * env["t"] - 7 * env["s"] + 11


class _Squeeze(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.squeeze(1)) * 2.0


@pytest.mark.parametrize("low", [1, 2])
def test_a_decision_on_a_symbolic_size_refuses_the_node_naming_it(low):
    """squeeze(1) of a dim that may be 1 depends on the size: refused, never specialised
    at the example (3); with min 2 it is decided (no squeeze) and delegated."""
    x = torch.randn(4, 3, 5)
    program = export(_Squeeze(), (x,), dynamic_shapes=({1: Dim("n", min=low, max=9)},),
                     backends=["cpu"])
    report = delegation_report(program)["forward"]
    squeeze = [r for r in report["rejected"] if r["op"].startswith("aten::squeeze")]
    if low == 1:
        assert squeeze and "the dynamic size n (in [1, 9])" in squeeze[0]["reason"]
    else:
        assert not squeeze
    # against the same export on the kernels: torch.export itself took the squeeze of a
    # dynamic dim as a no-op, so at n = 1 eager (which squeezes) is not the reference
    lean = load(export(_Squeeze(), (x,), dynamic_shapes=({1: Dim("n", min=low, max=9)},)))
    method = load(program).method("forward")
    for n in ([1] if low == 1 else []) + [2, 7, 9]:
        xn = torch.randn(4, n, 5).numpy()
        np.testing.assert_allclose(method(xn)[0], lean.method("forward")(xn)[0], rtol=1e-6)


def test_the_memory_limit_holds_for_all_cached_engines(layer):
    """The engines of all shapes and their shared weights stay within the delegate's memory
    limit: a build over it evicts the least recently used engine first, and only a shape
    that does not fit alone is refused."""
    model, program = layer
    from opforge.backends.named_data import NamedDataMap

    data = bytes(program.segments[program.delegates[0].segment].data)
    named = NamedDataMap(program)  # the layer's weights are stored in the program by name
    backend, probe = _handle(data, named)
    x30 = torch.randn(2, 30, 64)
    backend.bind(probe, [x30.numpy()], [np.zeros((2, 30, 64), np.float32)])()
    one = next(iter(probe.engines.values())).own_bytes
    shared = probe.stats()["shared_weight_bytes"]
    backend.destroy(probe)
    assert one > 0 and shared > 0

    from opforge.backends.base import BackendContext

    specs = {"num_threads": 1, "custom_ops": [], "op_packages": [], "fuse": True, "min_ops": 1}
    limited = backend.init(memoryview(data), specs,
                           BackendContext(max_memory=shared + 2 * one + one // 2,
                                          named_data=named))
    for seq in (30, 29, 28, 30):  # about the same size each: two fit, the third evicts
        x = torch.randn(2, seq, 64, generator=torch.Generator().manual_seed(seq))
        out = np.zeros((2, seq, 64), np.float32)
        backend.bind(limited, [x.numpy()], [out])()
        np.testing.assert_allclose(out, _eager64(model, x), atol=ATOL, rtol=0)
        assert limited.stats()["shared_weight_bytes"] + sum(
            h.own_bytes for h in limited.engines.values()) <= shared + 2 * one + one // 2
    assert limited.stats()["shapes"] == 2 and limited.stats()["evictions"] == 2
    backend.destroy(limited)
    tiny = backend.init(memoryview(data), specs,
                        BackendContext(max_memory=shared // 2, named_data=named))
    with pytest.raises(BackendError, match="memory limit"):
        backend.bind(tiny, [x30.numpy()], [np.zeros((2, 30, 64), np.float32)])
    backend.destroy(tiny)


def test_a_size_whose_bounds_leave_the_blob_range_refuses_the_node():
    """A size n - 3 with n in [1, 8] may be negative as an expression: the lowering refuses
    the node that makes it (the blob's load would refuse the blob, the same bounds of the
    same text), and so a size past 2^40."""
    from opforge.backends.cpu.lowering import Unsupported
    from opforge.backends.cpu.lowering.symbolic import SymDim, in_range

    ranges = {"n": (1, 8)}
    n = SymDim.symbol("n", ranges)
    in_range([n - 1, 4 * n, 7], 0, 1 << 40)
    with pytest.raises(Unsupported, match=r"\(n - 3\) spans \[-2, 5\]"):
        in_range([n - 3], 0, 1 << 40)
    with pytest.raises(Unsupported, match="outside"):
        in_range([n * (1 << 40)], 0, 1 << 40)
