"""Mixture of experts: a Mixtral-style layer written in plain torch, in the three ways
transformers' expert implementations compute it, exported and run on the lean runtime and
with the cpu backend against eager; and a decoder with such layers generating eager's tokens.

- ``loop``: one expert at a time on the tokens routed to it (``one_hot`` + ``where``: a
  data-dependent token count per expert, planned at its bound; ``index_add`` combines);
- ``grouped``: (token, expert) pairs sorted by expert, counted (``histc``, ``cumsum``) and
  multiplied by ``transformers::grouped_mm_fallback``, transformers' functional custom op
  (defined here as transformers defines it: transformers is not a test dependency);
- ``batched``: each pair's expert weights gathered, one ``bmm``.

The router's ``topk`` picks the experts. Custom ops without an out variant: one with a
CompositeImplicitAutograd kernel or a registered decomposition is decomposed at export, one
with only a Python kernel is refused naming both fixes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from opforge.errors import ExportError
from opforge.examples.decoder import Block, TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.runtime import load
from opforge.runtime.generate import Generator


def _define_grouped_mm_fallback() -> None:
    """``transformers::grouped_mm_fallback`` as transformers/integrations/moe.py defines it:
    a functional custom op whose only implementation is a Python loop over ``offs``."""
    if hasattr(torch.ops.transformers, "grouped_mm_fallback"):
        return  # transformers is installed and imported

    def grouped_mm_fallback(input: torch.Tensor, weight: torch.Tensor,
                            offs: torch.Tensor) -> torch.Tensor:
        output = torch.zeros(input.size(0), weight.size(2), dtype=input.dtype)
        start = 0
        for i, end in enumerate(offs.tolist()):
            if start == end:
                continue
            torch.mm(input[start:end], weight[i], out=output[start:end])
            start = end
        return output

    torch.library.custom_op("transformers::grouped_mm_fallback", grouped_mm_fallback,
                            mutates_args=(),
                            schema="(Tensor input, Tensor weight, Tensor offs) -> Tensor")
    torch.library.register_fake(
        "transformers::grouped_mm_fallback",
        lambda input, weight, offs: input.new_empty(input.size(0), weight.size(2)))


_define_grouped_mm_fallback()

STYLES = ("loop", "grouped", "batched")
DIM, HIDDEN, EXPERTS, TOP_K = 16, 24, 4, 2


class Experts(nn.Module):
    """A Mixtral sparse block: router → softmax → top-k (renormalized) → SwiGLU experts."""

    def __init__(self, style: str, dim: int = DIM, hidden: int = HIDDEN,
                 experts: int = EXPERTS, top_k: int = TOP_K, seed: int = 0) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(seed)
        self.style, self.experts, self.top_k = style, experts, top_k
        self.router = nn.Parameter(torch.randn(experts, dim, generator=generator))
        self.gate_up = nn.Parameter(torch.randn(experts, 2 * hidden, dim, generator=generator) * 0.3)
        self.down = nn.Parameter(torch.randn(experts, dim, hidden, generator=generator) * 0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (tokens, dim)
        probs = torch.softmax(x @ self.router.T, dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return getattr(self, f"_{self.style}")(x, weights, chosen)

    @staticmethod
    def _swiglu(gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def _loop(self, x, weights, chosen):
        out = torch.zeros_like(x)
        mask = torch.nn.functional.one_hot(chosen, self.experts).permute(2, 1, 0)  # (E, k, T)
        for e in range(self.experts):
            slot, token = torch.where(mask[e])  # how many: the data decides
            h = self._swiglu(x[token] @ self.gate_up[e].T) @ self.down[e].T
            out.index_add_(0, token, h * weights[token, slot, None])
        return out

    def _grouped(self, x, weights, chosen):
        expert_ids, order = torch.sort(chosen.reshape(-1))
        rows = x[order // self.top_k]
        counts = torch.histc(expert_ids.float(), bins=self.experts, min=0, max=self.experts - 1)
        offs = torch.cumsum(counts, dim=0, dtype=torch.int32)
        grouped = torch.ops.transformers.grouped_mm_fallback
        h = grouped(self._swiglu(grouped(rows, self.gate_up.transpose(1, 2), offs)),
                    self.down.transpose(1, 2), offs)
        h = h * weights.reshape(-1)[order, None]
        return torch.zeros_like(x).index_add(0, order // self.top_k, h)

    def _batched(self, x, weights, chosen):
        ids = chosen.reshape(-1)
        rows = x.repeat_interleave(self.top_k, dim=0)
        h = torch.bmm(self.gate_up[ids], rows[:, :, None])[:, :, 0]
        h = torch.bmm(self.down[ids], self._swiglu(h)[:, :, None])[:, :, 0]
        h = h * weights.reshape(-1, 1)
        return h.view(x.shape[0], self.top_k, -1).sum(dim=1)


# float32 products of at most 2 * HIDDEN = 48 terms summed in another order (BLAS vs
# ATen's kernels) and a softmax: each element within a few float32 ulps of eager's
# (|values| ~ 1, measured ≤ 5e-7); 1e-5 leaves room for other BLAS builds and still fails
# on any wrong routing, group boundary or weighting (differences of order 0.1-1).
RTOL = ATOL = 1e-5


def _tokens(n: int = 10, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, DIM, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("backends", [None, ["cpu"]], ids=["lean", "cpu"])
@pytest.mark.parametrize("style", STYLES)
def test_moe_layer_matches_eager(style, backends):
    model = Experts(style).eval()
    x = _tokens()
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
    other = _tokens(seed=7)
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


class MoEBlock(Block):
    """The bundled decoder's block with a mixture of experts for its MLP."""

    def __init__(self, *args, style: str, seed: int, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.moe = Experts(style, dim=32, hidden=24, seed=seed)

    def forward(self, x, positions, cos, sin, mask):
        x = x + self.attn(self.norm1(x), positions, cos, sin, mask)
        return x + self.moe(self.norm2(x))


class MoEDecoder(TinyDecoder):
    def __init__(self, style: str) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MoEBlock(32, 4, 2, 64, self.max_len, style=style, seed=i)
                                    for i in range(2))
        with torch.no_grad():  # the attention weights as the bundled decoder's
            for mine, theirs in zip(self.blocks, TinyDecoder().blocks):
                mine.attn.load_state_dict(theirs.attn.state_dict())
                mine.norm1.load_state_dict(theirs.norm1.state_dict())
                mine.norm2.load_state_dict(theirs.norm2.state_dict())


PROMPT = [5, 9, 1, 3, 17, 2]


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
