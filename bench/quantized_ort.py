"""ONNX Runtime running the zoo models quantized (QDQ ONNX, u8 activations, s8 per-channel
weights: what 8a8w is), for comparison with opforge's 8a8w programs on the cpu backend
(``bench/quantized.py``). Runs in the peers environment (ONNX Runtime is no dependency):

    bench/.venv-peers/bin/python bench/quantized_ort.py --models mlp cnn resnet_block --threads 1

Float model → ``torch.onnx.export`` (this bench's ONNX exporter) → ``quantize_static``
(QDQ, per-channel, calibrated on the same four normal samples as bench/quantized.py) →
``InferenceSession`` on the CPU provider; median of ``--runs`` calls.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn", "resnet_block"])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import numpy as np
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    from runtimes.onnxruntime_cpu import export as onnx_export
    from opforge.examples.zoo import ZOO

    class Reader(CalibrationDataReader):
        def __init__(self, name: str, samples: list) -> None:
            self.items = iter([{name: s} for s in samples])

        def get_next(self):
            return next(self.items, None)

    print("| model | ORT float32 | ORT QDQ 8a8w |\n| --- | ---: | ---: |")
    for model_name in args.models:
        model, inputs = ZOO[model_name]()
        model.eval()
        gen = torch.Generator().manual_seed(1)
        samples = [torch.randn(inputs[0].shape, generator=gen).numpy() for _ in range(4)]
        with tempfile.TemporaryDirectory() as tmp:
            float_path, q_path = pathlib.Path(tmp) / "f.onnx", pathlib.Path(tmp) / "q.onnx"
            onnx_export(model, inputs, float_path, "")
            options = ort.SessionOptions()
            options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
            name = ort.InferenceSession(str(float_path), options).get_inputs()[0].name
            quantize_static(str(float_path), str(q_path), Reader(name, samples),
                            quant_format=QuantFormat.QDQ, per_channel=True,
                            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
            row = []
            for path in (float_path, q_path):
                session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
                feed = {name: inputs[0].numpy()}
                for _ in range(20):
                    session.run(None, feed)
                times = []
                for _ in range(args.runs):
                    start = time.perf_counter()
                    session.run(None, feed)
                    times.append(time.perf_counter() - start)
                row.append(statistics.median(times) * 1e6)
        print(f"| {model_name} | {row[0]:.1f} µs | {row[1]:.1f} µs |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
