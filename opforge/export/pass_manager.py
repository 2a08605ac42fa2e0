"""Export passes and the manager that runs them and checks their contracts.

A pass is a class with one entry point, ``run(method) -> method``, and a declared
contract: ``requires`` names the properties the graph must have before the pass and
``ensures`` those it has afterwards. Properties are named checks over a
:class:`~opforge.export.method_graph.MethodGraph` (see ``properties.py``); the manager
evaluates every required property before a pass and every ensured one after it, so a
pass that breaks an invariant is caught at the pass, not three stages later in the
runtime. A broken contract is a bug in opforge (``InternalError``); a user problem a
pass discovers (an op without out variant) is an ``ExportError`` raised by the pass.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Sequence

from opforge.errors import InternalError
from opforge.export.method_graph import MethodGraph
from opforge.export.properties import check_property

__all__ = ["ExportPass", "PassManager"]


class ExportPass:
    """Base class of the export passes. Subclasses set ``requires``/``ensures`` and
    implement :meth:`run`."""

    requires: ClassVar[frozenset[str]] = frozenset()
    ensures: ClassVar[frozenset[str]] = frozenset()

    @property
    def name(self) -> str:
        return type(self).__name__

    def run(self, method: MethodGraph) -> MethodGraph:  # pragma: no cover - abstract
        raise NotImplementedError


class PassManager:
    """Runs passes in order, checking each one's ``requires`` before and ``ensures`` after.

    ``on_pass(pass_name, method_name)`` is called before each pass (progress display).
    """

    def __init__(
        self,
        passes: Sequence[ExportPass],
        *,
        check_contracts: bool = True,
        on_pass: Callable[[str, str], None] | None = None,
    ) -> None:
        self.passes = list(passes)
        self.check_contracts = check_contracts
        self.on_pass = on_pass

    def run(self, method: MethodGraph) -> MethodGraph:
        for export_pass in self.passes:
            if self.on_pass is not None:
                self.on_pass(export_pass.name, method.name)
            self._check(export_pass, "requires", export_pass.requires, method)
            method = export_pass.run(method)
            method.graph_module.recompile()
            self._check(export_pass, "ensures", export_pass.ensures, method)
        return method

    def _check(self, export_pass: ExportPass, clause: str, properties: frozenset[str], method: MethodGraph) -> None:
        if not self.check_contracts:
            return
        for prop in sorted(properties):
            violations = check_property(prop, method)
            if violations:
                listed = "\n".join(f"  - {v}" for v in violations[:20])
                raise InternalError(
                    f"`PassManager.run()`: pass {export_pass.name} {clause} property "
                    f"{prop!r} on method {method.name!r} — {len(violations)} violation(s):\n{listed}\n"
                    "— this is a bug in opforge's export passes; please report it with the model."
                )
