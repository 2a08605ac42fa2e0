"""Which nodes the cpu lowering folds to a constant at export, and the fold itself.

``Lowering._lower`` folds a node (``_fold``: it runs the op on the constants, no engine op)
when ``folds`` says so; the walk's deferral (``released.py``) holds back exactly the nodes
``folds`` names, asking it with the folds it already holds back seen as the constants they
will be (``Lowering.arg(..., held)``). One test for both: a node held back is one the
lowering would have folded, and a node the lowering folds is held back once its inputs
are constants, so neither a fold is lost (a fused op would read the wrong value) nor a
weight's float copy made early (the memory released.py saves).

``takes`` is the one list of the tables that lower a node in place of its own lowering;
``_lower`` dispatches on it, after the fold, so a table added there is a table ``folds``
sees.
"""

from __future__ import annotations

import operator

import torch

from opforge.backends.cpu.lowering.symbolic import reads_symbolic_sizes
from opforge.backends.partition import op_name

__all__ = ["FOLDABLE_NAMESPACES", "folds", "takes", "passed_through", "dynamic"]

FOLDABLE_NAMESPACES = ("aten", "quantized_decomposed", "torchao")


def folds(L, node: torch.fx.Node, args, kwargs) -> bool:
    """Whether ``L.lower(node)`` folds ``node``: not an item of a result, not a matmul
    operand's factor passed through, nothing ``takes`` names takes it, a foldable
    namespace, no argument an engine tensor (``args``, ``kwargs``: their values,
    ``Lowering.arg``) and no symbolic size."""
    return (node.target is not operator.getitem and passed_through(L, node) is None
            and takes(L, node) is None and op_name(node).split("::")[0] in FOLDABLE_NAMESPACES
            and _all_constant(args, kwargs) and not dynamic(L, node, args, kwargs))


def takes(L, node: torch.fx.Node) -> str | None:
    """What lowers ``node`` in place of its own lowering (never a fold): "package" (an op
    package), "int8" (a quantized pattern), "softmax" (fused into its safe softmax),
    "group" (one engine op of a fused group: RMSNorm, rotation, attention, int_dot, ...)
    or "grouped" (grouped-query attention's KV cache read in place); None: its own
    lowering, or a fold."""
    softmax = L.safe_softmax.get(node.name)
    if node.name in L.packages:
        return "package"
    if node.name in L.int8:
        return "int8"
    if softmax is not None and softmax is not node:
        return "softmax"
    if L.groups.get(node.name) is not None:
        return "group"
    if node.name in L.grouped:
        return "grouped"
    return None


def passed_through(L, node: torch.fx.Node):
    """The value a matmul operand's scalar multiply passes on (an engine tensor or a
    grouped view; its factor becomes the matmul's output scale, ``Lowering.lower``), or
    None."""
    feeds = L.scaled.get(node.name)
    source = L.env.get(node.args[0].name) if feeds is not None else None
    if isinstance(source, tuple) and len(source) == 2 and source[0] in ("t", "g"):
        return source
    return None


def dynamic(L, node: torch.fx.Node, args, kwargs) -> bool:
    """Whether ``node`` reads or makes a symbolic size (a dynamic method's delegate)."""
    return L.table is not None and reads_symbolic_sizes(L, node, args, kwargs)


def _all_constant(args, kwargs) -> bool:
    found = []

    def walk(v):
        if isinstance(v, tuple) and len(v) == 2 and v[0] == "t":
            found.append(False)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk(args)
    walk(list(kwargs.values()))
    return not found


def _unwrap(v):
    if isinstance(v, tuple) and len(v) == 2 and v[0] == "c":
        return v[1]
    if isinstance(v, (list, tuple)):
        return type(v)(_unwrap(x) for x in v)
    return v


def _fold(node, args, kwargs):
    return _wrap(node.target(*_unwrap(args), **_unwrap(kwargs)))


def _wrap(result):
    """A folded result as the environment holds it: each tensor ``("c", tensor)``."""
    if isinstance(result, (tuple, list)):
        return tuple(("c", r) if isinstance(r, torch.Tensor) else r for r in result)
    return ("c", result) if isinstance(result, torch.Tensor) else result
