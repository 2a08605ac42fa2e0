"""The lowering's core: the plan (tensors with dtype, dims, strides and role; ops), the
``Lowering`` walk over a subgraph, constants, aliases, custom ops through the kernel ABI and
op-package nodes, and the registry every op family adds its lowerings to (``LOWERINGS``).
"""

from __future__ import annotations

import math
import operator
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.constants import constant_bytes
from opforge.backends.cpu.lowering.folding import (  # noqa: F401 (re-exported to the families)
    FOLDABLE_NAMESPACES, _all_constant, _fold, _unwrap, _wrap, dynamic, folds, passed_through,
    takes,
)
from opforge.backends.cpu.lowering.released import FoldedConstants
from opforge.backends.cpu.lowering.symbolic import (  # noqa: F401 (_is_one: re-exported)
    _is_one, expr_text, in_range, known, same, symbols_of, to_dim,
)
from opforge.backends.cpu.lowering.layouts import (  # noqa: F401 (re-exported to the families)
    _broadcast_strides, _dense, _post_operand_misread, _tidy_strides, channels_last, row_major,
)
from opforge.backends.cpu.lowering.unsupported import Unsupported
from opforge.export.argument_values import scalar_type_of


aten = torch.ops.aten

# oneDNN eltwise algorithm codes (native/core.cpp alg_of) and binary codes
RELU, TANH, ELU, SQUARE, ABS, SQRT, LINEAR, SOFT_RELU, LOGISTIC, EXP, GELU_TANH, SWISH, LOG, \
    CLIP, POW, GELU_ERF, ROUND, MISH, HARDSWISH, HARDSIGMOID = range(20)
B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN = range(100, 106)
# generic elementwise codes (native/copy.cpp EwCode)
EW = {name: i for i, name in enumerate(
    ["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "where", "logical_not",
     "bitwise_not", "neg", "logical_and", "logical_or", "maximum", "minimum", "fill",
     "masked_fill"])}

GENERIC_DTYPES = (torch.float32, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8)


@dataclass
class TensorSpec:
    dtype: torch.dtype
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    role: str                      # input, state, output, const, temp, alias
    base: int = -1
    offset: int = 0
    data: bytes | memoryview | None = None  # a constant's bytes (a view of its tensor)

    def as_json(self, data_offset: int | None, named: str | None = None) -> dict:
        out = {"dtype": int(scalar_type_of(self.dtype)), "dims": [expr_text(d) for d in self.dims],
               "strides": [expr_text(s) for s in self.strides], "role": self.role}
        if self.role == "alias":
            out["base"], out["offset"] = self.base, expr_text(self.offset)
        if named is not None:
            out["named"] = [named, len(self.data)]
        elif self.data is not None:
            out["data"] = [data_offset, len(self.data)]
        return out


@dataclass
class Plan:
    tensors: list[TensorSpec] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    impls: list[dict] = field(default_factory=list)   # per lowered node: what runs it
    # [input position, output position] per state input written in place (blob.py)
    state: list[list[int]] = field(default_factory=list)
    # a debug build (``Lowering(..., debug=True)``): the trailing outputs are copies of
    # node results, each ``[output position, node name, result index]``
    debug: list[list] = field(default_factory=list)
    # a dynamic method's delegate: [name, min, max] of the symbols its sizes read
    symbols: list[list] = field(default_factory=list)


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


class Lowering:
    """Each op is tagged with the nodes it computes (``op["_nodes"]``, not written to the
    blob). A debug build makes node results delegate outputs (row-major copies, after the
    delegate's own) so a debugger can read them: ``debug="nodes"``, every node result the
    engine computes (lowered unfused); ``debug="groups"``, after fusion (``keep_results``),
    each tensor an op still writes, under the last node of its fused group."""

    def __init__(self, subgraph, specs: dict, *, debug: str | None = None) -> None:
        self.sub = subgraph
        self.specs = specs
        self.debug = debug
        self.results: list[tuple[str, int, int]] = []  # a "groups" build's candidates
        self.plan = Plan()
        # a temporary whose writers now write a delegate output instead → that output
        # (redirect_or_copy): a second output of the same value copies from the first
        self.redirected: dict[int, int] = {}
        self.shared_roots: set[int] = set()  # tensors two delegate outputs hold (run)
        # quantize node name → the shared quantize-dequantize result (lowering/quantized.py)
        self.round_trips: dict[str, tuple] = {}
        self.env: dict[str, Any] = {}       # node name → ("t", id) | ("c", tensor) | python value | tuple
        self.const_ids: dict[int, int] = {}  # id(torch tensor) → engine tensor id
        self.const_keep: list[torch.Tensor] = []
        self.channels_last_copies: dict[int, int] = {}
        self.users: dict[str, int] = {}
        self.custom_ops = set(specs.get("custom_ops") or [])
        from opforge.backends.cpu.lowering.quantized import find_int8_patterns  # (a family)

        self.int8 = find_int8_patterns(subgraph) if specs.get("int8", True) else {}
        from opforge.backends.cpu.lowering.normalization import find_rms_norm, find_safe_softmax
        from opforge.backends.cpu.lowering.rotary import find_rope

        # node name → its softmax node / the group (RMSNorm, rotation) it is part of, one
        # engine op each; a debug="nodes" build lowers them unfused, so each of their nodes'
        # results is computed and observable
        self.safe_softmax = find_safe_softmax(subgraph) if debug != "nodes" else {}
        self.groups = find_rms_norm(subgraph) if debug != "nodes" else {}
        self.groups.update(find_rope(subgraph, self.groups) if debug != "nodes" else {})
        if debug != "nodes" and os.environ.get("OPFORGE_CPU_FILLED_ATTENTION", "1") != "0":
            from opforge.backends.cpu.lowering.attention import find_filled_attention

            # a static KV cache's masked attention reads only the slots written so far
            filled = find_filled_attention(subgraph, self.groups, self.safe_softmax)
            self.groups.update(filled)
            for name in filled:  # a safe softmax a match took is computed by its op
                self.safe_softmax.pop(name, None)
        if specs.get("int8", True) and debug != "nodes":
            from opforge.backends.cpu.lowering.quantized import find_uint8_max_pools

            self.groups.update(find_uint8_max_pools(subgraph))
        if debug != "nodes":
            from opforge.backends.cpu.lowering.int_dot import find_int_dot

            # a linear on dynamically quantized int8 activations: one int_dot_matmul
            self.groups.update(find_int_dot(subgraph))
        from opforge.backends.cpu.lowering.grouped_matmul import find_grouped_chains

        # grouped-query attention: node name → "chain" | "matmul" (the expanded KV cache
        # read in place by its matmul; a debug="nodes" build lowers each view on its own)
        self.grouped = find_grouped_chains(subgraph) if debug != "nodes" else {}
        from opforge.backends.cpu.lowering.scaled_matmul import find_scaled_operands

        # q * s, k * s read only by their matmul: multiply node → matmul node; the factors
        # of those lowered as pass-throughs, per matmul node (lowering/scaled_matmul.py)
        self.scaled = find_scaled_operands(subgraph) if debug != "nodes" else {}
        self.scaled = {m: mm for m, mm in self.scaled.items() if m not in self.groups}  # (a group's own)
        self.scales: dict[str, float] = {}
        self.packages = specs.get("_package_nodes") or {}
        # node name → the state input it writes in place (its result is the delegate output
        # that ``Subgraph.state`` names for that input)
        self.in_place: dict[str, str] = {}
        # a dynamic method's symbol table (export/symbolic.py): sizes become ``SymDim``s
        self.table = getattr(subgraph, "symbols", None) or None

    def dim(self, value):
        """A plan size: an int, or a ``SymDim`` for a symbolic one (``lowering/symbolic.py``)."""
        return to_dim(value, self.table)

    def shape(self, fake) -> tuple:
        return tuple(self.dim(d) for d in fake.shape)

    # --- tensors ---------------------------------------------------------------------
    def new_tensor(self, dtype, dims, role="temp", strides=None, **kw) -> int:
        dims = tuple(self.dim(d) for d in dims)
        strides = _tidy_strides(dims, tuple(self.dim(s) for s in strides) if strides
                                else row_major(dims))
        if "offset" in kw:
            kw["offset"] = self.dim(kw["offset"])
        if self.table is not None:  # what the blob's load checks (cpu/dynamic.py) will hold
            in_range((*dims, *strides, kw.get("offset", 0)), 0, 1 << 40)
        self.plan.tensors.append(TensorSpec(dtype, dims, strides, role, **kw))
        return len(self.plan.tensors) - 1

    def spec(self, tid: int) -> TensorSpec:
        return self.plan.tensors[tid]

    def materialize(self, value) -> int:
        """An engine tensor id for an env entry (constants become const tensors once)."""
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "t":
            return value[1]
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "g":
            from opforge.backends.cpu.lowering.grouped_matmul import materialize

            return materialize(self, value)[1]  # (a grouped view: copied, as views are)
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "c":
            key = id(value[1])
            self.const_keep.append(value[1])  # ids stay unique while the tensor lives
            if key not in self.const_ids:
                tensor = value[1].detach()  # a view of it, or one copy (constants.py)
                data = constant_bytes(tensor, getattr(self.sub, "named_data", None))
                self.const_ids[key] = self.new_tensor(tensor.dtype, tensor.shape, "const", data=data)
            return self.const_ids[key]
        raise Unsupported("op", f"expected a tensor, found {type(value).__name__}")

    def arg(self, a, held=()):
        """An argument's value: a node's from the environment; one named in ``held`` (a
        fold not made yet, released.py) as the constant it will be (its fake value)."""
        if isinstance(a, torch.fx.Node):
            return _wrap(_val(a)) if a.name in held else self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x, held) for x in a)
        if hasattr(a, "expr") and hasattr(a, "hint"):  # a size known at run time (SymSize)
            return self.dim(a)
        return a

    def op(self, kind, ins, outs, ia=(), fa=(), name="", post=None) -> dict:
        ia = [self.dim(x) for x in ia]
        if self.table is not None:
            in_range(ia, -(1 << 62), 1 << 62)
        entry = {"kind": kind, "in": list(ins), "out": list(outs), "ia": ia,
                 "fa": [float(x) for x in fa], "post": post or [], "name": name}
        self.plan.ops.append(entry)
        return entry

    def contiguous(self, tid: int) -> int:
        """``tid`` itself if row-major contiguous, else a row-major copy of it."""
        t = self.spec(tid)
        if same(t.strides, row_major(t.dims)) or known(lambda: math.prod(t.dims) <= 1):
            return tid
        out = self.new_tensor(t.dtype, t.dims)
        self.copy(tid, out)
        return out

    def copy(self, src: int, dst: int, dst_offset: int = 0, dst_strides=None) -> None:
        s, d = self.spec(src), self.spec(dst)
        dims = s.dims
        ia = [len(dims), *dims, *s.strides, 0, *(dst_strides or d.strides), dst_offset]
        self.op("copy", [src], [dst], ia, name="copy")

    # --- the walk ------------------------------------------------------------------------
    def run(self) -> Plan:
        g = self.sub.graph_module.graph
        for node in g.nodes:
            for a in node.all_input_nodes:
                self.users[a.name] = self.users.get(a.name, 0) + 1
        outputs = self.sub.output_nodes()
        written = {name: position for name, position in getattr(self.sub, "state", {}).items()
                   if position is not None}
        self.in_place = {outputs[position].name: name for name, position in written.items()}
        for name in self.sub.inputs:
            node = next(n for n in g.nodes if n.name == name)
            fake = _val(node)
            tid = self.new_tensor(fake.dtype, fake.shape, "state" if name in written else "input")
            self.plan.inputs.append(tid)
            self.env[name] = ("t", tid)
        for name, tensor in self.sub.constants.items():
            self.env[name] = ("c", tensor)
        results = []
        folded = FoldedConstants(self)  # a folded weight dropped once read (released.py)
        for node in g.nodes:
            if node.op == "call_function":
                if not folded.defer(node):  # a constant fold: made when read (released.py)
                    folded.resolve(node)
                    first = len(self.plan.ops)
                    self.env[node.name] = self.lower(node)
                    folded.after(node)
                    for op in self.plan.ops[first:]:
                        op.setdefault("_nodes", []).append(node.name)
                if self.debug and node.target is not operator.getitem:
                    results.append(node.name)
        folded.resolve_rest(g)
        debug = []  # copied before the outputs are placed: a result they read is not redirected
        if self.debug == "groups":
            self.results = self._debug_results(results, outputs)  # kept after fusion
        for name, item, src in self._debug_results(results, outputs) if self.debug == "nodes" else ():
            spec = self.spec(src)
            debug.append((name, item, self.new_tensor(spec.dtype, spec.dims, "output")))
            self.copy(src, debug[-1][2])
        for name, position in sorted(written.items(), key=lambda item: item[1]):
            tid = self.sub.inputs.index(name)
            if self.env.get(outputs[position].name) != ("t", self.plan.inputs[tid]):
                raise Unsupported("op", f"{outputs[position].name}: the new value of state "
                                  f"{name} is not written in place by one engine op")
            self.plan.state.append([tid, position])
        self.shared_roots = _shared_roots(self, [self.env.get(o.name) for o in outputs])
        for position, out in enumerate(outputs):
            if position in written.values():
                continue  # the state itself: the program passes it as this output
            value = self.env[out.name]
            fake = _val(out)
            tid = self.new_tensor(fake.dtype, fake.shape, "output")
            src = self.materialize(value)
            self.plan.outputs.append(self.redirect_or_copy(src, tid))
        for name, item, out in debug:  # the delegate's own outputs first
            self.plan.outputs.append(out)
            self.plan.debug.append([len(self.plan.outputs) - 1, name, item])
        if self.table is not None:  # the symbols its sizes read (none: a static blob)
            used = symbols_of([*(v for t in self.plan.tensors for v in (*t.dims, *t.strides, t.offset)),
                               *(v for op in self.plan.ops for v in op["ia"])])
            self.plan.symbols = [[s.name, s.min, s.max] for s in self.table.symbols if s.name in used]
        return self.plan

    def _debug_results(self, results: list[str], outputs: list) -> list[tuple[str, int, int]]:
        """The node results a debug build copies out: each engine tensor once, under the
        last node that names it (a batch norm folded into its convolution: the tensor is
        the batch norm's, the convolution's own result is never computed); not the
        delegate's outputs (the runtime sees those) nor empty tensors."""
        own = {(o.args[0].name, o.args[1]) if o.target is operator.getitem else (o.name, 0)
               for o in outputs if isinstance(o, torch.fx.Node)}
        last: dict[int, tuple[str, int]] = {}
        for name in results:
            for item, tid in _engine_tensors(self.env[name]):
                last.pop(tid, None)  # re-inserted: the order is the last naming node's
                last[tid] = (name, item)
        return [(name, item, tid) for tid, (name, item) in last.items()
                if (name, item) not in own and not known(lambda: math.prod(self.spec(tid).dims) == 0)]

    def keep_results(self) -> None:
        """A ``debug="groups"`` build, after fusion and pruning: copy out each node result
        an op of the plan still writes (a fused group's is its last node's); the results
        fusion folded away are not computed, so not kept."""
        written = {t for op in self.plan.ops for t in op["out"]}
        for name, item, tid in self.results:
            spec = self.spec(tid)
            if tid in written and spec.role != "dead":
                out = self.new_tensor(spec.dtype, spec.dims, "output")
                self.copy(tid, out)
                self.plan.outputs.append(out)
                self.plan.debug.append([len(self.plan.outputs) - 1, name, item])

    def redirect_or_copy(self, src: int, out: int) -> int:
        """The delegate output holding ``src``'s value: ``out``, written directly by the ops
        that wrote ``src`` when nothing reads ``src`` after the first write and the layouts
        agree; ``src`` itself when ops wrote it through views (a layer or RMS norm writes
        its rows as a 2-d alias) that nothing reads (``src`` becomes the output, ``out`` is
        unused); else ``out``, a copy of ``src``. A value two outputs hold (a
        quantize-dequantize result shared by its dequantizes) goes to the first directly and
        is copied from there to the second."""
        src = self.redirected.get(src, src)
        s, o = self.spec(src), self.spec(out)
        if s.role == "alias" and self._reshaped_temp(src, out):
            return out
        views = {i for i, t in enumerate(self.plan.tensors) if t.role == "alias" and t.base == src}
        touched = {src} | views
        writers = [op for op in self.plan.ops if touched & set(op["out"])]
        first = min((self.plan.ops.index(w) for w in writers), default=-1)
        read = any(touched & set(op["in"]) or any(p[0] == 1 and p[4] in touched for p in op["post"])
                   for op in self.plan.ops[first:])
        if (writers and s.role == "temp" and not read and same(s.dims, o.dims)
                and same(s.strides, o.strides) and s.dtype == o.dtype):
            if views:
                s.role, o.role = "output", "dead"
                return src
            for w in writers:
                w["out"] = [out if t == src else t for t in w["out"]]
            s.role = "dead"
            self.redirected[src] = out
            return out
        self.copy(src, out)
        return out

    def _reshaped_temp(self, src: int, out: int) -> bool:
        """Whether the output ``out`` now holds ``src``, a row-major reshape of a whole
        row-major temporary (a 4-d matmul's result is its 3-d bmm's, viewed back): the ops
        that wrote the temporary (or views of it) write the same views of ``out`` instead
        and no copy follows them (issue 47: every batched matmul returned from a program
        carried one). Only when no op reads the temporary or a view of it."""
        s, o = self.spec(src), self.spec(out)
        b = self.spec(s.base)
        if s.base in self.shared_roots:  # another output reads it too: it stays, copied
            return False
        if not (b.role == "temp" and same(s.offset, 0) and s.dtype == o.dtype == b.dtype
                and same(s.dims, o.dims) and same(s.strides, row_major(s.dims))
                and same(o.strides, s.strides) and same(b.strides, row_major(b.dims))
                and same(math.prod(b.dims), math.prod(s.dims))):
            return False
        views = [i for i, t in enumerate(self.plan.tensors) if t.role == "alias" and t.base == s.base]
        touched = {s.base, *views}
        writers = [i for i, op in enumerate(self.plan.ops) if touched & set(op["out"])]
        if not writers or any(touched & set(op["in"]) or any(p[0] == 1 and p[4] in touched for p in op["post"])
                              for op in self.plan.ops):
            return False
        moved = {}  # the temporary and its views, as views of the output (tensors after it)
        for op in (self.plan.ops[i] for i in writers):
            for j, t in enumerate(op["out"]):
                if t in touched:
                    if t not in moved:
                        v = self.spec(t)
                        moved[t] = self.new_tensor(v.dtype, v.dims, "alias", strides=v.strides,
                                                   base=out, offset=v.offset if t != s.base else 0)
                    op["out"][j] = moved[t]
        b.role = "dead"  # (its views: read by no op)
        self.redirected[src] = out
        return True

    def lower(self, node: torch.fx.Node):
        """The node's value; a scalar multiply of a matmul operand passes its input through
        and its factor becomes the matmul's first post-op (``lowering/scaled_matmul.py``)."""
        from opforge.backends.cpu.lowering import scaled_matmul

        source = passed_through(self, node)
        if source is not None:
            feeds = self.scaled[node.name]
            self.scales[feeds] = self.scales.get(feeds, 1.0) * scaled_matmul.scalar_factor(node)
            self.plan.impls.append({"node": node.name, "op": op_name(node),
                                    "impl": f"folded into {feeds}'s output scale"})
            return source
        first = len(self.plan.ops)
        result = self._lower(node)
        if node.name in self.scales:
            scaled_matmul.apply_scale(self.plan.ops[first:], self.scales[node.name], node.name)
        return result

    def _lower(self, node: torch.fx.Node):
        if node.target is operator.getitem:
            return self.env[node.args[0].name][node.args[1]]
        name = op_name(node)
        args = self.arg(node.args)
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        if folds(self, node, args, kwargs):  # (released.py holds these back until read)
            return _fold(node, args, kwargs)
        taker = takes(self, node)  # what lowers it in place of its own lowering
        if dynamic(self, node, args, kwargs) and (taker in ("package", "int8") or (
                LOWERINGS.get(name) or LOWERINGS.get(name.split(".")[0])) not in SYMBOLIC_SIZES):
            raise Unsupported("shape", f"{name} on dynamic sizes: the cpu backend lowers "
                              "matmul, elementwise, softmax, layer norm, reductions, views, "
                              "cat, casts and embedding with symbolic sizes, and this op only "
                              "with static ones; stays on the kernels")
        if taker == "package":
            from opforge.backends.cpu.lowering.callouts import lower_package

            return lower_package(self, node, args)
        if taker == "int8":
            from opforge.backends.cpu.lowering.quantized import lower_int8  # (a family)

            return lower_int8(self, node)
        if taker == "softmax":  # the safe softmax computes these
            self.plan.impls.append({"node": node.name, "op": name,
                                    "impl": "fused into engine safe softmax"})
            softmax = self.safe_softmax[node.name]
            return self.env[softmax.name] if node.target is aten.where.self else ("fused", None)
        if taker == "group":  # computed by the group's one op, at its last node
            group = self.groups[node.name]
            last = node is group.last
            self.plan.impls.append({"node": node.name, "op": name, "impl": (
                "engine " if last else "fused into engine ") + group.kind})
            return group.lower(self) if last else ("fused", None)
        if taker == "grouped":
            from opforge.backends.cpu.lowering.grouped_matmul import lower_grouped

            first = len(self.plan.ops)
            result = lower_grouped(self, node, args, kwargs)
            kinds = sorted({op["kind"] for op in self.plan.ops[first:]})
            self.plan.impls.append({"node": node.name, "op": name, "impl": ", ".join(
                ("oneDNN " + k if k in DNNL_KINDS else "engine " + k) for k in kinds)
                or "view of the grouped KV cache (no copy)"})
            return result
        base = name.split(".")[0]
        if name.split("::")[0] not in ("aten", "quantized_decomposed"):
            from opforge.backends.cpu.lowering.callouts import lower_custom

            return lower_custom(self, node, args, kwargs)
        fn = LOWERINGS.get(name) or LOWERINGS.get(base)
        if fn is None:
            raise Unsupported("op", f"{name}: no cpu-backend implementation; stays on the kernels")
        first = len(self.plan.ops)
        result = fn(self, node, args, kwargs)
        kinds = sorted({op["kind"] for op in self.plan.ops[first:]})
        # an op a lowering leaves on a reference kernel on purpose says why in its name
        why = [op["name"] for op in self.plan.ops[first:] if "(reference kernel:" in op["name"]]
        self.plan.impls.append({"node": node.name, "op": name, "impl": ", ".join(
            ("oneDNN " + k if k in DNNL_KINDS else "engine " + k) for k in kinds)
            or ("view (no copy)" if not _all_constant(args, kwargs) else "folded at export")})
        if why:
            self.plan.impls[-1]["impl"] += "; " + "; ".join(why)
        return result


def _shared_roots(L: Lowering, values) -> set[int]:
    """The tensors (roots of their views) that more than one delegate output holds."""
    seen, shared = set(), set()
    for v in values:
        if not (isinstance(v, tuple) and v[0] == "t"):
            continue
        tid = v[1]
        while L.spec(tid).role == "alias":
            tid = L.spec(tid).base
        (shared if tid in seen else seen).add(tid)
    return shared


def _engine_tensors(value) -> list[tuple[int, int]]:
    """(result index, engine tensor id) of a lowered node's value: its tensors computed by
    the engine (not folded constants, not an int8 pattern's inner values)."""
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "t":
        return [(0, value[1])]
    if isinstance(value, tuple):
        return [(i, v[1]) for i, v in enumerate(value)
                if isinstance(v, tuple) and len(v) == 2 and v[0] == "t"]
    return []


def _tensor_args(node):
    return [a for a in node.all_input_nodes]


def _need_f32(node, what=None):
    for a in [node, *node.all_input_nodes]:
        v = _val(a)
        vs = v if isinstance(v, (tuple, list)) else [v]
        if a is node and isinstance(v, (tuple, list)):
            vs = vs[:1]  # the main result (max pooling's indices are never computed)
        for x in vs:
            if isinstance(x, torch.Tensor) and x.dtype != torch.float32:
                raise Unsupported("dtype", f"{op_name(node)} on {x.dtype}: the cpu backend runs "
                                  "this op in float32 only; stays on the kernels")


def _out(L: Lowering, node, strides=None):
    fake = _val(node)
    return L.new_tensor(fake.dtype, L.shape(fake), strides=strides)


def _dense_operand(L: Lowering, tid: int) -> int:
    return tid if _dense(L.spec(tid)) else L.contiguous(tid)


def _alias(self: Lowering, tid: int, dims, strides, offset: int = 0) -> int:
    spec = self.spec(tid)
    if spec.role == "alias":
        offset += spec.offset
        tid = spec.base
    return self.new_tensor(spec.dtype, dims, "alias", strides=strides, base=tid, offset=offset)


Lowering.alias = _alias


def _expand(v, n):
    v = list(v)
    return v * n if len(v) == 1 else v


def _uses_output(node, index) -> bool:
    return any(u.target is operator.getitem and u.args[1] == index for u in node.users)


DNNL_KINDS = ("conv", "deconv", "matmul", "pool", "eltwise", "binary", "softmax", "layer_norm",
              "reduction", "qconv", "qmatmul")


# op → its lowering (filled in by each op family's module)
LOWERINGS: dict[str, Callable] = {}
# the lowerings written for symbolic sizes (``lowering/symbolic.py``): every decision they
# make on a size holds for all of its values, or they refuse; the others see static sizes only
SYMBOLIC_SIZES: set[Callable] = set()
