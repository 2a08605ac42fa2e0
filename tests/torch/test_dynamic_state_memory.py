"""State that costs memory as it fills: splat initial values and lazily committed caches.

A KV cache exported for many positions must cost neither the program file nor resident
memory until calls write it (``runtime/state.py``). Resident bytes are read from Linux's
pagemap (pages present *and* written by this process), so these checks count pages, not
timings: deterministic on any Linux machine.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from opforge.examples.decoder import TinyDecoder, export_decoder, greedy_decode
from opforge.export import export
from opforge.program import PACKING_SPLAT, ConstantStorage, from_bytes, to_bytes
from opforge.runtime import load

LINUX = sys.platform.startswith("linux")
PAGE = 4096


def _state_storages(program):
    return {slot.name: program.methods[0].values[slot.value].storage
            for slot in program.methods[0].state}


@pytest.fixture(scope="module")
def decoder():
    model = TinyDecoder(max_len=2048, seed=3).eval()
    program = export_decoder(model)
    return model, to_bytes(program)


def test_a_zero_cache_is_one_element_in_the_file(decoder):
    model, data = decoder
    program = from_bytes(data)
    assert data[8] == 5  # format version 5: splat constants
    storages = _state_storages(program)
    assert len(storages) == 4 and all(
        type(s) is ConstantStorage and s.packing == PACKING_SPLAT for s in storages.values())
    cache_bytes = sum(b.nbytes for name, b in model.named_buffers() if "cache" in name)
    # the caches (4 x 2048 x 2 x 8 floats) are 512 KiB; the constant segment holds the
    # other constants (weights, rotary tables, slot indices) and one element per cache
    assert cache_bytes == 4 * 2048 * 2 * 8 * 4
    method = program.methods[0]
    state = {slot.value for slot in method.state}
    placed = {v.storage.offset: v.stored_nbytes for i, v in enumerate(method.values)
              if type(getattr(v, "storage", None)) is ConstantStorage}
    assert sum(method.values[i].stored_nbytes for i in state) == 4 * 4
    assert program.segments[0].nbytes <= sum(placed.values()) + 64 * len(placed)
    # the rotary tables and the slot indices are not state: stored densely as before
    assert all(v.storage.packing == 0 for i, v in enumerate(program.methods[0].values)
               if type(getattr(v, "storage", None)) is ConstantStorage and i not in
               {slot.value for slot in program.methods[0].state})


@pytest.mark.parametrize("mode", ["lean", "aten"])
def test_tokens_and_resident_memory_follow_the_positions_written(decoder, mode):
    model, data = decoder
    loaded = load(data, mode=mode)
    step = loaded.method("forward")
    run = lambda t, p: step(np.asarray(t), np.asarray(p))[0]  # noqa: E731
    with torch.no_grad():
        want = greedy_decode(lambda t, p: model(t, p), [5, 1, 7, 2], 12)
    memory = loaded.state_memory()
    assert all(logical == 2048 * 2 * 8 * 4 for logical, _ in memory.values())
    if not LINUX:
        pytest.skip("resident bytes come from Linux's pagemap")
    assert all(resident == 0 for _, resident in memory.values())
    got = greedy_decode(run, [5, 1, 7, 2], 12)
    assert got == want
    # 4 + 11 positions written, 64 bytes each: the first page of every cache, no more,
    # although every call read all 2,048 positions of every cache (the causal mask)
    for name, (logical, resident) in loaded.state_memory().items():
        assert resident == PAGE, (name, resident)
    # a prompt that reaches position 1,000 commits the pages up to it
    loaded.reset_state()
    assert all(r == 0 for _, r in loaded.state_memory().values())
    prompt = list(np.random.default_rng(0).integers(0, 64, 1000))
    step(np.array(prompt, np.int64), np.arange(1000, dtype=np.int64))
    for name, (logical, resident) in loaded.state_memory().items():
        assert resident == math.ceil(1000 * 64 / PAGE) * PAGE, (name, resident)
    # reset gives the pages back and restores zeros: the same tokens again
    loaded.reset_state()
    assert all(r == 0 for _, r in loaded.state_memory().values())
    assert not loaded.read_state("blocks.0.attn.k_cache").any()
    assert greedy_decode(run, [5, 1, 7, 2], 12) == want


class Filled(torch.nn.Module):
    """State whose initial values are a uniform non-zero fill and a non-uniform ramp."""

    def __init__(self):
        super().__init__()
        self.register_buffer("best", torch.full((2048,), -7.5))
        self.register_buffer("ramp", torch.arange(2048, dtype=torch.float32))

    def forward(self, x):
        self.best.copy_(torch.maximum(self.best, x))
        self.ramp.add_(x)
        return self.best + self.ramp


def test_uniform_non_zero_and_non_uniform_state():
    model = Filled()
    program = export(model, (torch.zeros(2048),))
    storages = _state_storages(program)
    assert storages["best"].packing == PACKING_SPLAT  # -7.5 everywhere: one element
    assert storages["ramp"].packing == 0  # stored densely
    loaded = load(to_bytes(program))
    forward = loaded.method("forward")
    rng = np.random.default_rng(1)
    reference = Filled()
    for _ in range(3):
        x = rng.standard_normal(2048).astype(np.float32) * 10
        (y,) = forward(x)
        np.testing.assert_array_equal(y, reference(torch.from_numpy(x)).numpy())
    np.testing.assert_array_equal(loaded.read_state("best"), reference.best.numpy())
    loaded.reset_state()
    np.testing.assert_array_equal(loaded.read_state("best"), np.full(2048, -7.5, np.float32))
    np.testing.assert_array_equal(loaded.read_state("ramp"), np.arange(2048, dtype=np.float32))
    if LINUX:  # a non-zero fill is a dense copy: all of it resident, as reported
        assert loaded.state_memory()["best"] == (8192, 8192)
