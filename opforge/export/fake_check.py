"""After capture: each custom operator's fake checked against its real implementation.

    check_fakes(method, example_inputs)     # ExportError on the first disagreement

# Design
#
# ``torch.export`` never runs a custom op's real kernel: it traces with fake tensors, and
# every shape it plans comes from the op's fake (``fake:`` / ``register_fake``, or the
# default one that shapes each output like the first tensor input). A wrong fake is not
# an error anywhere after that: the memory plan gives the op's output the fake's shape,
# the kernel writes into it, and the program computes wrong numbers without a word
# (``gelu_mul(w[1,16], x[6,16])`` planned as [1,16]). So export checks, once, what
# ``torch.library.opcheck`` checks: the shapes and dtypes the fake gives for the op's
# inputs against what the real implementation returns on those inputs.
#
# The inputs are the real ones: the captured graph is interpreted (``torch.fx.Interpreter``)
# on the example inputs, parameters and buffers, and at each custom-op node the real
# output is compared with the node's fake value (``meta["val"]``), whose symbolic sizes
# are evaluated at the example (their hints) — so a dynamic method is checked at its
# example shapes. Cost: nothing for a graph without custom ops (most of the zoo); else
# one eager run of the graph up to its last custom-op node, each node once, values freed
# after their last use, under ``no_grad`` and with the RNG state restored. Measured: an
# 8-layer decoder (dim 256, a 512-position cache, a 64-token example) with a custom op at
# its end, 1.1 s beside a 5 s export on 2 busy cores (0.13 s of it copying the caches).
# torch.export's graph keeps in-place updates of buffers (a KV cache's ``index_copy_``),
# so a placeholder the graph writes is run on a copy: the model is left as it was.
#
# What is not checked, and why: a custom op whose real implementation cannot run here
# (no Python reference and no loaded native kernel, an input it refuses, a graph input
# that cannot be matched to the example inputs) stops the check where it is — export
# never needed eager execution and does not start needing it now. An op whose eager path
# is a native kernel (``set_out_kernel``) allocates its outputs from the fake, so there
# the Python reference, if the op has one, gives the real shapes.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx

from opforge.errors import ExportError
from opforge.export.diagnostics import node_location
from opforge.export.method_graph import InputKind, MethodGraph

__all__ = ["check_fakes", "custom_op_nodes"]

# torch's and torchao's quantize / dequantize ops (every quantized model's) count as built
# in: their fakes ship with the ops, and running a quantized decoder's graph to check them
# computed every dequantized weight at once (PT2E puts them at the graph's top): the whole
# model's float32 weights beside the integers, during capture
_BUILT_IN = frozenset({"aten", "prims", "quantized_decomposed", "torchao"})


def custom_op_nodes(method: MethodGraph) -> list[torch.fx.Node]:
    """The graph's calls of custom operators (any namespace but ``aten`` and ``prims``)."""
    return [n for n in method.call_nodes()
            if isinstance(n.target, torch._ops.OpOverload) and n.target.namespace not in _BUILT_IN]


class _Stop(Exception):
    """Raised after the last custom-op node: the rest of the graph need not run."""


class _RealRun(torch.fx.Interpreter):
    def __init__(self, method: MethodGraph, custom: list[torch.fx.Node], api: str) -> None:
        super().__init__(method.graph_module)
        self.extra_traceback = False  # our ExportError goes out as it is
        self.method, self.custom, self.last, self.api = method, set(custom), custom[-1], api

    def run_node(self, node: torch.fx.Node) -> Any:
        value = super().run_node(node)
        if node in self.custom:
            _compare(self.api, self.method.name, node, value, self._reference_output(node))
            if node is self.last:
                raise _Stop
        return value

    def _reference_output(self, node: torch.fx.Node) -> Any:
        """With a native kernel bound, the eager output is shaped by the fake itself:
        the op's Python reference (if any) says what the real shapes are."""
        from opforge.torch_bridge.registration import has_out_kernel, registered_opdef

        name = node.target._schema.name  # "ns::op"
        opdef = registered_opdef(name)
        if opdef is None or opdef.python_impl is None or not has_out_kernel(name):
            return None
        from opforge.manifest import resolve_reference

        reference = resolve_reference(opdef.python_impl, what="python implementation",
                                      source=opdef.source)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        return reference(*args, **kwargs)


def check_fakes(method: MethodGraph, example_inputs: tuple | None, *,
                api: str = "opforge.export.export") -> None:
    """Refuse a custom op whose fake disagrees with its real implementation on the
    example inputs (``ExportError`` naming the op, the shapes and the fix)."""
    custom = custom_op_nodes(method)
    if not custom or example_inputs is None:
        return
    inputs = _graph_inputs(method, example_inputs)
    if inputs is None:
        return
    run = _RealRun(method, custom, api)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            run.run(*inputs, enable_io_processing=False)
        except _Stop:  # past the last custom op
            pass
        except ExportError:  # a fake that disagrees
            raise
        except Exception:  # noqa: BLE001 - the real run cannot go on; see "What is not checked"
            return


def _graph_inputs(method: MethodGraph, example_inputs: tuple) -> list | None:
    """The graph's placeholder values: the example inputs' leaves for the user inputs,
    the method's constants (parameters, buffers) for the rest; None if they do not match.
    A placeholder the graph writes (a KV cache's ``index_copy_``: torch.export's graph
    keeps in-place updates of buffers) is given a copy, so the model is left as it was."""
    leaves = torch.utils._pytree.tree_leaves(tuple(example_inputs))
    placeholders = method.placeholders()
    users = [n for n in placeholders if method.input_kinds.get(n.name) == InputKind.USER]
    if len(leaves) != len(users):
        return None
    written = _written_placeholders(method.graph)
    given = iter(leaves)
    values = []
    for node in placeholders:
        if method.input_kinds.get(node.name) == InputKind.USER:
            value = next(given)
        elif node.name in method.constants:
            value = method.constants[node.name]
        else:
            return None
        values.append(value.clone() if node in written and isinstance(value, torch.Tensor)
                      else value)
    return values


def _written_placeholders(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """Placeholders an in-place op writes, directly or through views of them."""
    written = set()
    for node in graph.nodes:
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
            continue
        for argument, value in zip(target._schema.arguments, node.args):
            if argument.alias_info is None or not argument.alias_info.is_write:
                continue
            while isinstance(value, torch.fx.Node) and value.op == "call_function" and \
                    isinstance(value.target, torch._ops.OpOverload) and value.target.is_view:
                value = value.args[0]
            if isinstance(value, torch.fx.Node) and value.op == "placeholder":
                written.add(value)
    return written


def _meta(value: Any) -> tuple | None:
    """(dtype, sizes) of a tensor, a symbolic size as its example value (None if it has
    none: an unbacked, data-dependent size is not compared)."""
    if not isinstance(value, torch.Tensor):
        return None
    sizes = []
    for size in value.shape:
        if isinstance(size, torch.SymInt):
            size = size.node.hint
        sizes.append(None if size is None else int(size))
    return str(value.dtype).removeprefix("torch."), tuple(sizes)


def _flat(value: Any) -> list:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _shown(meta: tuple | None) -> str:
    if meta is None:
        return "a non-tensor"
    dtype, sizes = meta
    return f"{dtype}[{', '.join('?' if s is None else str(s) for s in sizes)}]"


def _agree(fake: tuple | None, real: tuple | None) -> bool:
    if fake is None or real is None:
        return fake is real
    return fake[0] == real[0] and len(fake[1]) == len(real[1]) and all(
        f is None or f == r for f, r in zip(fake[1], real[1]))


def _compare(api: str, method: str, node: torch.fx.Node, value: Any, reference: Any) -> None:
    real_value = value if reference is None else reference
    fakes, reals = _flat(node.meta.get("val")), _flat(real_value)
    fake_metas = [_meta(f) for f in fakes]
    real_metas = [_meta(r) for r in reals]
    if len(fakes) == len(reals) and all(map(_agree, fake_metas, real_metas)):
        return
    op = node.target._schema.name
    args = [_meta(a.meta.get("val")) if isinstance(a, torch.fx.Node) else None
            for a in node.args]
    shown_args = ", ".join(_shown(m) if m is not None else "…" for m in args)
    where = node_location(node)
    raise ExportError(
        f"`{api}`: custom op {op} (node {node.name} of method {method!r}"
        + (f" at {where}" if where else "") + ") — on the example inputs "
        f"({shown_args}) its fake gives {', '.join(map(_shown, fake_metas))}, its real "
        f"implementation {', '.join(map(_shown, real_metas))} — valid: a fake (shape and dtype "
        f"function) that agrees with the real op — fix: {_fix(op)}")


def _fix(op: str) -> str:
    from opforge.torch_bridge.registration import registered_opdef

    opdef = registered_opdef(op)
    short = op.split("::")[-1]
    if opdef is None:
        return (f"correct the fake registered for {op} (torch.library.register_fake); "
                "torch.library.opcheck runs it against the real op")
    if opdef.fake is None:
        return (f"the op has no fake, and the default one shapes every output like its first "
                "tensor input (wrong for broadcasting, reductions, dtype changes): write one — "
                f"`fake: module:function` in {opdef.source}, or `@{short}.register_fake` for an "
                "@opforge.op (docs/manifest.md, `fake`)")
    name = opdef.fake if isinstance(opdef.fake, str) else getattr(
        opdef.fake, "__qualname__", repr(opdef.fake))
    return (f"correct its fake {name} (defined with the op at {opdef.source}); "
            f"`opforge check` runs the fake against the real op on many shapes")
