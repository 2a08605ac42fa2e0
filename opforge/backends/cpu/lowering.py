"""Subgraph → the cpu engine's plan: tensors (dtype, dims, strides, role) and ops.

Ahead of time, with torch: constants are folded (any node whose inputs are all constants
is evaluated here), batch norm after a convolution is folded into its weights, views
become strided aliases (no copy), elementwise ops after convolution/matmul/binary/pooling
become oneDNN post-ops, and 4-d activations of convolution chains are kept channels-last.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.export.argument_values import scalar_type_of

aten = torch.ops.aten

# oneDNN eltwise algorithm codes (engine.cpp alg_of) and binary codes
RELU, TANH, ELU, SQUARE, ABS, SQRT, LINEAR, SOFT_RELU, LOGISTIC, EXP, GELU_TANH, SWISH, LOG, \
    CLIP, POW, GELU_ERF, ROUND, MISH, HARDSWISH, HARDSIGMOID = range(20)
B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN = range(100, 106)
# generic elementwise codes (engine.cpp EwCode)
EW = {name: i for i, name in enumerate(
    ["add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "where", "logical_not",
     "bitwise_not", "neg", "logical_and", "logical_or", "maximum", "minimum", "fill",
     "masked_fill"])}

GENERIC_DTYPES = (torch.float32, torch.int64, torch.int32, torch.bool, torch.uint8, torch.int8)


class Unsupported(Exception):
    """A node the backend does not take: ``kind`` and a reason a user can act on."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(reason)
        self.kind = kind
        self.reason = reason


@dataclass
class TensorSpec:
    dtype: torch.dtype
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    role: str                      # input, output, const, temp, alias
    base: int = -1
    offset: int = 0
    data: bytes | None = None

    def as_json(self, data_offset: int | None) -> dict:
        out = {"dtype": int(scalar_type_of(self.dtype)), "dims": list(self.dims),
               "strides": list(self.strides), "role": self.role}
        if self.role == "alias":
            out["base"], out["offset"] = self.base, self.offset
        if self.data is not None:
            out["data"] = [data_offset, len(self.data)]
        return out


def _tidy_strides(dims, strides) -> tuple[int, ...]:
    """Strides of size-1 dims do not address anything; give them the value a dense layout
    would (oneDNN recognises dense layouts only then and otherwise falls back to its slow
    reference kernels)."""
    out = list(strides)
    for k in range(len(dims) - 1, -1, -1):
        if dims[k] == 1:
            inner = [j for j in range(k + 1, len(dims)) if dims[j] != 1]
            out[k] = max((out[j] * dims[j] for j in inner), default=1)
    return tuple(out)


def row_major(dims) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def channels_last(dims) -> tuple[int, ...]:
    n, c, *sp = dims
    inner = math.prod(sp) if sp else 1
    strides = [0] * len(dims)
    strides[1] = 1
    step = max(c, 1)
    for k in range(len(dims) - 1, 1, -1):
        strides[k] = step
        step *= max(dims[k], 1)
    strides[0] = step
    return tuple(strides)


@dataclass
class Plan:
    tensors: list[TensorSpec] = field(default_factory=list)
    ops: list[dict] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)
    impls: list[dict] = field(default_factory=list)   # per lowered node: what runs it


def _val(node: Any):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


class Lowering:
    def __init__(self, subgraph, specs: dict) -> None:
        self.sub = subgraph
        self.specs = specs
        self.plan = Plan()
        self.env: dict[str, Any] = {}       # node name → ("t", id) | ("c", tensor) | python value | tuple
        self.const_ids: dict[int, int] = {}  # id(torch tensor) → engine tensor id
        self.const_keep: list[torch.Tensor] = []
        self.channels_last_copies: dict[int, int] = {}
        self.users: dict[str, int] = {}
        self.custom_ops = set(specs.get("custom_ops") or [])
        self.int8 = find_int8_patterns(subgraph) if specs.get("int8", True) else {}
        self.packages = specs.get("_package_nodes") or {}

    # --- tensors ---------------------------------------------------------------------
    def new_tensor(self, dtype, dims, role="temp", strides=None, **kw) -> int:
        dims = tuple(int(d) for d in dims)
        strides = _tidy_strides(dims, tuple(strides or row_major(dims)))
        self.plan.tensors.append(TensorSpec(dtype, dims, strides, role, **kw))
        return len(self.plan.tensors) - 1

    def spec(self, tid: int) -> TensorSpec:
        return self.plan.tensors[tid]

    def materialize(self, value) -> int:
        """An engine tensor id for an env entry (constants become const tensors once)."""
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "t":
            return value[1]
        if isinstance(value, tuple) and len(value) == 2 and value[0] == "c":
            tensor = value[1].detach().contiguous()
            key = id(value[1])
            self.const_keep.append(value[1])  # ids stay unique while the tensor lives
            if key not in self.const_ids:
                data = tensor.view(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b""
                self.const_ids[key] = self.new_tensor(tensor.dtype, tensor.shape, "const", data=data)
            return self.const_ids[key]
        raise Unsupported("op", f"expected a tensor, found {type(value).__name__}")

    def arg(self, a):
        if isinstance(a, torch.fx.Node):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.arg(x) for x in a)
        return a

    def op(self, kind, ins, outs, ia=(), fa=(), name="", post=None) -> dict:
        entry = {"kind": kind, "in": list(ins), "out": list(outs), "ia": [int(x) for x in ia],
                 "fa": [float(x) for x in fa], "post": post or [], "name": name}
        self.plan.ops.append(entry)
        return entry

    def contiguous(self, tid: int) -> int:
        """``tid`` itself if row-major contiguous, else a row-major copy of it."""
        t = self.spec(tid)
        if t.strides == row_major(t.dims) or math.prod(t.dims) <= 1:
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
        for name in self.sub.inputs:
            node = next(n for n in g.nodes if n.name == name)
            fake = _val(node)
            tid = self.new_tensor(fake.dtype, fake.shape, "input")
            self.plan.inputs.append(tid)
            self.env[name] = ("t", tid)
        for name, tensor in self.sub.constants.items():
            self.env[name] = ("c", tensor)
        for node in g.nodes:
            if node.op == "call_function":
                self.env[node.name] = self.lower(node)
        outputs = self.sub.output_nodes()
        for out in outputs:
            value = self.env[out.name]
            fake = _val(out)
            tid = self.new_tensor(fake.dtype, fake.shape, "output")
            src = self.materialize(value)
            self.redirect_or_copy(src, tid)
            self.plan.outputs.append(tid)
        return self.plan

    def redirect_or_copy(self, src: int, out: int) -> None:
        """Make the ops that wrote ``src`` write ``out`` directly when nothing else reads or
        aliases ``src`` and the layouts agree; else copy it into ``out``."""
        s, o = self.spec(src), self.spec(out)
        writers = [op for op in self.plan.ops if src in op["out"]]
        last = max((self.plan.ops.index(w) for w in writers), default=-1)
        first = min((self.plan.ops.index(w) for w in writers), default=-1)
        read = any(src in op["in"] or any(p[0] == 1 and p[4] == src for p in op["post"])
                   for op in self.plan.ops[first:])
        aliased = any(t.role == "alias" and t.base == src for t in self.plan.tensors)
        if (writers and s.role == "temp" and not read and not aliased and s.dims == o.dims
                and s.strides == o.strides and s.dtype == o.dtype):
            for w in writers:
                w["out"] = [out if t == src else t for t in w["out"]]
            s.role = "dead"
            return
        self.copy(src, out)

    def lower(self, node: torch.fx.Node):
        if node.target is operator.getitem:
            return self.env[node.args[0].name][node.args[1]]
        name = op_name(node)
        args = self.arg(node.args)
        kwargs = {k: self.arg(v) for k, v in node.kwargs.items()}
        if node.name in self.packages:
            return self.lower_package(node, args)
        if node.name in self.int8:
            return self.lower_int8(node)
        if _all_constant(args, kwargs) and name.split("::")[0] in FOLDABLE_NAMESPACES:
            return _fold(node, args, kwargs)
        if False:
            return self.lower_package(node, args)
        base = name.split(".")[0]
        if name.split("::")[0] not in ("aten", "quantized_decomposed"):
            return self.lower_custom(node, args, kwargs)
        fn = LOWERINGS.get(name) or LOWERINGS.get(base)
        if fn is None:
            raise Unsupported("op", f"{name}: no cpu-backend implementation; stays on the kernels")
        first = len(self.plan.ops)
        result = fn(self, node, args, kwargs)
        kinds = sorted({op["kind"] for op in self.plan.ops[first:]})
        self.plan.impls.append({"node": node.name, "op": name, "impl": ", ".join(
            ("oneDNN " + k if k in DNNL_KINDS else "engine " + k) for k in kinds)
            or ("view (no copy)" if not _all_constant(args, kwargs) else "folded at export")})
        return result

    # --- 8a8w convolution / linear on oneDNN int8 ---------------------------------------------
    def lower_int8(self, node):
        """A node of an int8 pattern: the convolution/matmul emits the int8 op (reading the
        dequantize's integer input, writing the quantize's integer output); the relu between
        them is its post-op; the quantize returns that output."""
        pattern = self.int8[node.name]
        if node is not pattern.compute:
            return ("t", pattern.output) if node is pattern.quant else ("q8", node.name)
        x = self.materialize(self.env[pattern.dequant.args[0].name])
        if self.spec(x).dtype != torch.uint8:
            raise Unsupported("dtype", "an int8 pattern whose activation is not uint8")
        x = self.contiguous(x) if not pattern.conv else x
        fake = _val(pattern.quant)
        ins = [x]
        if pattern.conv:
            sx = self.spec(x)
            if sx.strides != channels_last(sx.dims):
                cl = self.new_tensor(sx.dtype, sx.dims, strides=channels_last(sx.dims))
                self.copy(x, cl)
                ins = [cl]
            out = self.new_tensor(torch.uint8, fake.shape, strides=channels_last(fake.shape))
        else:
            out = self.new_tensor(torch.uint8, fake.shape)
        ins += [self.materialize(("c", pattern.weight)), self.materialize(("c", pattern.scales))]
        if pattern.bias is not None:
            bias = pattern.bias
            if not pattern.conv:
                bias = bias.reshape(1, -1)
            ins.append(self.materialize(("c", bias.float().contiguous())))
        ia = [pattern.x_zp, pattern.y_zp, pattern.mask, int(pattern.bias is not None), *pattern.conv_ia]
        post = [[0, RELU, 0.0, 0.0, -1]] if pattern.relu is not None else []
        self.op("qconv" if pattern.conv else "qmatmul", ins, [out], ia, [pattern.x_scale, pattern.y_scale],
                name="int8 " + ("convolution" if pattern.conv else "matmul"), post=post)
        pattern.output = out
        self.plan.impls.append({"node": node.name, "op": op_name(node),
                                "impl": "oneDNN int8 " + ("convolution" if pattern.conv else "matmul")})
        return ("q8", node.name)

    # --- custom ops (kernel ABI) and packages ----------------------------------------------
    def lower_custom(self, node, args, kwargs):
        name = op_name(node)
        key = name.rsplit(".", 1)[0]
        if key not in self.custom_ops and name not in self.custom_ops:
            raise Unsupported("compile_spec", f"{name}: a custom op; list it in compile spec "
                              f"custom_ops (e.g. custom_ops=[\"{key}\"]) to run its native kernel "
                              "inside the delegate")
        schema = node.target._schema
        fakes = _val(node)
        fakes = list(fakes) if isinstance(fakes, (tuple, list)) else [fakes]
        ins, arglist = [], []
        bound = dict(zip([a.name for a in schema.arguments], node.args))
        bound.update(node.kwargs)
        for a in schema.arguments:
            value = bound.get(a.name, a.default_value if a.has_default_value() else None)
            if isinstance(value, torch.fx.Node):
                tid = self.contiguous(self.materialize(self.env[value.name]))
                ins.append(tid)
                arglist.append(["tensor", len(ins) - 1])
            elif isinstance(value, bool):
                arglist.append(["bool", int(value)])
            elif isinstance(value, int):
                arglist.append(["int", value])
            elif isinstance(value, float):
                arglist.append(["double", value])
            elif value is None:
                arglist.append(["none", 0])
            elif isinstance(value, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
                arglist.append(["int_list", [int(v) for v in value]])
            elif isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
                arglist.append(["double_list", [float(v) for v in value]])
            else:
                raise Unsupported("op", f"{name}: argument {a.name} of type {type(value).__name__} "
                                  "cannot be passed through the kernel ABI from the delegate")
        outs = []
        for fake in fakes:
            if not isinstance(fake, torch.Tensor):
                raise Unsupported("op", f"{name}: a non-tensor result")
            outs.append(self.new_tensor(fake.dtype, fake.shape))
            arglist.append(["tensor", len(ins) + len(outs) - 1])
        self.op("kernel", ins, outs, name=f"{key}.out")["args"] = arglist
        self.plan.impls.append({"node": node.name, "op": name, "impl": "native kernel (kernel ABI)"})
        results = tuple(("t", o) for o in outs)
        return results if isinstance(_val(node), (tuple, list)) else results[0]

    def lower_package(self, node, args):
        plan_node = self.packages[node.name]
        from opforge.backends.oppackage.planner import package_input_nodes

        ins = [self.contiguous(self.materialize(self.env[n.name])) for n in package_input_nodes(node)]
        fakes = _val(node)
        fakes = list(fakes) if isinstance(fakes, (tuple, list)) else [fakes]
        outs = [self.new_tensor(f.dtype, f.shape) for f in fakes]
        entry = self.op("package", ins, outs, name=plan_node.describe())
        entry["node"] = plan_node.to_bytes().hex()
        self.plan.impls.append({"node": node.name, "op": op_name(node), "impl": plan_node.describe()})
        results = tuple(("t", o) for o in outs)
        return results if isinstance(_val(node), (tuple, list)) else results[0]


FOLDABLE_NAMESPACES = ("aten", "quantized_decomposed", "torchao")


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
    result = node.target(*_unwrap(args), **_unwrap(kwargs))
    if isinstance(result, (tuple, list)):
        return tuple(("c", r) if isinstance(r, torch.Tensor) else r for r in result)
    return ("c", result) if isinstance(result, torch.Tensor) else result


# =========================================================================================
# per-op lowerings. Each raises Unsupported with a reason, or returns the env value.

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
    return L.new_tensor(fake.dtype, fake.shape, strides=strides)


ELTWISE: dict[str, Callable] = {
    "aten::relu": lambda n, a: (RELU, 0.0, 0.0),
    "aten::tanh": lambda n, a: (TANH, 0.0, 0.0),
    "aten::sigmoid": lambda n, a: (LOGISTIC, 0.0, 0.0),
    "aten::exp": lambda n, a: (EXP, 0.0, 0.0),
    "aten::log": lambda n, a: (LOG, 0.0, 0.0),
    "aten::sqrt": lambda n, a: (SQRT, 0.0, 0.0),
    "aten::abs": lambda n, a: (ABS, 0.0, 0.0),
    "aten::neg": lambda n, a: (LINEAR, -1.0, 0.0),
    "aten::silu": lambda n, a: (SWISH, 1.0, 0.0),
    "aten::mish": lambda n, a: (MISH, 0.0, 0.0),
    "aten::hardswish": lambda n, a: (HARDSWISH, 1 / 6, 0.5),
    "aten::hardsigmoid": lambda n, a: (HARDSIGMOID, 1 / 6, 0.5),
    "aten::gelu": lambda n, a: (GELU_TANH if n.kwargs.get("approximate", a[1] if len(a) > 1 else "none") == "tanh" else GELU_ERF, 0.0, 0.0),
    "aten::leaky_relu": lambda n, a: (RELU, float(a[1]) if len(a) > 1 else 0.01, 0.0),
    "aten::hardtanh": lambda n, a: (CLIP, float(a[1]) if len(a) > 1 else -1.0, float(a[2]) if len(a) > 2 else 1.0),
    "aten::rsqrt": lambda n, a: (POW, 1.0, -0.5),
}


def _elu(node, a):
    alpha = float(a[1]) if len(a) > 1 else 1.0
    scale = float(a[2]) if len(a) > 2 else 1.0
    input_scale = float(a[3]) if len(a) > 3 else 1.0
    if scale != 1.0 or input_scale != 1.0:
        raise Unsupported("op", "aten::elu with scale/input_scale (selu): no single oneDNN eltwise; stays on the kernels")
    return (ELU, alpha, 0.0)


def _clamp(node, a):
    lo = a[1] if len(a) > 1 else node.kwargs.get("min")
    hi = a[2] if len(a) > 2 else node.kwargs.get("max")
    if isinstance(lo, tuple) or isinstance(hi, tuple):
        raise Unsupported("op", "aten::clamp with tensor bounds; stays on the kernels")
    return (CLIP, float("-inf") if lo is None else float(lo), float("inf") if hi is None else float(hi))


def _softplus(node, a):
    beta = float(a[1]) if len(a) > 1 else 1.0
    threshold = float(a[2]) if len(a) > 2 else 20.0
    if beta != 1.0:
        raise Unsupported("op", "aten::softplus with beta != 1; stays on the kernels")
    return (SOFT_RELU, 1.0, 0.0)


def _rsub(node, a):
    # other - alpha * x. Not only folded: the support check folds it on constant inputs,
    # but a partition can receive those as runtime inputs (bicubic interpolation's weights)
    other = a[1] if len(a) > 1 else None
    alpha = node.kwargs.get("alpha", a[2] if len(a) > 2 else 1)
    if not isinstance(other, (int, float)) or not isinstance(alpha, (int, float)):
        raise Unsupported("op", "aten::rsub of two tensors; stays on the kernels")
    return (LINEAR, -float(alpha), float(other))


ELTWISE["aten::elu"] = _elu
ELTWISE["aten::clamp"] = _clamp
ELTWISE["aten::softplus"] = _softplus
ELTWISE["aten::rsub"] = _rsub


def _clamp_tensors(L: Lowering, node, args, kwargs):
    """clamp with tensor bounds: max(x, min) then min(·, max), as binary ops."""
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    fake = _val(node)
    value = args[0]
    for bound, alg, name in ((lo, B_MAX, "clamp_min"), (hi, B_MIN, "clamp_max")):
        if bound is None:
            continue
        src = L.materialize(value)
        b = L.materialize(bound) if isinstance(bound, tuple) else L.materialize(("c", torch.tensor(float(bound))))
        sa, sb = L.spec(src), L.spec(b)
        if tuple(sa.dims) != tuple(fake.shape) or sb.dtype != torch.float32:
            raise Unsupported("shape", "clamp whose bounds broadcast the input; stays on the kernels")
        if not _dense(sa):
            src, sa = L.contiguous(src), L.spec(L.contiguous(src))
        if tuple(sb.dims) == tuple(sa.dims) and sb.strides != sa.strides:
            like = L.new_tensor(sb.dtype, sb.dims, strides=sa.strides)
            L.copy(b, like)
            b, sb = like, L.spec(like)
        if len(sb.dims) < len(sa.dims):
            b = L.alias(b, (1,) * (len(sa.dims) - len(sb.dims)) + tuple(sb.dims),
                        (0,) * (len(sa.dims) - len(sb.dims)) + tuple(sb.strides))
        out = L.new_tensor(torch.float32, sa.dims, strides=sa.strides)
        L.op("binary", [src, b], [out], [alg], name=name)
        value = ("t", out)
    return value


def _dense(spec: TensorSpec) -> bool:
    """Strides that pack the tensor without gaps in some dim order (what oneDNN's fast
    kernels take); zero strides (broadcasts) and gaps are not."""
    pairs = sorted((s, d) for s, d in zip(spec.strides, spec.dims) if d != 1)
    step = 1
    for s, d in pairs:
        if s != step:
            return False
        step *= d
    return True


def _dense_operand(L: Lowering, tid: int) -> int:
    return tid if _dense(L.spec(tid)) else L.contiguous(tid)


def lower_eltwise(L: Lowering, node, args, kwargs):
    _need_f32(node)
    base = op_name(node).split(".")[0]
    if base == "aten::clamp" and any(isinstance(v, tuple) and len(v) == 2 and v[0] in "tc"
                                     for v in list(args[1:3]) + [kwargs.get("min"), kwargs.get("max")]):
        return _clamp_tensors(L, node, args, kwargs)
    alg, alpha, beta = ELTWISE[base](node, args)
    src = _dense_operand(L, L.materialize(args[0]))
    out = _out(L, node, strides=L.spec(src).strides)
    L.op("eltwise", [src], [out], [alg], [alpha, beta], name=base.split("::")[1])
    return ("t", out)


def lower_pow(L, node, args, kwargs):
    _need_f32(node)
    if not isinstance(args[1], (int, float)):
        raise Unsupported("op", "aten::pow with a tensor exponent; stays on the kernels")
    src = L.materialize(args[0])
    out = _out(L, node, strides=L.spec(src).strides)
    if float(args[1]) == 2.0:
        L.op("eltwise", [src], [out], [SQUARE], [0.0, 0.0], name="square")
    else:
        L.op("eltwise", [src], [out], [POW], [1.0, float(args[1])], name="pow")
    return ("t", out)


def _broadcast_strides(spec: TensorSpec, out_dims) -> list[int]:
    """``spec``'s strides aligned to ``out_dims`` (0 where it broadcasts)."""
    pad = len(out_dims) - len(spec.dims)
    strides = [0] * pad
    for d, s, o in zip(spec.dims, spec.strides, out_dims[pad:]):
        strides.append(0 if d == 1 and o != 1 else s)
    return strides


BINARY = {"aten::add": B_ADD, "aten::sub": B_SUB, "aten::mul": B_MUL, "aten::div": B_DIV,
          "aten::maximum": B_MAX, "aten::minimum": B_MIN}


def lower_binary(L: Lowering, node, args, kwargs):
    base = op_name(node).split(".")[0]
    fake = _val(node)
    a, b = args[0], args[1]
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    rounding = kwargs.get("rounding_mode")
    if rounding is not None:
        raise Unsupported("op", f"{base} with rounding_mode={rounding!r}; stays on the kernels")
    scalar_b = not (isinstance(b, tuple) and len(b) == 2 and b[0] in "tc")
    scalar_a = not (isinstance(a, tuple) and len(a) == 2 and a[0] in "tc")
    if fake.dtype == torch.float32 and not scalar_a:
        if scalar_b:  # x (op) scalar → linear
            src = L.materialize(a)
            s = float(b)
            alg = {"aten::add": (LINEAR, 1.0, s * float(alpha)), "aten::sub": (LINEAR, 1.0, -s * float(alpha)),
                   "aten::mul": (LINEAR, s, 0.0), "aten::div": (LINEAR, 1.0 / s if s else float("inf"), 0.0)}.get(base)
            if alg is not None and not (base == "aten::div" and (s == 0 or not math.isfinite(1.0 / s))):
                if base == "aten::div" and s != 0 and 1.0 / s * s != 1.0:
                    alg = None  # 1/s inexact: x/s != x*(1/s) in float32; use the exact generic loop
                if alg is not None:
                    out = _out(L, node, strides=L.spec(src).strides)
                    L.op("eltwise", [src], [out], [alg[0]], [alg[1], alg[2]], name=base.split("::")[1])
                    return ("t", out)
        elif base in BINARY and float(alpha) == 1.0:
            ta, tb = L.materialize(a), L.materialize(b)
            sa, sb = L.spec(ta), L.spec(tb)
            if sa.dtype == sb.dtype == torch.float32:
                out_dims = tuple(fake.shape)
                if tuple(sa.dims) != out_dims and tuple(sb.dims) == out_dims and base in (
                        "aten::add", "aten::mul", "aten::maximum", "aten::minimum"):
                    ta, tb, sa, sb = tb, ta, sb, sa
                if tuple(sa.dims) == out_dims:
                    if not _dense(sa):
                        ta = L.contiguous(ta)
                        sa = L.spec(ta)
                    if tuple(sb.dims) == out_dims and sb.strides != sa.strides:
                        # oneDNN's fast binary kernels want both operands in one layout
                        like = L.new_tensor(sb.dtype, sb.dims, strides=sa.strides)
                        L.copy(tb, like)
                        tb, sb = like, L.spec(like)
                    if len(sb.dims) < len(out_dims):  # oneDNN wants equal ranks
                        tb = L.alias(tb, (1,) * (len(out_dims) - len(sb.dims)) + tuple(sb.dims),
                                     (0,) * (len(out_dims) - len(sb.dims)) + tuple(sb.strides))
                    out = _out(L, node, strides=sa.strides)
                    L.op("binary", [ta, tb], [out], [BINARY[base]], name=base.split("::")[1])
                    return ("t", out)
    return lower_generic_ew(L, node, args, kwargs, base.split("::")[1], alpha)


def lower_generic_ew(L: Lowering, node, args, kwargs, code_name, alpha=1):
    fake = _val(node)
    if fake.dtype not in GENERIC_DTYPES:
        raise Unsupported("dtype", f"{op_name(node)} on {fake.dtype}: the cpu backend runs float32 "
                          "(and int/bool masks); stays on the kernels")
    if code_name not in EW:
        raise Unsupported("op", f"{op_name(node)}: no cpu-backend implementation")
    tensors, scalar = [], None
    for a in args:
        if isinstance(a, tuple) and len(a) == 2 and a[0] in "tc":
            tensors.append(L.materialize(a))
        elif isinstance(a, (int, float, bool)) and len(tensors) + (scalar is not None) < 3:
            if scalar is not None:
                raise Unsupported("op", f"{op_name(node)} with two scalars")
            scalar = float(a)
        if len(tensors) + (scalar is not None) >= (1 if code_name in ("logical_not", "bitwise_not", "neg") else 3 if code_name in ("where", "masked_fill") else 2):
            break
    if code_name == "bitwise_not" and L.spec(tensors[0]).dtype != torch.bool:
        raise Unsupported("dtype", "aten::bitwise_not on integers; stays on the kernels")
    for t in tensors:
        if L.spec(t).dtype not in GENERIC_DTYPES:
            raise Unsupported("dtype", f"{op_name(node)} reads {L.spec(t).dtype}")
    dims = tuple(fake.shape)
    out = L.new_tensor(fake.dtype, dims)
    floats = any(L.spec(t).dtype == torch.float32 for t in tensors) or fake.dtype == torch.float32 or (
        scalar is not None and not float(scalar).is_integer())
    ia = [EW[code_name], 0 if floats else 1, len(dims), *dims, *L.spec(out).strides]
    for t in tensors:
        ia += _broadcast_strides(L.spec(t), dims)
    fa = [float(alpha)] + ([scalar] if scalar is not None else [])
    L.op("ew", tensors, [out], ia, fa, name=code_name)
    return ("t", out)


def lower_named_ew(code):
    def lower(L, node, args, kwargs):
        return lower_generic_ew(L, node, args, kwargs, code)
    return lower


def lower_where(L, node, args, kwargs):
    return lower_generic_ew(L, node, args, kwargs, "where")


# --- views and copies ----------------------------------------------------------------------
def _fit_affine(offsets: torch.Tensor):
    """(base, strides) if ``offsets`` (int64, any shape) is base + idx·strides, else None."""
    if offsets.numel() == 0:
        return 0, [0] * offsets.dim()
    base = int(offsets.reshape(-1)[0])
    strides = []
    for k in range(offsets.dim()):
        if offsets.shape[k] > 1:
            index = [0] * offsets.dim()
            index[k] = 1
            strides.append(int(offsets[tuple(index)]) - base)
        else:
            strides.append(0)
    grid = torch.full(offsets.shape, base, dtype=torch.int64)
    for k, s in enumerate(strides):
        shape = [1] * offsets.dim()
        shape[k] = offsets.shape[k]
        grid = grid + torch.arange(offsets.shape[k]).reshape(shape) * s
    return (base, strides) if torch.equal(grid, offsets) else None


def _positions(spec: TensorSpec) -> torch.Tensor:
    grid = torch.zeros(spec.dims, dtype=torch.int64)
    for k, (d, s) in enumerate(zip(spec.dims, spec.strides)):
        shape = [1] * len(spec.dims)
        shape[k] = d
        grid = grid + torch.arange(d).reshape(shape) * s
    return grid


def lower_view(L: Lowering, node, args, kwargs):
    """Any op that picks elements of its one tensor input (view, permute, expand, select,
    slice, squeeze, split, clone...): run it on the input's element offsets; an affine
    result is an alias (no copy), with zero strides materialised."""
    source = args[0]
    tid = L.materialize(source)
    spec = L.spec(tid)
    if math.prod(spec.dims) > (1 << 24):
        raise Unsupported("shape", f"{op_name(node)} on a tensor of more than 2^24 elements: the "
                          "backend's view analysis is bounded; stays on the kernels")
    result = node.target(_positions(spec), *_unwrap(args[1:]), **_unwrap(kwargs))
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if any(_fit_affine(r) is None for r in results):
        # e.g. a view of a permuted tensor: make the input row-major first
        tid = L.contiguous(tid)
        spec = L.spec(tid)
        result = node.target(_positions(spec), *_unwrap(args[1:]), **_unwrap(kwargs))
        results = list(result) if isinstance(result, (tuple, list)) else [result]
    out = []
    for r in results:
        fit = _fit_affine(r)
        if fit is None:
            raise Unsupported("layout", f"{op_name(node)}: its result is not a strided view of the "
                              "input; stays on the kernels")
        base, strides = fit
        dims = tuple(r.shape)
        alias = L.alias(tid, dims, strides, base)
        if any(s == 0 and d > 1 for s, d in zip(strides, dims)):  # expand: make it real
            real = L.new_tensor(spec.dtype, dims)
            L.copy(alias, real)
            alias = real
        out.append(("t", alias))
    return tuple(out) if isinstance(result, (tuple, list)) else out[0]


def _alias(self: Lowering, tid: int, dims, strides, offset: int = 0) -> int:
    spec = self.spec(tid)
    if spec.role == "alias":
        offset += spec.offset
        tid = spec.base
    return self.new_tensor(spec.dtype, dims, "alias", strides=strides, base=tid, offset=offset)


Lowering.alias = _alias


def lower_cat(L: Lowering, node, args, kwargs):
    tensors = [L.materialize(t) for t in args[0]]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    fake = _val(node)
    dim = dim % fake.dim()
    out = L.new_tensor(fake.dtype, fake.shape)
    strides = L.spec(out).strides
    start = 0
    for t in tensors:
        s = L.spec(t)
        if s.dtype != fake.dtype:
            raise Unsupported("dtype", "aten::cat of mixed dtypes; stays on the kernels")
        if math.prod(s.dims) == 0:
            continue
        L.copy(t, out, start * strides[dim], strides)
        start += s.dims[dim]
    return ("t", out)


def lower_stack(L: Lowering, node, args, kwargs):
    """One copy per input into its slot of the new dim (torch's bicubic interpolation
    stacks its weights; the support check folds that on constants, but a partition can
    receive them at run time)."""
    tensors = [L.materialize(t) for t in args[0]]
    fake = _val(node)
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0)) % fake.dim()
    out = L.new_tensor(fake.dtype, fake.shape)
    strides = list(L.spec(out).strides)
    for i, t in enumerate(tensors):
        if L.spec(t).dtype != fake.dtype:
            raise Unsupported("dtype", "aten::stack of mixed dtypes; stays on the kernels")
        L.copy(t, out, i * strides[dim], strides[:dim] + strides[dim + 1:])
    return ("t", out)


def lower_to_copy(L, node, args, kwargs):
    fake = _val(node)
    src = L.materialize(args[0])
    if fake.dtype not in GENERIC_DTYPES or L.spec(src).dtype not in GENERIC_DTYPES:
        raise Unsupported("dtype", f"aten::_to_copy to {fake.dtype}; stays on the kernels")
    out = L.new_tensor(fake.dtype, fake.shape)
    L.copy(src, out)
    return ("t", out)


# --- heavy ops ------------------------------------------------------------------------------
def lower_convolution(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    if not (isinstance(w, tuple) and w[0] == "c"):
        raise Unsupported("layout", "aten::convolution with weights computed at run time; the "
                          "cpu backend reorders constant weights once at init")
    if b is not None and not (isinstance(b, tuple) and b[0] == "c"):
        raise Unsupported("layout", "aten::convolution with a bias computed at run time")
    weight = w[1]
    nsp = weight.dim() - 2
    if nsp not in (1, 2, 3):
        raise Unsupported("shape", f"aten::convolution with {nsp} spatial dims")
    fake = _val(node)
    if transposed:
        # torch (in, out/g, k...) → oneDNN (g, out/g, in/g, k...)
        i, og = weight.shape[:2]
        weight = weight.reshape(groups, i // groups, og, *weight.shape[2:]).transpose(1, 2)
        if groups == 1:
            weight = weight[0]
        weight = weight.contiguous()
    elif groups > 1:
        o = weight.shape[0]
        weight = weight.reshape(groups, o // groups, *weight.shape[1:]).contiguous()
    if any(p for p in (output_padding or [])) and not transposed:
        raise Unsupported("shape", "output_padding without transposed")
    if transposed and any(o - p >= s for o, p, s in zip(output_padding, padding, stride)):
        # torch allows output_padding < max(stride, dilation); oneDNN's deconvolution takes no
        # right padding (padding - output_padding) of -stride or less and refuses at load
        raise Unsupported("shape", "a transposed convolution whose output_padding exceeds its "
                          "padding by a stride or more (oneDNN's deconvolution refuses it); "
                          "stays on the kernels")
    src = L.materialize(x)
    src_spec = L.spec(src)
    if len(src_spec.dims) != nsp + 2:
        raise Unsupported("shape", "aten::convolution of an unbatched input")
    # activations of convolution chains are channels-last (one copy per source)
    if src_spec.strides != channels_last(src_spec.dims):
        if src not in L.channels_last_copies:
            cl = L.new_tensor(src_spec.dtype, src_spec.dims, strides=channels_last(src_spec.dims))
            L.copy(src, cl)
            L.channels_last_copies[src] = cl
        src = L.channels_last_copies[src]
    wid = L.materialize(("c", weight))
    ins = [src, wid]
    if b is not None:
        ins.append(L.materialize(b))
    pads_l = list(padding)
    pads_r = []
    for k in range(nsp):
        in_size = src_spec.dims[2 + k]
        out_size = fake.shape[2 + k]
        kernel = (weight.shape[-nsp + k] - 1) * dilation[k] + 1
        if transposed:
            pads_r.append(padding[k] - output_padding[k])
        else:
            pads_r.append((out_size - 1) * stride[k] + kernel - in_size - padding[k])
    out = L.new_tensor(fake.dtype, fake.shape, strides=channels_last(fake.shape))
    ia = [nsp, *stride, *pads_l, *pads_r, *dilation, 1 if b is not None else 0]
    L.op("deconv" if transposed else "conv", ins, [out], ia, name="convolution")
    return ("t", out)


def lower_mm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    name = op_name(node).split(".")[0]
    fake = _val(node)
    if name == "aten::addmm":
        bias, a, b = args[:3]
        beta = kwargs.get("beta", args[3] if len(args) > 3 else 1)
        alpha = kwargs.get("alpha", args[4] if len(args) > 4 else 1)
        if beta != 1 or alpha != 1:
            raise Unsupported("op", "aten::addmm with alpha/beta != 1; stays on the kernels")
    elif name == "aten::linear":
        a, w, bias = args[0], args[1], args[2] if len(args) > 2 else None
        if not (isinstance(w, tuple) and w[0] == "c"):
            raise Unsupported("layout", "aten::linear with run-time weights")
        b = ("c", w[1].t().contiguous())
    else:
        a, b = args[:2]
        bias = None
    ta, tb = _matmul_operand(L, L.materialize(a)), _matmul_operand(L, L.materialize(b))
    sa, sb = L.spec(ta), L.spec(tb)
    if len(sa.dims) != len(sb.dims):
        if len(sb.dims) == 2 and len(sa.dims) > 2:  # linear on a batch: broadcast weights
            tb = L.alias(tb, (1,) * (len(sa.dims) - 2) + sb.dims, (0,) * (len(sa.dims) - 2) + sb.strides)
        else:
            raise Unsupported("shape", "matmul operands of different ranks")
    ins = [ta, tb]
    if bias is not None:
        tbias = L.materialize(bias)
        sbias = L.spec(tbias)
        rank = len(fake.shape)
        dims = (1,) * (rank - len(sbias.dims)) + tuple(sbias.dims)
        tbias = L.alias(tbias, dims, (0,) * (rank - len(sbias.dims)) + tuple(sbias.strides))
        ins.append(tbias)
    out = L.new_tensor(fake.dtype, fake.shape)
    L.op("matmul", ins, [out], name=name.split("::")[1])
    return ("t", out)


def _matmul_operand(L: Lowering, tid: int) -> int:
    """``tid`` when oneDNN's matmul takes its layout fast (rows or columns contiguous, batch
    dims outermost and dense), else a row-major copy (oneDNN would run a reference kernel)."""
    t = L.spec(tid)
    if len(t.dims) < 2 or t.role == "const":
        return tid if t.role != "const" or t.strides == row_major(t.dims) else L.contiguous(tid)
    m, k = t.dims[-2:]
    sm, sk = t.strides[-2:]
    inner_ok = (sk == 1 and sm >= k) or (sm == 1 and sk >= m)
    span = m * k
    batch_ok = True
    for d, s in zip(reversed(t.dims[:-2]), reversed(t.strides[:-2])):
        if d != 1 and s != span:
            batch_ok = False
        span *= d
    return tid if inner_ok and batch_ok else L.contiguous(tid)


def lower_pool(L: Lowering, node, args, kwargs):
    _need_f32(node)
    name = op_name(node).split(".")[0]
    fake = _val(node)
    fakes = list(fake) if isinstance(fake, (tuple, list)) else [fake]
    x = L.materialize(args[0])
    spec = L.spec(x)
    nsp = len(spec.dims) - 2
    if nsp < 1:
        raise Unsupported("shape", f"{name} of an unbatched input")
    if name.startswith("aten::max_pool"):
        if _uses_output(node, 1):
            raise Unsupported("op", f"{name}: the indices output is used; oneDNN returns no indices")
        kernel = list(args[1]); stride = list(args[2]) if len(args) > 2 and args[2] else kernel
        padding = list(args[3]) if len(args) > 3 else [0] * nsp
        dilation = list(args[4]) if len(args) > 4 else [1] * nsp
        kind = 0
    else:
        kernel = list(args[1]); stride = list(args[2]) if len(args) > 2 and args[2] else kernel
        padding = list(args[3]) if len(args) > 3 else [0] * nsp
        include = args[5] if len(args) > 5 else True
        if len(args) > 6 and args[6] is not None:
            raise Unsupported("op", f"{name} with divisor_override")
        dilation = [1] * nsp
        kind = 1 if include else 2
    kernel, stride, padding, dilation = (_expand(v, nsp) for v in (kernel, stride, padding, dilation))
    out_dims = tuple(fakes[0].shape)
    pads_r = []
    for k in range(nsp):
        eff = (kernel[k] - 1) * dilation[k] + 1
        pads_r.append((out_dims[2 + k] - 1) * stride[k] + eff - spec.dims[2 + k] - padding[k])
        if kind == 1 and pads_r[-1] > padding[k]:
            raise Unsupported("shape", f"{name} with ceil_mode windows past the padding "
                              "(counted differently by oneDNN); stays on the kernels")
    out = L.new_tensor(fakes[0].dtype, out_dims, strides=_pool_dst_strides(spec, out_dims))
    L.op("pool", [x], [out], [kind, nsp, *kernel, *stride, *padding, *pads_r, *dilation], name="pooling")
    return (("t", out), None) if isinstance(fake, (tuple, list)) else ("t", out)


def _pool_dst_strides(spec: TensorSpec, dst_dims) -> tuple[int, ...] | None:
    """The layout the engine gives a pooling's destination: channels-last whenever the
    source's channel stride is 1 (with more than one channel), whatever its other strides
    (native/engine.cpp add_pool), e.g. a channel slice of a channels-last activation
    (timm's Res2Net pools one). The plan must say the same or the next op misreads it."""
    if len(spec.dims) >= 3 and spec.strides[1] == 1 and spec.dims[1] > 1:
        return channels_last(dst_dims)
    return None


def _expand(v, n):
    v = list(v)
    return v * n if len(v) == 1 else v


def _uses_output(node, index) -> bool:
    return any(u.target is operator.getitem and u.args[1] == index for u in node.users)


def lower_batch_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, mean, var, momentum, eps = args[:7]
    if not all(v is None or (isinstance(v, tuple) and v[0] == "c") for v in (w, b, mean, var)):
        raise Unsupported("layout", "batch norm with run-time statistics")
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "batch norm whose saved statistics are used")
    mean, var = mean[1].double(), var[1].double()
    scale = 1.0 / torch.sqrt(var + eps)
    if w is not None:
        scale = scale * w[1].double()
    shift = -mean * scale + (b[1].double() if b is not None else 0)
    src = L.materialize(x)
    spec = L.spec(src)
    # fold into the convolution that produced x, when nothing else reads it
    writer = next((op for op in reversed(L.plan.ops) if src in op["out"]), None)
    if (writer is not None and writer["kind"] == "conv" and not writer["post"]
            and L.users.get(node.args[0].name, 0) == 1 and spec.role == "temp"):
        wt = L.plan.tensors[writer["in"][1]]
        weight = torch.frombuffer(bytearray(wt.data), dtype=torch.float32).reshape(wt.dims).double()
        weight = weight * scale.reshape(-1, *([1] * (weight.dim() - 1))) if weight.dim() == len(spec.dims) \
            else weight * scale.reshape(weight.shape[0], -1, *([1] * (weight.dim() - 2)))
        bias = shift.clone()
        if len(writer["in"]) == 3:
            bt = L.plan.tensors[writer["in"][2]]
            bias = torch.frombuffer(bytearray(bt.data), dtype=torch.float32).double() * scale + shift
        writer["in"][1] = L.materialize(("c", weight.float().contiguous()))
        if len(writer["in"]) == 3:
            writer["in"][2] = L.materialize(("c", bias.float().contiguous()))
        else:
            writer["in"].append(L.materialize(("c", bias.float().contiguous())))
            writer["ia"][-1] = 1
        return (("t", src), None, None)
    # per-channel scale and shift broadcast along dim 1: dims (1, C, 1, ...), strides (0, 1, 0, ...)
    channel_dims = tuple(spec.dims[1] if i == 1 else 1 for i in range(len(spec.dims)))
    channel_strides = tuple(1 if i == 1 else 0 for i in range(len(spec.dims)))
    ts = L.alias(L.materialize(("c", scale.float().contiguous())), channel_dims, channel_strides)
    tb = L.alias(L.materialize(("c", shift.float().contiguous())), channel_dims, channel_strides)
    out = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
    if _post_operand_misread(spec.dims, channel_dims):
        scaled = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
        L.op("binary", [src, ts], [scaled], [B_MUL], name="batch_norm")
        L.op("binary", [scaled, tb], [out], [B_ADD], name="batch_norm shift")
        return (("t", out), None, None)
    L.op("binary", [src, ts], [out], [B_MUL], post=[[1, B_ADD, 0.0, 0.0, tb]], name="batch_norm")
    return (("t", out), None, None)


def _post_operand_misread(dst_dims, operand_dims) -> bool:
    """oneDNN (2023.2) applies a binary post-op whose operand is (1, C, 1, ...) to a
    destination (N > 1, C, 1, ...) of rank >= 3 with the wrong values (BatchNorm1d over
    (2, 2, 1) was off by the size of its output); the plain binary primitive broadcasts it
    right, so such an operand stays a separate op."""
    return (len(dst_dims) >= 3 and dst_dims[0] > 1 and all(d == 1 for d in dst_dims[2:])
            and len(operand_dims) == len(dst_dims) and operand_dims[0] == 1
            and any(d > 1 for d in operand_dims[1:]))


def lower_layer_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, shape, w, b, eps = args[:5]
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "layer norm whose mean/rstd outputs are used")
    src = L.contiguous(L.materialize(x))
    spec = L.spec(src)
    inner = math.prod(shape)
    outer = math.prod(spec.dims) // max(inner, 1)
    flat = L.alias(src, (outer, inner), (inner, 1))
    out = L.new_tensor(torch.float32, spec.dims)
    flat_out = L.alias(out, (outer, inner), (inner, 1))
    ins = [flat]
    for v in (w, b):
        if v is not None:
            t = L.materialize(v)
            ins.append(L.alias(t, (inner,), (1,)) if L.spec(t).dims != (inner,) else t)
    L.op("layer_norm", ins, [flat_out], [w is not None, b is not None], [eps], name="layer_norm")
    return (("t", out), None, None)


def lower_group_norm(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, n, c, hw, groups, eps = args[:8]
    if _uses_output(node, 1) or _uses_output(node, 2):
        raise Unsupported("op", "group norm whose mean/rstd outputs are used")
    src = L.contiguous(L.materialize(x))
    ins = [src] + [L.materialize(v) for v in (w, b) if v is not None]
    out = L.new_tensor(torch.float32, L.spec(src).dims)
    L.op("group_norm", ins, [out], [groups, w is not None, b is not None], [eps], name="group_norm")
    return (("t", out), None, None)


def lower_softmax(L, node, args, kwargs):
    _need_f32(node)
    src = _dense_operand(L, L.materialize(args[0]))
    spec = L.spec(src)
    dim = args[1] % max(len(spec.dims), 1)
    out = L.new_tensor(torch.float32, spec.dims, strides=spec.strides)
    log = op_name(node).startswith("aten::_log_softmax")
    L.op("softmax", [src], [out], [dim, int(log)], name="log_softmax" if log else "softmax")
    return ("t", out)


REDUCE = {"aten::sum": 0, "aten::mean": 1, "aten::amax": 2, "aten::amin": 3, "aten::any": 4, "aten::all": 5}


def lower_reduce(L: Lowering, node, args, kwargs):
    name = op_name(node).split(".")[0]
    fake = _val(node)
    src = L.materialize(args[0])
    spec = L.spec(src)
    rank = len(spec.dims)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        dims = list(range(rank))
    dims = sorted({d % max(rank, 1) for d in dims})
    if kwargs.get("dtype") is not None or (len(args) > 3 and args[3] is not None and name in ("aten::sum", "aten::mean")):
        raise Unsupported("dtype", f"{name} with a dtype argument; stays on the kernels")
    kept = tuple(1 if k in dims else d for k, d in enumerate(spec.dims))
    count = math.prod(spec.dims[k] for k in dims) if dims else 1
    if (spec.dtype == torch.float32 and fake.dtype == torch.float32 and name == "aten::mean"
            and rank in (3, 4, 5) and dims == list(range(2, rank)) and _dense(spec)):
        # a global average pool: oneDNN's pooling runs it fast in any layout
        out = L.new_tensor(torch.float32, kept, strides=_pool_dst_strides(spec, kept))
        nsp = rank - 2
        window = list(spec.dims[2:])
        L.op("pool", [src], [out], [1, nsp, *window, *window, *([0] * nsp), *([0] * nsp), *([1] * nsp)],
             name="mean")
    elif spec.dtype == torch.float32 and fake.dtype == torch.float32 and name in ("aten::sum", "aten::mean", "aten::amax", "aten::amin") and count > 0:
        src = _dense_operand(L, src)
        out = L.new_tensor(torch.float32, kept)
        L.op("reduction", [src], [out], [REDUCE[name]], name=name.split("::")[1])
    else:
        if fake.dtype not in GENERIC_DTYPES or spec.dtype not in GENERIC_DTYPES:
            raise Unsupported("dtype", f"{name} on {spec.dtype}")
        out = L.new_tensor(fake.dtype, kept)
        out_strides = [0 if k in dims else s for k, s in enumerate(row_major(kept))]
        L.op("reduce", [src], [out], [REDUCE[name], rank, *spec.dims, *spec.strides, *out_strides, max(count, 1)],
             name=name.split("::")[1])
    result = tuple(fake.shape)
    if result != kept:
        return ("t", L.alias(out, result, row_major(result)))
    return ("t", out)


def lower_embedding(L, node, args, kwargs):
    weight, indices = args[0], args[1]
    w = L.contiguous(L.materialize(weight))
    ix = L.contiguous(L.materialize(indices))
    if L.spec(w).dtype != torch.float32 or L.spec(ix).dtype not in (torch.int64, torch.int32):
        raise Unsupported("dtype", "aten::embedding needs float32 weights and int indices")
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape)
    L.op("embedding", [w, ix], [out], name="embedding")
    return ("t", out)


def lower_adaptive_avg(L, node, args, kwargs):
    _need_f32(node)
    src = L.materialize(args[0])
    spec = L.spec(src)
    out_size = list(args[1])
    nsp = len(out_size)
    in_sp = spec.dims[-nsp:]
    if any(i % o for i, o in zip(in_sp, out_size)):
        raise Unsupported("shape", "adaptive average pooling whose output does not divide the input")
    kernel = [i // o for i, o in zip(in_sp, out_size)]
    fake = _val(node)
    out = L.new_tensor(torch.float32, fake.shape, strides=_pool_dst_strides(spec, fake.shape))
    L.op("pool", [src], [out], [1, nsp, *kernel, *kernel, *([0] * nsp), *([0] * nsp), *([1] * nsp)],
         name="pooling")
    return ("t", out)


VIEW_OPS = ["aten::view", "aten::_unsafe_view", "aten::reshape", "aten::permute", "aten::expand",
            "aten::squeeze", "aten::unsqueeze", "aten::select", "aten::slice", "aten::alias",
            "aten::clone", "aten::t", "aten::transpose", "aten::split_with_sizes", "aten::split",
            "aten::unbind", "aten::narrow", "aten::diagonal", "aten::unfold", "aten::as_strided",
            "aten::detach", "aten::view_copy", "aten::permute_copy", "aten::expand_copy",
            "aten::squeeze_copy", "aten::unsqueeze_copy", "aten::select_copy", "aten::slice_copy",
            "aten::alias_copy", "aten::split_with_sizes_copy", "aten::split_copy", "aten::t_copy",
            "aten::transpose_copy", "aten::unbind_copy", "aten::lift_fresh_copy", "aten::contiguous"]

LOWERINGS: dict[str, Callable] = {k: lower_eltwise for k in ELTWISE}
LOWERINGS.update({k: lower_binary for k in BINARY})
LOWERINGS.update({k: lower_view for k in VIEW_OPS})
LOWERINGS.update({
    "aten::pow": lower_pow,
    "aten::convolution": lower_convolution,
    "aten::addmm": lower_mm, "aten::mm": lower_mm, "aten::bmm": lower_mm, "aten::matmul": lower_mm,
    "aten::linear": lower_mm,
    "aten::max_pool2d_with_indices": lower_pool, "aten::max_pool3d_with_indices": lower_pool,
    "aten::max_pool2d": lower_pool, "aten::avg_pool2d": lower_pool, "aten::avg_pool3d": lower_pool,
    "aten::avg_pool1d": lower_pool,
    "aten::_adaptive_avg_pool2d": lower_adaptive_avg, "aten::adaptive_avg_pool2d": lower_adaptive_avg,
    "aten::_native_batch_norm_legit_no_training": lower_batch_norm,
    "aten::native_layer_norm": lower_layer_norm,
    "aten::native_group_norm": lower_group_norm,
    "aten::_softmax": lower_softmax, "aten::_log_softmax": lower_softmax,
    "aten::sum": lower_reduce, "aten::mean": lower_reduce, "aten::amax": lower_reduce,
    "aten::amin": lower_reduce, "aten::any": lower_reduce, "aten::all": lower_reduce,
    "aten::embedding": lower_embedding,
    "aten::cat": lower_cat, "aten::stack": lower_stack,
    "aten::_to_copy": lower_to_copy,
    "aten::where": lower_where,
    "aten::eq": lower_named_ew("eq"), "aten::ne": lower_named_ew("ne"), "aten::lt": lower_named_ew("lt"),
    "aten::le": lower_named_ew("le"), "aten::gt": lower_named_ew("gt"), "aten::ge": lower_named_ew("ge"),
    "aten::logical_not": lower_named_ew("logical_not"), "aten::bitwise_not": lower_named_ew("bitwise_not"),
    "aten::logical_and": lower_named_ew("logical_and"), "aten::logical_or": lower_named_ew("logical_or"),
    "aten::full_like": None,
})
del LOWERINGS["aten::full_like"]


def lower_full_like(L, node, args, kwargs):
    fake = _val(node)
    value = args[1]
    if fake.dtype not in GENERIC_DTYPES:
        raise Unsupported("dtype", f"aten::full_like of {fake.dtype}")
    out = L.new_tensor(fake.dtype, fake.shape)
    dims = tuple(fake.shape)
    L.op("ew", [], [out], [EW["fill"], 0, len(dims), *dims, *L.spec(out).strides], [1.0, float(value)], name="fill")
    return ("t", out)


LOWERINGS["aten::full_like"] = lower_full_like


def lower_zeros_like(L, node, args, kwargs):
    return lower_full_like(L, node, [args[0], 0], kwargs)


def lower_masked_fill(L, node, args, kwargs):
    x, mask, value = args[:3]
    if not isinstance(value, (int, float, bool)):
        raise Unsupported("op", "aten::masked_fill with a tensor value; stays on the kernels")
    return lower_generic_ew(L, node, [mask, x, value], kwargs, "masked_fill")


LOWERINGS["aten::zeros_like"] = lower_zeros_like
LOWERINGS["aten::ones_like"] = lambda L, node, args, kwargs: lower_full_like(L, node, [args[0], 1], kwargs)
LOWERINGS["aten::masked_fill"] = lower_masked_fill


# =========================================================================================
# fusion: elementwise ops after convolution / matmul / binary become oneDNN post-ops

FUSABLE = ("conv", "deconv", "matmul", "binary")
DNNL_KINDS = ("conv", "deconv", "matmul", "pool", "eltwise", "binary", "softmax", "layer_norm",
              "reduction", "qconv", "qmatmul")


def prune(plan: Plan) -> None:
    """Ops whose results nobody reads are dropped (a dequantize an int8 op made redundant),
    and temporaries no op reads or writes any more take no memory."""
    keep = set(plan.outputs)
    changed = True
    while changed:
        changed = False
        read = {t for op in plan.ops for t in op["in"]} | {p[4] for op in plan.ops for p in op["post"] if p[0] == 1}
        read |= {t.base for t in plan.tensors if t.role == "alias"} | keep
        for i, op in enumerate(plan.ops):
            if op["kind"] in ("kernel", "package"):
                continue  # foreign code: kept as written
            if all(plan.tensors[t].role == "temp" and t not in read for t in op["out"]):
                del plan.ops[i]
                changed = True
                break
    used = {t for op in plan.ops for t in (*op["in"], *op["out"])}
    used |= {p[4] for op in plan.ops for p in op["post"] if p[0] == 1}
    used |= {t.base for t in plan.tensors if t.role == "alias"}
    for i, t in enumerate(plan.tensors):
        if t.role == "temp" and i not in used:
            t.role = "dead"


def _root(plan: Plan, tid: int) -> int:
    seen = 0
    while plan.tensors[tid].role == "alias" and seen < len(plan.tensors):
        tid, seen = plan.tensors[tid].base, seen + 1
    return tid


def _last_write(plan: Plan, tid: int) -> int:
    """The index of the last op that writes any part of ``tid``'s storage (a tensor, its
    base, or another alias of the same base: a concatenation is written by several copies)."""
    root = _root(plan, tid)
    return max((k for k, op in enumerate(plan.ops) if any(_root(plan, t) == root for t in op["out"])),
               default=-1)


def _readers(plan: Plan, tid: int) -> list[int]:
    return [i for i, op in enumerate(plan.ops)
            if tid in op["in"] or any(p[0] == 1 and p[4] == tid for p in op["post"])]


MAX_POST_OPS = 16


def fuse(plan: Plan) -> None:
    """Post-op fusion. A chain of elementwise ops that no convolution/matmul/binary absorbs
    starts as ``binary add`` of a broadcast zero with the first op as a post-op: oneDNN runs
    a binary with an eltwise chain as one fast pass, while an eltwise primitive with
    post-ops falls back to its reference kernel."""
    _fuse(plan)
    while True:
        first = next((op for op in plan.ops if op["kind"] == "eltwise" and not op["post"]
                      and _starts_chain(plan, op)), None)
        if first is None:
            return
        src = plan.tensors[first["in"][0]]
        zero = _zero_constant(plan, src.dtype, len(src.dims))
        first.update(kind="binary", post=[[0, first["ia"][0], first["fa"][0], first["fa"][1], -1]],
                     ia=[B_ADD], fa=[])
        first["in"] = [first["in"][0], zero]
        _fuse(plan)


def _starts_chain(plan: Plan, op: dict) -> bool:
    """An eltwise op whose result only another same-layout eltwise op reads (a lone eltwise
    stays an eltwise primitive, which is as fast)."""
    t = op["out"][0]
    spec = plan.tensors[t]
    readers = _readers(plan, t)
    if len(readers) != 1 or spec.role != "temp" or any(
            x.role == "alias" and x.base == t for x in plan.tensors):
        return False
    nxt = plan.ops[readers[0]]
    src = plan.tensors[op["in"][0]]
    return (nxt["kind"] == "eltwise" and src.strides == spec.strides
            and plan.tensors[nxt["out"][0]].strides == spec.strides)


def _zero_constant(plan: Plan, dtype, rank: int) -> int:
    dims = (1,) * max(rank, 1)
    plan.tensors.append(TensorSpec(dtype, dims, (1,) * len(dims), "const",
                                   data=torch.zeros(dims, dtype=dtype).numpy().tobytes()))
    return len(plan.tensors) - 1


def _fuse(plan: Plan) -> None:
    aliased = {t.base for t in plan.tensors if t.role == "alias"}
    changed = True
    while changed:
        changed = False
        for i, op in enumerate(plan.ops):
            if op["kind"] not in FUSABLE or len(op["out"]) != 1 or len(op["post"]) >= MAX_POST_OPS:
                continue
            t = op["out"][0]
            spec = plan.tensors[t]
            if spec.role != "temp" or t in aliased:
                continue
            readers = _readers(plan, t)
            if len(readers) != 1:
                continue
            j = readers[0]
            nxt = plan.ops[j]
            out_spec = plan.tensors[nxt["out"][0]] if nxt["out"] else None
            if out_spec is None or out_spec.dims != spec.dims or out_spec.strides != spec.strides \
                    or out_spec.dtype != spec.dtype:
                continue  # oneDNN's fast kernels write the layout they read
            if nxt["kind"] == "eltwise" and not nxt["post"]:
                op["post"].append([0, nxt["ia"][0], nxt["fa"][0], nxt["fa"][1], -1])
            elif nxt["kind"] == "binary" and not nxt["post"] and nxt["ia"][0] in (B_ADD, B_MUL, B_MAX, B_MIN, B_SUB, B_DIV):
                other = nxt["in"][1] if nxt["in"][0] == t else nxt["in"][0]
                if nxt["in"][0] != t and nxt["ia"][0] in (B_SUB, B_DIV):
                    continue  # other - t: not expressible as a post-op on t
                if other == t:
                    continue
                if _last_write(plan, other) > i:
                    continue  # computed after op: not available to it
                if any(p[0] == 1 for p in op["post"]) and op["kind"] == "binary":
                    continue
                if _post_operand_misread(spec.dims, plan.tensors[other].dims):
                    continue
                op["post"].append([1, nxt["ia"][0], 0.0, 0.0, other])
            else:
                continue
            op["out"] = list(nxt["out"])
            op["name"] += "+" + nxt["name"]
            spec.role = "dead"
            del plan.ops[j]
            changed = True
            break



# =========================================================================================
# quantize / dequantize, and the 8a8w int8 patterns

_qd = getattr(torch.ops, "quantized_decomposed", None)


def _qop(name):
    try:
        return getattr(getattr(torch.ops.quantized_decomposed, name), "default")
    except (AttributeError, RuntimeError):
        return None


QUANT_DTYPES = (torch.uint8, torch.int8, torch.int16, torch.int32)


def lower_quant(L: Lowering, node, args, kwargs):
    """Per-tensor quantize/dequantize with scalar parameters, as quantized_decomposed
    computes them (exact: the same float32 operations)."""
    name = op_name(node)
    quantize = name.startswith("quantized_decomposed::quantize_per_tensor")
    x, scale, zp, qmin, qmax, dtype = (list(args) + [None] * 6)[:6]
    if not all(isinstance(v, (int, float)) for v in (scale, zp, qmin, qmax)):
        raise Unsupported("op", f"{name} with tensor parameters; stays on the kernels")
    if dtype not in QUANT_DTYPES or kwargs.get("out_dtype") not in (None, torch.float32):
        raise Unsupported("dtype", f"{name} with {dtype}; stays on the kernels")
    src = _dense_operand(L, L.materialize(x))
    fake = _val(node)
    out = L.new_tensor(fake.dtype, fake.shape, strides=L.spec(src).strides)  # same layout
    L.op("quant", [src], [out], [0 if quantize else 1, int(qmin), int(qmax)], [float(scale), float(zp)],
         name="quantize" if quantize else "dequantize")
    return ("t", out)


LOWERINGS["quantized_decomposed::quantize_per_tensor"] = lower_quant
LOWERINGS["quantized_decomposed::dequantize_per_tensor"] = lower_quant


@dataclass
class Int8Pattern:
    dequant: Any
    compute: Any
    relu: Any
    quant: Any
    conv: bool
    weight: torch.Tensor      # int8, oneDNN's layout (conv: O,I,k..; matmul: K,N)
    scales: torch.Tensor      # float32 per output channel
    bias: torch.Tensor | None
    x_scale: float
    x_zp: int
    y_scale: float
    y_zp: int
    mask: int
    conv_ia: list
    output: int = -1


def _is(node, op) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and op is not None \
        and node.target == op


def _const(sub, node):
    if isinstance(node, torch.fx.Node) and node.op == "placeholder":
        return sub.constants.get(node.name)
    return None


def _per_tensor_u8(node, quantize: bool) -> tuple[float, int] | None:
    op = _qop("quantize_per_tensor" if quantize else "dequantize_per_tensor")
    if not _is(node, op) or node.kwargs.get("out_dtype") not in (None, torch.float32):
        return None
    _, scale, zp, qmin, qmax, dtype = (list(node.args) + [None] * 6)[:6]
    if dtype != torch.uint8 or qmin != 0 or qmax != 255 or not isinstance(scale, float) \
            or not isinstance(zp, int):
        return None
    return scale, zp


def _int8_weight(sub, node):
    """(int8 weight, float32 scales) of a per-channel dequantize of a constant along axis 0
    with zero zero-points, else None."""
    if not _is(node, _qop("dequantize_per_channel")):
        return None
    w, scales, zps, axis, qmin, qmax, dtype = (list(node.args) + [None] * 7)[:7]
    w, scales, zps = _const(sub, w), _const(sub, scales), _const(sub, zps)
    if w is None or scales is None or w.dtype != torch.int8 or dtype != torch.int8 or axis != 0:
        return None
    if zps is not None and bool((zps != 0).any()):
        return None
    return w, scales.float().contiguous()


def find_int8_patterns(sub) -> dict[str, Int8Pattern]:
    """``dequantize_per_tensor(u8) → convolution/addmm/mm [→ relu] → quantize_per_tensor(u8)``
    with per-channel int8 weights: the 8a8w patterns oneDNN runs in int8. Keyed by the name
    of every node in each pattern."""
    found: dict[str, Int8Pattern] = {}
    if _qop("dequantize_per_channel") is None:
        return found
    for node in sub.graph_module.graph.nodes:
        q = _per_tensor_u8(node, quantize=True)
        if q is None:
            continue
        src = node.args[0]
        relu = None
        if _is(src, aten.relu.default) and len(src.users) == 1:
            relu, src = src, src.args[0]
        if not isinstance(src, torch.fx.Node) or len(src.users) != 1:
            continue
        pattern = _match_compute(sub, src)
        if pattern is None:
            continue
        dq, conv, weight, scales, bias, mask, conv_ia = pattern
        x = _per_tensor_u8(dq, quantize=False)
        if x is None:
            continue
        p = Int8Pattern(dq, src, relu, node, conv, weight, scales, bias, x[0], x[1], q[0], q[1],
                        mask, conv_ia)
        for n in (src, relu, node):
            if n is not None:
                found[n.name] = p
    return found


def _match_compute(sub, node):
    if _is(node, aten.convolution.default):
        x, w, b, stride, padding, dilation, transposed, output_padding, groups = node.args[:9]
        wq = _int8_weight(sub, w)
        if wq is None or transposed or groups != 1 or (b is not None and _const(sub, b) is None):
            return None
        weight, scales = wq
        nsp = weight.dim() - 2
        fake_in, fake_out = _val(x), _val(node)
        if fake_in is None or fake_out is None or fake_in.dim() != nsp + 2:
            return None
        pads_r = []
        for k in range(nsp):
            kernel = (weight.shape[2 + k] - 1) * dilation[k] + 1
            pads_r.append((fake_out.shape[2 + k] - 1) * stride[k] + kernel - fake_in.shape[2 + k] - padding[k])
        ia = [nsp, *stride, *padding, *pads_r, *dilation]
        bias = _const(sub, b) if b is not None else None
        return x, True, weight.contiguous(), scales, bias, 1, ia
    if _is(node, aten.addmm.default) or _is(node, aten.mm.default):
        if _is(node, aten.addmm.default):
            b, x, wt = node.args[:3]
            if len(node.args) > 3 or node.kwargs or _const(sub, b) is None:
                return None
            bias = _const(sub, b)
        else:
            x, wt = node.args[:2]
            bias = None
        if not (_is(wt, aten.permute.default) and list(wt.args[1]) == [1, 0]) and not _is(wt, aten.t.default):
            return None
        wq = _int8_weight(sub, wt.args[0])
        if wq is None or _val(x) is None or _val(x).dim() != 2:
            return None
        weight, scales = wq
        return x, False, weight.t().contiguous(), scales, bias, 1 << 1, []
    return None



def lower_constant_pad(L: Lowering, node, args, kwargs):
    """constant_pad_nd: fill the output with the value, then copy the input's overlap into
    it (negative padding crops)."""
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    fake = _val(node)
    if fake.dtype not in GENERIC_DTYPES or not isinstance(value, (int, float, bool)):
        raise Unsupported("dtype", f"aten::constant_pad_nd on {fake.dtype}; stays on the kernels")
    src = L.materialize(x)
    s = L.spec(src)
    out = L.new_tensor(fake.dtype, fake.shape)
    o = L.spec(out)
    dims = tuple(fake.shape)
    L.op("ew", [], [out], [EW["fill"], 0, len(dims), *dims, *o.strides], [1.0, float(value)], name="fill")
    lengths, src_off, dst_off = [], 0, 0
    for k in range(len(s.dims)):
        j = len(s.dims) - 1 - k  # pad pairs run from the last dim backwards
        before, after = (pad[2 * j], pad[2 * j + 1]) if 2 * j + 1 < len(pad) else (0, 0)
        start_src, start_dst = max(0, -before), max(0, before)
        length = s.dims[k] - start_src - max(0, -after)
        if length <= 0:
            return ("t", out)
        lengths.append(length)
        src_off += start_src * s.strides[k]
        dst_off += start_dst * o.strides[k]
    L.op("copy", [src], [out], [len(lengths), *lengths, *s.strides, src_off, *o.strides, dst_off],
         name="pad")
    return ("t", out)


def lower_index_select(L: Lowering, node, args, kwargs):
    """index_select along dim 0: a row gather (the engine's embedding loop, indices checked
    at run time)."""
    x, dim, index = args[:3]
    fake = _val(node)
    if isinstance(index, tuple) and index[0] == "c" and index[1].dim() <= 1:
        runs = _runs(index[1].reshape(-1).tolist())
        if runs is not None and len(runs) <= 16:  # e.g. torch.roll: two runs
            return _select_runs(L, node, L.materialize(x), dim, runs)
    src = L.contiguous(L.materialize(x))
    s = L.spec(src)
    if dim % max(len(s.dims), 1) != 0 or s.dtype != torch.float32 or len(s.dims) < 1:
        raise Unsupported("op", "aten::index_select other than float32 rows (dim 0); stays on the kernels")
    ix = L.contiguous(L.materialize(index))
    if L.spec(ix).dtype not in (torch.int64, torch.int32):
        raise Unsupported("dtype", "aten::index_select with non-integer indices")
    inner = math.prod(s.dims[1:]) if len(s.dims) > 1 else 1
    rows = L.alias(src, (s.dims[0], inner), (inner, 1))
    out = L.new_tensor(fake.dtype, fake.shape)
    n = math.prod(L.spec(ix).dims) if L.spec(ix).dims else 1
    flat_out = L.alias(out, (n, inner), (inner, 1))
    L.op("embedding", [rows, ix], [flat_out], name="index_select")
    return ("t", out)


def _runs(indices: list[int]) -> list[tuple[int, int]] | None:
    """Constant indices as (start, length) runs of consecutive values."""
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][0] + runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([i, 1])
    return [tuple(r) for r in runs]


def _select_runs(L: Lowering, node, src: int, dim: int, runs) -> Any:
    """index_select with constant indices in a few runs: one strided copy per run."""
    fake = _val(node)
    s = L.spec(src)
    dim %= max(len(s.dims), 1)
    if any(start < 0 or start + n > s.dims[dim] for start, n in runs):
        raise Unsupported("shape", "aten::index_select with an index out of range")
    out = L.new_tensor(fake.dtype, fake.shape)
    o = L.spec(out)
    position = 0
    for start, n in runs:
        dims = list(s.dims)
        dims[dim] = n
        L.op("copy", [src], [out], [len(dims), *dims, *s.strides, start * s.strides[dim],
                                    *o.strides, position * o.strides[dim]], name="index_select")
        position += n
    return ("t", out)


LOWERINGS["aten::constant_pad_nd"] = lower_constant_pad
LOWERINGS["aten::index_select"] = lower_index_select
