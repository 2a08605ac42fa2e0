"""Every op the zoo needs after core-ATen decomposition has a portable kernel — and the
portable kernels, run node by node, reproduce each zoo model's output.

The mapping functional → out overload mirrors the exporter's: the overload of the same op
packet (or of the ``*_copy`` packet for a view op) whose schema takes the same arguments
plus keyword-only ``Tensor(a!)`` outs. Factory arguments (dtype, layout, device,
pin_memory) are dropped before matching: the out tensor already carries the dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from opforge.examples.zoo import ZOO
from opforge.kernels.portable import portable_kernels

_FACTORY_ARGS = {"dtype", "layout", "device", "pin_memory"}

_NUMPY_DTYPES = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_,
}


def _is_out(arg: torch._C.Argument) -> bool:
    return arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write


def _signature(args) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in args if a.name not in _FACTORY_ARGS]


def out_overload(op: torch._ops.OpOverload) -> torch._ops.OpOverload:
    schema = op._schema
    name = schema.name.split("::")[1]
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        name += "_copy"  # a view: its out variant lives on the copy op
    packet = getattr(torch.ops.aten, name)
    wanted = _signature(schema.arguments)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        args = candidate._schema.arguments
        if any(_is_out(a) for a in args) and _signature(
            [a for a in args if not _is_out(a)]
        ) == wanted:
            return candidate
    raise LookupError(f"no out overload for {schema}")


def registry_key(op: torch._ops.OpOverload) -> str:
    return f"{op._schema.name}.{op._schema.overload_name}"


@pytest.fixture(scope="module")
def exported() -> dict[str, tuple]:
    programs = {}
    for name, factory in ZOO.items():
        model, inputs = factory()
        ep = torch.export.export(model, inputs).run_decompositions()
        programs[name] = (model, inputs, ep)
    return programs


def _zoo_ops(ep) -> set[torch._ops.OpOverload]:
    return {n.target for n in ep.graph.nodes
            if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_every_zoo_op_has_a_portable_kernel(exported, name):
    kernels = portable_kernels()
    ops = _zoo_ops(exported[name][2])
    missing = sorted(registry_key(out_overload(op)) for op in ops
                     if registry_key(out_overload(op)) not in kernels)
    assert not missing, f"{name}: no portable kernel for {missing}"


# --- a minimal node-by-node interpreter over the portable kernels ----------------------

def _to_numpy(value):
    if isinstance(value, torch.Tensor):
        return value.detach().numpy().copy()
    return value


def _convert(value, env):
    if isinstance(value, torch.fx.Node):
        return env[value]
    if isinstance(value, (list, tuple)):
        items = [_convert(v, env) for v in value]
        return items if any(isinstance(i, np.ndarray) or i is None for i in items) \
            else tuple(items)
    if isinstance(value, torch.dtype):
        return np.dtype(_NUMPY_DTYPES[value])
    if isinstance(value, (torch.memory_format, torch.layout, torch.device)):
        return None
    return value


def _allocate(fake):
    if isinstance(fake, (list, tuple)):
        return [_allocate(f) for f in fake]
    return np.empty(tuple(fake.shape), dtype=_NUMPY_DTYPES[fake.dtype])


def run_portable(ep, inputs) -> list[np.ndarray]:
    kernels = portable_kernels()
    env: dict = {}
    user_inputs = iter(inputs)
    state = {**ep.state_dict, **ep.constants}
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            spec = specs[node.name]
            src = next(user_inputs) if spec.target is None else state[spec.target]
            env[node] = _to_numpy(src)
        elif node.op == "call_function" and not isinstance(node.target, torch._ops.OpOverload):
            env[node] = _convert(node.args[0], env)[node.args[1]]  # operator.getitem
        elif node.op == "call_function":
            out_op = out_overload(node.target)
            given = dict(zip([a.name for a in node.target._schema.arguments], node.args))
            given.update(node.kwargs)
            outs = _allocate(node.meta["val"])
            out_args = [a for a in out_op._schema.arguments if _is_out(a)]
            fill = outs if len(out_args) > 1 else [outs]
            args = []
            for a in out_op._schema.arguments:
                if _is_out(a):
                    args.append(fill[out_args.index(a)])
                elif a.name in given:
                    args.append(_convert(given[a.name], env))
                else:
                    args.append(_convert(a.default_value, env))
            assert kernels[registry_key(out_op)](*args) is None
            env[node] = outs
        elif node.op == "output":
            return [env[v] for v in node.args[0]]
    raise AssertionError("graph has no output node")


@pytest.mark.parametrize("name", sorted(ZOO))
def test_portable_kernels_reproduce_the_zoo(exported, name):
    model, inputs, ep = exported[name]
    with torch.no_grad():
        expected = model(*inputs)
    (got,) = run_portable(ep, inputs)
    # float32 end to end through a few dozen ops: accumulated rounding, not one ulp.
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("functional, out", [
    (torch.ops.aten.add.Tensor, "aten::add.out"),
    (torch.ops.aten.add.Scalar, "aten::add.Scalar_out"),
    (torch.ops.aten.sum.dim_IntList, "aten::sum.IntList_out"),
    (torch.ops.aten.var.correction, "aten::var.correction_out"),
    (torch.ops.aten.where.self, "aten::where.self_out"),
    (torch.ops.aten.view.default, "aten::view_copy.out"),
    (torch.ops.aten.slice.Tensor, "aten::slice_copy.Tensor_out"),
    (torch.ops.aten.select.int, "aten::select_copy.int_out"),
    (torch.ops.aten.split_with_sizes.default, "aten::split_with_sizes_copy.out"),
    (torch.ops.aten.unbind.int, "aten::unbind_copy.int_out"),
    (torch.ops.aten.arange.start_step, "aten::arange.start_out"),
    (torch.ops.aten.full_like.default, "aten::full_like.out"),
    (torch.ops.aten._to_copy.default, "aten::_to_copy.out"),
])
def test_out_overload_mapping(functional, out):
    assert registry_key(out_overload(functional)) == out


def test_a_missing_kernel_is_reported(exported, monkeypatch):
    import opforge.kernels.portable.linalg as linalg

    monkeypatch.delitem(linalg.KERNELS, "aten::addmm.out")
    with pytest.raises(AssertionError, match="aten::addmm.out"):
        test_every_zoo_op_has_a_portable_kernel(exported, "mlp")
