"""The runtimes under test, one module each, all with the same small contract.

A runtime module defines:

- ``unavailable() -> str | None``: why it cannot run here (an import failing), or None;
- ``export(model, inputs, path, variant) -> None``: turn a torch model into the file this
  runtime loads (runs in the prepare step, which has torch);
- optionally ``export_quantized(workload, path, variant) -> None``: the same for a
  quantized workload (``quantized_workloads.QuantizedWorkload``: the float model, its
  calibration samples, torchao's converted model), done the way this runtime's users
  quantize; a runtime without it is not measured on quantized workloads;
- ``load(path, workload, threads, variant) -> Session``: read that file back (runs in a
  measuring worker, which imports only what this runtime itself needs).

A ``Session`` has ``feed(list[np.ndarray])`` → the runtime's own argument object (built
once, outside the timed loop), ``run(args)`` → outputs (timed), and
``outputs(result) -> list[np.ndarray]`` (for the check against eager, untimed).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["Runtime", "RUNTIMES", "runtime"]


@dataclass(frozen=True)
class Runtime:
    name: str          # the name in tables and on the command line
    module: str        # bench.runtimes.<module>
    variant: str       # passed to export/load (e.g. "portable" vs "xnnpack")
    suffix: str        # the artifact's file suffix
    description: str

    def impl(self) -> ModuleType:
        return importlib.import_module(f"runtimes.{self.module}")


RUNTIMES: dict[str, Runtime] = {r.name: r for r in (
    Runtime("opforge-lean", "opforge_rt", "lean", ".opf",
            "opforge program on the lean runtime (NumPy portable kernels, no torch)"),
    Runtime("opforge-aten", "opforge_rt", "aten", ".opf",
            "the same program file with PyTorch's own out kernels (ATen mode)"),
    Runtime("opforge-cpu", "opforge_rt", "cpu", ".opf",
            "opforge program fully delegated to the compiled cpu backend (oneDNN)"),
    Runtime("eager", "eager", "", ".eager",
            "torch eager under torch.inference_mode()"),
    Runtime("ort", "onnxruntime_cpu", "", ".onnx",
            "ONNX Runtime, CPUExecutionProvider, model from torch.onnx.export"),
    Runtime("et-portable", "executorch_rt", "portable", ".pte",
            "ExecuTorch, portable kernels only (no delegate)"),
    Runtime("et-xnnpack", "executorch_rt", "xnnpack", ".pte",
            "ExecuTorch with the XNNPACK delegate"),
)}


def runtime(name: str) -> Runtime:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise SystemExit(f"bench: unknown runtime {name!r}; known: {', '.join(RUNTIMES)}") from None
