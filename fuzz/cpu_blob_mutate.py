"""Field-level mutations of cpu backend blobs, for ``cpu_blob_fuzz.py``.

A case is one seed program with one of its delegate blobs parsed (``blob.parse``: the
seeds are valid), one to three fields of the plan changed, the blob written again by
``cpu_blob_write.py`` (the format of ``blob.encode``: header, JSON plan, padding, data,
CRC-32 recomputed) and put back into the program, whose own header and CRC ``to_bytes``
writes afresh. So every mutation reaches ``blob.parse`` and, when it gets past it, the
engine — nothing stops at a checksum.

What changes (each mutator returns a ``Mutation`` naming the field and the op kind it
touched; the report dedupes findings by them):

* tensor ids of ops: dangling, negative, 2**31, swapped, another tensor of the plan;
* tensor dims (0, 1, huge, 2**40, negative, rank changes) and strides (0, negative,
  2**62, overlapping, swapped);
* aliases: base (chains, to itself, to a later tensor, to a constant), offset past the end;
* dtypes (valid and not), roles (input/output/const/temp/alias/dead), constants' data
  ranges and bytes (int constants get out-of-range values: gather indices); constants stored
  by name in the program (another key, absent, empty or huge; another size; the reference
  moved to a tensor that is no constant);
* op kinds swapped keeping the operands; operands dropped, added, duplicated; ops swapped
  or duplicated (order);
* ``ia``/``fa`` attributes (interesting ints, NaN/inf), post-ops (kinds, algs, tensors);
* kernel-ABI args (tags, tensor slots, ints, lists) and op-package nodes (shapes, dtypes,
  slots, params, bytes);
* the plan's inputs/outputs lists, its state list (state inputs written in place), the
  blob header's version/reserved word, and the delegate's compile specs (num_threads);
* a dynamic delegate's size expressions (syntax, depth, undefined symbols, overflowing
  products, division by zero, negative sizes) and symbols (ranges, names, duplicates, a
  symbol no input binds), and expressions put where plain numbers were.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random

from cpu_blob_write import ParsedSeed, program_with_blob, write_blob  # noqa: F401 (re-exported)
from opforge.backends.cpu import blob as B
from opforge.errors import OpforgeError

INTS = [0, 1, 2, 3, -1, -2, 7, 8, 64, 255, 4096, 2**16, 2**20, 2**31 - 1, 2**31, 2**32,
        2**40, 2**40 + 1, 2**48, 2**62, -(2**31), -(2**40), -(2**62)]
SMALL = [0, 1, 2, 3, -1, 5, 9]
FLOATS = [0.0, -0.0, 1.0, -1.0, 0.5, 1e-45, 1e30, -1e30, 3.4e38, 1e300, math.inf, -math.inf,
          math.nan]
DIMS = [0, 1, 2, 3, 7, 64, 4096, 2**20, 2**31, 2**40, 2**40 + 1, -1, -(2**40)]
STRIDES = [0, 1, 2, -1, -8, 2**31, 2**40, 2**40 + 1, 2**62, -(2**62)]
DTYPES = sorted(B.DTYPES) + [5, 8, 12, -1]
ROLES = list(B.ROLES)
KERNEL_TAGS = ["none", "tensor", "int", "double", "bool", "int_list", "double_list", "string",
               "scalar_type", 3]


@dataclasses.dataclass(frozen=True)
class Mutation:
    field: str      # what was changed, e.g. "tensor.strides", "op.ia", "post.alg"
    op_kind: str    # the kind of the op it touched ("-" for plan-level fields)
    detail: str     # what exactly, for the crash file

    def __str__(self) -> str:
        return f"{self.field} [{self.op_kind}] {self.detail}"


@dataclasses.dataclass
class Case:
    """A plan being mutated: the parsed JSON, its data bytes and the delegate's specs."""
    plan: dict
    data: bytearray
    specs: list[tuple[str, bytes]]
    header: dict = dataclasses.field(default_factory=dict)  # version / reserved overrides


def _pick(rng: random.Random, values: list):
    return values[rng.randrange(len(values))]


def _tensor_users(plan: dict, tid: int) -> str:
    kinds = {op["kind"] for op in plan["ops"] if tid in op["in"] + op["out"]}
    return ",".join(sorted(kinds)) or "-"


def _any_id(rng, plan) -> int:
    n = len(plan["tensors"])
    return _pick(rng, [rng.randrange(n)] * 6 + [n, n + 7, -1, -(2**31), 2**31 - 1, 2**31])


# --- mutators: each changes one field of case.plan and says which -------------------------

def op_tensor_id(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    side = _pick(rng, [s for s in ("in", "out") if op[s]] or ["in"])
    if not op[side]:
        return None
    k = rng.randrange(len(op[side]))
    old = op[side][k]
    mode = rng.randrange(3)
    if mode == 0 and len(op["in"] + op["out"]) > 1:  # swapped with another operand of the op
        both = [(s, j) for s in ("in", "out") for j in range(len(op[s])) if (s, j) != (side, k)]
        s2, j2 = _pick(rng, both)
        op[side][k], op[s2][j2] = op[s2][j2], op[side][k]
        return Mutation(f"op.{side}", op["kind"], f"{side}[{k}] swapped with {s2}[{j2}]")
    op[side][k] = _any_id(rng, c.plan)
    return Mutation(f"op.{side}", op["kind"], f"{side}[{k}] {old} -> {op[side][k]}")


def op_operand_count(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    side = _pick(rng, ["in", "out"])
    mode = rng.randrange(3)
    if mode == 0 and op[side]:
        del op[side][rng.randrange(len(op[side]))]
        what = "dropped one"
    elif mode == 1 and op[side]:
        op[side].append(_pick(rng, op[side]))
        what = "duplicated one"
    else:
        op[side].insert(rng.randrange(len(op[side]) + 1), rng.randrange(len(c.plan["tensors"])))
        what = "added one"
    return Mutation(f"op.{side}.count", op["kind"], f"{what}: {op[side]}")


def op_kind(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    old = op["kind"]
    op["kind"] = _pick(rng, [k for k in B.OP_KINDS if k != old])
    if op["kind"] == "kernel":
        op.setdefault("args", [["tensor", 0], ["tensor", 1]])
    if op["kind"] == "package":
        op.setdefault("node", "")
    return Mutation("op.kind", old, f"{old} -> {op['kind']}")


def op_order(rng, c: Case):
    ops = c.plan["ops"]
    i, j = rng.randrange(len(ops)), rng.randrange(len(ops))
    if rng.random() < 0.5:
        ops[i], ops[j] = ops[j], ops[i]
        return Mutation("op.order", ops[j]["kind"], f"ops {i} and {j} swapped")
    ops.insert(j, copy.deepcopy(ops[i]))
    return Mutation("op.order", ops[i]["kind"], f"ops[{i}] run again at {j}")


def op_ia(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    ia = op["ia"]
    mode = rng.randrange(5)
    if mode <= 1 and ia:
        k = rng.randrange(len(ia))
        ia[k] = _pick(rng, INTS if mode == 0 else [ia[k] + 1, ia[k] - 1, ia[k] * 2, -ia[k],
                                                   rng.randrange(-2, 40)] + SMALL)
        what = f"ia[{k}] = {ia[k]}"
    elif mode == 2 and ia:
        del ia[rng.randrange(len(ia)):]
        what = f"truncated to {len(ia)}"
    elif mode == 3:
        ia.extend(_pick(rng, INTS) for _ in range(rng.randint(1, 8)))
        what = f"extended to {len(ia)}"
    else:
        op["ia"] = [_pick(rng, INTS + SMALL) for _ in range(rng.randint(0, 16))]
        what = f"replaced by {op['ia']}"
    return Mutation("op.ia", op["kind"], what)


def op_fa(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    fa = op["fa"]
    if fa and rng.random() < 0.7:
        k = rng.randrange(len(fa))
        fa[k] = _pick(rng, FLOATS)
        return Mutation("op.fa", op["kind"], f"fa[{k}] = {fa[k]}")
    op["fa"] = [_pick(rng, FLOATS) for _ in range(rng.randint(0, 4))]
    return Mutation("op.fa", op["kind"], f"replaced by {op['fa']}")


def op_post(rng, c: Case):
    op = _pick(rng, c.plan["ops"])
    post = op["post"]
    n = len(c.plan["tensors"])
    mode = rng.randrange(5)
    if mode == 0 or not post:
        kind = rng.randrange(2)
        item = [kind, _pick(rng, [0, 1, 2, 6, 100, 101, 102, 103, 104, 105, 999, -1]),
                _pick(rng, FLOATS), _pick(rng, FLOATS),
                (_pick(rng, [rng.randrange(n), rng.randrange(n), 0]) if kind else -1)]
        post.insert(rng.randrange(len(post) + 1), item)
        return Mutation("post.add", op["kind"], f"added {item}")
    k = rng.randrange(len(post))
    p = post[k]
    if mode == 1:
        p[1] = _pick(rng, INTS[:12] + [100, 105, 110, 200])
        field = "post.alg"
    elif mode == 2:
        p[2 + rng.randrange(2)] = _pick(rng, FLOATS)
        field = "post.scale"
    elif mode == 3:
        p[0] = 1 - p[0]
        p[4] = rng.randrange(n) if p[0] == 1 else -1
        field = "post.kind"
    else:
        p[4] = rng.randrange(n) if rng.random() < 0.8 else n
        p[0] = 1
        field = "post.tensor"
    return Mutation(field, op["kind"], f"post[{k}] = {p}")


def tensor_dims(rng, c: Case):
    tid = rng.randrange(len(c.plan["tensors"]))
    t = c.plan["tensors"][tid]
    mode = rng.randrange(4)
    if mode <= 1 and t["dims"]:
        k = rng.randrange(len(t["dims"]))
        t["dims"][k] = _pick(rng, DIMS)
        if mode == 1 and t["dims"][k] >= 0:  # keep the strides row-major: past the io check
            t["strides"] = _row_major(t["dims"])
        what = f"dims[{k}] = {t['dims'][k]}"
    elif mode == 2 and t["dims"]:
        k = rng.randrange(len(t["dims"]))
        del t["dims"][k]
        del t["strides"][k]
        what = f"rank {len(t['dims'])}"
    else:
        t["dims"].insert(0, _pick(rng, [1, 2, 3, 0]))
        t["strides"] = _row_major(t["dims"]) if rng.random() < 0.7 else [1] + t["strides"]
        what = f"rank {len(t['dims'])}"
    if "data" in t and rng.random() < 0.7:  # a constant keeps a byte count that matches
        t["data"][1] = _fit(t, c)
    return Mutation("tensor.dims", _tensor_users(c.plan, tid), f"tensors[{tid}] {what}: {t['dims']}")


def _fit(t: dict, c: Case) -> int:
    """The byte count of constant ``t``'s new shape, when its data has room for it."""
    try:
        want = _nbytes(t)
    except (TypeError, KeyError):
        return t["data"][1]
    return want if 0 <= want <= len(c.data) - t["data"][0] else t["data"][1]


def _row_major(dims):
    out, step = [], 1
    for d in reversed(dims):
        out.append(step)
        step *= max(d, 1)
    return list(reversed(out))


def tensor_strides(rng, c: Case):
    tid = rng.randrange(len(c.plan["tensors"]))
    t = c.plan["tensors"][tid]
    if not t["strides"]:
        return None
    mode = rng.randrange(4)
    if mode == 0:
        k = rng.randrange(len(t["strides"]))
        t["strides"][k] = _pick(rng, STRIDES)
    elif mode == 1:  # overlapping: every stride smaller than the inner extent
        t["strides"] = [max(1, s // 2) for s in t["strides"]]
    elif mode == 2:
        t["strides"] = list(reversed(t["strides"]))
    else:  # another dense layout of the same dims (the order of the dims in memory permuted)
        order = list(range(len(t["dims"])))
        rng.shuffle(order)
        step, strides = 1, [0] * len(order)
        for k in reversed(order):
            strides[k] = step
            step *= max(t["dims"][k], 1) if type(t["dims"][k]) is int else 1
        t["strides"] = strides
    return Mutation("tensor.strides", _tensor_users(c.plan, tid),
                    f"tensors[{tid}] strides {t['strides']} dims {t['dims']}")


def tensor_alias(rng, c: Case):
    ts = c.plan["tensors"]
    tid = rng.randrange(len(ts))
    t = ts[tid]
    mode = rng.randrange(4)
    if t["role"] != "alias" or mode == 0:  # make it an alias of an earlier tensor
        t.pop("data", None)
        t["role"] = "alias"
        t["base"] = rng.randrange(max(tid, 1))
        t["offset"] = _pick(rng, [0, 0, 1, 64])
        what = f"now an alias of {t['base']}"
    elif mode == 1:
        aliases = [i for i, u in enumerate(ts[:tid]) if u["role"] == "alias"]
        t["base"] = _pick(rng, aliases + [tid, tid + 1, len(ts), -1, 0])
        what = f"base {t['base']}"
    else:
        t["offset"] = _pick(rng, [1, 63, 64, 4096, 2**31, 2**40, 2**40 + 1, -1, -(2**40)])
        what = f"offset {t['offset']}"
    return Mutation("tensor.alias", _tensor_users(c.plan, tid), f"tensors[{tid}] {what}")


def tensor_dtype(rng, c: Case):
    tid = rng.randrange(len(c.plan["tensors"]))
    t = c.plan["tensors"][tid]
    old = t["dtype"]
    t["dtype"] = _pick(rng, DTYPES)
    if "data" in t and rng.random() < 0.7:
        t["data"][1] = _fit(t, c)
    return Mutation("tensor.dtype", _tensor_users(c.plan, tid), f"tensors[{tid}] {old} -> {t['dtype']}")


def tensor_role(rng, c: Case):
    tid = rng.randrange(len(c.plan["tensors"]))
    t = c.plan["tensors"][tid]
    old = t["role"]
    t["role"] = _pick(rng, [r for r in ROLES if r != old])
    if t["role"] == "const" and "data" not in t:
        t["data"] = [_pick(rng, [0, len(c.data) // 64 * 64]), 0]
        t["data"][1] = min(len(c.data) - t["data"][0], _nbytes(t))
    if t["role"] != "const" and rng.random() < 0.8:
        t.pop("data", None)
    if t["role"] == "alias":
        t["base"], t["offset"] = rng.randrange(max(tid, 1)), 0
    return Mutation("tensor.role", _tensor_users(c.plan, tid), f"tensors[{tid}] {old} -> {t['role']}")


def _nbytes(t) -> int:
    span = 1
    for d, s in zip(t["dims"], t["strides"]):
        if d == 0:
            return 0
        span += (d - 1) * s
    return span * B.ITEMSIZE.get(t["dtype"], 1)


def const_data(rng, c: Case):
    consts = [i for i, t in enumerate(c.plan["tensors"]) if "data" in t]
    if not consts:
        return None
    tid = _pick(rng, consts)
    t = c.plan["tensors"][tid]
    off, nbytes = t["data"]
    mode = rng.randrange(4)
    if mode == 0:
        t["data"] = [_pick(rng, [off + 64, 0, len(c.data) // 64 * 64, off - 64]), nbytes]
        what = f"data {t['data']}"
    elif mode == 1:
        t["data"] = [off, _pick(rng, [0, 1, nbytes - 1, nbytes + 1, nbytes * 2, len(c.data)])]
        what = f"data {t['data']}"
    else:  # the bytes: int constants (gather indices, zero points) out of range
        size = B.ITEMSIZE.get(t["dtype"], 1)
        if nbytes < size:
            return None
        k = rng.randrange(nbytes // size)
        value = _pick(rng, INTS + [-9, 100]) & ((1 << (8 * size)) - 1)
        if t["dtype"] in (6, 7) and rng.random() < 0.6:
            value = _pick(rng, [0x7FC00000, 0x7F800000, 0xFF800000]) if size == 4 else \
                _pick(rng, [0x7FF8000000000000, 0x7FF0000000000000])
        c.data[off + k * size:off + (k + 1) * size] = value.to_bytes(size, "little")
        what = f"element {k} bytes = {value:#x}"
    return Mutation("const.data", _tensor_users(c.plan, tid), f"tensors[{tid}] {what}")


def named_ref(rng, c: Case):
    """A constant stored by name in the program: another key (of another weight, absent,
    empty, huge), another size, or the reference moved to a tensor that is no constant."""
    named = [i for i, t in enumerate(c.plan["tensors"]) if "named" in t]
    if not named:
        return None
    tid = _pick(rng, named)
    t = c.plan["tensors"][tid]
    key, nbytes = t["named"]
    others = [c.plan["tensors"][i]["named"][0] for i in named]
    mode = rng.randrange(4)
    if mode == 0:
        t["named"] = [_pick(rng, others + ["", "sha256:" + "0" * 64, "k" * 257, 7]), nbytes]
    elif mode == 1:
        t["named"] = [key, _pick(rng, [0, 1, nbytes - 4, nbytes + 4, nbytes * 2, -1, 1 << 48])]
    elif mode == 2:
        target = c.plan["tensors"][_any_id(rng, c.plan)]
        target["named"] = [key, nbytes]
        tid = c.plan["tensors"].index(target)
    else:
        t["named"] = _pick(rng, [[key], key, None, [key, nbytes, 0]])
    return Mutation("const.named", _tensor_users(c.plan, tid), f"tensors[{tid}] named {t.get('named')}"[:120])


def kernel_args(rng, c: Case):
    ops = [op for op in c.plan["ops"] if op["kind"] == "kernel"]
    if not ops:
        return None
    op = _pick(rng, ops)
    args = op["args"]
    mode = rng.randrange(5)
    if mode == 0 and args:
        k = rng.randrange(len(args))
        args[k] = [args[k][0], _pick(rng, [-1, 0, 1, 2, 3, 7, 2**31, 2**40])]
        if args[k][0] in ("int_list", "double_list"):
            args[k][1] = [_pick(rng, INTS) for _ in range(rng.randint(0, 5))]
    elif mode == 1 and args:
        k = rng.randrange(len(args))
        args[k] = [_pick(rng, KERNEL_TAGS), args[k][1]]
    elif mode == 2 and args:
        del args[rng.randrange(len(args))]
    elif mode == 3:
        args.insert(rng.randrange(len(args) + 1), _pick(rng, [
            ["tensor", rng.randrange(4)], ["int", _pick(rng, INTS)], ["double", _pick(rng, FLOATS)],
            ["int_list", [_pick(rng, INTS)] * rng.randint(0, 3)], ["bool", 1], ["none", None]]))
    else:
        op["name"] = _pick(rng, ["my_ops::mul4.out", "my_ops::minmax.out", "my_ops::scaled_sum.out",
                                 "aten::relu.out", "nope::x.out", ""])
    return Mutation("kernel.args", "kernel", f"{op['name']}: {str(args)[:120]}")


def package_node(rng, c: Case):
    ops = [op for op in c.plan["ops"] if op["kind"] == "package"]
    if not ops:
        return None
    op = _pick(rng, ops)
    from opforge.backends.oppackage.node import PackageNode, TensorSpec

    if rng.random() < 0.2:
        raw = bytearray(bytes.fromhex(op["node"]))
        if raw:
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        op["node"] = raw.hex()
        return Mutation("package.node.bytes", "package", "one bit flipped")
    node = PackageNode.from_bytes(bytes.fromhex(op["node"]))
    mode = rng.randrange(4)
    try:
        if mode == 0 and node.inputs:
            specs = list(node.inputs)
            k = rng.randrange(len(specs))
            specs[k] = TensorSpec(specs[k].dtype, tuple(_pick(rng, [0, 1, 2, 1000, 2**20]) for _ in
                                                        range(rng.randint(0, 3))))
            node = dataclasses.replace(node, inputs=tuple(specs))
            what = f"inputs[{k}] shape {specs[k].shape}"
        elif mode == 1 and node.outputs:
            specs = list(node.outputs)
            k = rng.randrange(len(specs))
            specs[k] = TensorSpec(_pick(rng, ["float32", "int64", "uint8", "float64"]),
                                  specs[k].shape[::-1] + (2,) * rng.randint(0, 1))
            node = dataclasses.replace(node, outputs=tuple(specs))
            what = f"outputs[{k}] {specs[k]}"
        elif mode == 2:
            slots = tuple(_pick(rng, [0, 1, 2, -1, 7, 2**31 - 1]) for _ in
                          range(rng.randint(0, len(node.input_slots) + 1)))
            node = dataclasses.replace(node, input_slots=slots)
            what = f"input_slots {slots}"
        else:
            node = dataclasses.replace(node, params=(), inputs=node.inputs[:-1] or node.inputs)
            what = "params dropped, last input dropped"
        op["node"] = node.to_bytes().hex()
    except Exception as e:  # noqa: BLE001 - the node's own checks refuse the edit
        return Mutation("package.node", "package", f"refused by PackageNode: {type(e).__name__}")
    return Mutation("package.node", "package", what)


def plan_io(rng, c: Case):
    side = _pick(rng, ["inputs", "outputs"])
    ids = c.plan[side]
    mode = rng.randrange(3)
    if mode == 0 and ids:
        del ids[rng.randrange(len(ids))]
    elif mode == 1 and len(ids) > 1:
        ids.reverse()
    else:
        ids.append(rng.randrange(len(c.plan["tensors"])))
    return Mutation(f"plan.{side}", "-", f"{side} = {ids}")


def plan_state(rng, c: Case):
    """The state list (a state input written in place): entries dropped, swapped, pointed
    at other inputs or outputs, malformed; or an input made a state tensor."""
    state = c.plan.setdefault("state", [])
    mode = rng.randrange(5)
    if mode == 0 and state:
        del state[rng.randrange(len(state))]
    elif mode == 1 and state:
        entry = _pick(rng, state)
        entry[rng.randrange(2)] = _pick(rng, [0, 1, -1, len(c.plan["inputs"]), 2**31,
                                             rng.randrange(len(c.plan["inputs"]) + 1)])
    elif mode == 2 and c.plan["inputs"]:
        tid = _pick(rng, c.plan["inputs"])
        c.plan["tensors"][tid]["role"] = "state"  # a read-only input made writable
        return Mutation("plan.state", _tensor_users(c.plan, tid), f"tensors[{tid}] input -> state")
    elif mode == 3:
        state.append([rng.randrange(len(c.plan["inputs"]) + 1),
                      rng.randrange(len(c.plan["outputs"]) + 2)])
    else:
        c.plan["state"] = _pick(rng, [None, 3, "x", [[0]], [[0, 0, 0]], [["a", 0]]])
    return Mutation("plan.state", "-", f"state = {c.plan['state']!r}"[:200])


def plan_header(rng, c: Case):
    mode = rng.randrange(4)
    if mode == 0:
        c.header["version"] = _pick(rng, [0, 1, 2, 3, 2**32 - 1])  # 1: no named constants
        return Mutation("blob.version", "-", f"version {c.header['version']}")
    if mode == 1:
        c.header["reserved"] = _pick(rng, [1, 2**32 - 1])
        return Mutation("blob.reserved", "-", f"reserved {c.header['reserved']}")
    if mode == 2:
        c.plan["impls"] = _pick(rng, [None, 7, "x", [[1, 2]], {"a": 1}])
        return Mutation("plan.impls", "-", f"impls {c.plan['impls']!r}")
    key = _pick(rng, ["tensors", "ops", "inputs", "outputs"])
    c.plan[key] = _pick(rng, [None, {}, 3, "x"])
    return Mutation("plan.table", "-", f"{key} = {c.plan[key]!r}")


def _hostile_exprs(name: str) -> list[str]:
    return ["((", "(" * 17 + name + " + 1)" * 17, f"({name} + zz)", f"({name} * {2**40})",
            f"((({name} * {name}) * {name}) * {2**30})", f"floordiv({name}, ({name} - {name}))",
            f"mod({name}, 0)", f"(0 - {name})", f"({name} - 1)", f"(2 * {name})", name, "7",
            f"max({name}, {2**41})", f"min({name}, 0)", f"({name} * {name})"]


def symbolic_exprs(rng, c: Case):
    """A dynamic plan's expressions and symbols (None for a static plan)."""
    symbols = c.plan.get("symbols")
    if not symbols:
        return None
    name = symbols[0][0]
    mode = rng.randrange(4)
    if mode == 0:  # an expression, or a number, replaced by a hostile expression
        fields = [(t, key, k) for t in c.plan["tensors"] for key in ("dims", "strides")
                  for k in range(len(t[key]))]
        fields += [(t, "offset", None) for t in c.plan["tensors"] if "offset" in t]
        fields += [(op, "ia", k) for op in c.plan["ops"] for k in range(len(op["ia"]))]
        prefer = [f for f in fields if type(f[0][f[1]] if f[2] is None else f[0][f[1]][f[2]]) is str]
        obj, key, k = _pick(rng, prefer if prefer and rng.random() < 0.7 else fields)
        value = _pick(rng, _hostile_exprs(name))
        if k is None:
            obj[key] = value
        else:
            obj[key][k] = value
        return Mutation("symbolic.expr", key, f"{key}[{k}] = {value!r}")
    if mode == 1:  # a symbol's range
        entry = _pick(rng, symbols)
        entry[rng.randrange(1, 3)] = _pick(rng, [-1, 0, 1, 2, 3, 2**31, 2**40, 2**40 + 1, "8", None])
        return Mutation("symbolic.range", "-", f"symbol {entry}")
    if mode == 2:  # names: renamed, duplicated, dropped, or one more no input binds
        kind = rng.randrange(4)
        if kind == 0:
            symbols[0][0] = _pick(rng, ["s_other", "1x", "", "a" * 300])
        elif kind == 1:
            symbols.append(list(symbols[0]))
        elif kind == 2:
            del symbols[0]
        else:
            symbols.append(["extra", 1, 8])
            _pick(rng, c.plan["ops"])["ia"].append("extra")
        return Mutation("symbolic.symbols", "-", f"symbols {symbols}"[:200])
    c.plan["symbols"] = _pick(rng, [None, {}, 3, "x", [["s", 1]], [[name, 1, 8]] * 65])
    return Mutation("symbolic.symbols", "-", f"symbols = {str(c.plan['symbols'])[:80]}")


def compile_spec(rng, c: Case):
    specs = dict(c.specs)
    key = _pick(rng, ["num_threads"] * 4 + ["fuse", "custom_ops", "op_packages", "min_ops"])
    if key == "num_threads":
        value = f"i:{_pick(rng, [0, 1, 2, 3, 16, 64, 1024, 2**31 - 1, -1])}".encode()
    else:
        value = _pick(rng, [b"i:0", b"b:0", b"j:[]", b"j:{}", b"s:x", b"i:-5"])
    specs[key] = value
    c.specs = sorted(specs.items())
    return Mutation("spec." + key, "-", f"{key} = {value!r}")


MUTATORS = [
    (op_tensor_id, 10), (op_operand_count, 5), (op_kind, 6), (op_order, 3), (op_ia, 12),
    (op_fa, 5), (op_post, 6), (tensor_dims, 10), (tensor_strides, 8), (tensor_alias, 6),
    (tensor_dtype, 6), (tensor_role, 5), (const_data, 6), (named_ref, 4), (kernel_args, 4),
    (package_node, 4),
    (plan_io, 3), (plan_state, 3), (plan_header, 1), (compile_spec, 3), (symbolic_exprs, 8),
]
_FUNCS = [f for f, _ in MUTATORS]
_WEIGHTS = [w for _, w in MUTATORS]


# --- a case ----------------------------------------------------------------------------

def mutate(rng: random.Random, seed: ParsedSeed) -> tuple[bytes, list[Mutation]]:
    """One mutated program from ``seed`` and what was changed."""
    index, plan, data = _pick(rng, list(seed.plans))
    delegate = seed.program.delegates[index]
    case = Case(copy.deepcopy(plan), bytearray(data), list(delegate.compile_specs))
    done: list[Mutation] = []
    for _ in range(_pick(rng, [1, 1, 1, 1, 2, 3])):
        for _attempt in range(8):
            try:
                m = rng.choices(_FUNCS, _WEIGHTS)[0](rng, case)
            except (ValueError, TypeError, KeyError, IndexError, AttributeError, OpforgeError):
                m = None  # a field an earlier mutation of this case already broke
            if m is not None:
                done.append(m)
                break
        if any(m.field == "plan.table" for m in done):
            break  # the tables are gone: nothing left to mutate
    blob_bytes = write_blob(case.plan, case.data, version=case.header.get("version"),
                            reserved=case.header.get("reserved", 0))
    return program_with_blob(seed.program, index, blob_bytes, case.specs), done
