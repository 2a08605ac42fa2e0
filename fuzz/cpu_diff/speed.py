"""Throughput: what every export recomputes although nothing it depends on changed.

Most of an export of a small graph is spent before the graph is looked at:
``torch.export`` walks every registered operator to list the CompositeImplicitAutograd
ops on each ``run_decompositions`` call (~0.1 s), and opforge rebuilds the core-ATen
decomposition table on every export (~0.07 s). Both depend only on the operators
registered in the process, which a fuzz run never changes after start-up, so they are
computed once per worker. What is exported, decomposed and delegated is unchanged: the
same sets and tables are passed on (copies where the caller mutates them).
"""

from __future__ import annotations

import functools

__all__ = ["cache_export_setup", "share_capture_between_exports", "restore"]

_undo: list = []


def cache_export_setup():
    """Install the caches; returns a function that takes them out again (a test session
    registers new operators after this, and they must be seen)."""
    if _undo:
        return restore
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    import opforge.export.api as api
    import opforge.export.passes.decompose as decompose

    cia_ops = functools.lru_cache(maxsize=None)(export_utils._collect_all_valid_cia_ops)
    build_table = decompose.decomposition_table
    tables: dict = {}

    def decomposition_table(preserve=()):
        key = frozenset(preserve)
        if key not in tables:
            tables[key] = build_table(key)
        return tables[key].copy()  # run_decompositions and its callers may edit their table

    # callers of _collect_all_valid_cia_ops copy its set (set(...)) or only read it
    _patch(exported_program, "_collect_all_valid_cia_ops", cia_ops)
    _patch(decomp_utils, "_collect_all_valid_cia_ops", cia_ops)
    _patch(decompose, "decomposition_table", decomposition_table)
    _patch(api, "decomposition_table", decomposition_table)
    return restore


def _patch(owner, name, value) -> None:
    _undo.append((owner, name, getattr(owner, name)))
    setattr(owner, name, value)


def restore() -> None:
    """Every patch of this module undone."""
    while _undo:
        owner, name, value = _undo.pop()
        setattr(owner, name, value)
    _shared.clear()


# The two exports of one graph (portable kernels, then the cpu backend) capture the same
# model on the same inputs, and decompose with the same table whenever the backend
# preserves no op that portable kernels do not: torch.export's capture and decomposition
# then run once, and each export gets its own deep copy of the decomposed method (the
# later passes rewrite it in place). Different preserve sets are simply decomposed anew.
_shared: dict = {}


def share_capture_between_exports() -> None:
    import copy

    import opforge.export.api as api
    from opforge.export.passes import decompose

    capture, run = api.capture, decompose.DecomposeToCoreAten.run

    def shared_capture(spec, *, strict=False):
        key = (id(spec.module), tuple(id(x) for x in spec.example_inputs), strict)
        if _shared.get("capture_key") != key:
            _shared.clear()
            _shared.update(capture_key=key, captured=capture(spec, strict=strict), keep=(spec,))
        return _shared["captured"]

    def shared_decompose(self, method):
        key = (id(method), self.preserve)
        if _shared.get("decompose_key") != key:
            _shared.update(decompose_key=key, decomposed=run(self, method))
        return copy.deepcopy(_shared["decomposed"])

    _patch(api, "capture", shared_capture)
    _patch(decompose.DecomposeToCoreAten, "run", shared_decompose)
