"""Out variants of the quantize / dequantize operators that converted PT2E graphs contain.

``quantized_decomposed`` and ``torchao`` define functional overloads only; their out
overloads (``quantized_decomposed::quantize_per_tensor.out`` and the like) are among the
library out variants ``opforge.torch_bridge.library_ops`` adds. This module keeps the
quantize ops' own names: importing it registers them once; ``ensure_registered()`` is the
explicit call.
"""

from __future__ import annotations

from opforge.torch_bridge.library_ops import LIBRARY_OUT_SCHEMAS, ensure_registered

__all__ = ["ensure_registered", "QUANTIZED_OUT_SCHEMAS"]

QUANTIZED_OUT_SCHEMAS: dict[str, str] = {
    name: schema for name, schema in LIBRARY_OUT_SCHEMAS.items()
    if name.startswith(("quantized_decomposed::", "torchao::"))
}

ensure_registered()
