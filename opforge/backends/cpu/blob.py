"""The cpu backend's blob: a header, a JSON plan, then the constants' bytes.

    offset 0   8 bytes  magic b"OFCPUBLB"
    offset 8   u32      format version (1)
    offset 12  u32      plan bytes (JSON, UTF-8)
    offset 16  u64      data bytes
    offset 24  u32      CRC-32 of plan + data
    offset 28  u32      0 (reserved)
    offset 32  plan     {"tensors": [...], "ops": [...], "inputs": [...], "outputs": [...],
                         "impls": [...], ["state": [...]], ["debug": [...]], ["symbols": [...]]}
    then zero padding to a multiple of 64, then the data: each constant's bytes at a
    64-byte-aligned offset a tensor names as "data": [offset, nbytes].

Version 2 adds named constants: a constant of at least ``NAMED_MIN_BYTES`` exported with a
named data store (``opforge/backends/named_data.py``) is stored once in the program, not in
the blob, and its tensor says ``"named": [key, nbytes]`` instead of ``"data"``. A blob is
written as version 1 unless it names a constant.

Program state: an input of role ``state`` is a state tensor (a KV cache) the delegate may
write in place; every other input is read-only. ``state`` lists ``[input position, call
output position]`` for each state input the delegate writes: the program passes the state
itself as that output of its DelegateCall (the new value is the state), so the engine has
no output of its own for it. The call's other outputs are ``outputs``, in order.

The blob is untrusted at init: ``parse`` checks the header, the CRC, every field's type,
every count, id, dtype, rank and byte range before anything is built; the engine checks
ids, strides and reaches again in C++.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import Any

from opforge.errors import BackendError

MAGIC = b"OFCPUBLB"
VERSION = 2
VERSIONS = (1, 2)
# constants smaller than this stay in the blob: a named one costs a key and a segment
NAMED_MIN_BYTES = 4096
HEADER = struct.Struct("<8sIIQII")
MAX_PLAN = 64 << 20
MAX_TENSORS = 1 << 20
MAX_RANK = 8
# (5 float16, 15 bfloat16: a KV cache's storage, read only by its write and attention)
DTYPES = {0, 1, 2, 3, 4, 5, 6, 7, 11, 15}
ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2}
DTYPE_NAMES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16",
               6: "float32", 7: "float64", 11: "bool", 15: "bfloat16"}
ROLES = ("input", "output", "const", "temp", "alias", "dead", "state")
OP_KINDS = ("conv", "deconv", "matmul", "pool", "eltwise", "binary", "softmax", "layer_norm",
            "reduction", "copy", "ew", "reduce", "embedding", "group_norm", "kernel", "package",
            "qconv", "qmatmul", "quant", "index", "index_put", "index_copy", "rms_norm", "rope",
            "int_matmul", "int_embedding", "attention", "int_dot_matmul")


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def encode(plan, named_data=None) -> bytes:
    """A lowering ``Plan`` → blob bytes; constants of ``NAMED_MIN_BYTES`` or more go to
    ``named_data`` (a ``NamedDataStore``) when one is given."""
    data = bytearray()
    tensors = []
    for t in plan.tensors:
        offset, key = None, None
        if t.data is not None and named_data is not None and len(t.data) >= NAMED_MIN_BYTES:
            key = named_data.add(t.data, _layout(t))
        elif t.data is not None:
            data += bytes(_align(len(data)) - len(data))
            offset = len(data)
            data += t.data
        tensors.append(t.as_json(offset, key))
    from opforge.backends.cpu.lowering.symbolic import expr_text

    ops = [{k: [expr_text(x) for x in v] if k == "ia" else v for k, v in op.items()
            if not k.startswith("_")} for op in plan.ops]
    doc = {"tensors": tensors, "ops": ops, "inputs": plan.inputs, "outputs": plan.outputs,
           "impls": plan.impls}
    if plan.state:
        doc["state"] = plan.state
    if plan.debug:
        doc["debug"] = plan.debug
    if plan.symbols:
        doc["symbols"] = plan.symbols
    text = json.dumps(doc, separators=(",", ":"), allow_nan=True).encode()
    head_len = HEADER.size + len(text)
    pad = bytes(_align(head_len) - head_len)
    crc = zlib.crc32(text + bytes(data))
    version = version_for(tensors)
    return HEADER.pack(MAGIC, version, len(text), len(data), crc, 0) + text + pad + bytes(data)


def _layout(t) -> str:
    """A lowering tensor's layout as ``named_layout`` writes it."""
    j = t.as_json(None)
    return named_layout(j["dtype"], j["dims"])


def named_layout(dtype: int, dims: list) -> str:
    """How a named constant's bytes are read (``named_data.layout``): its dtype and dims,
    which every reader of its key must share."""
    from opforge.backends.named_data import layout

    return layout(DTYPE_NAMES.get(dtype, f"dtype{dtype}"), dims)


def version_for(tensors: list) -> int:
    """The blob version a plan's tensor table needs: 2 when it names a constant, else 1."""
    return 2 if any(type(t) is dict and "named" in t for t in tensors) else 1


def _refuse(what: str) -> BackendError:
    return BackendError(f"cpu backend blob: {what} — valid: a blob written by this opforge's "
                        "cpu backend — fix: re-export the program; this one was altered, "
                        "corrupted, or written by an incompatible version")


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if type(v) is not int or not lo <= v <= hi:
        raise _refuse(f"{what} is {str(v)[:40]!r}, not an int in [{lo}, {hi}]")
    return v


def _ints(v: Any, n_max: int, lo: int, hi: int, what: str) -> list[int]:
    if type(v) is not list or len(v) > n_max:
        raise _refuse(f"{what} is not a list of at most {n_max} ints")
    return [_int(x, lo, hi, f"{what} item") for x in v]


def _row_major(dims: list[int]) -> list[int]:
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= max(d, 1)
    return list(reversed(strides))


def parse(blob: memoryview) -> tuple[dict, memoryview]:
    """Check ``blob`` and return (plan, data); ``BackendError`` for anything malformed."""
    blob = memoryview(blob).cast("B")
    if blob.nbytes < HEADER.size:
        raise _refuse(f"{blob.nbytes} bytes, shorter than its {HEADER.size}-byte header")
    magic, version, plan_len, data_len, crc, _ = HEADER.unpack_from(blob, 0)
    if magic != MAGIC:
        raise _refuse(f"magic {bytes(magic)!r}")
    if version not in VERSIONS:
        raise _refuse(f"format version {version}; this opforge reads versions {VERSIONS}")
    if plan_len > MAX_PLAN:
        raise _refuse(f"plan of {plan_len} bytes")
    data_start = _align(HEADER.size + plan_len)
    if data_start + data_len != blob.nbytes:
        raise _refuse(f"sizes (plan {plan_len}, data {data_len}) that do not add up to the "
                      f"blob's {blob.nbytes} bytes")
    text = blob[HEADER.size:HEADER.size + plan_len]
    data = blob[data_start:]
    if zlib.crc32(data, zlib.crc32(text)) != crc:
        raise _refuse("a CRC-32 that does not match its contents")
    try:
        doc = json.loads(bytes(text).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise _refuse(f"a plan that is not JSON ({type(e).__name__})") from None
    if type(doc) is not dict:
        raise _refuse("a plan that is not an object")
    if version < version_for(doc.get("tensors") if type(doc.get("tensors")) is list else []):
        raise _refuse(f"a version-{version} blob that names constants (version 2 or later)")
    if "symbols" in doc:  # a dynamic method's delegate: checked per shape (cpu/dynamic.py)
        from opforge.backends.cpu.dynamic import check_symbolic

        check_symbolic(doc, data)  # (parsed again by the DynamicHandle that runs it)
        return doc, data
    check_plan(doc, data)
    return doc, data


def check_plan(doc: dict, data: memoryview) -> None:
    """Every field of a plan with plain-number sizes (a static blob's, or a dynamic one's
    made concrete for one shape); ``BackendError`` for anything malformed."""
    tensors = doc.get("tensors")
    if type(tensors) is not list or len(tensors) > MAX_TENSORS:
        raise _refuse("no tensor table")
    n = len(tensors)
    for i, t in enumerate(tensors):
        if type(t) is not dict:
            raise _refuse(f"tensors[{i}] is not an object")
        _int(t.get("dtype"), 0, 15, f"tensors[{i}].dtype")
        if t["dtype"] not in DTYPES:
            raise _refuse(f"tensors[{i}].dtype {t['dtype']}")
        dims = _ints(t.get("dims"), MAX_RANK, 0, 1 << 40, f"tensors[{i}].dims")
        strides = _ints(t.get("strides"), MAX_RANK, 0, 1 << 40, f"tensors[{i}].strides")
        if len(dims) != len(strides):
            raise _refuse(f"tensors[{i}]: {len(dims)} dims but {len(strides)} strides")
        if t.get("role") not in ROLES:
            raise _refuse(f"tensors[{i}].role {str(t.get('role'))[:20]!r}")
        if t["role"] == "alias":
            base = _int(t.get("base"), 0, n - 1, f"tensors[{i}].base")
            if base >= i:
                raise _refuse(f"tensors[{i}] aliases a later tensor")
            _int(t.get("offset"), 0, 1 << 40, f"tensors[{i}].offset")
        if "named" in t:
            _check_named(t, i)
        elif "data" in t:
            span = _ints(t["data"], 2, 0, data.nbytes, f"tensors[{i}].data")
            if len(span) != 2:
                raise _refuse(f"tensors[{i}].data has {len(span)} items, not [offset, nbytes]")
            offset, nbytes = span
            if t["role"] != "const" or offset + nbytes > data.nbytes or offset % 64:
                raise _refuse(f"tensors[{i}].data [{offset}, {offset + nbytes}) outside the "
                              f"{data.nbytes} data bytes, unaligned, or not a constant")
        elif t["role"] == "const":
            raise _refuse(f"tensors[{i}] is a constant without data")
    ops = doc.get("ops")
    if type(ops) is not list or len(ops) > MAX_TENSORS:
        raise _refuse("no op list")
    for i, op in enumerate(ops):
        if type(op) is not dict or op.get("kind") not in OP_KINDS:
            raise _refuse(f"ops[{i}] is not an op of a known kind")
        _ints(op.get("in"), 64, 0, n - 1, f"ops[{i}].in")
        _ints(op.get("out"), 64, 0, n - 1, f"ops[{i}].out")
        _ints(op.get("ia"), 4096, -(1 << 62), 1 << 62, f"ops[{i}].ia")
        fa = op.get("fa")
        if type(fa) is not list or len(fa) > 64 or not all(type(x) in (int, float) for x in fa):
            raise _refuse(f"ops[{i}].fa")
        post = op.get("post")
        if type(post) is not list or len(post) > 32:
            raise _refuse(f"ops[{i}].post")
        for p in post:
            if type(p) is not list or len(p) != 5 or p[0] not in (0, 1) or type(p[1]) is not int \
                    or type(p[2]) not in (int, float) or type(p[3]) not in (int, float):
                raise _refuse(f"ops[{i}].post item")
            if p[0] == 1:
                _int(p[4], 0, n - 1, f"ops[{i}].post tensor")
        if type(op.setdefault("name", "")) is not str:
            raise _refuse(f"ops[{i}].name")
        if op["kind"] == "kernel" and (type(op.get("args")) is not list or len(op["args"]) > 256):
            raise _refuse(f"ops[{i}].args")
        if op["kind"] == "package" and type(op.get("node")) is not str:
            raise _refuse(f"ops[{i}].node")
    _ints(doc.get("inputs"), 1 << 16, 0, n - 1, "inputs")
    _ints(doc.get("outputs"), 1 << 16, 0, n - 1, "outputs")
    for role, ids in (("input", doc["inputs"]), ("output", doc["outputs"])):
        for tid in ids:
            if tensors[tid]["role"] != role and (role, tensors[tid]["role"]) != ("input", "state"):
                raise _refuse(f"{role}s list tensor {tid}, which is a {tensors[tid]['role']}")
            if tensors[tid]["strides"] != _row_major(tensors[tid]["dims"]):
                raise _refuse(f"{role} tensor {tid} is not row-major contiguous (the runtime "
                              "passes C-contiguous arrays)")
    if len(set(doc["inputs"]) | set(doc["outputs"])) != len(doc["inputs"]) + len(doc["outputs"]):
        raise _refuse("a tensor listed twice among the inputs and outputs")
    io = set(doc["inputs"]) | set(doc["outputs"])
    for i, t in enumerate(tensors):
        if t["role"] in ("input", "output", "state") and i not in io:
            raise _refuse(f"tensors[{i}] is an {t['role']} the delegate does not list")
    if type(doc.get("impls", [])) is not list:
        raise _refuse("impls")
    _check_state(doc)
    _check_debug(doc)


def _check_named(t: dict, i: int) -> None:
    """``"named": [key, nbytes]``: a constant stored in the program by key (resolved and
    its size checked against the program's bytes at init)."""
    named = t["named"]
    if type(named) is not list or len(named) != 2 or type(named[0]) is not str \
            or not 0 < len(named[0]) <= 256:
        raise _refuse(f"tensors[{i}].named is not [key, nbytes]")
    _int(named[1], 0, 1 << 48, f"tensors[{i}].named nbytes")
    if t["role"] != "const" or "data" in t:
        raise _refuse(f"tensors[{i}] is named but is not a constant, or also has data")


def _check_state(doc: dict) -> None:
    """``state``: ``[input position, call output position]`` per state input written in
    place; each input a ``state`` tensor and each ``state`` tensor listed, each position
    used once, the call's outputs the engine's plus these."""
    state = doc.get("state", [])
    if type(state) is not list or len(state) > len(doc["inputs"]):
        raise _refuse("a state list longer than the inputs")
    calls = len(doc["outputs"]) + len(state)
    for k, entry in enumerate(state):
        if type(entry) is not list or len(entry) != 2:
            raise _refuse(f"state[{k}] is not [input position, output position]")
        position = _int(entry[0], 0, len(doc["inputs"]) - 1, f"state[{k}] input")
        _int(entry[1], 0, calls - 1, f"state[{k}] output")
        if doc["tensors"][doc["inputs"][position]]["role"] != "state":
            raise _refuse(f"state[{k}] names input {position}, which is not a state tensor")
    for column in (0, 1):
        if len({entry[column] for entry in state}) != len(state):
            raise _refuse("a state input or output position listed twice")
    named = {doc["inputs"][entry[0]] for entry in state}
    for tid in doc["inputs"]:
        if doc["tensors"][tid]["role"] == "state" and tid not in named:
            raise _refuse(f"tensors[{tid}] is a state input the state list does not name (a "
                          "state tensor is written in place and passed back as an output)")


def _check_debug(doc: dict) -> None:
    """A debug build's ``debug`` list: ``[output position, node name, result index]`` for
    each trailing output that is a copy of a node result, positions ascending to the end."""
    debug = doc.get("debug", [])
    outputs = len(doc["outputs"])
    if type(debug) is not list or len(debug) > outputs:
        raise _refuse("a debug list longer than the outputs")
    first = outputs - len(debug)
    for k, entry in enumerate(debug):
        if type(entry) is not list or len(entry) != 3 or type(entry[1]) is not str \
                or len(entry[1]) > 4096:
            raise _refuse(f"debug[{k}] is not [output, node name, result index]")
        _int(entry[0], first + k, first + k, f"debug[{k}] output")
        _int(entry[2], 0, 1 << 16, f"debug[{k}] result index")
