"""``OpPackageInfo``: one registration of a package op with a backend (ExecuTorch's
``QnnExecuTorchOpPackageInfo``), and reading lists of them from a compile spec or a file.

The cpu backend's ``op_packages`` compile spec is a JSON list of dicts with these keys::

    [{"op_package_name": "ExampleOpPackage",
      "op_package_path": "libQnnExampleOpPackage.so",
      "interface_provider": "ExampleOpPackageInterfaceProvider",   # optional (this default)
      "target": "cpu",                                             # optional (cpu)
      "custom_op_name": "my_ops.mul3.default",
      "op_type_name": "ExampleCustomOp",                           # or "qnn_op_type_name"
      "platform": "x86_64"}]                                       # optional (this machine)

The same list (or ``{"op_packages": [...]}``) may be written in a JSON or YAML file for the
command line (``load_op_package_infos``). A relative ``op_package_path`` in a file is
relative to that file.

>>> infos = parse_op_package_infos([{"op_package_name": "P", "op_package_path": "libQnnP.so",
...     "custom_op_name": "my_ops::mul3", "op_type_name": "Mul3", "platform": "X86_64"}])
>>> infos[0].custom_op_name, infos[0].interface_provider, infos[0].platform
('my_ops.mul3.default', 'PInterfaceProvider', 'x86_64')
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable

from opforge.errors import BackendError, shown

__all__ = ["OpPackageInfo", "parse_op_package_infos", "load_op_package_infos",
           "normalize_op_name", "check_registrations", "claimed_op_keys"]

_FIELDS = ("op_package_name", "op_package_path", "interface_provider", "target",
           "custom_op_name", "op_type_name", "platform")
_ALIASES = {"qnn_op_type_name": "op_type_name"}
_OP = re.compile(r"(?P<ns>[A-Za-z_]\w*)(?:::|\.)(?P<op>[A-Za-z_]\w*)(?:\.(?P<ov>[A-Za-z_]\w*))?\Z")


def normalize_op_name(name: str) -> str | None:
    """``my_ops::mul3`` / ``my_ops.mul3`` / ``aten::add.Tensor`` → ``my_ops.mul3.default`` /
    ``aten.add.Tensor`` (torch's ``OpOverload`` spelling); None if it is not an op name."""
    m = _OP.match(str(name).strip())
    if m is None:
        return None
    return f"{m['ns']}.{m['op']}.{m['ov'] or 'default'}"


@dataclass(frozen=True)
class OpPackageInfo:
    """One package op registered for one torch op (see the module docstring)."""

    op_package_name: str
    op_package_path: str
    interface_provider: str
    target: str
    custom_op_name: str
    op_type_name: str
    platform: str

    def __post_init__(self) -> None:
        for name in _FIELDS:
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"OpPackageInfo.{name} must be a non-empty string")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def _info(item: Any, where: str) -> OpPackageInfo:
    from opforge.backends.oppackage.platforms import PLATFORMS, TARGETS, host_platform

    if not isinstance(item, dict):
        raise BackendError(f"{where}: {shown(item)} — not a mapping — valid: "
                           f"{{{', '.join(_FIELDS)}}} — fix: write one object per package op")
    data = {_ALIASES.get(k, k): v for k, v in item.items()}
    unknown = sorted(str(k) for k in data if k not in _FIELDS)
    if unknown:
        raise BackendError(f"{where}: unknown key {shown(unknown[0])} — valid: "
                           f"{', '.join(_FIELDS)} — fix: check the spelling")
    for required in ("op_package_name", "op_package_path", "custom_op_name", "op_type_name"):
        if not isinstance(data.get(required), str) or not data[required].strip():
            raise BackendError(f"{where}: {required} = {shown(data.get(required))} — valid: a "
                               "non-empty string — fix: add it")
    for key in ("interface_provider", "target", "platform"):
        if key in data and not isinstance(data[key], str):
            raise BackendError(f"{where}: {key} = {shown(data[key])} — valid: a string")
    name = data["op_package_name"].strip()
    custom = normalize_op_name(data["custom_op_name"])
    if custom is None:
        raise BackendError(f"{where}: custom_op_name {shown(data['custom_op_name'])} — not a torch "
                           "op name — valid: namespace.op.overload, e.g. my_ops.mul3.default or "
                           "aten.add.Tensor — fix: write the op as torch.ops spells it")
    target = data.get("target", "cpu").strip().lower()
    if target not in TARGETS:
        raise BackendError(f"{where}: target {shown(target)} — valid: {', '.join(TARGETS)}")
    plat = data.get("platform", host_platform()).strip().lower()
    if plat not in PLATFORMS:
        raise BackendError(f"{where}: platform {shown(plat)} — valid: {', '.join(PLATFORMS)}")
    return OpPackageInfo(name, data["op_package_path"].strip(),
                         (data.get("interface_provider") or f"{name}InterfaceProvider").strip(),
                         target, custom, data["op_type_name"].strip(), plat)


def parse_op_package_infos(value: Any, *, where: str = "compile spec 'op_packages'",
                           base: Path | None = None) -> list[OpPackageInfo]:
    """A list of dicts (the ``op_packages`` compile spec's JSON value, or text of it) →
    ``OpPackageInfo``s; ``BackendError`` naming the entry and key that is wrong."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value) if str(value).strip() else []
        except ValueError as e:
            raise BackendError(f"{where}: not JSON ({e}) — valid: a JSON list of package "
                               "registrations") from None
    if isinstance(value, dict) and "op_packages" in value:
        value = value["op_packages"]
    if value is None:
        return []
    if not isinstance(value, list):
        raise BackendError(f"{where}: {shown(value)} — valid: a list of package registrations "
                           f"({', '.join(_FIELDS)}) — fix: wrap the entries in [...]")
    infos = []
    for i, item in enumerate(value):
        info = _info(item, f"{where}[{i}]")
        if base is not None and not Path(info.op_package_path).is_absolute():
            info = OpPackageInfo(**{**info.as_dict(),
                                    "op_package_path": str(base / info.op_package_path)})
        infos.append(info)
    check_registrations(infos, where=where)
    return infos


def claimed_op_keys(infos: Iterable[OpPackageInfo]) -> set[str]:
    """The torch ops the registrations claim, as export's ``preserve_ops`` spells them
    (``aten::linear.default``): a backend keeps them out of decomposition, so that a package
    can override an op export would otherwise decompose."""
    out = set()
    for info in infos:
        ns, op, overload = info.custom_op_name.split(".")
        out.add(f"{ns}::{op}.{overload}")
    return out


def check_registrations(infos: Iterable[OpPackageInfo], *, where: str = "op_packages") -> None:
    """Two registrations for one torch op are an error (which package would win?)."""
    seen: dict[str, tuple[int, OpPackageInfo]] = {}
    for i, info in enumerate(infos):
        first = seen.get(info.custom_op_name)
        if first is not None and first[1] != info:
            raise BackendError(
                f"{where}[{i}]: custom_op_name {info.custom_op_name!r} is already mapped to "
                f"{first[1].op_package_name}::{first[1].op_type_name} by entry [{first[0]}] — "
                f"found a second mapping to {info.op_package_name}::{info.op_type_name} — valid: "
                "one package op per torch op — fix: drop one of the two entries")
        seen.setdefault(info.custom_op_name, (i, info))


def load_op_package_infos(path: str | Path) -> list[OpPackageInfo]:
    """Read registrations from a JSON or YAML file (``opforge export --op-packages FILE``).

    The file holds a list of registrations, or a mapping with an ``op_packages`` list.
    """
    path = Path(path)
    where = f"`opforge export --op-packages`: {path}"
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise BackendError(f"{where}: cannot read it ({getattr(e, 'strerror', None) or e}) — "
                           "fix: check the path") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise BackendError(f"{where}: not JSON ({e})") from None
    else:
        from opforge.errors import ManifestError
        from opforge.manifest.yaml_source import load_yaml

        try:
            data = load_yaml(text, str(path))
        except ManifestError as e:
            raise BackendError(f"{where}: {e}") from None
        data = json.loads(json.dumps(data))  # LineMap → plain dicts
    return parse_op_package_infos(data, where=where, base=path.resolve().parent)
