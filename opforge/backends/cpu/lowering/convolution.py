"""Convolution (1-3 spatial dims, grouped, transposed) on oneDNN: constant weights,
channels-last activations (one copy per source).
"""

from __future__ import annotations

from opforge.backends.cpu.lowering.core import (
    LOWERINGS, Lowering, Unsupported, _need_f32, _val, channels_last,
)


# --- heavy ops ------------------------------------------------------------------------------
def lower_convolution(L: Lowering, node, args, kwargs):
    _need_f32(node)
    x, w, b, stride, padding, dilation, transposed, output_padding, groups = args[:9]
    if not (isinstance(w, tuple) and w[0] == "c"):
        raise Unsupported("layout", "aten::convolution with weights computed at run time; the "
                          "cpu backend reorders constant weights once at init")
    if b is not None and not (isinstance(b, tuple) and b[0] == "c"):
        raise Unsupported("layout", "aten::convolution with a bias computed at run time")
    weight = w[1]
    nsp = weight.dim() - 2
    if nsp not in (1, 2, 3):
        raise Unsupported("shape", f"aten::convolution with {nsp} spatial dims")
    fake = _val(node)
    if transposed:
        # torch (in, out/g, k...) → oneDNN (g, out/g, in/g, k...)
        i, og = weight.shape[:2]
        weight = weight.reshape(groups, i // groups, og, *weight.shape[2:]).transpose(1, 2)
        if groups == 1:
            weight = weight[0]
        weight = weight.contiguous()
    elif groups > 1:
        o = weight.shape[0]
        weight = weight.reshape(groups, o // groups, *weight.shape[1:]).contiguous()
    if any(p for p in (output_padding or [])) and not transposed:
        raise Unsupported("shape", "output_padding without transposed")
    if transposed and any(o - p >= s for o, p, s in zip(output_padding, padding, stride)):
        # torch allows output_padding < max(stride, dilation); oneDNN's deconvolution takes no
        # right padding (padding - output_padding) of -stride or less and refuses at load
        raise Unsupported("shape", "a transposed convolution whose output_padding exceeds its "
                          "padding by a stride or more (oneDNN's deconvolution refuses it); "
                          "stays on the kernels")
    src = L.materialize(x)
    src_spec = L.spec(src)
    if len(src_spec.dims) != nsp + 2:
        raise Unsupported("shape", "aten::convolution of an unbatched input")
    # activations of convolution chains are channels-last (one copy per source)
    if src_spec.strides != channels_last(src_spec.dims):
        if src not in L.channels_last_copies:
            cl = L.new_tensor(src_spec.dtype, src_spec.dims, strides=channels_last(src_spec.dims))
            L.copy(src, cl)
            L.channels_last_copies[src] = cl
        src = L.channels_last_copies[src]
    wid = L.materialize(("c", weight))
    ins = [src, wid]
    if b is not None:
        ins.append(L.materialize(b))
    pads_l = list(padding)
    pads_r = []
    for k in range(nsp):
        in_size = src_spec.dims[2 + k]
        out_size = fake.shape[2 + k]
        kernel = (weight.shape[-nsp + k] - 1) * dilation[k] + 1
        if transposed:
            pads_r.append(padding[k] - output_padding[k])
        else:
            pads_r.append((out_size - 1) * stride[k] + kernel - in_size - padding[k])
    out = L.new_tensor(fake.dtype, fake.shape, strides=channels_last(fake.shape))
    ia = [nsp, *stride, *pads_l, *pads_r, *dilation, 1 if b is not None else 0]
    L.op("deconv" if transposed else "conv", ins, [out], ia, name="convolution")
    return ("t", out)


LOWERINGS["aten::convolution"] = lower_convolution
