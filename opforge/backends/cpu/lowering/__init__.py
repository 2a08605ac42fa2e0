"""Subgraph → the cpu engine's plan: tensors (dtype, dims, strides, role) and ops.

Ahead of time, with torch: constants are folded (any node whose inputs are all constants
is evaluated here), batch norm after a convolution is folded into its weights, views
become strided aliases (no copy), elementwise ops after convolution/matmul/binary/pooling
become oneDNN post-ops, and 4-d activations of convolution chains are kept channels-last.

One module per op family; each adds its lowerings to ``LOWERINGS`` when imported.
"""

from __future__ import annotations

from opforge.backends.cpu.lowering.core import (  # noqa: F401
    ABS,
    B_ADD,
    B_DIV,
    B_MAX,
    B_MIN,
    B_MUL,
    B_SUB,
    CLIP,
    DNNL_KINDS,
    ELU,
    EW,
    EXP,
    FOLDABLE_NAMESPACES,
    GELU_ERF,
    GELU_TANH,
    GENERIC_DTYPES,
    HARDSIGMOID,
    HARDSWISH,
    LINEAR,
    LOG,
    LOGISTIC,
    LOWERINGS,
    Lowering,
    MISH,
    POW,
    Plan,
    RELU,
    ROUND,
    SOFT_RELU,
    SQRT,
    SQUARE,
    SWISH,
    TANH,
    TensorSpec,
    Unsupported,
    _alias,
    _all_constant,
    _broadcast_strides,
    _dense,
    _dense_operand,
    _expand,
    _fold,
    _need_f32,
    _out,
    _post_operand_misread,
    _tensor_args,
    _tidy_strides,
    _unwrap,
    _uses_output,
    _val,
    aten,
    channels_last,
    row_major,
)
from opforge.backends.cpu.lowering.elementwise import (  # noqa: F401
    BINARY,
    ELTWISE,
    _clamp,
    _clamp_tensors,
    _elu,
    _rsub,
    _softplus,
    lower_binary,
    lower_eltwise,
    lower_full_like,
    lower_generic_ew,
    lower_masked_fill,
    lower_named_ew,
    lower_pow,
    lower_where,
    lower_zeros_like,
)
from opforge.backends.cpu.lowering.views import (  # noqa: F401
    VIEW_OPS,
    _fit_affine,
    _positions,
    _runs,
    _select_runs,
    lower_cat,
    lower_constant_pad,
    lower_index_select,
    lower_stack,
    lower_to_copy,
    lower_view,
)
from opforge.backends.cpu.lowering.convolution import (  # noqa: F401
    lower_convolution,
)
from opforge.backends.cpu.lowering.matmul import (  # noqa: F401
    _matmul_operand,
    lower_mm,
)
from opforge.backends.cpu.lowering.pooling import (  # noqa: F401
    _pool_dst_strides,
    lower_adaptive_avg,
    lower_pool,
)
from opforge.backends.cpu.lowering.normalization import (  # noqa: F401
    lower_batch_norm,
    lower_group_norm,
    lower_layer_norm,
    lower_softmax,
)
from opforge.backends.cpu.lowering.reduction import (  # noqa: F401
    REDUCE,
    lower_reduce,
)
from opforge.backends.cpu.lowering.embedding import (  # noqa: F401
    lower_embedding,
)
from opforge.backends.cpu.lowering.indexing import (  # noqa: F401
    lower_index,
    lower_index_copy,
    lower_index_put,
    lower_scatter_region,
)
from opforge.backends.cpu.lowering.quantized import (  # noqa: F401
    Int8Pattern,
    QUANT_DTYPES,
    _const,
    _int8_weight,
    _is,
    _match_compute,
    _per_tensor_u8,
    _qd,
    _qop,
    find_int8_patterns,
    lower_quant,
)
from opforge.backends.cpu.lowering.roll import lower_roll  # noqa: F401
from opforge.backends.cpu.lowering.fusion import (  # noqa: F401
    FUSABLE,
    MAX_POST_OPS,
    _fuse,
    _last_write,
    _readers,
    _root,
    _starts_chain,
    _zero_constant,
    fuse,
    prune,
)
