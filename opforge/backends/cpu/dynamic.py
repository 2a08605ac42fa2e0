"""A dynamic method's delegate at run time: the blob's size expressions made concrete per
call shape, one engine per shape in a bounded least-recently-used cache.

# Design
#
# The lowering of a dynamic method records each symbolic size (a tensor's dims, strides or
# alias offset, an op's integer attributes) as the text of a size expression
# (``opforge.program.symbolic.SizeExpr``), and the plan's ``symbols`` as ``[name, min,
# max]``. ``check_symbolic`` (at init, from ``blob.parse``) checks every expression: its
# text parses within the expression caps, it reads only declared symbols, and its interval
# bounds over the symbols' ranges stay inside the field's range (sizes and strides in
# [0, 2^40], attributes in [-2^62, 2^62]), so no in-range shape can overflow; every symbol
# must be bound by a dimension ``a * s + b`` of a delegate input; the plan made concrete at
# the symbols' minima and maxima passes ``blob.check_plan``.
#
# ``DynamicHandle.bind`` gets the runtime's views at the call's actual sizes: it binds the
# symbols from the inputs' dimensions, refuses values outside the blob's bounds (before
# anything is built or touched), and takes the engine for that shape from its cache: on a
# miss, the plan is made concrete (sizes evaluated, strides of size-1 dims tidied as a static
# lowering would), checked like a static blob by ``blob.check_plan`` and by the engine's
# validation layer, and built. Engines borrow the blob's constant bytes in place (the blob
# segment, or one aligned copy of it, outlives them) and share one weight cache (the
# weights in the layouts oneDNN picked, reordered once per delegate); what each holds of its
# own is its intermediates, scratchpads and primitives. The cache keeps ``MAX_SHAPES`` engines
# (least recently used evicted and destroyed); a binding re-fetches its engine per call, so
# an evicted one is rebuilt, never used after it is freed. The memory limit holds for the
# delegate as a whole: each engine is built within what the shared weights and the other
# cached engines leave, and a build over it evicts the least recently used engine and
# tries again (refused only when it alone does not fit). ``OPFORGE_CPU_PROFILE=1`` prints
# the hits, misses and evictions when the handle is destroyed.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import OrderedDict
from typing import Any

from opforge.backends.cpu.blob import MAX_RANK, _refuse, check_plan
from opforge.backends.named_data import aligned
from opforge.errors import BackendError, OpforgeError
from opforge.program.symbolic import MAX_SYMBOLS, SizeExpr, linear_form

__all__ = ["check_symbolic", "DynamicHandle", "MAX_SHAPES", "concrete_plan"]

MAX_SHAPES = 8
MAX_SIZE = 1 << 40
MAX_ATTR = 1 << 62


class _Exprs:
    """A symbolic plan's parsed expressions, symbol ranges and binding steps."""

    def __init__(self, ranges: dict[str, tuple[int, int]]) -> None:
        self.ranges = ranges
        self.parsed: dict[str, SizeExpr] = {}
        self.bounds: dict[str, tuple[int, int]] = {}
        self.steps: list[tuple[int, int, str, int, int]] = []  # input, dim, symbol, a, b

    def check(self, value: Any, lo: int, hi: int, what: str) -> None:
        if type(value) is int:
            if not lo <= value <= hi:
                raise _refuse(f"{what} is {value}, not in [{lo}, {hi}]")
            return
        if type(value) is not str:
            raise _refuse(f"{what} is {str(value)[:40]!r}, neither an int nor a size expression")
        expr = self.parsed.get(value)
        if expr is None:
            try:
                expr = SizeExpr.parse(value)
            except OpforgeError as e:
                raise _refuse(f"{what}: the size expression {value[:60]!r} does not parse "
                              f"({str(e)[:120]})") from None
            undefined = sorted(expr.symbols() - set(self.ranges))
            if undefined:
                raise _refuse(f"{what}: the size expression {value[:60]!r} reads undefined "
                              f"symbol(s) {undefined[:4]}")
            try:
                self.bounds[value] = expr.bounds(self.ranges)
            except (ZeroDivisionError, OpforgeError, ValueError):
                self.bounds[value] = (-MAX_ATTR - 1, MAX_ATTR + 1)
            self.parsed[value] = expr
        low, high = self.bounds[value]
        if low < lo or high > hi:
            raise _refuse(f"{what}: the size expression {value[:60]!r} spans [{low}, {high}] "
                          f"over the symbols' ranges, outside [{lo}, {hi}]")

    def evaluate(self, value: Any, env: dict[str, int]) -> int:
        return value if type(value) is int else self.parsed[value].evaluate(env)


def check_symbolic(doc: dict, data: memoryview) -> _Exprs:
    """Check a dynamic blob's symbols and expressions (see the module docstring); their
    parsed form, for ``concrete_plan``."""
    symbols = doc.get("symbols")
    if type(symbols) is not list or not 1 <= len(symbols) <= MAX_SYMBOLS:
        raise _refuse(f"symbols is not a list of 1 to {MAX_SYMBOLS} [name, min, max]")
    ranges: dict[str, tuple[int, int]] = {}
    for k, entry in enumerate(symbols):
        if type(entry) is not list or len(entry) != 3 or type(entry[0]) is not str:
            raise _refuse(f"symbols[{k}] is not [name, min, max]")
        name, lo, hi = entry
        try:
            SizeExpr.sym(name)
        except OpforgeError:
            raise _refuse(f"symbols[{k}] name {name[:40]!r} is not an identifier") from None
        if type(lo) is not int or type(hi) is not int or not 0 <= lo <= hi <= MAX_SIZE \
                or name in ranges:
            raise _refuse(f"symbols[{k}] {name[:40]!r} has range [{str(lo)[:20]}, {str(hi)[:20]}] "
                          f"or is declared twice — valid: 0 <= min <= max <= {MAX_SIZE}")
        ranges[name] = (lo, hi)
    exprs = _Exprs(ranges)
    tensors, ops = doc.get("tensors"), doc.get("ops")
    if type(tensors) is not list or type(ops) is not list:
        raise _refuse("no tensor table or op list")
    for i, t in enumerate(tensors):
        if type(t) is not dict:
            raise _refuse(f"tensors[{i}] is not an object")
        for key in ("dims", "strides"):
            values = t.get(key)
            if type(values) is not list or len(values) > MAX_RANK:
                raise _refuse(f"tensors[{i}].{key} is not a list of at most {MAX_RANK} sizes")
            for v in values:
                exprs.check(v, 0, MAX_SIZE, f"tensors[{i}].{key}")
        if len(t["dims"]) != len(t["strides"]):
            raise _refuse(f"tensors[{i}]: {len(t['dims'])} dims but {len(t['strides'])} strides")
        if "offset" in t:
            exprs.check(t["offset"], 0, MAX_SIZE, f"tensors[{i}].offset")
    for i, op in enumerate(ops):
        ia = op.get("ia") if type(op) is dict else None
        if type(ia) is not list or len(ia) > 4096:
            raise _refuse(f"ops[{i}].ia is not a list of at most 4096 attributes")
        for v in ia:
            exprs.check(v, -MAX_ATTR, MAX_ATTR, f"ops[{i}].ia")
    inputs = doc.get("inputs")
    if type(inputs) is not list or not all(type(t) is int and 0 <= t < len(tensors) for t in inputs):
        raise _refuse("inputs is not a list of tensor ids")
    bound: set[str] = set()
    for position, tid in enumerate(inputs):
        for dim, size in enumerate(tensors[tid]["dims"]):
            if type(size) is str:
                form = linear_form(exprs.parsed[size])
                if form is not None and form[0] not in bound:
                    bound.add(form[0])
                    exprs.steps.append((position, dim, *form))
    used = set().union(*(e.symbols() for e in exprs.parsed.values())) if exprs.parsed else set()
    if used - bound:
        raise _refuse(f"symbol(s) {sorted(used - bound)[:4]} that no input dimension binds")
    for env in ({n: lo for n, (lo, _) in ranges.items()}, {n: hi for n, (_, hi) in ranges.items()}):
        check_plan(concrete_plan(doc, exprs, env), data)
    return exprs


def _tidy(dims: list[int], strides: list[int]) -> list[int]:
    """``lowering.core._tidy_strides`` on numbers: a size-1 dim's stride as a dense layout
    would have it (it addresses nothing; oneDNN recognises dense layouts only then)."""
    out = list(strides)
    for k in range(len(dims) - 1, -1, -1):
        if dims[k] == 1:
            out[k] = max((out[j] * dims[j] for j in range(k + 1, len(dims)) if dims[j] != 1),
                         default=1)
    return out


def concrete_plan(doc: dict, exprs: _Exprs, env: dict[str, int]) -> dict:
    """The plan with every expression evaluated at ``env`` (a static plan's form)."""
    ev = exprs.evaluate
    tensors = []
    for t in doc["tensors"]:
        c = dict(t)
        dims = [ev(d, env) for d in t["dims"]]
        strides = [ev(s, env) for s in t["strides"]]
        symbolic = any(type(v) is str for v in (*t["dims"], *t["strides"]))
        c["dims"], c["strides"] = dims, _tidy(dims, strides) if symbolic else strides
        if "offset" in t:
            c["offset"] = ev(t["offset"], env)
        tensors.append(c)
    ops = []
    for op in doc["ops"]:
        c = dict(op)
        c["ia"] = [ev(v, env) for v in op["ia"]]
        ops.append(c)
    plan = {k: v for k, v in doc.items() if k != "symbols"}
    plan["tensors"], plan["ops"] = tensors, ops
    return plan


class DynamicHandle:
    """A dynamic delegate: engines per shape (``MAX_SHAPES`` cached) over one blob."""

    def __init__(self, plan: dict, data: memoryview, threads: int, max_memory: int,
                 registry: Any, specs: dict, capacity: int = MAX_SHAPES, *,
                 weight_cache: int | None = None, named: Any = None) -> None:
        from opforge.backends.cpu.engine import library

        self.lib = library()  # a missing or stale engine fails at load, as for a static delegate
        if plan.get("debug") or any(op.get("kind") in ("kernel", "package") for op in plan["ops"]):
            raise _refuse("a dynamic plan with debug outputs, kernels or package ops")
        self.exprs = check_symbolic(plan, data)  # blob.parse checked it; the parsed form
        self.plan, self.data = plan, aligned(data)  # every shape's engine borrows from it
        self.callouts = any(op["kind"] in ("kernel", "package") for op in plan["ops"])
        self.threads, self.max_memory, self.registry, self.specs = threads, max_memory, registry, specs
        # the engine's own default limit (native/core.cpp ofc_new) when the context gives none
        self.limit = max_memory if max_memory > 0 else 1 << 33
        self.capacity = capacity
        self.engines: OrderedDict[tuple, Any] = OrderedDict()
        # builds and lookups from several method instances: one at a time
        self.lock = threading.Lock()
        # the reordered weights every shape's engine shares (freed after the engines): the
        # program's (shared with its other delegates, freed by it), else the delegate's own
        self.named, self.own_cache = named, weight_cache is None
        self.weight_cache = self.lib.ofc_weight_cache_new() if self.own_cache else weight_cache
        if not self.weight_cache:
            raise BackendError("cpu backend: no memory for the dynamic delegate's weight cache")
        self.hits = self.misses = self.evictions = 0
        self.closed = False
        self.debug_outputs: list = []
        self.crash_names: list = []

    def env_of(self, inputs) -> dict[str, int]:
        """The symbols' values from the inputs' sizes; BackendError outside the blob's bounds."""
        env: dict[str, int] = {}
        for position, dim, symbol, a, b in self.exprs.steps:
            shape = getattr(inputs[position], "shape", None) if position < len(inputs) else None
            if shape is None or dim >= len(shape):
                raise BackendError(f"cpu backend: delegate input {position} has no dimension {dim}")
            value, rest = divmod(int(shape[dim]) - b, a)
            lo, hi = self.exprs.ranges[symbol]
            if rest or not lo <= value <= hi:
                raise BackendError(
                    f"cpu backend: delegate input {position} dimension {dim} — found size "
                    f"{shape[dim]} — valid: {a} * {symbol} + {b} with {symbol} in [{lo}, {hi}] "
                    "(the delegate's bounds) — fix: call the method with sizes in range")
            env[symbol] = value
        return env

    def engine(self, key: tuple) -> tuple[Any, bool]:
        """(the engine for the shape ``key`` (sorted symbol values), whether it was built
        now): cached, else built (the least recently used one evicted beyond capacity)."""
        with self.lock:
            self._live()
            found = self.engines.get(key)
            if found is not None:
                self.engines.move_to_end(key)
                return found, False
            from opforge.backends.cpu.engine import EngineHandle

            plan = concrete_plan(self.plan, self.exprs, dict(key))
            check_plan(plan, self.data)
            while len(self.engines) >= self.capacity:
                self._evict()
            lib, cache = self.lib, self.weight_cache
            while True:  # the memory limit holds for all cached engines and shared weights
                budget = self.limit - lib.ofc_weight_cache_bytes(cache) - sum(
                    h.own_bytes for h in self.engines.values())
                before = lib.ofc_weight_cache_bytes(cache)
                try:
                    handle = EngineHandle(plan, self.data, self.threads, max(budget, 1),
                                          self.registry, self.specs,
                                          weight_cache=cache, named=self.named)
                    break
                except BackendError as e:
                    if "memory limit" not in str(e) or not self.engines:
                        raise
                    self._evict()  # room for this shape: the least recently used one goes
            # what it holds of its own: its allocations less the weights it added to the cache
            handle.own_bytes = lib.ofc_used_bytes(handle.ptr) - (
                lib.ofc_weight_cache_bytes(cache) - before)
            self.engines[key] = handle
            return handle, True

    def _evict(self) -> None:
        _, old = self.engines.popitem(last=False)
        old.close()
        self.evictions += 1

    def bind(self, inputs, outputs) -> "DynamicBinding":
        env = self.env_of(inputs)
        return DynamicBinding(self, tuple(sorted(env.items())), inputs, outputs)

    def _live(self) -> None:
        if self.closed:
            raise BackendError("cpu backend: a call on a delegate that was closed — valid: a call "
                               "before LoadedProgram.delegates.close() — fix: load the program again")

    def stats(self) -> dict:
        return {"shapes": len(self.engines), "capacity": self.capacity, "hits": self.hits,
                "misses": self.misses, "evictions": self.evictions,
                "shared_weight_bytes": self.lib.ofc_weight_cache_bytes(self.weight_cache)
                if not self.closed else 0}

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            if os.environ.get("OPFORGE_CPU_PROFILE") == "1":
                calls = self.hits + self.misses
                rate = f"{100.0 * self.hits / calls:.1f}%" if calls else "-"
                shared = self.lib.ofc_weight_cache_bytes(self.weight_cache)
                print(f"opforge cpu backend: dynamic delegate shape cache: {self.hits} hits, "
                      f"{self.misses} misses (hit rate {rate}), {self.evictions} evictions, "
                      f"{len(self.engines)}/{self.capacity} shapes cached, {shared} bytes of "
                      "reordered weights shared", file=sys.stderr)
            self.closed = True
            for handle in self.engines.values():
                handle.close()
            self.engines.clear()
            if self.own_cache:
                self.lib.ofc_weight_cache_free(self.weight_cache)  # after every engine using it
            self.weight_cache = None


class DynamicBinding:
    """A binding at one shape: fetches that shape's engine per call (an evicted one is
    rebuilt) and keeps the engine's own ``Binding`` while the engine stays the same. A call
    counts as a cache miss when its engine was built for it (at the first call after the
    binding, or after an eviction), else as a hit."""

    def __init__(self, owner: DynamicHandle, key: tuple, inputs, outputs) -> None:
        from opforge.backends.cpu.binding import Binding

        self.owner, self.key = owner, key
        self.inputs, self.outputs = list(inputs), list(outputs)
        self._engine, self._built = owner.engine(key)
        self._bound = Binding(self._engine, self.inputs, self.outputs)  # checks every shape

    def __call__(self) -> None:
        owner = self.owner
        engine, built = owner.engine(self.key)
        if built or self._built:
            owner.misses += 1
            self._built = False
        else:
            owner.hits += 1
        if engine is not self._engine:
            from opforge.backends.cpu.binding import Binding

            self._bound = Binding(engine, self.inputs, self.outputs)
            self._engine = engine
        self._bound()
