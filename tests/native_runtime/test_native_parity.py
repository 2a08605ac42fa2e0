"""executor='native' against executor='lean' on whole programs: the fast subset of
bench/native_parity.py (which runs every zoo model, the transformers decoders and more).

- the bundled decoder exported with a static one-token call and with a dynamic sequence:
  the same greedy tokens (opforge.runtime.generate on both) and the same prefill logits;
- one 8a8w and one 16a4w program: the same outputs.

Each on portable kernels (C++ kernels against NumPy ones) and with cpu delegates (the same
engine from C and from Python). Tolerances: cpu-delegated programs and the quantized
programs on portable kernels run the same arithmetic (integer Q/DQ, the same engine), so
they must give the same bits; float programs on portable kernels sum their matmuls and
reductions in another order than NumPy's BLAS, float32 rounding of O(1) logits over two
layers: rtol/atol 1e-5 (a wrong kernel moves them by O(0.1)).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opforge.runtime import load  # noqa: E402
from opforge.runtime.generate import Generator  # noqa: E402

PROMPT = [3, 14, 15, 9, 2, 6]


def _backends(executor: str) -> list[str]:
    if executor == "portable":
        return []
    from opforge.backends.cpu import engine

    if engine.missing():
        pytest.skip(f"cpu backend unavailable: {engine.missing()}")
    return ["cpu"]


def _decoder():
    from opforge.examples.decoder import TinyDecoder

    return TinyDecoder(vocab=64, dim=32, heads=4, kv_heads=2, hidden=64, layers=2, max_len=32,
                       seed=11).eval()


def _export_decoder(kind: str, backends: list[str]):
    from opforge.examples.decoder import export_decoder
    from opforge.export import export

    model = _decoder()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if kind == "dynamic":
            return export_decoder(model, backends=backends)
        return export(model, (torch.tensor([1]), torch.tensor([0])), backends=backends)


def _same(want, got, exact: bool) -> None:
    for w, g in zip(want, got):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype
        if exact:
            assert g.tobytes() == w.tobytes()
        else:
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("executor", ["portable", "cpu"])
@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_decoder_greedy_tokens_and_logits(kind, executor):
    program = _export_decoder(kind, _backends(executor))
    lean, native = load(program), load(program, executor="native")
    tokens = {}
    for label, loaded in (("lean", lean), ("native", native)):
        tokens[label] = Generator(loaded).generate(PROMPT, 10).tokens
    assert tokens["native"] == tokens["lean"] and len(tokens["lean"]) == 10
    # one call's logits (the whole prompt at once where the method takes it), from a fresh cache
    seq = len(PROMPT) if kind == "dynamic" else 1
    inputs = (np.array(PROMPT[:seq], np.int64), np.arange(seq, dtype=np.int64))
    lean.reset_state()
    native.reset_state()
    want = [np.array(o) for o in lean.method("forward")(*inputs)]
    got = native.method("forward")(*inputs)
    _same(want, got, exact=executor == "cpu")


@pytest.mark.parametrize("executor", ["portable", "cpu"])
@pytest.mark.parametrize("scheme", ["8a8w", "16a4w"])
def test_quantized_program_outputs(scheme, executor):
    from opforge.examples.zoo import ZOO
    from tests.quantize.quantize_support import quantized_zoo

    backends = _backends(executor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = quantized_zoo("mlp", scheme).export(backends=backends)
    inputs = [x.numpy() for x in ZOO["mlp"]()[1]]
    want = load(program).method("forward")(*inputs)
    got = load(program, executor="native").method("forward")(*inputs)
    _same(want, got, exact=True)


def test_symbolic_int_list_with_an_inferred_dim():
    """A view's size list ``[1, s, -1, 16]`` is a symbolic int list holding -1 (transformers'
    attention reshapes export this way): the native runtime refused every call ("size
    expression -1 — cannot be evaluated") while only tensor sizes must be >= 0."""

    class Heads(torch.nn.Module):
        def forward(self, x):
            return (x.view(1, x.shape[0], -1, 16) * 2).transpose(1, 2)

    seq = torch.export.Dim("seq", min=1, max=8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from opforge.export import export

        program = export(Heads(), (torch.randn(3, 64),), dynamic_shapes=({0: seq},))
    lists = [sv for sv in program.methods[0].symbolic_values
             if type(program.methods[0].values[sv.value]).__name__ == "IntListValue"]
    assert any(str(e) == "-1" for sv in lists for e in sv.exprs)  # the case this test is about
    native = load(program, executor="native").method("forward")
    # shapes again after others: the binding's staged inputs and output views per shape
    for n in (5, 1, 8, 5, 1):
        x = np.random.default_rng(n).standard_normal((n, 64)).astype(np.float32)
        (want,) = load(program).method("forward")(x)
        (got,) = native(x)
        assert got.shape == (1, 4, n, 16) and got.tobytes() == want.tobytes()
