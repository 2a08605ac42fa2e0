"""Store 4-bit weights two per byte: a Program → the same Program with int4-packed constants.

After export, a 4-bit weight (schemes ``16a4w``, ``16a4w_block``, ``8a4w``, ``w4``) is an int8
constant in [-7, 7] that only dequantize instructions read. This rewrite stores each such
constant with ``ConstantStorage.packing = PACKING_INT4`` (format version 2,
docs/program-format.md) and re-lays out the constant segment without the unpacked bytes.
Nothing else changes: readers unpack on load, so instructions and kernels are the same.

A constant is packed only when every instruction that reads it (in every method) is a
dequantize whose declared ``quant_min``/``quant_max`` lie within [-8, 7] and its bytes
really do; anything else is left as it is.
"""

from __future__ import annotations

import dataclasses


from opforge.program import (
    PACKING_INT4, ConstantStorage, IntValue, KernelCall, Program, ScalarType, Segment, TensorValue,
    constant_array, pack_int4, verify,
)

__all__ = ["pack_4bit_weights"]

# out overload key -> (index of quant_min, index of quant_max) in its arguments
_DEQUANTIZE_RANGE = {
    "quantized_decomposed::dequantize_per_tensor.out": (3, 4),
    "quantized_decomposed::dequantize_per_channel.out": (4, 5),
    "torchao::dequantize_affine.out": (5, 6),
}
_ALIGN = 64


def _packable_values(method) -> set[int]:
    """Indices of int8 constants read only as the input of a 4-bit dequantize."""
    ok: dict[int, bool] = {}
    for ins in method.instructions:
        if type(ins) is not KernelCall:
            for arg in getattr(ins, "args", ()):
                ok[arg] = False
            continue
        key = method.operators[ins.op].key
        bounds = _DEQUANTIZE_RANGE.get(key)
        for position, arg in enumerate(ins.args):
            good = False
            if bounds is not None and position == 0:
                lo, hi = (method.values[ins.args[i]] for i in bounds)
                good = (type(lo) is IntValue and type(hi) is IntValue
                        and lo.value >= -8 and hi.value <= 7)
            ok[arg] = ok.get(arg, True) and good
    return {
        i for i, good in ok.items() if good
        and type(v := method.values[i]) is TensorValue and v.dtype is ScalarType.INT8
        and type(v.storage) is ConstantStorage and not v.storage.packing
    }


def pack_4bit_weights(program: Program) -> Program:
    """``program`` with its 4-bit weights int4-packed (unchanged when there are none)."""
    # every constant region: (segment, offset) -> (stored bytes, packable by all users?)
    regions: dict[tuple[int, int], list] = {}
    for method in program.methods:
        packable = _packable_values(method)
        for i, v in enumerate(method.values):
            if type(v) is TensorValue and type(v.storage) is ConstantStorage:
                key = (v.storage.segment, v.storage.offset)
                entry = regions.setdefault(key, [v.stored_nbytes, True, v])
                if entry[0] != v.stored_nbytes or entry[2].sizes != v.sizes:
                    entry[1] = False  # two views of one region: leave it alone
                entry[1] = entry[1] and i in packable
    segments = {s for (s, _), e in regions.items() if e[1]}
    packed_keys = set()
    for (s, o), (_, good, v) in regions.items():
        if good:
            values = constant_array(program, v)
            if values.size and values.min() >= -8 and values.max() <= 7:
                packed_keys.add((s, o))
    segments = {s for s, _ in packed_keys}
    if not segments:
        return program
    new_segments = list(program.segments)
    moved: dict[tuple[int, int], tuple[int, int]] = {}
    for segment in sorted(segments):
        keys = sorted((o, e) for (s, o), e in regions.items() if s == segment)
        spans = [(o, o + e[0]) for o, e in keys]
        if any(a_end > b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])):
            packed_keys -= {(segment, o) for o, _ in keys}  # overlapping regions: keep as is
            continue
        pool = bytearray()
        source = program.segments[segment].data
        for offset, (nbytes, _, value) in keys:
            start = (len(pool) + _ALIGN - 1) // _ALIGN * _ALIGN
            pool += bytes(start - len(pool))
            if (segment, offset) in packed_keys:
                data = pack_int4(constant_array(program, value)).tobytes()
            else:
                data = bytes(source[offset:offset + nbytes])
            moved[(segment, offset)] = (segment, start)
            pool += data
        new_segments[segment] = Segment(bytes(pool))
    if not moved:
        return program

    def relocate(v):
        if type(v) is not TensorValue or type(v.storage) is not ConstantStorage:
            return v
        key = (v.storage.segment, v.storage.offset)
        if key not in moved:
            return v
        segment, offset = moved[key]
        packing = PACKING_INT4 if key in packed_keys else v.storage.packing
        return dataclasses.replace(v, storage=ConstantStorage(segment, offset, packing))

    methods = tuple(dataclasses.replace(m, values=tuple(relocate(v) for v in m.values))
                    for m in program.methods)
    result = dataclasses.replace(program, methods=methods, segments=tuple(new_segments))
    verify(result)
    return result
