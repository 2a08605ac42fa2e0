"""Quantizing holds the float weights about once (issue 46: a 1B decoder's 6 GB of float32
weights must quantize and export on a machine of 24 GB).

Where a PT2E quantization made copies of the weights, and what this module does instead:

- ``convert_pt2e`` folds each weight's ``quantize`` with torchao's constant folder, which
  also computes every weight's ``dequantize`` (as float32) and then drops it, and computes
  each ``quantize`` on the whole weight at once (a few float temporaries of its size: the
  output projection's are the largest). :func:`fold_weight_quantizes` runs the same folder
  (the same nodes folded, in the same order, under the same names) without computing the
  dequantizes, and a weight's quantize on ``CHUNK_BYTES`` of its rows at a time;
- a converted graph dequantizes every weight at its top (where convert puts them), so
  running it (quantize's accuracy measurement, ``evaluate``) held every weight's float
  copy at once: :func:`near_users` is a copy whose constant chains sit just before their
  first user (the same values; each float copy dropped after its linear);
- copies of the converted graph (``QuantizedModel.export``, ``weights_only``) share its
  weights (:func:`graph_copy`): only the graph is rewritten;
- torch's and torchao's device lookups cache the graph modules they see, float weights
  and all: :func:`forget_cached_modules` after convert.

The exported program is byte for byte what it was (``tests/backends/test_export_memory.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.fx

__all__ = ["graph_copy", "near_users", "fold_weight_quantizes", "forget_cached_modules",
           "rows_at_a_time", "CHUNK_BYTES"]

CHUNK_BYTES = 8 << 20  # a weight's quantize computed on this many bytes of it at a time


def graph_copy(gm: torch.fx.GraphModule, *, share_state: bool = False) -> torch.fx.GraphModule:
    """A copy of ``gm``'s modules and graph that shares its weights (its parameters and
    integer buffers: a deep copy holds every integer weight twice) and copies the rest
    (float buffers: a KV cache the graph writes is state of its own in each copy, as with
    ``copy.deepcopy``; scales; and any buffer the graph writes, a step counter included).
    The shared weights must not be changed in place.
    ``share_state=True`` shares every tensor: running the copy writes ``gm``'s KV cache, as
    running ``gm`` does."""
    import copy

    from opforge.quantize.state import mutated_buffers

    # an integer buffer the graph writes (a step counter) is state, not a weight
    state = set() if share_state else {id(gm.get_buffer(n)) for n in mutated_buffers(gm)}
    memo: dict[int, Any] = {}
    for module in gm.modules():
        shared = [*module._parameters.values(),
                  *(b for b in module._buffers.values()
                    if b is not None and (share_state or not (b.is_floating_point()
                                                              or b.is_complex()
                                                              or id(b) in state)))]
        for value in shared:
            if value is not None:
                memo[id(value)] = value
    with warnings.catch_warnings():  # torch's own pytree deprecation, inside deepcopy
        warnings.simplefilter("ignore", FutureWarning)
        return copy.deepcopy(gm, memo)


def near_users(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A :func:`graph_copy` of ``gm`` whose constant nodes (``get_attr`` and what computes
    only from them: a weight's dequantize) run just before their first user, a weight's
    dequantize a few rows at a time (:func:`rows_at_a_time`)."""
    copy = graph_copy(gm, share_state=True)  # (a run writes gm's state, as gm's own would)
    graph = copy.graph
    constant: set[torch.fx.Node] = set()
    for node in graph.nodes:
        if node.op == "get_attr" or (node.op == "call_function" and node.all_input_nodes
                                     and all(a in constant for a in node.all_input_nodes)):
            constant.add(node)
    position = {node: i for i, node in enumerate(graph.nodes)}
    for node in reversed(list(graph.nodes)):  # users first: a chain moves as a whole
        if node in constant and node.users:
            first = min(node.users, key=position.__getitem__)
            if position[first] != position[node] + 1:
                first.prepend(node)
                position[node] = position[first] - 1e-9 * (1 + len(node.users))  # before it
            if node.op == "call_function" and node.target in _ROWS_OF:
                node.target = _ROWS_OF[node.target]
    copy.recompile()
    return copy


def fold_weight_quantizes(gm: torch.fx.GraphModule) -> None:
    """``convert_pt2e``'s folding of the weights' quantize nodes into integer constants
    (``fold_quantize=True``), at one weight's integers of extra memory: call
    ``convert_pt2e(prepared, fold_quantize=False)`` then this."""
    from torchao.quantization.pt2e.constant_fold import replace_node_with_constant
    from torchao.quantization.pt2e.quantize_pt2e import _quant_node_constraint

    with torch.utils._python_dispatch._disable_current_modes():
        folder = _WeightFolder(gm, skip_constructors=True)
        folder.run()
        for node, constant in folder.node_replacements.items():
            if _quant_node_constraint(node):
                replace_node_with_constant(gm, node, constant)
        unused = [n for n in gm.graph.find_nodes(op="get_attr") if not n.users]
        for node in unused:
            if hasattr(gm, node.target):
                delattr(gm, node.target)
        for node in unused:
            gm.graph.erase_node(node)
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()


def forget_cached_modules() -> None:
    """Empty the ``lru_cache`` of torch's and torchao's ``assert_and_get_unique_device``:
    prepare and convert call it on the graph modules they make, and the cache kept every
    one alive, with the float weights they read, for the rest of the process (the caller's
    float model was never freed)."""
    import torch.ao.quantization.fx.utils as ao_utils
    import torchao.utils

    for name, module in (("_assert_and_get_unique_device", torchao.utils),
                         ("assert_and_get_unique_device", ao_utils)):
        clear = getattr(getattr(module, name, None), "cache_clear", None)
        if clear is not None:
            clear()


def _folder_class():
    from torchao.quantization.pt2e.constant_fold import ConstantFolder

    class WeightFolder(ConstantFolder):
        """torchao's folder, less its copies: a dequantize (the folder computes one, then
        never folds it: it is "impure" there) is not computed, nor an in-place op; a
        weight's quantize per channel or per block of a row is computed on a few rows at
        a time."""

        def _deduce_value(self, node: torch.fx.Node) -> Any:
            if node.op == "call_function" and node.target in _dequantizes():
                return self.unknown_value
            schema = getattr(node.target, "_schema", None)
            if node.op == "call_function" and schema is not None and schema.is_mutable:
                # an in-place op on a buffer (a step counter's ``add_``) reads constants
                # only: running it here wrote the model's state at convert time
                return self.unknown_value
            if node.op == "call_function":
                args, kwargs = self.fetch_args_kwargs_from_env(node)
                value = _rows_at_a_time(node.target, args, kwargs) if _is_quantize(node.target) \
                    else None
                if value is not None:
                    return value
            return super()._deduce_value(node)

    return WeightFolder


def _WeightFolder(gm: torch.fx.GraphModule, **kwargs):  # noqa: N802 (a class, made lazily)
    return _folder_class()(gm, **kwargs)


def _is_quantize(target) -> bool:
    qd = torch.ops.quantized_decomposed
    return target is qd.quantize_per_channel.default or target in _affine()[:2]


def _dequantizes() -> tuple:
    """The ops torchao's folder treats as impure by their target (``is_impure``)."""
    import torchao.quantization.quant_primitives  # noqa: F401  defines torch.ops.torchao

    qd = torch.ops.quantized_decomposed
    return (qd.dequantize_per_channel.default, qd.dequantize_per_tensor.default,
            qd.dequantize_per_tensor.tensor, qd.convert_element_type.no_fuse,
            torch.ops.torchao.dequantize_affine)


def _rows_at_a_time(target, args: tuple, kwargs: dict) -> torch.Tensor | None:
    """A weight's quantize computed on ``CHUNK_BYTES`` of its rows at a time (each
    element's result depends on its own row's scale only: the same integers; its float
    temporaries are a chunk's), or None (not such an op, or a small weight: computed as
    it is)."""
    qd = torch.ops.quantized_decomposed
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.numel() * 4 <= CHUNK_BYTES \
            or any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return None
    step = max(1, CHUNK_BYTES // max(1, 4 * x.shape[1]))  # rows of float32 per chunk
    if target in (qd.quantize_per_channel.default, qd.dequantize_per_channel.default) \
            and len(args) == 7 and args[3] == 0:
        sliced = (1, 2)  # scales, zero points: one per row
    elif target in _affine() and len(args) >= 5 and len(args[1]) == 2 and args[1][0] == 1:
        sliced = (2, 3)  # scale, zero point: [N, K / block] (or None)
    else:
        return None
    n = x.shape[0]
    for i in sliced:
        if isinstance(args[i], torch.Tensor) and (args[i].dim() == 0 or args[i].shape[0] != n):
            return None
    out = None
    for start in range(0, n, step):
        rows = slice(start, start + step)
        part = list(args)
        part[0] = x[rows]
        for i in sliced:
            if isinstance(args[i], torch.Tensor):
                part[i] = args[i][rows]
        value = target(*part, **kwargs)
        if out is None:
            out = torch.empty((n, *value.shape[1:]), dtype=value.dtype)
        out[rows] = value
    return out


def _affine() -> tuple:
    import torchao.quantization.quant_primitives  # noqa: F401  defines torch.ops.torchao

    ops = torch.ops.torchao
    return (ops.quantize_affine, ops.quantize_affine.default, ops.dequantize_affine,
            ops.dequantize_affine.default)


def rows_at_a_time(target, *args, **kwargs):
    """``target(*args, **kwargs)``, a weight's (de)quantize computed a few rows at a time
    where it is one (the same values: each row reads its own scales): what the measuring
    copy of ``near_users`` runs for a weight's dequantize, and the cpu lowering's fold."""
    value = _rows_at_a_time(target, args, kwargs)
    return target(*args, **kwargs) if value is None else value


def dequantize_per_channel_rows(*args, **kwargs):
    return rows_at_a_time(torch.ops.quantized_decomposed.dequantize_per_channel.default,
                          *args, **kwargs)


def dequantize_affine_rows(*args, **kwargs):
    return rows_at_a_time(torch.ops.torchao.dequantize_affine, *args, **kwargs)


class _RowsOf(dict):
    """A weight's dequantize → the function ``near_users``'s copy calls instead (made on
    first use: the ops exist once torchao is imported)."""

    def _fill(self) -> None:
        if not self:
            import torchao.quantization.quant_primitives  # noqa: F401

            qd, ao = torch.ops.quantized_decomposed, torch.ops.torchao
            self.update({qd.dequantize_per_channel.default: dequantize_per_channel_rows,
                         ao.dequantize_affine: dequantize_affine_rows,
                         ao.dequantize_affine.default: dequantize_affine_rows})

    def __contains__(self, key) -> bool:
        self._fill()
        return dict.__contains__(self, key)


_ROWS_OF = _RowsOf()
