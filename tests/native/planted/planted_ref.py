"""References of planted.yaml's operators (what their kernels should compute)."""

import torch


def add_k(x, k):
    return x + k


def sub_k(x, k):
    return x - k


def above(x, t):
    return torch.where(x > t, x, torch.zeros_like(x))


def halve(x):
    if not x.dtype.is_floating_point:
        raise TypeError("halve: floating inputs only")
    return x / 2


def positive(x):
    return x > 0


def positive_fake(x):
    return torch.empty_like(x, dtype=torch.bool)


def mul_k(x, k):
    return x * k


def mul_k_samples():
    x = torch.arange(6.0).reshape(2, 3)
    return [((x, 7), {}), ((x.t(),), {"k": 7})]
