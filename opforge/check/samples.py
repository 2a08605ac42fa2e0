"""Samples for ``opforge check``: argument values for a functional schema, per argument kind.

    generate_samples(schema, seed)  → Sample, ... (torch values, functional argument order)
    user_samples(fn, schema)        → the ``samples:`` function's (args, kwargs), normalised

What is generated, per argument kind:

- ``Tensor`` (and ``Tensor?``, ``Tensor[]``): dtypes float32/float64/int32/int64; shapes
  ``()``, ``(0,)``, ``(5,)``, ``(3, 4)``, ``(2, 3, 4)``, ``(4, 0)``; every tensor argument the
  same shape, then broadcast pairs (``(3, 4)`` with ``(4,)``, ``(3, 1)`` with ``(1, 4)``, ...)
  and shapes per argument from a pool (every combination for float32 when there are at
  most 150, some for the other dtypes): the op's fake decides which combinations are valid
  (a combination it refuses is skipped as "invalid for the op"). Layouts: contiguous,
  transposed, sliced (a stride of 2) and expanded (a stride of 0); random values and, for
  ``(5,)``, edge values (±0, ±inf, nan; 0, -1, ±2**20).
- ``int`` named like a dimension (``dim``, ``dims``, ``axis``, ``start_dim``...): every valid
  dim of the first tensor, both signs; other ints: 1, 2, 3, 5, 0.
- ``int[]`` dims: ``[]``, ``[0]``, ``[-1]``, ``[0, rank-1]``, ``[-2]``; other int lists: small
  sizes (``int[2]`` gets two values).
- ``float``: 0.5, -2.0, 0.0; ``bool``: False, True; ``Scalar``: 2, -1.5, True (int, float
  and bool); ``ScalarType``: float32, float64.
- an optional argument: its values and ``None``; an argument with a default: the default
  first. A ``str``, ``Layout``, ``Device``... without a default cannot be generated: such
  an op needs ``samples:``.

The first value of every argument makes the "base" sample of a tensor; each other value
is then tried with the rest at their base values (one argument varied at a time), so the
number of samples grows with the sum of the choices, not their product.
"""

from __future__ import annotations

import ast
import itertools
import random
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch

from opforge.schema import BaseType, FunctionSchema, ListType, OptionalType

__all__ = ["Sample", "generate_samples", "user_samples", "NoSamples", "DTYPES", "SHAPES"]

DTYPES = ("float32", "float64", "int32", "int64")
SHAPES = ((), (0,), (5,), (3, 4), (2, 3, 4), (4, 0))
# (first tensor argument, second tensor argument): broadcasting pairs
BROADCAST = (((3, 4), (4,)), ((3, 4), (1, 4)), ((3, 1), (1, 4)), ((2, 3, 4), (3, 1)),
             ((4,), (3, 4)), ((3, 4), ()))
SHAPE_POOL = ((), (1,), (4,), (5,), (3, 4), (4, 3), (4, 5), (1, 4), (3, 1), (2, 3, 4), (0,))
LAYOUTS = ("transposed", "sliced", "expanded")
_INTS = (1, 2, 3, 5, 0)
_INT = (BaseType("int"), BaseType("SymInt"))
_TENSOR = BaseType("Tensor")


class NoSamples(Exception):
    """An argument the generator has no values for (its type and name are in the text)."""


@dataclass
class Sample:
    """One call of the functional op: positional arguments (torch values)."""

    args: list
    dtype: str  # the first tensor's dtype ("" if none)
    origin: str = "generated"  # or "samples: module:function"
    layout: str = "contiguous"
    index: int = -1  # set by the caller (its position in the op's run)
    notes: list = field(default_factory=list)

    @property
    def from_user(self) -> bool:
        return self.origin != "generated"


def _is_dim(name: str) -> bool:
    return "dim" in name or "axis" in name


def _default(text: str | None):
    if text is None:
        return ()
    try:
        return (ast.literal_eval(text),)
    except (ValueError, SyntaxError):
        return ()  # an enum name (contiguous_format): not generated


def _dim_lists(rank: int) -> list[list[int]]:
    lists = [[], [0], [-1]]
    if rank >= 2:
        lists += [[0, rank - 1], [-2]]
    return lists


def _values(arg, rank: int) -> list | None:
    """The values tried for a non-tensor argument of a sample whose first tensor has
    ``rank`` dims; None if the type cannot be generated."""
    t = arg.type
    optional = isinstance(t, OptionalType)
    base = t.elem if optional else t
    values: list = list(_default(arg.default))
    if base in _INT:
        values += (list(range(rank)) + list(range(-rank, 0)) if rank else [0, -1]) \
            if _is_dim(arg.name) else list(_INTS)
    elif base == BaseType("float"):
        values += [0.5, -2.0, 0.0]
    elif base == BaseType("bool"):
        values += [False, True]
    elif base == BaseType("Scalar"):
        values += [2, -1.5, True]
    elif base == BaseType("ScalarType"):
        values += [torch.float32, torch.float64]
    elif isinstance(base, ListType) and base.elem in _INT:
        if _is_dim(arg.name):
            values += _dim_lists(rank)
        elif base.size:
            values += [[1] * base.size, [2] * base.size, [1, 2][: base.size] + [1] * (base.size - 2)]
        else:
            values += [[1], [2], [1, 2], []]
    elif isinstance(base, ListType) and base.elem == BaseType("float"):
        values += [[0.5], [1.0, 2.0]]
    elif isinstance(base, ListType) and base.elem == BaseType("bool"):
        values += [[True], [False, True]]
    if optional:
        values.append(None)
    if not values:
        return None
    unique, seen = [], set()
    for v in values:  # True == 1 == 1.0: keep values of different types apart
        key = (type(v).__name__, repr(v))
        if key not in seen:
            seen.add(key)
            unique.append(v)
    return unique


def _tensor_kind(arg) -> str | None:
    t = arg.type
    base = t.elem if isinstance(t, OptionalType) else t
    if base == _TENSOR:
        return "tensor"
    if isinstance(base, ListType) and base.elem == _TENSOR:
        return "list"
    if isinstance(base, ListType) and base.elem == OptionalType(_TENSOR):
        return "optlist"
    return None


def make_tensor(shape: tuple, dtype: str, layout: str, gen: torch.Generator) -> torch.Tensor:
    """Random values of ``dtype`` and ``shape`` laid out as ``layout`` (see the module text)."""
    torch_dtype = getattr(torch, dtype)
    rank = len(shape)

    def values(s):
        return (torch.randn(s, generator=gen, dtype=torch.float64) * 10).to(torch_dtype)

    if layout == "transposed" and rank >= 2:
        return values(tuple(reversed(shape))).permute(*reversed(range(rank)))
    if layout == "sliced" and rank >= 1:
        return values((*shape[:-1], shape[-1] * 2))[..., ::2]
    if layout == "expanded" and any(s > 1 for s in shape):
        d = next(i for i, s in enumerate(shape) if s > 1)
        return values(tuple(1 if i == d else s for i, s in enumerate(shape))).expand(*shape)
    return values(shape)


def _edge_tensor(dtype: str) -> torch.Tensor:
    if dtype.startswith("float"):
        data = [0.0, -0.0, float("inf"), -float("inf"), float("nan")]
    else:
        data = [0, -1, 1, 2**20, -(2**20)]
    return torch.tensor(data, dtype=getattr(torch, dtype))


def _layout_applies(layout: str, shape: tuple) -> bool:
    if layout == "transposed":
        return len(shape) >= 2 and sum(s > 1 for s in shape) >= 2
    if layout == "sliced":
        return len(shape) >= 1 and shape[-1] > 1
    return any(s > 1 for s in shape)  # expanded


def generate_samples(schema: FunctionSchema, seed: int = 0) -> Iterator[Sample]:
    """Samples of the functional ``schema`` (see the module text); raises ``NoSamples``
    naming the argument the generator has no values for."""
    args = schema.arguments.flat
    kinds = [_tensor_kind(a) for a in args]
    tensor_positions = [i for i, k in enumerate(kinds) if k]
    for a, kind in zip(args, kinds):
        if kind is None and _values(a, 1) is None:
            raise NoSamples(f"argument '{a.name}' of type {a.type} has no default and no "
                            "generated values")
    gen = torch.Generator().manual_seed(seed)
    rng = random.Random(seed)
    assignments: list[tuple[str, tuple]] = [("same", (s,) * len(tensor_positions))
                                            for s in SHAPES]
    per_argument: list[tuple[str, tuple]] = []
    if len(tensor_positions) >= 2:
        rest = len(tensor_positions) - 2
        for a, b in BROADCAST:
            assignments.append(("broadcast", (a, b) + (a,) * rest))
        # the fake says which of these are valid for the op (a matmul's (3, 4) @ (4, 5)):
        # every combination of the pool for the first dtype when there are few, else some
        combos = list(itertools.product(SHAPE_POOL, repeat=len(tensor_positions)))
        per_argument = [("per-argument", c) for c in
                        (combos if len(combos) <= 150 else rng.sample(combos, 40))]
    if not tensor_positions:
        assignments = [("none", ())]
    for n, dtype in enumerate(DTYPES):
        extra = per_argument if n == 0 else rng.sample(per_argument, min(12, len(per_argument)))
        for how, shapes in assignments + extra:
            layouts = ["contiguous"] + [lay for lay in LAYOUTS if how == "same" and shapes
                                        and _layout_applies(lay, shapes[0])]
            for layout in layouts:
                tensors = [make_tensor(s, dtype, layout, gen) for s in shapes]
                yield from _with_values(args, kinds, tensor_positions, tensors, dtype,
                                        layout if how == "same" else how,
                                        vary=how != "per-argument" and layout == "contiguous",
                                        rng=rng)
            if how == "same" and shapes and shapes[0] == (5,):
                tensors = [_edge_tensor(dtype) for _ in shapes]
                yield from _with_values(args, kinds, tensor_positions, tensors, dtype,
                                        "edge values", vary=False, rng=rng)


def _with_values(args, kinds, tensor_positions, tensors, dtype, layout, *, vary, rng):
    """The base sample of these tensors, then (if ``vary``) one non-tensor argument or
    optional tensor varied at a time."""
    rank = tensors[0].dim() if tensors else 1
    choices: list[list] = []
    for i, (a, kind) in enumerate(zip(args, kinds)):
        if kind is None:
            choices.append(_values(a, rank))
            continue
        t = tensors[tensor_positions.index(i)]
        value = t if kind == "tensor" else [t, t.clone()] if kind == "list" else [t, None]
        choices.append([value, None] if isinstance(a.type, OptionalType) else [value])
    base = [c[0] for c in choices]
    yield Sample(list(base), dtype, layout=layout)
    if not vary:
        if any(len(c) > 1 for c in choices):  # one random combination instead
            yield Sample([rng.choice(c) for c in choices], dtype, layout=layout)
        return
    for i, c in enumerate(choices):
        for value in c[1:]:
            args_i = list(base)
            args_i[i] = value
            yield Sample(args_i, dtype, layout=layout)


def user_samples(fn: Callable, schema: FunctionSchema, origin: str) -> list[Sample]:
    """The ``samples:`` function's ``[(args, kwargs), ...]`` as samples in schema order."""
    result = fn()
    params = schema.arguments.flat
    samples = []
    for n, item in enumerate(result):
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[1], dict)):
            raise TypeError(f"{origin}: sample {n} is {item!r:.200} — valid: a pair "
                            "(args tuple, kwargs dict) — fix: return [((x, 1), {}), ...]")
        args, kwargs = list(item[0]), dict(item[1])
        for p in params[len(args):]:
            if p.name in kwargs:
                args.append(kwargs.pop(p.name))
            elif _default(p.default):
                args.append(_default(p.default)[0])
            else:
                raise TypeError(f"{origin}: sample {n} has no value for '{p.name}' — fix: "
                                "pass it in args or kwargs")
        if kwargs:
            raise TypeError(f"{origin}: sample {n}: unknown argument(s) {sorted(kwargs)} — "
                            f"valid: {[p.name for p in params]}")
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        dtype = str(first.dtype).removeprefix("torch.") if first is not None else ""
        samples.append(Sample(args, dtype, origin=origin, layout="user"))
    return samples
