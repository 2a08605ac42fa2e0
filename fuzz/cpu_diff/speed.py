"""Throughput: two pure, process-stable computations of every export cached for the run.

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

__all__ = ["cache_export_setup"]

_done = False


def cache_export_setup() -> None:
    global _done
    if _done:
        return
    import torch._export.utils as export_utils
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    import opforge.export.api as api
    import opforge.export.passes.decompose as decompose

    cia_ops = functools.lru_cache(maxsize=None)(export_utils._collect_all_valid_cia_ops)
    exported_program._collect_all_valid_cia_ops = cia_ops  # callers copy it (set(...)) or read it
    decomp_utils._collect_all_valid_cia_ops = cia_ops

    build_table = decompose.decomposition_table
    tables: dict = {}

    def decomposition_table(preserve=()):
        key = frozenset(preserve)
        if key not in tables:
            tables[key] = build_table(key)
        return tables[key].copy()  # run_decompositions and its callers may edit their table

    decompose.decomposition_table = decomposition_table
    api.decomposition_table = decomposition_table
    _done = True
