"""Max and average pooling (1-3 d) and adaptive average pooling on oneDNN.
"""

from __future__ import annotations

import torch
import torch.fx

from opforge.backends.partition import op_name
from opforge.backends.cpu.lowering.core import (
    LOWERINGS, Lowering, TensorSpec, Unsupported, _dense, _expand, _need_f32, _uses_output, _val,
    channels_last,
)


def lower_pool(L: Lowering, node, args, kwargs, source: int | None = None):
    """``source``: the engine tensor to pool instead of ``args[0]`` (a uint8 activation a
    max pooling reads as it is: ``lowering/quantized.py``, ``Uint8MaxPool``); the output
    takes its dtype."""
    if source is None:
        _need_f32(node)
    name = op_name(node).split(".")[0]
    fake = _val(node)
    fakes = list(fake) if isinstance(fake, (tuple, list)) else [fake]
    x = L.materialize(args[0]) if source is None else source
    spec = L.spec(x)
    nsp = len(spec.dims) - 2
    if nsp < 1:
        raise Unsupported("shape", f"{name} of an unbatched input")
    if not _dense(spec) and spec.strides[1] == 1 and spec.dims[1] > 1:
        # a channel slice of a channels-last activation (timm Res2Net pools one per stage):
        # oneDNN pools a view with gaps on its reference kernel; a dense channels-last copy
        # of it (values moved, not rounded) on its jit one
        dense = L.new_tensor(spec.dtype, spec.dims, strides=channels_last(spec.dims))
        L.copy(x, dense)
        x, spec = dense, L.spec(dense)
    if name.startswith("aten::max_pool"):
        if _uses_output(node, 1):
            raise Unsupported("op", f"{name}: the indices output is used; oneDNN returns no indices")
        kernel = list(args[1]); stride = list(args[2]) if len(args) > 2 and args[2] else kernel
        padding = list(args[3]) if len(args) > 3 else [0] * nsp
        dilation = list(args[4]) if len(args) > 4 else [1] * nsp
        kind = 0
    else:
        kernel = list(args[1]); stride = list(args[2]) if len(args) > 2 and args[2] else kernel
        padding = list(args[3]) if len(args) > 3 else [0] * nsp
        include = args[5] if len(args) > 5 else True
        if len(args) > 6 and args[6] is not None:
            raise Unsupported("op", f"{name} with divisor_override")
        dilation = [1] * nsp
        kind = 1 if include else 2
    kernel, stride, padding, dilation = (_expand(v, nsp) for v in (kernel, stride, padding, dilation))
    out_dims = tuple(fakes[0].shape)
    pads_r = []
    for k in range(nsp):
        eff = (kernel[k] - 1) * dilation[k] + 1
        pads_r.append((out_dims[2 + k] - 1) * stride[k] + eff - spec.dims[2 + k] - padding[k])
        if kind == 1 and pads_r[-1] > padding[k]:
            raise Unsupported("shape", f"{name} with ceil_mode windows past the padding "
                              "(counted differently by oneDNN); stays on the kernels")
    out = L.new_tensor(fakes[0].dtype if source is None else spec.dtype, out_dims,
                       strides=_pool_dst_strides(spec, out_dims))
    L.op("pool", [x], [out], [kind, nsp, *kernel, *stride, *padding, *pads_r, *dilation], name="pooling")
    return (("t", out), None) if isinstance(fake, (tuple, list)) else ("t", out)


def _pool_dst_strides(spec: TensorSpec, dst_dims) -> tuple[int, ...] | None:
    """The layout the engine gives a pooling's destination: channels-last whenever the
    source's channel stride is 1 (with more than one channel), whatever its other strides
    (native/engine.cpp add_pool), e.g. a channel slice of a channels-last activation
    (timm's Res2Net pools one). The plan must say the same or the next op misreads it."""
    if len(spec.dims) >= 3 and spec.strides[1] == 1 and spec.dims[1] > 1:
        return channels_last(dst_dims)
    return None


def lower_adaptive_avg(L, node, args, kwargs):
    _need_f32(node)
    src = L.materialize(args[0])
    spec = L.spec(src)
    out_size = list(args[1])
    nsp = len(out_size)
    in_sp = spec.dims[-nsp:]
    if any(i % o for i, o in zip(in_sp, out_size)):
        raise Unsupported("shape", "adaptive average pooling whose output does not divide the input")
    kernel = [i // o for i, o in zip(in_sp, out_size)]
    fake = _val(node)
    out = L.new_tensor(torch.float32, fake.shape, strides=_pool_dst_strides(spec, fake.shape))
    L.op("pool", [src], [out], [1, nsp, *kernel, *kernel, *([0] * nsp), *([0] * nsp), *([1] * nsp)],
         name="pooling")
    return ("t", out)


LOWERINGS["aten::max_pool2d_with_indices"] = lower_pool
LOWERINGS["aten::max_pool3d_with_indices"] = lower_pool
LOWERINGS["aten::max_pool2d"] = lower_pool
LOWERINGS["aten::avg_pool2d"] = lower_pool
LOWERINGS["aten::avg_pool3d"] = lower_pool
LOWERINGS["aten::avg_pool1d"] = lower_pool
LOWERINGS["aten::_adaptive_avg_pool2d"] = lower_adaptive_avg
LOWERINGS["aten::adaptive_avg_pool2d"] = lower_adaptive_avg
