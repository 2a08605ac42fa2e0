"""Random graphs from a seed: ``generate(seed)`` is a pure function of the seed.

The builder keeps every value's float64 reference while it builds, so each op is checked
the moment it is added: it must run in eager float64, give finite values of a sane size
(|x| ≤ 1e4, 1..4096 elements) and pass its own ``valid`` (e.g. comparison margins). An op
that does not fit is simply not added. ``replay(graph)`` repeats the same checks on a
graph the shrinker has edited.

Wiring: an op reads an existing value (most often the latest, so graphs get deep; any
value may get several readers) or a new graph input; binary ops and friends get a second
operand that broadcasts. Every value nobody reads is returned, and a few others too (an
intermediate value, sometimes a graph input itself).
"""

from __future__ import annotations

import math
import random
from dataclasses import replace

import torch

from fuzz.cpu_diff.graph import HELPERS, Graph, Input, Node, compact
from fuzz.cpu_diff.ops import OPS

__all__ = ["generate", "replay", "Builder", "HELPER_NS"]

HELPER_NS: dict = {}
exec(HELPERS, HELPER_NS)  # draw() and spread(), the same code every rendered graph runs

MAX_ABS = 1e4
MAX_NUMEL = 4096


class Builder:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.inputs: list[Input] = []
        self.nodes: list[Node] = []
        self.values: list[torch.Tensor] = []  # float64 (or integer/bool) reference values
        self.where: list[tuple[str, int]] = []  # builder value id → ("input" | "node", index)

    # --- values ---------------------------------------------------------------------------
    def val(self, vid: int) -> torch.Tensor:
        return self.values[vid]

    def shape(self, vid: int) -> tuple[int, ...]:
        return tuple(self.values[vid].shape)

    def dtype(self, vid: int) -> str:
        t = self.values[vid]
        return "bool" if t.dtype == torch.bool else ("float32" if t.is_floating_point() else str(t.dtype)[6:])

    def candidates(self, dtype: str) -> list[int]:
        return [v for v in range(len(self.values)) if self.dtype(v) == dtype and self.values[v].dim() > 0]

    # --- graph inputs ---------------------------------------------------------------------
    def new_input(self, shape, dtype="float32", kind="randn", high=10) -> int:
        shape = tuple(int(s) for s in shape)
        if dtype == "bool":
            kind = "bool"
        elif dtype != "float32":
            kind = "int"
        scale = self.rng.choice([1.0, 1.0, 3.0, 0.1]) if kind in ("randn", "pos") else 1.0
        inp = Input(shape, dtype, kind, self.rng.randrange(2**31), scale, high)
        self.inputs.append(inp)
        self.where.append(("input", len(self.inputs) - 1))
        self.values.append(_draw64(inp))
        return len(self.values) - 1

    def random_shape(self, ranks=None) -> tuple[int, ...]:
        r = self.rng
        rank = r.choice(ranks) if ranks else r.choice([1, 2, 2, 3, 3, 4])
        while True:
            shape = tuple(r.choice([1, 2, 3, 4, 5, 6, 8]) for _ in range(rank))
            if math.prod(shape) <= 256:
                return shape

    def conv_shape(self, d: int) -> tuple[int, ...]:
        r = self.rng
        hi = {1: 12, 2: 8, 3: 5}[d]
        return (r.randint(1, 2), r.randint(1, 6), *(r.randint(1, hi) for _ in range(d)))

    def pick(self, dtype="float32", ranks=None, pred=None, kind="randn", shape=None, new_shape=None) -> int:
        """An existing value that fits (mostly the latest), else a new graph input."""
        cands = [v for v in self.candidates(dtype)
                 if (ranks is None or self.values[v].dim() in ranks)
                 and (shape is None or self.shape(v) == tuple(shape))
                 and (pred is None or pred(self.values[v]))]
        if cands and self.rng.random() < 0.85:
            return cands[-1] if self.rng.random() < 0.5 else self.rng.choice(cands)
        if shape is None:
            shape = new_shape() if new_shape else self.random_shape(ranks)
        high = 10
        return self.new_input(shape, dtype, kind, high)

    def pick_broadcast(self, shape, dtype, pred=None, kind="randn", allow_bigger=False) -> int | None:
        """A second operand whose shape broadcasts to ``shape`` (or, with allow_bigger,
        one that ``shape`` broadcasts into)."""
        r = self.rng
        cands = [v for v in self.candidates(dtype) if _broadcasts(self.shape(v), shape)
                 and (pred is None or pred(self.values[v]))]
        if cands and r.random() < 0.5:
            return r.choice(cands)
        if r.random() < 0.4:
            target = tuple(shape)
        else:
            keep = r.randint(0, len(shape)) if r.random() < 0.4 else len(shape)
            target = tuple(1 if r.random() < 0.4 else s for s in shape[len(shape) - keep:]) or (1,)
        if allow_bigger and r.random() < 0.3:
            target = tuple(r.randint(1, 3) if s == 1 else s for s in shape)
        return self.new_input(target, dtype, kind)

    # --- nodes ----------------------------------------------------------------------------
    def emit(self, name: str, args, attrs: dict) -> int | None:
        node = Node(name, tuple(args), tuple(sorted(attrs.items())), self.rng.randrange(2**31))
        out = evaluate(node, [self.values[a] for a in args])
        if out is None:
            return None
        self.nodes.append(node)
        self.where.append(("node", len(self.nodes) - 1))
        self.values.append(out)
        return len(self.values) - 1

    def finish(self) -> Graph:
        """The graph with inputs numbered first; every value nobody reads is returned, and
        a few others (an intermediate value, sometimes a graph input)."""
        n_in = len(self.inputs)
        gid = [i if kind == "input" else n_in + i for kind, i in self.where]
        nodes = tuple(replace(n, args=tuple(gid[a] for a in n.args)) for n in self.nodes)
        read = {a for n in nodes for a in n.args}
        values = range(n_in, n_in + len(nodes))
        outputs = [v for v in values if v not in read]
        outputs += [v for v in values if v in read and self.rng.random() < 0.15]
        if self.rng.random() < 0.1:
            outputs.append(self.rng.randrange(n_in))
        self.rng.shuffle(outputs)
        return Graph(tuple(self.inputs), nodes, tuple(dict.fromkeys(outputs)))


def _broadcasts(small, big) -> bool:
    if len(small) > len(big):
        return False
    return all(s == b or s == 1 for s, b in zip(reversed(small), reversed(big)))


def _draw64(inp: Input) -> torch.Tensor:
    t = HELPER_NS["draw"](inp.shape, inp.dtype, inp.kind, inp.seed, inp.scale, inp.high)
    return t.double() if t.is_floating_point() else t


def render(node: Node):
    return OPS[node.op].render(node.attr)


def evaluate(node: Node, args: list[torch.Tensor]) -> torch.Tensor | None:
    """The node's float64 value, or None when it does not belong in a graph (eager refuses
    it, the result is not a finite sane tensor, or the op's own check fails)."""
    spec = OPS[node.op]
    expr, ctor = spec.render(node.attr)
    ns = dict(HELPER_NS)
    try:
        if ctor is not None:
            ns["M"] = HELPER_NS["spread"](eval(ctor, ns), node.seed).double()
        names = [f"a{i}" for i in range(len(args))]
        ns.update(zip(names, args))
        with torch.no_grad():
            out = eval(expr.format(*names, m="M"), ns)
    except Exception:  # noqa: BLE001 - eager's refusal means the op does not fit here
        return None
    if not isinstance(out, torch.Tensor) or not 1 <= out.numel() <= MAX_NUMEL or out.dim() == 0:
        return None
    if out.is_floating_point():
        if out.dtype != torch.float64 or not torch.isfinite(out).all() or float(out.abs().max()) > MAX_ABS:
            return None
    if spec.valid is not None and not spec.valid(args, out, node.attr):
        return None
    return out


def generate(seed: int, max_nodes: int = 10) -> Graph:
    rng = random.Random(seed)
    b = Builder(rng)
    names = sorted(OPS)
    weights = [OPS[n].weight for n in names]
    target = rng.randint(1, max_nodes)
    for _ in range(target * 4):
        if len(b.nodes) >= target:
            break
        name = rng.choices(names, weights)[0]
        picked = OPS[name].gen(b)
        if picked is not None:
            b.emit(name, *picked)  # inputs a refused op drew stay unread; compact drops them
    if not b.nodes:
        x = b.new_input(b.random_shape())
        b.emit("unary.relu", (x,), {"fn": "relu"})
    return compact(b.finish())


def replay(graph: Graph) -> list[torch.Tensor] | None:
    """Every value's float64 reference, or None if an edited graph no longer fits."""
    values = [_draw64(i) for i in graph.inputs]
    for node in graph.nodes:
        out = evaluate(node, [values[a] for a in node.args])
        if out is None:
            return None
        values.append(out)
    return values
