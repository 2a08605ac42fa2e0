"""``PackageNode``: one model node mapped to a package op, and its bytes in a backend blob.

What export decides (``planner.plan_package_nodes``) and what run time needs
(``runtime.prepare``) to call the op: the package's identity (name, interface provider,
target, platform, the library path registered at export), the op type, the torch op it
stands for, the parameters (named, typed, scalar or 1-D list), which OpDef input each
run-time input fills, and the dtype and shape of every input and output (static: the
backend preallocates them).

Bytes (all integers little-endian)::

    offset 0   8 bytes  magic b"OFPKGND\\0"
    offset 8   u32      format version (1)
    offset 12  u32      n: length of the body
    offset 16  n bytes  body: UTF-8 JSON object (keys below), nothing after it

The bytes live inside a program file, so ``from_bytes`` treats them as hostile: bounded
sizes, every key and type checked, a ``BackendError`` naming what is wrong, never a crash.

>>> node = PackageNode("P", "Mul3", "my_ops.mul3.default", "PInterfaceProvider", "cpu",
...     "x86_64", "libQnnP.so", (PackageParam("scale", "float", (3.0,)),), (0,),
...     (TensorSpec("float32", (2, 3)),), (TensorSpec("float32", (2, 3)),))
>>> PackageNode.from_bytes(node.to_bytes()) == node
True
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

from opforge.errors import BackendError, shown
from opforge.program.scalar_type import ScalarType

__all__ = ["PackageNode", "PackageParam", "TensorSpec", "MAGIC", "FORMAT_VERSION"]

MAGIC = b"OFPKGND\0"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sII")
MAX_BODY = 1 << 20
MAX_NDIM = 16
MAX_VALUES = 1 << 16
MAX_TENSORS = 1024
PARAM_KINDS = ("int", "float", "bool")
_DTYPES = {t.name.lower(): t for t in ScalarType}


@dataclass(frozen=True)
class PackageParam:
    """A parameter: ``kind`` int/float/bool; ``values`` one value (``is_list`` False) or a
    1-D list."""

    name: str
    kind: str
    values: tuple
    is_list: bool = False

    def __post_init__(self) -> None:
        if self.kind not in PARAM_KINDS:
            raise ValueError(f"PackageParam.kind {self.kind!r} not in {PARAM_KINDS}")
        if not self.is_list and len(self.values) != 1:
            raise ValueError(f"PackageParam {self.name!r}: a scalar has one value")


@dataclass(frozen=True)
class TensorSpec:
    dtype: str            # "float32" (ScalarType name, lower case)
    shape: tuple[int, ...]

    @property
    def code(self) -> int:
        return int(_DTYPES[self.dtype])


@dataclass(frozen=True)
class PackageNode:
    package: str
    op_type: str
    custom_op: str
    interface_provider: str
    target: str
    platform: str
    package_path: str
    params: tuple[PackageParam, ...]
    input_slots: tuple[int, ...]
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]

    def describe(self) -> str:
        """What ``inspect`` shows for the node: ``package ExampleOpPackage::ExampleCustomOp``."""
        return f"package {self.package}::{self.op_type}"

    # --- bytes ---------------------------------------------------------------------------
    def to_bytes(self) -> bytes:
        body = json.dumps({
            "package": self.package, "op_type": self.op_type, "custom_op": self.custom_op,
            "interface_provider": self.interface_provider, "target": self.target,
            "platform": self.platform, "package_path": self.package_path,
            "params": [{"name": p.name, "kind": p.kind, "list": p.is_list,
                        "values": list(p.values)} for p in self.params],
            "input_slots": list(self.input_slots),
            "inputs": [{"dtype": t.dtype, "shape": list(t.shape)} for t in self.inputs],
            "outputs": [{"dtype": t.dtype, "shape": list(t.shape)} for t in self.outputs],
        }, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
        return _HEADER.pack(MAGIC, FORMAT_VERSION, len(body)) + body

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview) -> "PackageNode":
        data = bytes(data)
        if len(data) < _HEADER.size:
            raise _bad(f"{len(data)} bytes, shorter than the {_HEADER.size}-byte header")
        magic, version, size = _HEADER.unpack_from(data)
        if magic != MAGIC:
            raise _bad(f"magic {shown(magic)}, not {MAGIC!r}")
        if version != FORMAT_VERSION:
            raise _bad(f"format version {version}; this opforge reads {FORMAT_VERSION}")
        if size > MAX_BODY or _HEADER.size + size != len(data):
            raise _bad(f"body length {size} for {len(data) - _HEADER.size} bytes after the header")
        try:
            body = json.loads(data[_HEADER.size:].decode("utf-8"),
                              parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            raise _bad(f"the body is not JSON ({type(e).__name__})") from None
        return _node(body)


def _bad(what: str) -> BackendError:
    return BackendError(f"op-package node: {what} — valid: what `opforge export` writes — fix: "
                        "re-export the program; this one was altered or corrupted")


def _get(obj: dict, key: str, kind: type | tuple) -> object:
    if not isinstance(obj, dict) or key not in obj:
        raise _bad(f"no {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise _bad(f"{key!r} = {shown(value)} is not a {getattr(kind, '__name__', kind)}")
    return value


def _text(obj: dict, key: str) -> str:
    value = _get(obj, key, str)
    if not value or len(value) > 4096 or "\0" in value:
        raise _bad(f"{key!r} = {shown(value)}")
    return value


def _tensors(obj: dict, key: str) -> tuple[TensorSpec, ...]:
    items = _get(obj, key, list)
    if len(items) > MAX_TENSORS:
        raise _bad(f"{len(items)} {key}")
    out = []
    for item in items:
        dtype = _get(item, "dtype", str)
        if dtype not in _DTYPES:
            raise _bad(f"dtype {shown(dtype)}")
        shape = _get(item, "shape", list)
        if len(shape) > MAX_NDIM or any(type(d) is not int or not 0 <= d < (1 << 40) for d in shape):
            raise _bad(f"shape {shown(shape)}")
        out.append(TensorSpec(dtype, tuple(shape)))
    return tuple(out)


def _node(body: object) -> PackageNode:
    if not isinstance(body, dict):
        raise _bad("the body is not a JSON object")
    params = []
    raw_params = _get(body, "params", list)
    if len(raw_params) > MAX_TENSORS:
        raise _bad(f"{len(raw_params)} params")
    for p in raw_params:
        kind = _get(p, "kind", str)
        if kind not in PARAM_KINDS:
            raise _bad(f"param kind {shown(kind)}")
        values = _get(p, "values", list)
        is_list = _get(p, "list", bool)
        if len(values) > MAX_VALUES or (not is_list and len(values) != 1):
            raise _bad(f"param {shown(p.get('name'))}: {len(values)} values")
        for v in values:
            ok = (type(v) is bool if kind == "bool" else
                  type(v) is int and -(1 << 63) <= v < (1 << 63) if kind == "int" else
                  type(v) in (int, float) and math.isfinite(v))
            if not ok:
                raise _bad(f"param {shown(p.get('name'))}: value {shown(v)} is not a {kind}")
        params.append(PackageParam(_text(p, "name"), kind, tuple(values), is_list))
    slots = _get(body, "input_slots", list)
    inputs = _tensors(body, "inputs")
    if len(slots) != len(inputs) or any(type(s) is not int or not 0 <= s < MAX_TENSORS for s in slots):
        raise _bad(f"input_slots {shown(slots)} for {len(inputs)} inputs")
    return PackageNode(_text(body, "package"), _text(body, "op_type"), _text(body, "custom_op"),
                       _text(body, "interface_provider"), _text(body, "target"),
                       _text(body, "platform"), _text(body, "package_path"), tuple(params),
                       tuple(slots), inputs, _tensors(body, "outputs"))
