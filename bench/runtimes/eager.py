"""torch eager: the model object itself, called under ``torch.inference_mode()``.

The "artifact" is only a marker file: the worker rebuilds the model from its factory
(building it is not timed), which is what an eager user does.
"""

from __future__ import annotations

import pathlib

import numpy as np


def unavailable() -> str | None:
    try:
        import torch  # noqa: F401
    except Exception as error:
        return f"import torch failed: {error}"
    return None


def export(model, inputs, path: pathlib.Path, variant: str) -> None:
    path.write_text("eager: the model is rebuilt from its factory\n")


def export_quantized(workload, path: pathlib.Path, variant: str) -> None:
    """Eager runs torchao's converted model, which the quantized workload's factory returns."""
    export(workload.converted, workload.inputs, path, variant)


class Session:
    def __init__(self, model, threads: int) -> None:
        import torch
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = model
        # Entered once for the whole worker, not per call: the timed loop then measures
        # the model, not the context manager (~1 µs) around it.
        self._mode = torch.inference_mode()
        self._mode.__enter__()

    def feed(self, arrays: list[np.ndarray]):
        return [self.torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]

    def run(self, args):
        return self.model(*args)

    def outputs(self, result) -> list[np.ndarray]:
        results = result if isinstance(result, (tuple, list)) else [result]
        return [r.detach().numpy().copy() for r in results]


def load(path: pathlib.Path, workload: str, threads: int, variant: str) -> Session:
    from workloads import workload as build
    model, _ = build(workload)
    return Session(model, threads)
