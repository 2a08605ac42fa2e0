"""Out variants opforge adds to other libraries' functional operators.

opforge programs call out variants only (the memory planner owns every buffer), but some
libraries define functional custom ops only: ``quantized_decomposed`` and ``torchao`` (the
quantize / dequantize ops of PT2E and torchao programs) and ``transformers`` (the grouped
matmul of its mixture-of-experts layers, ``transformers::grouped_mm_fallback``, a
``torch.library.custom_op`` whose only implementation is Python). For the operators listed
in :data:`LIBRARY_OUT_SCHEMAS` this module adds ``ns::op.out`` to that namespace (a
``torch.library`` fragment, as ExecuTorch does for the quantize ops), each computing its
functional twin and copying into ``out``. Export finds them through
``opforge.export.out_variants.find_out_variant``; ATen mode runs them; the lean runtime has
NumPy kernels for the same keys (``opforge.kernels.portable``), so the program carries no
Python callback and runs wherever those kernels exist.

A library's op opforge does not list here is decomposed at export when torch knows a
decomposition for it, or refused with the fixes (``opforge.export.passes.decompose``).

An operator whose library has not defined it yet (its module not imported) is skipped and
looked up again on the next call; asked for one namespace, the module defining its ops is
imported when the library is installed (torch's quantize ops, torchao's, transformers' MoE).
"""

from __future__ import annotations

import importlib.util

import torch

__all__ = ["ensure_registered", "LIBRARY_OUT_SCHEMAS", "LIBRARY_NAMESPACES", "has_library_out"]

# functional overload ("ns::op") -> the out overload's schema (without namespace)
LIBRARY_OUT_SCHEMAS: dict[str, str] = {
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
    # transformers/integrations/moe.py: rows of input sorted by expert, offs the cumulative
    # row count of each expert; rows past offs[-1] are zero
    "transformers::grouped_mm_fallback":
        "grouped_mm_fallback.out(Tensor input, Tensor weight, Tensor offs, *, "
        "Tensor(a!) out) -> Tensor(a!)",
}

LIBRARY_NAMESPACES: frozenset[str] = frozenset(name.split("::")[0] for name in LIBRARY_OUT_SCHEMAS)

_LIBRARIES: dict[str, torch.library.Library] = {}
_DONE: set[str] = set()


def has_library_out(key: str) -> bool:
    """True when ``key`` (``"ns::op.out"``) is an out overload this module adds."""
    name, _, overload = key.partition(".")
    return overload == "out" and name in LIBRARY_OUT_SCHEMAS


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


def _define_library_ops(namespace: str | None) -> None:
    """Import the modules that define the functional ops of ``namespace`` (all when None),
    where they are opforge's dependencies (torch's) or installed (torchao)."""
    if namespace in (None, "quantized_decomposed"):
        import torch.ao.quantization.fx._decomposed  # noqa: F401  defines the functional ops
    if namespace in (None, "torchao") and "torchao" not in _DONE:
        _DONE.add("torchao")
        if importlib.util.find_spec("torchao") is not None:
            import torchao.quantization.quant_primitives  # noqa: F401  defines torchao:: ops
    if namespace == "transformers" and "transformers" not in _DONE:
        # only when asked (a program calls one of its ops: ATen mode in a fresh process);
        # importing transformers costs seconds, so never on the way to another namespace
        _DONE.add("transformers")
        if importlib.util.find_spec("transformers") is not None:
            try:
                import transformers.integrations.moe  # noqa: F401  defines grouped_mm_fallback
            except Exception:  # noqa: BLE001 - a transformers without it: the op stays unknown
                pass


def ensure_registered(namespace: str | None = None) -> None:
    """Register the out overloads (of ``namespace`` only, when given) that are missing."""
    _define_library_ops(namespace)
    for name, schema in LIBRARY_OUT_SCHEMAS.items():
        ns = name.split("::")[0]
        if name in _DONE or (namespace is not None and ns != namespace):
            continue
        functional = _functional(name)
        if functional is None:
            continue  # its library is not imported (yet)
        packet = getattr(getattr(torch.ops, ns), name.split("::")[1])
        _DONE.add(name)
        if "out" in packet.overloads():
            continue
        lib = _LIBRARIES.setdefault(ns, torch.library.Library(ns, "FRAGMENT"))
        lib.define(schema)
        lib.impl(schema.split("(")[0], _out_impl(functional), "CompositeExplicitAutograd")
