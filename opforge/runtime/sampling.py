"""Choosing the next token from a row of logits: greedy, or temperature with top-k.

NumPy only. A ``Sampler`` owns its random generator (``numpy.random.default_rng(seed)``),
so the same seed, prompt and program give the same tokens on every run.

>>> import numpy as np
>>> logits = np.array([0.5, 3.0, 1.0], np.float32)
>>> Sampler().choose(logits)                      # temperature 0: greedy
1
>>> Sampler(temperature=1.0, top_k=1, seed=7).choose(logits)   # top-1 is greedy too
1
"""

from __future__ import annotations

import numpy as np

from opforge.errors import GenerationError

__all__ = ["Sampler", "top_k_candidates"]


def top_k_candidates(logits: np.ndarray, k: int | None) -> np.ndarray:
    """Indices of the ``k`` largest logits (all of them without ``k`` or when ``k`` is
    at least the vocabulary), in ascending index order. Ties at the k-th value are broken
    by ``numpy.argpartition``; the set always has exactly ``k`` members."""
    n = logits.shape[-1]
    if k is None or k >= n:
        return np.arange(n)
    return np.sort(np.argpartition(logits, n - k)[n - k:])


class Sampler:
    """Picks one token id from a 1-D row of logits.

    ``temperature == 0`` (the default) is greedy: ``argmax``, the first index on ties, the
    same as ``torch.argmax``. ``temperature > 0`` samples from ``softmax(logits /
    temperature)`` restricted to the ``top_k`` largest logits (all without ``top_k``),
    with ``numpy.random.default_rng(seed)``; ``top_k == 1`` is greedy at any temperature.
    """

    def __init__(self, temperature: float = 0.0, top_k: int | None = None,
                 seed: int | None = None) -> None:
        api = "opforge.runtime.sampling.Sampler"
        if not (temperature >= 0.0) or temperature == float("inf"):
            raise GenerationError(f"`{api}(temperature=...)`: found {temperature!r} — valid: "
                                  "0 (greedy) or a finite positive number — fix: e.g. 0.8")
        if top_k is not None and (type(top_k) is not int or top_k < 1):
            raise GenerationError(f"`{api}(top_k=...)`: found {top_k!r} — valid: an integer "
                                  ">= 1, or None for the whole vocabulary — fix: e.g. 40")
        if seed is not None and (type(seed) is not int or seed < 0):
            raise GenerationError(f"`{api}(seed=...)`: found {seed!r} — valid: an integer >= 0 "
                                  "(NumPy's generators take no negative seed), or None for a "
                                  "fresh one each run — fix: e.g. --seed 0")
        self.temperature = float(temperature)
        self.top_k = top_k
        self.seed = seed
        self._rng = np.random.default_rng(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    def choose(self, logits: np.ndarray) -> int:
        """The next token id for ``logits`` (1-D, the vocabulary's scores)."""
        if self.greedy:
            return int(np.argmax(logits))
        candidates = top_k_candidates(logits, self.top_k)
        scaled = logits[candidates].astype(np.float64) / self.temperature
        scaled -= scaled.max()
        weights = np.exp(scaled)
        total = weights.sum()
        if not np.isfinite(total) or total <= 0.0:  # NaN logits: nothing to sample from
            raise GenerationError(
                "`opforge.runtime.sampling.Sampler.choose()`: logits — found non-finite "
                "values — valid: finite scores — fix: check the program's outputs with "
                "`opforge run` (and --mode aten to compare)")
        return int(candidates[self._rng.choice(len(candidates), p=weights / total)])
