"""PyTorch's own operator list (``native_functions.yaml``), read without importing torch.

The file ships inside the torch wheel under ``torchgen/packaged/ATen/native/``. It is the
source of truth for ATen schemas: the manifest's ``op: add.out`` entries are looked up
here, and error messages use it to name the real out variant of an ATen op. Finding
``torchgen`` only locates the package; neither torch nor torchgen is imported.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import replace
from pathlib import Path

from opforge.errors import SchemaError
from opforge.schema.model import Arguments, FunctionSchema, SchemaKind

__all__ = ["native_functions_path", "aten_schemas", "lookup_aten", "find_out_variant"]


def native_functions_path() -> Path | None:
    """Path of ``native_functions.yaml`` in the installed torch wheel, or None."""
    spec = importlib.util.find_spec("torchgen")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        p = Path(root) / "packaged" / "ATen" / "native" / "native_functions.yaml"
        if p.is_file():
            return p
    return None


def load_native_function_entries(path: Path) -> list[dict]:
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        entries = yaml.load(f, Loader=loader)
    return [e for e in entries if isinstance(e, dict) and "func" in e]


@functools.lru_cache(maxsize=1)
def aten_schemas() -> dict[str, FunctionSchema]:
    """``"add.out"`` → its parsed schema, for every ATen function (cached; ~1 s first call)."""
    path = native_functions_path()
    if path is None:
        raise SchemaError(
            "`opforge`: ATen operator lookup — PyTorch's native_functions.yaml was not found "
            "(it ships in the torch wheel under torchgen/packaged/ATen/native/) — "
            "install torch==2.13.0, or write the full schema with `func:` instead of `op:`"
        )
    table: dict[str, FunctionSchema] = {}
    for entry in load_native_function_entries(path):
        schema = FunctionSchema.parse(entry["func"])
        table[str(schema.name)] = schema
        # `autogen: native_layer_norm.out` asks torchgen to derive the out variant; derive it
        # the same way (out0, out1, ... with alias sets a, b, ...) so lookups find it.
        functional = _functional_form(schema)
        if entry.get("autogen") and functional is not None:
            for name in str(entry["autogen"]).split(","):
                base, _, overload = name.strip().partition(".")
                if base != functional.name.name or not overload.endswith("out"):
                    continue
                try:
                    derived = functional.out_variant()
                except SchemaError:
                    continue
                # torchgen drops TensorOptions from out variants: the out tensor carries them.
                kw = tuple(a for a in derived.arguments.kwarg_only
                           if a.is_write or a.name not in ("dtype", "layout", "device", "pin_memory"))
                derived = replace(
                    derived,
                    name=replace(derived.name, overload=overload),
                    arguments=Arguments(derived.arguments.positional, kw),
                )
                table.setdefault(str(derived.name), derived)
    return table


def _functional_form(schema: FunctionSchema) -> FunctionSchema | None:
    """The functional op an autogen'd out variant derives from (in-place ops: drop the `_`)."""
    kind = schema.kind()
    if kind is SchemaKind.functional:
        return schema
    if kind is not SchemaKind.inplace or schema.name.name.startswith("__"):
        return None
    args = Arguments(
        tuple(replace(a, annotation=None) for a in schema.arguments.positional),
        tuple(replace(a, annotation=None) for a in schema.arguments.kwarg_only),
    )
    returns = tuple(replace(r, annotation=None) for r in schema.returns)
    name = replace(schema.name, name=schema.name.name[:-1])
    return FunctionSchema(name, args, returns)


def lookup_aten(name: str) -> FunctionSchema | None:
    """The ATen schema called ``name`` (``add.out``, ``aten::add.out``), or None."""
    name = name.removeprefix("aten::")
    if name.endswith(".default"):
        name = name[: -len(".default")]
    return aten_schemas().get(name)


def near_aten_names(name: str, limit: int = 3) -> list[str]:
    import difflib

    return difflib.get_close_matches(name.removeprefix("aten::"), list(aten_schemas()), n=limit)


def find_out_variant(namespace: str, base: str, schema: FunctionSchema) -> str | None:
    """The name of ATen's out overload of ``base`` whose arguments match ``schema``'s."""
    if namespace != "aten" or native_functions_path() is None:
        return None
    want = schema.signature()[2]
    for key, candidate in aten_schemas().items():
        if candidate.name.name != base or candidate.kind() is not SchemaKind.out:
            continue
        if candidate.signature()[2] == want:
            return f"aten::{key}"
    return None
