"""Mixture of experts: a Mixtral-style layer written in plain torch (moe_models.py: its
experts as a loop over data-dependent token sets, as transformers' grouped matmul, as a
batched matmul) exported and run on the lean runtime and with the cpu backend against
eager, and a decoder of such layers generating eager's tokens.

Other libraries' functional custom ops without an out variant: one with a
CompositeImplicitAutograd kernel or a registered decomposition is decomposed at export, one
with only a Python kernel is refused naming both fixes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch._decomp
from torch import nn

from moe_models import PROMPT, STYLES, Experts, MoEDecoder, tokens
from opforge.errors import ExportError
from opforge.examples.decoder import export_decoder, greedy_decode
from opforge.export import export
from opforge.runtime import load
from opforge.runtime.generate import Generator

# float32 products of at most 2 * HIDDEN = 48 terms summed in another order (BLAS or the
# cpu engine vs ATen's kernels) and a softmax: outputs up to ~6 in magnitude, measured
# within 2.2e-6 of eager's (about 4 ulps) on lean and cpu; 1e-5 leaves room for other BLAS
# builds and ISAs and still fails on any wrong routing, group boundary or weighting
# (differences of order 0.1-1).
RTOL = ATOL = 1e-5


@pytest.mark.parametrize("backends", [None, ["cpu"]], ids=["lean", "cpu"])
@pytest.mark.parametrize("style", STYLES)
def test_moe_layer_matches_eager(style, backends):
    model = Experts(style).eval()
    x = tokens()
    with torch.no_grad():
        want = model(x).numpy()
        # every style computes the same function: the loop is the reference
        np.testing.assert_allclose(want, Experts("loop").eval()(x).numpy(), rtol=RTOL, atol=ATOL)
    program = export(model, (x,), backends=backends)
    keys = {op.key for op in program.method("forward").operators}
    if style == "grouped":
        assert "transformers::grouped_mm_fallback.out" in keys
    (got,) = load(program).method("forward")(x.numpy())
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    # other tokens route elsewhere: the program follows the data, not the example
    other = tokens(seed=7)
    (got,) = load(program).method("forward")(other.numpy())
    with torch.no_grad():
        np.testing.assert_allclose(got, model(other).numpy(), rtol=RTOL, atol=ATOL)


def test_grouped_mm_fallback_kernel_follows_the_offsets():
    """Empty groups, a group past the rows (Python's slice rule) and rows after the last
    offset (zero), against the op's own Python implementation."""
    from opforge.kernels.portable import portable_kernels

    kernel = portable_kernels()["transformers::grouped_mm_fallback.out"]
    generator = torch.Generator().manual_seed(3)
    x, w = torch.randn(7, 5, generator=generator), torch.randn(4, 5, 3, generator=generator)
    for offs in ([2, 2, 5, 6], [0, 3, 3, 9], [0, 0, 0, 0], [7, 7, 7, 7]):
        offs = torch.tensor(offs, dtype=torch.int32)
        want = torch.ops.transformers.grouped_mm_fallback(x, w, offs).numpy()
        out = np.full((7, 3), np.nan, np.float32)
        kernel(x.numpy(), w.numpy(), offs.numpy(), out)
        np.testing.assert_allclose(out, want, rtol=RTOL, atol=ATOL)


# the loop's data-dependent nodes stay on the kernels with the cpu backend (the layer test
# above checks that partition): its decoder runs on lean only, to keep the suite short
@pytest.mark.parametrize("style, backends", [("loop", None), ("grouped", None),
                                             ("grouped", ["cpu"])],
                         ids=["loop-lean", "grouped-lean", "grouped-cpu"])
def test_moe_decoder_generates_eager_tokens(style, backends):
    model = MoEDecoder(style).eval()
    with torch.no_grad():
        want = greedy_decode(lambda t, p: model(t, p), PROMPT, 12)
    program = export_decoder(model, backends=backends)
    result = Generator(load(program)).generate(PROMPT, 12)
    assert list(result.tokens) == want


# --- other libraries' functional custom ops without an out variant ------------------------

_LIB = torch.library.Library("moe_test", "DEF")
_LIB.define("scaled_sin(Tensor x) -> Tensor")  # written with torch ops: decomposable
_LIB.impl("scaled_sin", lambda x: torch.sin(x) * 2, "CompositeImplicitAutograd")
_LIB.define("cos_cpu(Tensor x) -> Tensor")  # a CPU kernel plus a registered decomposition
_LIB.impl("cos_cpu", lambda x: torch.from_numpy(np.cos(x.numpy())), "CPU")
_LIB.impl("cos_cpu", lambda x: torch.empty_like(x), "Meta")
torch._decomp.register_decomposition(torch.ops.moe_test.cos_cpu.default)(lambda x: torch.cos(x))
_LIB.define("tan_cpu(Tensor x) -> Tensor")  # a CPU kernel only: not traced
_LIB.impl("tan_cpu", lambda x: torch.from_numpy(np.tan(x.numpy())), "CPU")
_LIB.impl("tan_cpu", lambda x: torch.empty_like(x), "Meta")


class LibraryOps(nn.Module):
    def forward(self, x):
        return torch.ops.moe_test.scaled_sin(x) + torch.ops.moe_test.cos_cpu(x)


def test_library_op_with_a_known_decomposition_is_decomposed_at_export():
    x = torch.randn(5)
    program = export(LibraryOps(), (x,))
    keys = {op.key for op in program.method("forward").operators}
    assert not any(k.startswith("moe_test::") for k in keys), keys
    (got,) = load(program).method("forward")(x.numpy())
    np.testing.assert_allclose(got, LibraryOps()(x).numpy(), rtol=1e-6, atol=1e-6)


def test_library_op_with_only_a_python_kernel_is_refused_naming_the_fixes():
    class Tan(nn.Module):
        def forward(self, x):
            return torch.ops.moe_test.tan_cpu(x) + 1

    with pytest.raises(ExportError) as info:
        export(Tan(), (torch.randn(3),))
    message = str(info.value)
    assert "`moe_test::tan_cpu`" in message and "device kernel" in message
    assert "register_decomposition(torch.ops.moe_test.tan_cpu.default)" in message
    assert "moe_test::tan_cpu.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)" in message
