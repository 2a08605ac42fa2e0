"""A 16-bit activation scheme's roundings inside the engine's fused ops (16a4w_block, 16a8w,
16a16w, 16a4w on the cpu backend).

PT2E's 16-bit schemes round every op's float32 result to its own 16-bit grid:
``dequantize(quantize(x, s, zp, qmin, qmax))``, a pair after each node. A decoder's RMSNorm
(pow, mean, add, rsqrt, mul, mul), rotation (neg, cat, mul, mul, add) and attention
(scores, scaling, softmax, value sum) then carry a pair between every two of their nodes,
and the matchers that make each of them one engine op (``rms_norm``, ``rope``,
``attention``) see no group: the program ran 40 quantize-dequantize ops a layer, the
attention over the whole cache capacity, the grouped KV cache copied twice and re-rounded
(issue 46: 16a4w_block decoded at 2.3-2.5x its float32 program, the same weights with float
activations at 3.2x).

``fold_activation_roundings`` gives the lowering the subgraph with three kinds of pairs
taken out (the partition's own graph is not touched: a copy, the same node names):

1. **on the grid** (exact): the value is already on the pair's grid, so the pair gives it
   back bit for bit (``quantized._on_grid``: a view of a pair's result re-rounded with the
   same parameters) — and a **KV cache** written in place with values on its grid, read
   back through a pair of the same parameters: each slot holds what a write stored (a
   value on the grid) or its initial zero (on the grid when ``qmin <= zp <= qmax``), so the
   whole cache is on the grid (this assumes the cache state holds only what the program
   writes, as generation does: a state set from outside to values off the grid would be
   re-rounded by the lean runtime and not here);
2. **inside a fused group** (within a bound): a pair on a node that an engine op computes
   together with its neighbours and never writes out (an RMSNorm's mean, a rotation's
   products, attention's scores and weights). The engine keeps those intermediates in
   float32; every value a fused op writes is still rounded to its 16-bit grid, as every
   unfused op's result is. Only 16-bit grids (``qmax - qmin >= 65535``) are dropped: each
   dropped rounding moved its value by at most half a step, ``range / 131070``, where the
   value lies inside the calibrated range (outside it, the pair clamped, and the fused op
   keeps the unclamped float32 value);
3. the **duplicates**: several dequantizes of one quantize are one node (the same values),
   so a group reading one value twice (an RMSNorm's ``x`` in pow and in the product) matches.

The groups are found on the graph with every 16-bit pair taken out, then the graph is
rebuilt taking out only the pairs inside a group (and 1 and 3), and matched again: a pair
dropped for a group the second match does not find is put back, until both agree.

``OPFORGE_CPU_FUSED_ROUNDINGS=0`` at export keeps every pair (each rounding computed as
lean computes it: the A/B of ``bench/int_weights.py``, and the exact path).
"""

from __future__ import annotations

import dataclasses
import os

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.quantized import _MOVES, _on_grid, _qop, _round_trip

__all__ = ["fold_activation_roundings", "enabled"]

# a grid of at least this many steps is "16-bit" (its rounding may be left inside a fused op)
_STEPS_16 = (1 << 16) - 1
_CACHE_WRITES = {"aten::index_copy": 3, "aten::index_copy_": 3, "aten::index_put": 2,
                 "aten::index_put_": 2}  # op → the position of the values written


def enabled() -> bool:
    return os.environ.get("OPFORGE_CPU_FUSED_ROUNDINGS", "1") != "0"


@dataclasses.dataclass
class _Pair:
    """``x`` → ``quantize`` → each of ``dequantizes``, one set of parameters."""

    x: torch.fx.Node
    quantize: torch.fx.Node
    dequantizes: list


def _pairs(graph: torch.fx.Graph) -> dict[str, _Pair]:
    """Every round trip on a 16-bit grid of a float32 node ``x`` read by one quantize,
    keyed by ``x``'s name (an 8-bit scheme's pairs stay as they are: the int8 patterns of
    lowering/quantized.py read them)."""
    found: dict[str, _Pair] = {}
    q_op = _qop("quantize_per_tensor")
    for q in graph.nodes:
        if q.op != "call_function" or q.target != q_op or q.kwargs:
            continue
        x = q.args[0]
        fake = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(fake, torch.Tensor) or fake.dtype != torch.float32 \
                or sum(u.target == q_op for u in x.users) != 1:
            continue  # (a KV cache write is read by its pair and by the state's output too)
        dqs = [u for u in q.users if _round_trip(u) is q]
        if not dqs or len(dqs) != len(q.users):
            continue
        qmin, qmax = (list(q.args) + [None] * 5)[3:5]
        if isinstance(qmin, int) and isinstance(qmax, int) and qmax - qmin >= _STEPS_16:
            found[x.name] = _Pair(x, q, dqs)
    return found


def _cache_on_grid(x, pair: _Pair, state: dict) -> bool:
    """``x`` writes a program state tensor (a KV cache) in place with values on the pair's
    grid, and the pair's zero point lies in its range (the initial zeros are on it)."""
    name = op_name(x) if x.op == "call_function" else ""
    at = _CACHE_WRITES.get(name.split(".")[0])
    if at is None or len(x.args) <= at:
        return False
    if at == 2 and (len(x.args) > 3 and x.args[3] or x.kwargs.get("accumulate")):
        return False  # (an accumulating index_put adds: its sums are off the grid)
    buffer, values = x.args[0], x.args[at]
    params = tuple(pair.quantize.args[1:6])
    zp, qmin, qmax = params[1], params[2], params[3]
    return (isinstance(buffer, torch.fx.Node) and buffer.op == "placeholder"
            and buffer.name in state and isinstance(zp, int) and qmin <= zp <= qmax
            and _on_grid(values, params))


def _exact(pairs: dict[str, _Pair], sub) -> dict[str, str | None]:
    """The pairs that give their value back bit for bit (module docstring, 1): x's name →
    the name of the pair whose grid it is on (None: a cache)."""
    exact: dict[str, str | None] = {}
    for name, pair in pairs.items():
        params = tuple(pair.quantize.args[1:6])
        if _cache_on_grid(pair.x, pair, sub.state or {}):
            exact[name] = None
            continue
        if _on_grid(pair.x, params):
            v = pair.x
            while isinstance(v, torch.fx.Node) and v.op == "call_function" \
                    and op_name(v).split(".")[0] in _MOVES:
                v = v.args[0]
            source = v.args[0].args[0] if isinstance(v, torch.fx.Node) else None  # dq → q → x
            exact[name] = source.name if isinstance(source, torch.fx.Node) else None
    return exact


def _rewritten(sub, pairs: dict[str, _Pair], bypass: set[str]):
    """A copy of ``sub`` whose pairs named in ``bypass`` are gone (their dequantizes'
    readers read ``x``) and whose other pairs have one dequantize each."""
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    out = graph.graph_copy(sub.graph_module.graph, env)
    old_output = next(n for n in reversed(sub.graph_module.graph.nodes) if n.op == "output")
    graph.output(out).meta = dict(old_output.meta)
    for name, pair in pairs.items():
        dqs = [env[d] for d in pair.dequantizes]
        target = env[pair.x] if name in bypass else dqs[0]
        for d in dqs:
            if d is not target:
                d.replace_all_uses_with(target)
                graph.erase_node(d)
        if name in bypass:
            graph.erase_node(env[pair.quantize])
    return dataclasses.replace(sub, graph_module=torch.fx.GraphModule(sub.graph_module, graph))


def _interior(sub, specs: dict) -> set[str]:
    """The nodes the lowering's matchers make part of a fused op without writing them out
    (every node of a group but its last; a safe softmax's inner nodes)."""
    from opforge.backends.cpu.lowering.core import Lowering

    lowering = Lowering(sub, specs)
    inner = {name for name, group in lowering.groups.items() if group.last.name != name}
    inner |= {name for name, softmax in lowering.safe_softmax.items() if softmax.name != name}
    return inner


def fold_activation_roundings(sub, specs: dict, debug: str | None = None):
    """``sub`` for the lowering with the 16-bit activation pairs the module docstring names
    taken out (``sub`` itself when there is none, or when disabled or a debug build)."""
    if debug or not enabled():
        return sub
    pairs = _pairs(sub.graph_module.graph)
    if not pairs:
        return sub
    exact = first = _exact(pairs, sub)
    dropped = set(pairs) - set(exact)  # first: every pair out, to find the groups they hide
    for _ in range(4):
        trial = _rewritten(sub, pairs, dropped | set(exact))
        inner = _interior(trial, specs)
        keep = {name for name in dropped if name in inner}
        # an exact pair whose source pair is dropped is on that grid no more, unless inside
        safe = {name for name, source in exact.items() if source not in keep or name in inner}
        if keep == dropped and safe == set(exact):
            return trial
        dropped, exact = keep, {name: exact[name] for name in safe}
    return _rewritten(sub, pairs, set(first))  # (no agreement: the exact ones alone)
