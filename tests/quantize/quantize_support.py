"""Shared helpers of the quantization tests (imported by name, not through conftest)."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from opforge.examples.zoo import ZOO


def calibration_samples(inputs: tuple, count: int = 4, seed: int = 1) -> list[tuple]:
    """``count`` samples like ``inputs``: fresh normal floats of the same shape (the zoo's
    example inputs are normal too, so these are representative); integer inputs (token
    ids) are drawn in the example's range."""
    gen = torch.Generator().manual_seed(seed)
    samples = []
    for _ in range(count):
        sample = []
        for x in inputs:
            if x.is_floating_point():
                sample.append(torch.randn(x.shape, generator=gen, dtype=x.dtype))
            else:
                high = int(x.max()) + 1
                sample.append(torch.randint(0, high, x.shape, generator=gen, dtype=x.dtype))
        samples.append(tuple(sample))
    return samples


def quantized_zoo(name: str, scheme: str, **kw):
    from opforge.quantize import quantize

    model, inputs = ZOO[name]()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return quantize(model, inputs, scheme, calibration=calibration_samples(inputs), **kw)


def run_lean(program, inputs: tuple, registry=None) -> list[np.ndarray]:
    from opforge.runtime import load

    loaded = load(program, registry=registry) if registry is not None else load(program)
    return loaded.method("forward")(*[x.numpy() for x in inputs])


def output_scale(graph_module: torch.fx.GraphModule) -> float:
    """Scale of the last dequantize before the output (one quantization step)."""
    output = next(n for n in graph_module.graph.nodes if n.op == "output")
    node = output.args[0][0] if isinstance(output.args[0], (tuple, list)) else output.args[0]
    while node.op == "call_function" and "dequantize" not in str(node.target):
        node = node.all_input_nodes[0]
    return float(node.args[1])


def decoder_factory(tmp_path, monkeypatch, module: str, seed: int = 0) -> str:
    """A small TinyDecoder factory written as ``module.py`` under ``tmp_path`` and made
    importable, for `opforge quantize MODULE:make`: the name to pass."""
    (tmp_path / f"{module}.py").write_text(
        "import torch\nfrom opforge.examples.decoder import TinyDecoder\n"
        "def make():\n    return TinyDecoder(vocab=64, dim=64, heads=4, kv_heads=2, hidden=128, "
        f"layers=1, max_len=16, seed={seed}).eval(), (torch.tensor([1, 2, 3]), torch.arange(3))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:make"
