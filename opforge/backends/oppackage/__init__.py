"""Op packages: Qualcomm-format OpDef XML → generated skeleton → a compiled package the cpu
backend loads through compile specs, overriding built-in ops if asked.

The stages, one module each::

    xml_reader / yaml_reader   OpDef XML (defusedxml, line numbers) or the YAML manifest's
                               ``op_package:`` entries → model.OpPackage
    skeleton                   OpPackage → a package project (typed C++ op stubs, the
                               interface provider, build files; Jinja2 templates)
    build                      project → libQnn<Package>.so (cpu target, build cache)
    info                       OpPackageInfo registrations (compile spec, JSON/YAML file)
    planner  (needs torch)     export graph + registrations → PackageNode per node, or a
                               Rejection saying why the node cannot be mapped
    node                       PackageNode ⇄ bytes (stored in the backend's blob)
    runtime  (no torch)        load packages (ABI, platform, name checks) and ``prepare``
                               a node: (execute fn, op instance, keepalive) for the engine

The package C ABI is ``include/opforge/oppackage.h``; ``docs/op-packages.md`` is the guide.

>>> from opforge.backends.oppackage import parse_opdef_xml, skeleton_ops
>>> from opforge.backends.oppackage.skeleton import EXAMPLE_XML
>>> skeleton_ops(parse_opdef_xml(EXAMPLE_XML))[0].name
'Mul3'
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> module: imported on first use, so the run-time half (runtime, node, info) loads
# with NumPy alone (no Jinja2, defusedxml or torch)
_EXPORTS = {
    "build_package": "build", "check_target": "build", "host_platform": "platforms",
    "OpPackageInfo": "info", "load_op_package_infos": "info", "normalize_op_name": "info",
    "parse_op_package_infos": "info", "OpDefinition": "model", "OpPackage": "model",
    "TensorDef": "model", "PackageNode": "node", "PackageParam": "node", "TensorSpec": "node",
    "generate_skeleton": "skeleton", "include_dir": "skeleton", "skeleton_ops": "skeleton",
    "load_opdef_xml": "xml_reader", "parse_opdef_xml": "xml_reader",
}

__all__ = [
    "OpPackage", "OpDefinition", "TensorDef", "parse_opdef_xml", "load_opdef_xml",
    "skeleton_ops", "generate_skeleton", "include_dir", "build_package", "check_target",
    "host_platform", "OpPackageInfo", "parse_op_package_infos", "load_op_package_infos",
    "normalize_op_name", "PackageNode", "PackageParam", "TensorSpec", "ABI_VERSION",
]

ABI_VERSION = 1  # OPFORGE_OPPACKAGE_ABI_VERSION; runtime.ABI_VERSION is the one checked


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
