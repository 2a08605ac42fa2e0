"""Reference (eager) implementations and fake functions of the example operators.

They are named by ``python:`` and ``fake:`` in ``my_ops.yaml``; ``manifest_path()`` gives
that file. The references define the semantics every compiled kernel is checked against.
"""

from __future__ import annotations

from pathlib import Path

import torch

__all__ = ["manifest_path", "mul3_reference", "mul4_reference", "minmax_reference",
           "minmax_fake", "scaled_sum_reference", "scaled_sum_fake", "register_examples"]


def manifest_path() -> Path:
    return Path(__file__).with_name("my_ops.yaml")


def mul3_reference(input: torch.Tensor) -> torch.Tensor:
    return input * 3


def mul4_reference(input: torch.Tensor) -> torch.Tensor:
    return input * 4


def minmax_reference(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.amin(input, dim), torch.amax(input, dim)


def minmax_fake(input: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    if input.dim() == 0:  # like torch.amin: a 0-d input reduces over dim 0 (or -1) to 0-d
        return input.new_empty(()), input.new_empty(())
    shape = list(input.shape)
    del shape[dim]
    return input.new_empty(shape), input.new_empty(shape)


def _reduced_shape(input: torch.Tensor, dims: list[int], keepdim: bool) -> list[int]:
    rank = input.dim()
    axes = {d % rank for d in dims} if dims else set(range(rank))
    if keepdim:
        return [1 if i in axes else s for i, s in enumerate(input.shape)]
    return [s for i, s in enumerate(input.shape) if i not in axes]


def scaled_sum_reference(input: torch.Tensor, scale, dims: list[int], keepdim: bool = False):
    return torch.sum(input, dim=list(dims) if dims else None, keepdim=keepdim) * scale


def scaled_sum_fake(input: torch.Tensor, scale, dims: list[int], keepdim: bool = False):
    return input.new_empty(_reduced_shape(input, dims, keepdim))


def register_examples() -> list:
    """Register the example ops with PyTorch once per process; returns their OpDefs."""
    from opforge.manifest import load_manifest
    from opforge.torch_bridge import is_registered, register

    defs = load_manifest(manifest_path())
    register([d for d in defs if not is_registered(d.name)])
    return defs
