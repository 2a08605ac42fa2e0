"""The generation runner's sampler (NumPy only): greedy is argmax, a seed makes sampling
reproducible, top-k keeps to the k largest logits, temperature sharpens or flattens."""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import GenerationError
from opforge.runtime.sampling import Sampler, top_k_candidates


def test_greedy_is_the_first_argmax():
    logits = np.array([1.0, 4.0, 4.0, -2.0], np.float32)
    assert Sampler().choose(logits) == 1
    assert Sampler(temperature=3.0, top_k=1, seed=0).choose(logits) == 1


def test_a_seed_makes_sampling_reproducible():
    logits = np.random.default_rng(0).standard_normal(100).astype(np.float32)
    def draw(seed):
        sampler = Sampler(1.0, seed=seed)
        return [sampler.choose(logits) for _ in range(30)]

    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


@pytest.mark.parametrize("k", [1, 2, 5, 17])
def test_top_k_draws_only_the_k_largest(k):
    rng = np.random.default_rng(k)
    logits = rng.standard_normal(50).astype(np.float32)
    allowed = set(np.argsort(logits)[-k:].tolist())
    assert set(top_k_candidates(logits, k).tolist()) == allowed
    sampler = Sampler(temperature=10.0, top_k=k, seed=1)
    drawn = {sampler.choose(logits) for _ in range(400)}
    assert drawn <= allowed
    assert len(drawn) == k  # a flat distribution over k tokens: 400 draws reach all


def test_temperature_sharpens_the_distribution():
    logits = np.array([0.0, 1.0, 2.0], np.float32)
    cold, hot = Sampler(0.05, seed=2), Sampler(50.0, seed=2)
    assert all(cold.choose(logits) == 2 for _ in range(200))
    assert len({hot.choose(logits) for _ in range(200)}) == 3


@pytest.mark.parametrize("options, message", [
    ({"temperature": -0.5}, "temperature"), ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"), ({"top_k": 0}, "top_k"),
    ({"top_k": 2.5}, "top_k"), ({"seed": -1}, "seed=...\\)`: found -1"), ({"seed": 1.5}, "seed"),
])
def test_bad_options_are_refused(options, message):
    with pytest.raises(GenerationError, match=message):
        Sampler(**options)


def test_non_finite_logits_are_refused_when_sampling():
    with pytest.raises(GenerationError, match="non-finite"):
        Sampler(1.0, seed=0).choose(np.array([np.nan, 1.0], np.float32))
