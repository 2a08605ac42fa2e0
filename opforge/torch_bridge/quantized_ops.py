"""Out variants of the quantize / dequantize operators that converted PT2E graphs contain.

opforge programs call out variants only (the memory planner owns every buffer), but
``quantized_decomposed`` and ``torchao`` define just functional overloads. This module adds
``quantized_decomposed::quantize_per_tensor.out`` and the like to those namespaces (a
``torch.library`` fragment, as ExecuTorch does for the same ops), each computing its
functional twin and copying into ``out``. Export finds them through
``opforge.export.out_variants.find_out_variant``; ATen mode runs them; the lean runtime
has NumPy kernels for the same keys (``opforge.kernels.portable.quantized``).

Importing this module registers them once; ``ensure_registered()`` is the explicit call.
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["ensure_registered", "QUANTIZED_OUT_SCHEMAS"]

# functional overload ("ns::op.overload") -> the out overload's schema (without namespace)
QUANTIZED_OUT_SCHEMAS: dict[str, str] = {
    "quantized_decomposed::quantize_per_tensor":
        "quantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed::dequantize_per_tensor":
        "dequantize_per_tensor.out(Tensor input, float scale, int zero_point, int quant_min, "
        "int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed::quantize_per_channel":
        "quantize_per_channel.out(Tensor input, Tensor scales, Tensor zero_points, int axis, "
        "int quant_min, int quant_max, ScalarType dtype, *, Tensor(a!) out) -> Tensor(a!)",
    "quantized_decomposed::dequantize_per_channel":
        "dequantize_per_channel.out(Tensor input, Tensor scales, Tensor? zero_points, int axis, "
        "int quant_min, int quant_max, ScalarType dtype, *, ScalarType? out_dtype=None, "
        "Tensor(a!) out) -> Tensor(a!)",
    "torchao::dequantize_affine":
        "dequantize_affine.out(Tensor input, SymInt[] block_size, Tensor scale, Tensor? zero_point, "
        "ScalarType input_dtype, Scalar? quant_min=None, Scalar? quant_max=None, "
        "ScalarType output_dtype=6, *, Tensor(a!) out) -> Tensor(a!)",
    "torchao::quantize_affine":
        "quantize_affine.out(Tensor input, SymInt[] block_size, Tensor scale, Tensor? zero_point, "
        "ScalarType output_dtype, Scalar? quant_min=None, Scalar? quant_max=None, *, "
        "Tensor(a!) out) -> Tensor(a!)",
}

_LIBRARIES: dict[str, torch.library.Library] = {}
_DONE: set[str] = set()


def _functional(name: str):
    ns, op = name.split("::")
    try:
        return getattr(getattr(torch.ops, ns), op).default
    except (AttributeError, RuntimeError):
        return None


def _out_impl(functional):
    def impl(*args, out, **kwargs):
        out.copy_(functional(*args, **kwargs))
        return out

    return impl


def ensure_registered(namespace: str | None = None) -> None:
    """Register the out overloads (of ``namespace`` only, when given) that are missing."""
    if namespace in (None, "quantized_decomposed"):
        import torch.ao.quantization.fx._decomposed  # noqa: F401  defines the functional ops
    if namespace in (None, "torchao") and "torchao" not in _DONE:
        if importlib.util.find_spec("torchao") is not None:
            import torchao.quantization.quant_primitives  # noqa: F401  defines torchao:: ops
    for name, schema in QUANTIZED_OUT_SCHEMAS.items():
        ns = name.split("::")[0]
        if name in _DONE or (namespace is not None and ns != namespace):
            continue
        functional = _functional(name)
        if functional is None:
            continue
        packet = getattr(getattr(torch.ops, ns), name.split("::")[1])
        _DONE.add(name)
        if "out" in packet.overloads():
            continue
        lib = _LIBRARIES.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        lib.define(schema)
        lib.impl(schema.split("(")[0], _out_impl(functional), "CompositeExplicitAutograd")
    if namespace in (None, "torchao"):
        _DONE.add("torchao")


ensure_registered()
