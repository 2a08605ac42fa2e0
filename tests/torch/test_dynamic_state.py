"""Program state: buffers a method updates in place (counters, KV caches)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

from opforge.errors import ExportError
from opforge.export import export
from opforge.program import from_bytes, to_bytes
from opforge.runtime import load


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        return x * self.count


class KVCache(torch.nn.Module):
    """Writes ``k`` at positions ``pos`` of a cache and attends over the whole cache."""

    def __init__(self, length=8, dim=4):
        super().__init__()
        self.register_buffer("cache", torch.zeros(length, dim))

    def forward(self, k, pos):
        self.cache.index_copy_(0, pos, k)
        return torch.softmax(k @ self.cache.T, dim=-1) @ self.cache

    def read(self, q):
        return q @ self.cache.T


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_counter_state_updates_in_place_and_resets(mode):
    program = from_bytes(to_bytes(export(Counter(), (torch.ones(2),), kernels="portable")))
    loaded = load(program, mode=mode)
    forward = loaded.method("forward")
    assert [forward(np.ones(2, np.float32))[0].tolist() for _ in range(3)] == [
        [1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]
    assert loaded.read_state("count").tolist() == [3.0]
    loaded.reset_state("count")
    assert forward(np.ones(2, np.float32))[0].tolist() == [1.0, 1.0]
    loaded.write_state("count", np.array([10.0], np.float32))
    assert forward(np.ones(2, np.float32))[0].tolist() == [11.0, 11.0]


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_kv_cache_with_dynamic_chunk_matches_eager(mode):
    torch.manual_seed(0)
    seq = Dim("seq", min=1, max=8)
    program = export(KVCache(), (torch.randn(2, 4), torch.tensor([0, 1])),
                     dynamic_shapes=({0: seq}, {0: seq}), kernels="portable")
    program = from_bytes(to_bytes(program))
    loaded = load(program, mode=mode)
    forward = loaded.method("forward")
    eager = KVCache()
    start = 0
    for chunk in (3, 1, 1, 2):  # a prompt, then single steps
        k, pos = torch.randn(chunk, 4), torch.arange(start, start + chunk)
        with torch.no_grad():
            expected = eager(k, pos)
        (got,) = forward(k.numpy(), pos.numpy())
        np.testing.assert_allclose(got, expected.numpy(), rtol=1e-5, atol=1e-5)
        start += chunk
    np.testing.assert_allclose(loaded.read_state("cache"), eager.cache.numpy(), rtol=1e-6)


def test_two_methods_share_one_cache_by_name():
    torch.manual_seed(0)
    model = KVCache()
    program = export(None, methods={
        "write": (model, (torch.randn(1, 4), torch.tensor([2]))),
        "read": (model.read, (torch.randn(1, 4),)),
    }, kernels="portable")
    loaded = load(from_bytes(to_bytes(program)))
    write, read = loaded.method("write"), loaded.method("read")
    k = np.arange(4, dtype=np.float32).reshape(1, 4)
    write(k, np.array([2]))
    (scores,) = read(np.ones((1, 4), np.float32))
    assert scores.tolist() == [[0.0, 0.0, 6.0, 0.0, 0.0, 0.0, 0.0, 0.0]]


def test_mutating_a_user_input_is_refused():
    class Bad(torch.nn.Module):
        def forward(self, x):
            x.add_(1)
            return x * 2

    with pytest.raises(ExportError, match="writes in place into the input"):
        export(Bad(), (torch.ones(2),))
