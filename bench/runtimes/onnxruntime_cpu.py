"""ONNX Runtime on the CPU execution provider; the model comes from ``torch.onnx.export``.

torch 2.13's ``torch.onnx.export`` uses the dynamo exporter by default, which needs
``onnxscript`` (and ``onnx``); if it fails the TorchScript exporter (``dynamo=False``) is
tried. Threads: ``intra_op_num_threads`` = the suite's thread count, one inter-op thread,
sequential execution, all graph optimisations on (ORT's default level).
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np


def unavailable() -> str | None:
    try:
        import onnxruntime  # noqa: F401
    except Exception as error:
        return f"import onnxruntime failed: {type(error).__name__}: {error}"
    return None


def export(model, inputs, path: pathlib.Path, variant: str) -> None:
    import torch
    names = [f"input_{i}" for i in range(len(inputs))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(model, inputs, input_names=names, dynamo=True,
                                        external_data=False, verbose=False)
            program.save(str(path), external_data=False)
        except Exception as dynamo_error:  # fall back to the TorchScript exporter
            try:
                torch.onnx.export(model, inputs, str(path), input_names=names, dynamo=False)
            except Exception as legacy_error:
                raise RuntimeError(f"torch.onnx.export failed: dynamo: {dynamo_error!r}; "
                                   f"torchscript: {legacy_error!r}") from legacy_error


def export_quantized(workload, path: pathlib.Path, variant: str) -> None:
    """A quantized workload (``quantized_workloads.QuantizedWorkload``) as ONNX Runtime
    quantizes a model: the float model exported as above, then ``quantize_static`` (QDQ,
    uint8 activations, int8 per-channel weights) calibrated on the workload's samples."""
    import tempfile

    import onnxruntime as ort
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)

    class Samples(CalibrationDataReader):
        def __init__(self, names: list[str]) -> None:
            self.items = iter([dict(zip(names, (x.numpy() for x in sample)))
                               for sample in workload.calibration])

        def get_next(self):
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        float_path = pathlib.Path(tmp) / "float.onnx"
        export(workload.float_model, workload.inputs, float_path, variant)
        names = [i.name for i in ort.InferenceSession(str(float_path)).get_inputs()]
        quantize_static(str(float_path), str(path), Samples(names), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QUInt8,
                        weight_type=QuantType.QInt8)


class Session:
    def __init__(self, path: pathlib.Path, threads: int) -> None:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session = ort.InferenceSession(str(path), options,
                                            providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def feed(self, arrays: list[np.ndarray]):
        return dict(zip(self.names, (np.ascontiguousarray(a) for a in arrays)))

    def run(self, args):
        return self.session.run(None, args)

    def outputs(self, result) -> list[np.ndarray]:
        return [np.asarray(r) for r in result]


def load(path: pathlib.Path, workload: str, threads: int, variant: str) -> Session:
    return Session(path, threads)
