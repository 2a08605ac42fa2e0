"""opforge: ``opforge.export.export`` → program file → ``opforge.runtime.load(mode=...)``.

``cpu`` runs a program whose subgraphs the compiled cpu backend (oneDNN) took, the rest
on the portable kernels; ``lean`` runs the portable NumPy kernels (the worker proves torch never gets imported);
``aten`` runs the same file with PyTorch's own out kernels. Calls go through the public
API a user calls, ``forward(*arrays)``, which copies inputs into the arena and returns
fresh output arrays (``views=False``), like ONNX Runtime's ``run`` does. Threads:
``load(num_threads=threads)`` holds every pool a call reaches (NumPy's BLAS, OpenMP,
torch's intra-op pool in ATen mode) at the suite's count for the call; the portable
kernels' large elementwise steps and the cpu backend's engine follow OPFORGE_NUM_THREADS,
which the harness sets to the same count.
"""

from __future__ import annotations

import pathlib

import numpy as np


def unavailable() -> str | None:
    try:
        from opforge.runtime import load  # noqa: F401
    except Exception as error:
        return f"opforge.runtime.load not importable: {type(error).__name__}: {error}"
    return None


def export(model, inputs, path: pathlib.Path, variant: str) -> None:
    from opforge.export import export as opforge_export
    from opforge.program import save
    # lean and aten run the same program: exported once against the portable kernel set
    # (the stricter one), so ATen mode differs only in who runs each instruction. cpu
    # delegates what the cpu backend takes (everything, for the zoo); its threads come from
    # OPFORGE_NUM_THREADS, which the harness sets to --threads.
    backends = ["cpu"] if variant == "cpu" else None
    save(opforge_export(model, inputs, kernels="portable", backends=backends), path)


def export_quantized(workload, path: pathlib.Path, variant: str) -> None:
    """A quantized workload (``quantized_workloads.QuantizedWorkload``): torchao's converted
    model exported as ``opforge quantize`` does (Q/DQ ops and integer constants kept)."""
    from opforge.program import save
    backends = ["cpu"] if variant == "cpu" else None
    save(workload.quantized.export(kernels="portable", backends=backends), path)


class Session:
    def __init__(self, path: pathlib.Path, threads: int, mode: str) -> None:
        from opforge.runtime import load
        self.program = load(path, mode="lean" if mode == "cpu" else mode, num_threads=threads)
        self.forward = self.program.method("forward")

    def feed(self, arrays: list[np.ndarray]):
        return [np.ascontiguousarray(a) for a in arrays]

    def run(self, args):
        return self.forward(*args)

    def run_views(self, args):
        """The call without output copies: what the runtime itself allocates per call."""
        return self.forward(*args, views=True)

    def outputs(self, result) -> list[np.ndarray]:
        return [np.array(r, copy=True) for r in result]


def load(path: pathlib.Path, workload: str, threads: int, variant: str) -> Session:
    return Session(path, threads, variant)
