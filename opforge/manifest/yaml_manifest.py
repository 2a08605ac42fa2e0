"""Operator manifests in YAML: ExecuTorch's ``custom_ops.yaml`` / ``functions.yaml``, extended.

Every ExecuTorch entry form is valid input::

    - func: my_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
      kernels:
        - arg_meta: null
          kernel_name: custom::mul3_out_impl      # → custom::native::mul3_out_impl

    - op: add.out                                # an ATen op; schema from native_functions.yaml
      type_alias: {T0: [Double, Float]}
      dim_order_alias: {D0: [[0, 1, 2, 3]]}
      kernels:
        - arg_meta: {self: [T0, D0], other: [T0, D0], out: [T0, D0]}
          kernel_name: torch::executor::add_out_float

    - func: allclose.out(...)                    # the legacy form
      dispatch: {CPU: torch::executor::allclose_out}

A ``func:`` may be the functional or the out schema; the other is derived. opforge's own
keys extend an entry: ``python``, ``fake`` and ``samples`` ("module:function" references to a
reference implementation, a shape/dtype function and a function returning ``opforge check``'s
extra samples) and ``doc``. Keys torchgen/ExecuTorch use but
that do not change a kernel binding (``variants``, ``tags``, ...) are accepted and kept in
``OpDef.extra``; any other key is an error.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

from opforge.errors import ManifestError, SchemaError, shown
from opforge.manifest.model import (
    DTYPE_NAMES,
    KernelBinding,
    OpDef,
    TensorMeta,
    check_kernel_name,
)
from opforge.manifest.yaml_source import LineMap, load_yaml
from opforge.schema import FunctionSchema, SchemaKind, is_tensor_like_type

__all__ = ["load_manifest", "parse_manifest"]

_OPFORGE_KEYS = {"python", "fake", "doc", "samples", "quantization"}
_BINDING_KEYS = {"func", "op", "kernels", "type_alias", "dim_order_alias", "dispatch"}
# Keys of torchgen / ExecuTorch entries that do not affect kernel binding here.
_PASSIVE_KEYS = {"variants", "tags", "device_check", "device_guard", "cpp_no_default_args",
                 "manual_cpp_binding", "python_module", "category_override", "structured",
                 "structured_delegate", "structured_inherits", "precomputed", "autogen",
                 "manual_kernel_registration", "use_const_ref_for_mutable_tensors",
                 "has_composite_explicit_autograd_kernel"}
_ALL_KEYS = _OPFORGE_KEYS | _BINDING_KEYS | _PASSIVE_KEYS
_REF = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


class _Entry:
    """One manifest entry being validated; errors come out as ``file:line: ...``."""

    def __init__(self, raw: LineMap, filename: str) -> None:
        self.raw, self.filename = raw, filename

    def fail(self, key: str | None, message: str, fix: str) -> ManifestError:
        line = self.raw.line_of(key) if key else self.raw.line
        return ManifestError(f"`opforge manifest`: {self.filename}:{line}: {message} — {fix}")


def load_manifest(path: str | Path, *, api: str = "opforge manifest") -> list[OpDef]:
    """Load a manifest file into one :class:`OpDef` per operator.

    ``api`` is the command or function its errors name (``"opforge build"`` when a build
    reads the manifest).
    """
    path = Path(path)
    try:
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ManifestError(f"`opforge manifest`: {path}: no such file — check the path") \
                from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ManifestError(f"`opforge manifest`: {path}: cannot read it ({exc})") from None
        return parse_manifest(text, str(path))
    except ManifestError as exc:
        if api == "opforge manifest":
            raise
        # every message of the parser starts with its own prefix; the caller's replaces it
        message = str(exc).removeprefix("`opforge manifest`: ")
        raise ManifestError(f"`{api}`: {message}") from None


def parse_manifest(text: str, filename: str = "<manifest>") -> list[OpDef]:
    """Parse manifest YAML text (see the module docstring for the accepted forms)."""
    data = load_yaml(text, filename)
    if data is None:
        return []
    if not isinstance(data, list):
        raise ManifestError(f"`opforge manifest`: {filename}:1: the manifest is a YAML list of "
                            "entries (each starting with '- func:' or '- op:') — found a "
                            f"{type(data).__name__}")
    defs: list[OpDef] = []
    seen: dict[str, str] = {}
    for item in data:
        if not isinstance(item, LineMap):
            raise ManifestError(f"`opforge manifest`: {filename}: every entry is a mapping with "
                                f"'func:' or 'op:', found {shown(item)}")
        if "op_package" in item:  # an op package (docs/op-packages.md): checked, not an op
            from opforge.backends.oppackage.yaml_reader import check_entry
            check_entry(item, filename)
            continue
        opdef = _parse_entry(_Entry(item, filename))
        key = str(opdef.out.name)
        if key in seen:
            raise ManifestError(f"`opforge manifest`: {opdef.source}: operator "
                                f"{shown(opdef.out_key)} is defined twice (first at {seen[key]}) "
                                "— merge the kernels of both entries into one entry")
        seen[key] = opdef.source
        defs.append(opdef)
    return defs


def _cut(text: str, limit: int = 400) -> str:
    """A message from another stage (which may quote a user's schema), cut to ``limit``."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _parse_entry(e: _Entry) -> OpDef:
    raw = e.raw
    unknown = sorted(str(k) for k in raw if k not in _ALL_KEYS)
    if unknown:
        import difflib

        near = difflib.get_close_matches(unknown[0][:100], sorted(_ALL_KEYS), n=1)
        hint = f"did you mean '{near[0]}'?" if near else "remove it"
        raise e.fail(unknown[0], f"unknown key {shown(unknown[0])}",
                     f"{hint} (valid keys: {', '.join(sorted(_BINDING_KEYS | _OPFORGE_KEYS))})")
    if ("func" in raw) == ("op" in raw):
        raise e.fail(None, "an entry needs exactly one of 'func:' (a full schema) and 'op:' "
                     f"(an ATen op name), found {'both' if 'func' in raw else 'neither'}",
                     "keep 'func:' for a custom op, or 'op:' to bind kernels to an ATen op")
    is_aten = "op" in raw
    functional, out = _aten_op(e) if is_aten else _func(e)
    for key in ("doc",):
        if key in raw and not isinstance(raw[key], str):
            raise e.fail(key, f"'{key}' must be a string", "quote the text")
    refs = {}
    for key in ("python", "fake", "samples"):
        if key in raw:
            if not isinstance(raw[key], str) or not _REF.match(raw[key]):
                raise e.fail(key, f"'{key}: {shown(raw[key])}' is not a 'module:function' "
                             "reference",
                             "write e.g. 'my_pkg.ops:mul3_ref'")
            refs[key] = raw[key]
    kernels = _kernels(e, out)
    extra = tuple((k, raw[k]) for k in raw if k in _PASSIVE_KEYS)
    quantization = None
    if "quantization" in raw:
        from opforge.manifest.quantization import QuantContract

        try:
            quantization = QuantContract.parse(_plain(raw["quantization"]), functional,
                                               f"quantization ({e.filename}:{raw.line})")
        except ManifestError as exc:
            raise e.fail("quantization", "invalid quantization contract", str(exc)) from None
    return OpDef(functional, out, kernels, refs.get("python"), refs.get("fake"),
                 raw.get("doc", ""), f"{e.filename}:{raw.line}", is_aten, extra,
                 samples=refs.get("samples"), quantization=quantization)


def _plain(value: object) -> object:
    """YAML line-tracking containers → plain dicts, lists and scalars."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _func(e: _Entry) -> tuple[FunctionSchema, FunctionSchema]:
    text = e.raw["func"]
    if not isinstance(text, str):
        raise e.fail("func", f"'func:' must be a schema string, found {shown(text)}",
                     "write e.g. 'my_ops::mul3(Tensor input) -> Tensor'")
    try:
        schema = FunctionSchema.parse(text.strip(), api="opforge manifest")
    except SchemaError as exc:
        raise e.fail("func", "invalid schema", f"fix the schema:\n{exc}") from None
    if schema.name.namespace is None:
        from opforge.schema.native_functions import lookup_aten, native_functions_path

        if native_functions_path() is not None and lookup_aten(str(schema.name)) is not None:
            return _aten_pair(e, "func", FunctionSchema.parse(f"aten::{schema}"))
        else:
            raise e.fail("func", f"{shown(str(schema.name))} has no namespace, and custom "
                         "operators need one",
                         f"write it as {shown(f'my_ops::{schema}')} (or use 'op:' for an ATen op)")
    if schema.is_mutating():
        out_name = shown(str(schema.name))
        raise e.fail("func", f"{out_name} mutates its input; only functional and out-variant "
                     "schemas can be defined", "define the functional op (or its .out variant)")
    try:
        if schema.kind() is SchemaKind.out:
            return schema.functional_variant(), schema
        return schema, schema.out_variant()
    except SchemaError as exc:
        raise e.fail("func", "the out variant cannot be derived", _cut(str(exc))) from None


def _aten_op(e: _Entry) -> tuple[FunctionSchema, FunctionSchema]:
    from opforge.schema.native_functions import lookup_aten, near_aten_names

    name = e.raw["op"]
    if not isinstance(name, str) or not name.strip():
        raise e.fail("op", f"'op:' must be an ATen op name, found {shown(name)}",
                     "write e.g. 'add.out'")
    name = name.strip()
    try:
        schema = lookup_aten(name)
    except SchemaError as exc:
        raise e.fail("op", f"cannot look up ATen op {shown(name)}", _cut(str(exc))) from None
    if schema is None:
        near = near_aten_names(name)
        hint = f"did you mean {', '.join(repr(n) for n in near)}?" if near else \
            "check the name in PyTorch's native_functions.yaml"
        raise e.fail("op", f"{shown(name)} is not an ATen operator", hint)
    return _aten_pair(e, "op", FunctionSchema.parse(f"aten::{schema}"))


def _aten_pair(e: _Entry, key: str, schema: FunctionSchema) -> tuple[FunctionSchema, FunctionSchema]:
    """An ATen op's functional and out schemas, as PyTorch names them."""
    from opforge.schema.native_functions import aten_schemas

    name = str(schema.name)
    if schema.kind() is SchemaKind.out:
        want = schema.signature()
        for candidate in aten_schemas().values():
            if candidate.is_functional() and candidate.signature() == want:
                return FunctionSchema.parse(f"aten::{candidate}"), schema
        return schema.functional_variant(), schema
    if schema.is_functional():
        try:
            out = schema.out_variant()
        except SchemaError as exc:
            raise e.fail(key, f"ATen op '{name}' has no out variant", _cut(str(exc))) from None
        for candidate in aten_schemas().values():
            if candidate.is_out_variant() and candidate.signature() == schema.signature():
                out = FunctionSchema.parse(f"aten::{candidate}")
        return schema, out
    raise e.fail(key, f"ATen op '{name}' mutates its input", "bind kernels to its out variant")


def _kernels(e: _Entry, out: FunctionSchema) -> tuple[KernelBinding, ...]:
    raw = e.raw
    bindings: list[KernelBinding] = []
    if "dispatch" in raw:
        dispatch = raw["dispatch"]
        if not isinstance(dispatch, dict):
            raise e.fail("dispatch", "'dispatch:' must map a backend to a kernel name",
                         "write e.g. 'dispatch: {CPU: custom::mul3_out_impl}'")
        for backend, name in dispatch.items():
            if backend not in ("CPU", "CompositeExplicitAutograd", "CompositeImplicitAutograd"):
                continue  # kernels for other devices are not this runtime's business
            bindings.append(_binding(e, "dispatch", name, None))
    if "kernels" in raw:
        kernels = raw["kernels"]
        if not isinstance(kernels, list) or not kernels:
            raise e.fail("kernels", "'kernels:' must be a non-empty list of "
                         "{arg_meta, kernel_name} entries", "add '- arg_meta: null' and "
                         "'kernel_name: ns::fn' under it")
        types = _aliases(e, "type_alias", _dtype_list)
        orders = _aliases(e, "dim_order_alias", _order_list)
        for k in kernels:
            if not isinstance(k, dict) or set(k) - {"arg_meta", "kernel_name"} or "kernel_name" not in k:
                raise e.fail("kernels",
                             f"each kernel is {{arg_meta, kernel_name}}, found {shown(k)}",
                             "write '- arg_meta: null' and 'kernel_name: ns::fn'")
            meta = k.get("arg_meta")
            if meta is None:
                bindings.append(_binding(e, "kernels", k["kernel_name"], None))
            else:
                for concrete in _expand_arg_meta(e, meta, out, types, orders):
                    bindings.append(_binding(e, "kernels", k["kernel_name"], concrete))
    keys = [b.dtype_key for b in bindings]
    dup = next((k for k in keys if keys.count(k) > 1), None)
    if dup is not None:
        raise e.fail("kernels", f"two kernels are bound for the same dtypes ({_cut(dup)})",
                     "keep one kernel per arg_meta")
    return tuple(bindings)


def _binding(e: _Entry, key: str, name: object, meta) -> KernelBinding:
    problem = check_kernel_name(name)
    if problem:
        raise e.fail(key, f"kernel_name {shown(name)} is not a valid C++ qualified name: "
                     f"{_cut(problem)}",
                     "write e.g. 'custom::mul3_out_impl' (the 'native' sub-namespace is added)")
    return KernelBinding(name, meta)


def _aliases(e: _Entry, key: str, convert) -> dict[str, list]:
    raw = e.raw.get(key)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise e.fail(key, f"'{key}:' must map alias names to lists", "see ExecuTorch's format")
    return {name: convert(e, key, values) for name, values in raw.items()}


def _dtype_list(e: _Entry, key: str, values) -> list[str]:
    if not isinstance(values, list) or not all(isinstance(v, str) and v in DTYPE_NAMES
                                               for v in values):
        raise e.fail(key, f"a type alias is a list of dtype names, found {shown(values)}",
                     f"use names from: {', '.join(DTYPE_NAMES)}")
    return values


def _order_list(e: _Entry, key: str, values) -> list[tuple[int, ...]]:
    ok = isinstance(values, list) and all(
        isinstance(v, list) and all(type(i) is int for i in v) and sorted(v) == list(range(len(v)))
        for v in values)
    if not ok:
        raise e.fail(key, f"a dim order alias is a list of permutations, found {shown(values)}",
                     "write e.g. [[0, 1, 2, 3], [0, 2, 3, 1]]")
    return [tuple(v) for v in values]


def _expand_arg_meta(e: _Entry, meta, out: FunctionSchema, types, orders):
    """Expand aliases: one concrete arg_meta per combination of alias values."""
    if not isinstance(meta, dict):
        raise e.fail("kernels", f"arg_meta is null or a mapping of argument to [type, dim order], "
                     f"found {shown(meta)}",
                     "write e.g. 'arg_meta: {self: [T0, D0], out: [T0, D0]}'")
    tensor_args = {a.name for a in out.arguments.flat if is_tensor_like_type(a.type)}
    used_t, used_d = [], []
    for arg, spec in meta.items():
        if arg not in tensor_args:
            raise e.fail("kernels", f"arg_meta names {shown(arg)}, which is not a tensor "
                         f"argument of {shown(str(out.name))}",
                         f"use one of: {', '.join(sorted(tensor_args))}")
        if not (isinstance(spec, list) and len(spec) in (1, 2)):
            raise e.fail("kernels", f"arg_meta for '{arg}' is [type alias, dim order alias], "
                         f"found {shown(spec)}", "write e.g. [T0, D0]")
        t = spec[0]
        if not isinstance(t, str) or (t not in types and t not in DTYPE_NAMES):
            raise e.fail("kernels", f"{shown(t)} is neither a type alias nor a dtype name",
                         "declare it under type_alias")
        if t in types and t not in used_t:
            used_t.append(t)
        if len(spec) == 2:
            if not isinstance(spec[1], str) or spec[1] not in orders:
                raise e.fail("kernels", f"{shown(spec[1])} is not a dim order alias",
                             "declare it under dim_order_alias")
            if spec[1] not in used_d:
                used_d.append(spec[1])
    for tv in itertools.product(*(types[t] for t in used_t)):
        for dv in itertools.product(*(orders[d] for d in used_d)):
            tmap, dmap = dict(zip(used_t, tv)), dict(zip(used_d, dv))
            yield tuple(
                (arg, TensorMeta(tmap.get(spec[0], spec[0]),
                                 dmap[spec[1]] if len(spec) == 2 else None))
                for arg, spec in meta.items()
            )
