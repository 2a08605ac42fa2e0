"""ExecuTorch: ``torch.export`` → ``to_edge_transform_and_lower`` → ``.to_executorch()``.

Two variants: ``portable`` (no partitioner: every op runs on the portable kernel library
the pybindings ship) and ``xnnpack`` (``XnnpackPartitioner`` delegates what it can). The
.pte is run through the pybindings' ``_load_for_executorch`` module, the
lowest-overhead Python entry point (``module.forward(inputs)``).

Threads: the pybindings share one XNNPACK/portable thread pool; where the installed
version offers ``_unsafe_reset_threadpool`` it is set to the suite's thread count, else
the pool keeps its default (reported by the worker).
"""

from __future__ import annotations

import pathlib

import numpy as np


def unavailable() -> str | None:
    try:
        import executorch  # noqa: F401
        from executorch.extension.pybindings import portable_lib  # noqa: F401
    except Exception as error:
        return f"executorch not importable: {type(error).__name__}: {error}"
    return None


def export(model, inputs, path: pathlib.Path, variant: str) -> None:
    import torch
    from executorch.exir import to_edge_transform_and_lower
    partitioner = []
    if variant == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
        partitioner = [XnnpackPartitioner()]
    exported = torch.export.export(model, inputs)
    program = to_edge_transform_and_lower(exported, partitioner=partitioner).to_executorch()
    path.write_bytes(program.buffer)


class Session:
    def __init__(self, path: pathlib.Path, threads: int) -> None:
        import torch
        from executorch.extension.pybindings import portable_lib
        # xnnpack's kernels are registered by importing the backend's pybinding module in
        # some versions; the portable_lib wheel links XNNPACK in.
        torch.set_num_threads(threads)
        self.thread_pool = "default"
        reset = getattr(portable_lib, "_unsafe_reset_threadpool", None)
        if reset is not None:
            reset(threads)
            self.thread_pool = str(threads)
        self.torch = torch
        self.module = portable_lib._load_for_executorch(str(path))

    def feed(self, arrays: list[np.ndarray]):
        return tuple(self.torch.from_numpy(np.ascontiguousarray(a)) for a in arrays)

    def run(self, args):
        return self.module.forward(args)

    def outputs(self, result) -> list[np.ndarray]:
        return [r.numpy().copy() if hasattr(r, "numpy") else np.asarray(r) for r in result]


def load(path: pathlib.Path, workload: str, threads: int, variant: str) -> Session:
    return Session(path, threads)
