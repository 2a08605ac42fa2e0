"""The state a run of the model writes, kept out of what quantizing leaves behind (issue 46).

# Design
#
# Quantizing runs the model many times: the float model on every calibration sample (the
# reference), the observed graph on them (calibration), the converted graph on them
# (accuracy), both again in ``QuantizedModel.evaluate``, and the user's ``train`` under QAT.
# A model with state (a decoder's KV cache written by ``index_copy_``, a step counter) is
# changed by each run, and the captured, observed and converted graphs share the model's
# buffers (``torch.export``'s module reads the model's tensors). Without care the user's
# model came back with the calibration prompt's keys in its cache, the exported program
# stored them as the cache's initial value, and each sample ran on the cache the one
# before it wrote.
#
# So the state is the buffers the captured graph writes in place (:func:`mutated_buffers`:
# the written argument of every in-place op, followed back through views to the buffer it
# reads; a graph from ``torch.export(...).module()`` keeps ``index_copy_`` and ``copy_`` as
# they are, with an empty ``buffers_to_mutate``), copied once before any run
# (:class:`InitialState`): only those, not the parameters nor the buffers nobody writes, so
# no weight is ever copied. Each *pass* (all the samples through one model) starts from
# that state and leaves the model's buffers as it found them (:meth:`InitialState.pass_over`).
# Per pass, not per sample: a decoder's samples may be a prompt and then its decoding steps,
# each step reading the cache the one before wrote, and restoring before every pass is what
# runs the float model and the quantized one on the same sequence of states, so that the
# report compares like with like.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.fx

__all__ = ["mutated_buffers", "InitialState"]


def mutated_buffers(gm: torch.fx.GraphModule) -> list[str]:
    """The names of ``gm``'s buffers its graph writes in place, in graph order: the written
    argument (``Tensor(a!)``) of each in-place op, followed back through the views that
    alias it (``slice``, ``select``, ``view``: ``cache[:, p] = k``) to a ``get_attr``."""
    buffers = dict(gm.named_buffers())
    found: dict[str, None] = {}
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for i, argument in enumerate(schema.arguments):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            written = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
            name = _aliased_attribute(written)
            if name is not None and name in buffers:
                found[name] = None
    return list(found)


def _aliased_attribute(node) -> str | None:
    """The ``get_attr`` target ``node`` is a view of (itself, or through ops whose output
    aliases their first input), or None."""
    while isinstance(node, torch.fx.Node):
        if node.op == "get_attr":
            return str(node.target)
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None or not schema.returns or schema.returns[0].alias_info is None \
                or not node.args:
            return None
        node = node.args[0]
    return None


def _buffer_slot(module: torch.nn.Module, name: str) -> tuple[torch.nn.Module, str]:
    owner, _, leaf = name.rpartition(".")
    return (module.get_submodule(owner) if owner else module), leaf


def _tensor(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The buffer ``name`` (or a plain tensor attribute: the captured graph may register
    one the model holds as such)."""
    owner, leaf = _buffer_slot(module, name)
    return getattr(owner, leaf)


@dataclass
class InitialState:
    """A copy of the buffers a run writes (name → tensor), taken before any run.

    >>> state = InitialState.of(model, mutated_buffers(captured))   # doctest: +SKIP
    >>> with state.pass_over(model):                                 # doctest: +SKIP
    ...     reference = [model(*s) for s in samples]
    """

    values: dict[str, torch.Tensor]

    @classmethod
    def of(cls, module: torch.nn.Module, names: Iterable[str]) -> "InitialState":
        return cls({name: _tensor(module, name).detach().clone() for name in names})

    def restrict(self, names: Iterable[str]) -> "InitialState":
        """Only ``names`` of this state (those a later graph still writes)."""
        keep = set(names)
        return InitialState({k: v for k, v in self.values.items() if k in keep})

    def restore(self, module: torch.nn.Module, values: dict[str, torch.Tensor] | None = None) -> None:
        """Write ``values`` (this initial state by default) into ``module``'s buffers, in
        place: a copy that shares the tensors (``memory.graph_copy(share_state=True)``,
        ``near_users``) is restored with it."""
        with torch.no_grad():
            for name, value in (self.values if values is None else values).items():
                _tensor(module, name).copy_(value)

    def give_own_copy(self, module: torch.nn.Module) -> None:
        """Give ``module`` buffers of its own, holding this state, in place of the ones it
        shares (the converted graph shares the float model's: running one would write the
        other's cache)."""
        for name, value in self.values.items():
            owner, leaf = _buffer_slot(module, name)
            if leaf in owner._buffers:
                owner._buffers[leaf] = value.clone()
            else:
                setattr(owner, leaf, value.clone())

    @contextlib.contextmanager
    def pass_over(self, module: torch.nn.Module) -> Iterator[None]:
        """Run a pass over ``module`` from this state; afterwards its buffers hold what they
        held before (bitwise), whatever the pass wrote."""
        if not self.values:
            yield
            return
        before = {name: _tensor(module, name).detach().clone() for name in self.values}
        self.restore(module)
        try:
            yield
        finally:
            self.restore(module, before)
