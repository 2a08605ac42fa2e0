"""Every zoo model exports to a valid program that computes what eager PyTorch computes.

The program is executed by a tiny reference interpreter below (test-only, not the
runtime): arena tensors are real views into one byte arena per memory id, so a memory
plan that overlaps two live tensors produces wrong numbers, and each KernelCall runs
torch's own out overload (``torch.ops.<ns>.<op>.<overload>``) with the emitted arguments.
"""

from __future__ import annotations

import pytest
import torch

from opforge.examples.zoo import ZOO
from opforge.export import export
from opforge.program import (
    ArenaStorage, BoolListValue, BoolValue, ConstantStorage, DoubleListValue, DoubleValue,
    IntListValue, IntValue, KernelCall, NoneValue, OptionalTensorListValue, Program,
    ScalarTypeValue, StringValue, TensorListValue, TensorValue, constant_array, from_bytes,
    to_bytes, verify,
)

_TORCH_DTYPE = {
    "FLOAT32": torch.float32, "FLOAT64": torch.float64, "FLOAT16": torch.float16,
    "BFLOAT16": torch.bfloat16, "INT64": torch.int64, "INT32": torch.int32, "INT16": torch.int16,
    "INT8": torch.int8, "UINT8": torch.uint8, "BOOL": torch.bool,
}
_MEMORY_FORMAT = {0: torch.contiguous_format, 1: torch.preserve_format, 2: torch.channels_last}


def _op(key: str):
    name, _, overload = key.partition(".")
    namespace, op = name.split("::")
    return getattr(getattr(getattr(torch.ops, namespace), op), overload or "default")


def run_program(program: Program, method_name: str, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """Execute ``program`` with torch's out kernels (ATen mode in a few lines)."""
    method = program.method(method_name)
    arenas = [torch.full((size,), 0xAB, dtype=torch.uint8) for size in method.memory_plan.arena_sizes]

    def tensor(value: TensorValue) -> torch.Tensor:
        dtype = _TORCH_DTYPE[value.dtype.name]
        storage = value.storage
        if type(storage) is ConstantStorage:
            return torch.from_numpy(constant_array(program, value).copy())
        if value.nbytes == 0:
            return torch.empty(value.sizes, dtype=dtype)
        assert type(storage) is ArenaStorage
        raw = arenas[storage.mem_id][storage.offset: storage.offset + value.nbytes]
        return raw.view(dtype).view(value.sizes)

    def materialize(index: int):
        value = method.values[index]
        kind = type(value)
        if kind is TensorValue:
            return tensor(value)
        if kind is TensorListValue:
            return [tensor(method.values[i]) for i in value.items]
        if kind is OptionalTensorListValue:
            return [None if i is None else tensor(method.values[i]) for i in value.items]
        if kind is NoneValue:
            return None
        if kind is ScalarTypeValue:
            return _TORCH_DTYPE[value.dtype.name]
        if kind in (IntListValue, DoubleListValue, BoolListValue):
            return list(value.values)
        assert kind in (IntValue, DoubleValue, BoolValue, StringValue), kind
        return value.value

    for index, given in zip(method.inputs, inputs):
        tensor(method.values[index]).copy_(given)
    for instruction in method.instructions:
        assert type(instruction) is KernelCall
        op = _op(method.operators[instruction.op].key)
        args = []
        for arg, index in zip(op._schema.arguments, instruction.args):
            value = materialize(index)
            if "MemoryFormat" in str(arg.real_type) and isinstance(value, int):
                value = _MEMORY_FORMAT[value]
            args.append(value)
        positional = [a for a in op._schema.arguments if not a.kwarg_only]
        op(*args[: len(positional)], **{a.name: v for a, v in zip(op._schema.arguments[len(positional):], args[len(positional):])})
    return [materialize(i).clone() for i in method.outputs]


def arena_overlaps(program: Program) -> list[str]:
    """An independent check of the memory plan: two arena tensors whose live ranges over
    the instruction list intersect must not share a byte."""
    problems = []
    for method in program.methods:
        steps = len(method.instructions)
        first: dict[int, int] = {i: -1 for i in method.inputs}
        last: dict[int, int] = {i: -1 for i in method.inputs}
        for step, instruction in enumerate(method.instructions):
            refs = []
            for index in instruction.args:
                value = method.values[index]
                refs.extend(value.items if type(value) in (TensorListValue, OptionalTensorListValue) else [index])
            for index in refs:
                if index is None:
                    continue
                first.setdefault(index, step)
                last[index] = step
        for index in method.outputs:
            first.setdefault(index, steps)
            last[index] = steps
        planned = [
            (i, v) for i, v in enumerate(method.values)
            if type(v) is TensorValue and type(v.storage) is ArenaStorage and v.nbytes
        ]
        for a, (i, u) in enumerate(planned):
            for j, v in planned[a + 1:]:
                if i not in first or j not in first or u.storage.mem_id != v.storage.mem_id:
                    continue
                live_together = first[i] <= last[j] and first[j] <= last[i]
                disjoint = (u.storage.offset + u.nbytes <= v.storage.offset
                            or v.storage.offset + v.nbytes <= u.storage.offset)
                if live_together and not disjoint:
                    problems.append(f"{method.name}: %{i} and %{j} overlap while both live")
    return problems


@pytest.fixture(scope="module", params=sorted(ZOO))
def exported(request):
    model, inputs = ZOO[request.param]()
    return request.param, model, inputs, export(model, inputs)


def test_zoo_program_is_valid_and_round_trips(exported):
    name, _, _, program = exported
    verify(program)
    assert from_bytes(to_bytes(program)) == program


def test_zoo_operator_table_is_out_overloads_only(exported):
    _, _, _, program = exported
    method = program.method("forward")
    keys = [op.key for op in method.operators]
    assert len(keys) == len(set(keys))
    for key in keys:
        schema = _op(key)._schema
        assert any(arg.is_out for arg in schema.arguments), key
    used = {instruction.op for instruction in method.instructions}
    assert used == set(range(len(keys)))


def test_zoo_memory_plan_never_overlaps_live_tensors(exported):
    _, _, _, program = exported
    assert arena_overlaps(program) == []
    meta = program.metadata
    arena = int(meta["opforge.memory_plan.forward.arena_bytes"])
    naive = int(meta["opforge.memory_plan.forward.naive_bytes"])
    assert arena == sum(program.method("forward").memory_plan.arena_sizes)
    assert arena <= naive


def test_zoo_program_computes_what_eager_computes(exported):
    _, model, inputs, program = exported
    with torch.no_grad():
        expected = model(*inputs)
    (actual,) = run_program(program, "forward", inputs)
    torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_mlp_plan_strictly_reuses_memory():
    model, inputs = ZOO["mlp"]()
    meta = export(model, inputs).metadata
    assert int(meta["opforge.memory_plan.forward.arena_bytes"]) < int(meta["opforge.memory_plan.forward.naive_bytes"])


@pytest.mark.parametrize("name", ["mlp", "transformer_layer", "gpt_decoder"])
def test_zoo_with_portable_kernels_keeps_composite_ops_and_still_matches(name):
    model, inputs = ZOO[name]()
    program = export(model, inputs, kernels="portable")
    keys = {op.key for op in program.method("forward").operators}
    assert "aten::linear.out" in keys
    assert program.metadata["opforge.kernels"] == "portable"
    assert arena_overlaps(program) == []
    with torch.no_grad():
        expected = model(*inputs)
    torch.testing.assert_close(run_program(program, "forward", inputs)[0], expected, rtol=1e-4, atol=1e-5)
