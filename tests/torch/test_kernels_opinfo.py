"""Portable kernels against PyTorch's own operator test data: OpInfo sample inputs.

For every OpInfo in ``torch.testing._internal.common_methods_invocations.op_db`` whose
functional ATen op has an out variant with a portable kernel, each of its reference
inputs (its sample inputs followed, where it has them, by PyTorch's extra reference cases:
Python scalars, extremal values, type promotion; at most MAX_SAMPLES per dtype, picked
deterministically, see ``_samples``), for dtypes float32, float64, int64, int32, bool and
float16 where the OpInfo supports them, becomes one ATen call:

1. the sample's ``input, *args, **kwargs`` are mapped onto the functional ATen op (the
   OpInfo's ``aten_name``, or an explicit adapter in ``ADAPTERS`` where the Python API's
   signature is not ATen's), and its overload is resolved the way ``torch.ops.aten.X(...)``
   resolves it: the first overload whose schema type-checks the arguments;
2. the reference is that overload, called through ``torch.ops.aten``;
3. the out overload is the exporter's: the same packet's (a view's ``*_copy`` packet's)
   overload taking the same arguments plus keyword-only ``Tensor(a!)`` outs, factory
   arguments (dtype, layout, device, pin_memory) carried by the out tensor instead;
4. the portable kernel runs positionally in out-schema order on NumPy views of the same
   tensors (strides kept), three ways: unbound, bound (``kernel.bind``) on writable inputs,
   and bound on read-only inputs (what program constants look like: binders may fold
   them); each bound pair runs twice, the second time over garbage left in the outs;
5. outputs are compared with the reference (shape, dtype, values), and inputs must be
   unchanged afterwards. Two outputs ATen leaves unspecified are checked for what is
   specified: ``empty``/``empty_like`` values (shape and dtype only) and the indices of
   equal values in a non-stable sort or topk (the input gathered at them must equal the
   values).

A sample the out variant cannot express, or that needs what the portable library
documents as unsupported, is filtered by a named rule (``RULES``, with its reason), and
the test prints how many samples each rule took and how many were exercised; an OpInfo
that exercises no sample fails. ``test_every_portable_kernel_is_covered`` requires every
portable key to be reached by some OpInfo sample or listed in ``COVERED_ELSEWHERE`` with
the test file that covers it.

Tolerances (``TOLERANCE``, rtol and atol per op class and dtype). Integers and bool are
compared exactly. float32 / float64 / float16 epsilons are 1.2e-7 / 2.2e-16 / 9.8e-4.
- "exact": one correctly rounded IEEE operation per element, or none (copies, add,
  division, comparisons, rounding, min/max, indexing): ATen and NumPy agree bit for bit
  except where ATen fuses a multiply-add (``a + alpha * b``, ``addcmul``-style formulas)
  or computes float16 through float32: 2 ulp relative (rtol 2.4e-7 / 4.5e-16 / 1e-3) and
  an absolute floor for results that cancel to near zero (1e-6 / 1e-14 / 1e-3; OpInfo
  samples are O(10)).
- "transcendental": exp, log, sin, erf, pow, tanh-based activations…: ATen vectorises them
  with SLEEF-style polynomials, NumPy calls its own SIMD/libm code, each within ~1-4 ulp,
  and multi-step formulas (gelu, silu, softplus, elu) round a few times: float32 rtol 5e-6
  (~40 ulp: the sum of a few 4-ulp errors, amplified by up to ~3x where an activation's
  formula cancels), atol 1e-6; float64 rtol 1e-13 / atol 1e-14 (the erf-based GELU's
  documented 1e-14 bound plus roundings); float16 rtol/atol 2e-3 (two half roundings).
- "accumulate": matmul, convolution, reductions and normalisation sum in a different order
  (BLAS blocking, pairwise summation, Welford vs two-pass variance); the error bound is
  ~n·eps·sum(|x|), so with OpInfo's sizes (n <= a few hundred, |x| <= 9) float32 allows
  rtol/atol 1e-4, float64 1e-11, and float16 (both sides accumulate in float32 and round
  once, but 1 half ulp of a sum of O(100) is ~0.06) rtol 1e-2 / atol 5e-2.

Special values (``expected_outputs``): for transcendental and accumulate ops in float32 and
float16, an element where PyTorch's result and the same call in float64 (rounded to the
sample's dtype) disagree on NaN / +inf / -inf / finite is expected to be the float64 one:
ATen's vectorised code decides those by its code path, which differs by CPU.
"""

from __future__ import annotations

import functools
import random
from collections import Counter
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pytest
import torch
from torch.testing._internal import common_utils
from torch.testing._internal.common_methods_invocations import op_db  # seconds: once

from opforge.kernels.portable import portable_kernels

KERNELS = portable_kernels()

DTYPES = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.float16)
# Samples per (OpInfo, dtype), chosen deterministically under a fixed seed (see _samples):
# enough to reach the Python-scalar and extremal-value cases of every op while keeping
# the file under a minute on 2 cores.
MAX_SAMPLES = 32
MAX_ELEMENTS = 1 << 16

NUMPY_DTYPES = {
    torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64,
    torch.int8: np.int8, torch.uint8: np.uint8, torch.int16: np.int16,
    torch.int32: np.int32, torch.int64: np.int64, torch.bool: np.bool_,
}

# Named rules: every sample that is not exercised is taken by exactly one of these.
RULES = {
    "unsupported_dtype": "a tensor or dtype outside NUMPY_DTYPES, the real dtypes the "
                         "portable kernels compute in (complex is not implemented; NumPy has "
                         "no bfloat16; uint16/32/64 are outside ATen's CPU kernels' dtypes)",
    "no_out_overload": "the functional overload has no out overload in ATen (e.g. var.default, "
                       "std.default), so no program can call a kernel for it",
    "no_portable_kernel": "ATen has the out overload but the portable library does not "
                          "implement it (a coverage gap, listed per key in the output)",
    "over_size_budget": "the sample's tensors hold more than MAX_ELEMENTS elements (a few "
                        "reference inputs of ~1M elements): three kernel runs of each would "
                        "cost seconds per op and reach no code path a 64K sample does not",
    "scalar_self": "the sample's first operand is a Python number (mul(5.1, t)) and the op "
                   "has no Scalar-self overload (remainder.Scalar_Tensor and the like are "
                   "exercised): the Python binding wraps it in a 0-d 'wrapped number' "
                   "tensor, which an ATen call, and so an out variant, cannot express",
    "python_only_argument": "the sample uses a Python-API option with no ATen argument (a "
                            "padding string, embedding's max_norm, a dtype= that decomposes "
                            "into _to_copy + op)",
    "storage_outside_input": "as_strided reads ATen's storage, the portable kernel its input's "
                             "own elements in row-major order; the exporter rebases an explicit "
                             "offset onto the input (the adapter does the same) and refuses an "
                             "as_strided that reads storage outside its input (a partial view's "
                             "neighbours), which no program can express",
}

# --- OpInfo → functional ATen call ---------------------------------------------------------


class Excluded(Exception):
    """A sample taken by a rule in RULES."""

    def __init__(self, rule: str, detail: str = ""):
        assert rule in RULES, rule
        super().__init__(f"{rule}: {detail}")
        self.rule = rule


def _drop_false(kwargs: dict, *names: str) -> dict:
    """Python-only flags whose default changes nothing (inplace=False, requires_grad=False)."""
    kwargs = dict(kwargs)
    for name in names:
        if kwargs.pop(name, False):
            raise Excluded("python_only_argument", f"{name}=True")
    return kwargs


def _nonzero(s):
    # torch.nonzero's as_tuple is Python's (aten::nonzero has none); True is nonzero_numpy
    return "nonzero", (s.input,), _drop_false(s.kwargs, "as_tuple")


def _where(s):
    return "where", (s.args[0], s.input, s.args[1]), s.kwargs


def _pad_constant(s):
    pad, mode, value = (list(s.args) + ["constant", 0.0])[:3]
    mode, value = s.kwargs.get("mode", mode), s.kwargs.get("value", value)
    assert mode == "constant"
    return "constant_pad_nd", (s.input, pad, 0.0 if value is None else value), {}


def _softmax(name):
    def adapt(s):
        dim = s.kwargs.get("dim", s.args[0] if s.args else None)
        if s.kwargs.get("dtype") is not None or len(s.args) > 1:
            raise Excluded("python_only_argument", "dtype= (decomposes into _to_copy)")
        return name, (s.input, dim, False), {}
    return adapt


def _pair(v) -> tuple:
    return (v, v) if isinstance(v, int) else tuple(v)


def _conv2d(s):
    given = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    given.update(zip(("weight", "bias", "stride", "padding", "dilation", "groups"), s.args))
    given.update(s.kwargs)
    if isinstance(given["padding"], str):
        raise Excluded("python_only_argument", f"padding={given['padding']!r}")
    x = s.input if s.input.dim() == 4 else s.input.unsqueeze(0)  # as F.conv2d does (C, H, W)
    return "convolution", (x, given["weight"], given["bias"], _pair(given["stride"]),
                           _pair(given["padding"]), _pair(given["dilation"]), False, (0, 0),
                           given["groups"]), {}


def _max_pool(name):
    def adapt(s):
        names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        given = dict(zip(names, s.args))
        given.update(s.kwargs)
        given.pop("return_indices", None)  # ATen computes the indices either way
        given = {k: v for k, v in given.items() if v is not None}
        return name, (s.input,), given
    return adapt


def _adaptive_pool(name, spatial):
    def adapt(s):
        size = s.kwargs.get("output_size", s.args[0] if s.args else None)
        size = (size,) * spatial if isinstance(size, int) else tuple(size)
        # F.adaptive_*_pool{2,3}d read None as "the input's size"; ATen always returns the
        # indices of a max pool (return_indices only chooses what Python hands back).
        size = tuple(s.input.shape[i - spatial] if v is None else v for i, v in enumerate(size))
        return name, (s.input, size), {}
    return adapt


def _embedding(s):
    weight, indices = s.input, s.args[0]  # the OpInfo's lambda takes (weight, indices)
    given = dict(s.kwargs)
    if given.get("max_norm") is not None or given.get("sparse"):
        raise Excluded("python_only_argument", "max_norm / sparse")
    padding_idx = given.get("padding_idx")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    return "embedding", (weight, indices, -1 if padding_idx is None else padding_idx,
                         bool(given.get("scale_grad_by_freq", False))), {}


def _batch_norm(s):
    names = ("running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
    given = dict(zip(names, s.args))
    given.update(s.kwargs)
    x, weight, bias = s.input, given.get("weight"), given.get("bias")
    mean, var = given.get("running_mean"), given.get("running_var")
    momentum, eps = given.get("momentum", 0.1), given.get("eps", 1e-5)
    if not given.get("training"):
        return "_native_batch_norm_legit_no_training", (
            x, weight, bias, mean, var, momentum, eps), {}
    if mean is None:  # batch statistics, nothing to update: the no_stats overload
        return "_native_batch_norm_legit", (x, weight, bias, True, momentum, eps), {}
    return "_native_batch_norm_legit", (x, weight, bias, mean, var, True, momentum, eps), {}


def _layer_norm(s):
    names = ("normalized_shape", "weight", "bias", "eps")
    given = dict(zip(names, s.args))
    given.update(s.kwargs)
    return "native_layer_norm", (s.input, given["normalized_shape"], given.get("weight"),
                                 given.get("bias"), given.get("eps", 1e-5)), {}


def _group_norm(s):
    names = ("num_groups", "weight", "bias", "eps")
    given = dict(zip(names, s.args))
    given.update(s.kwargs)
    x = s.input
    hxw = int(np.prod(x.shape[2:])) if x.dim() > 2 else 1
    return "native_group_norm", (x, given.get("weight"), given.get("bias"), x.shape[0],
                                 x.shape[1], hxw, given["num_groups"],
                                 given.get("eps", 1e-5)), {}


def _as_strided(s):
    # What the exporter writes (opforge/export/passes/to_out_variant.py): the input as its
    # own buffer (a clone), an explicit storage offset rebased onto it.
    x, (size, stride), offset = s.input, s.args[:2], s.kwargs.get("storage_offset")
    start = (x.storage_offset() if offset is None else offset) - x.storage_offset()
    reach = start + sum((n - 1) * st for n, st in zip(size, stride))
    if 0 not in size and (not x.is_contiguous() or start < 0 or reach >= x.numel()):
        raise Excluded("storage_outside_input", f"storage_offset={offset} of {x.storage_offset()}")
    return "as_strided", (x.clone(), size, stride), (
        {} if offset is None else {"storage_offset": start})


# OpInfos whose Python signature is not their ATen op's: (OpInfo name, variant) → adapter
# returning (ATen packet name, args, kwargs). Composite Python functions map to the ATen op
# torch.export's decomposition produces (softmax → _softmax, conv2d → convolution, …).
ADAPTERS = {
    ("where", ""): _where,
    ("nonzero", ""): _nonzero,
    ("as_strided", ""): _as_strided,
    ("as_strided", "partial_views"): _as_strided,
    ("nn.functional.pad", "constant"): _pad_constant,
    ("softmax", ""): _softmax("_softmax"),
    ("log_softmax", ""): _softmax("_log_softmax"),
    ("nn.functional.conv2d", ""): _conv2d,
    ("nn.functional.max_pool2d", ""): _max_pool("max_pool2d_with_indices"),
    ("nn.functional.max_pool3d", ""): _max_pool("max_pool3d_with_indices"),
    ("nn.functional.adaptive_avg_pool2d", ""): _adaptive_pool("_adaptive_avg_pool2d", 2),
    ("nn.functional.adaptive_max_pool2d", ""): _adaptive_pool("adaptive_max_pool2d", 2),
    ("nn.functional.adaptive_avg_pool3d", ""): _adaptive_pool("_adaptive_avg_pool3d", 3),
    ("nn.functional.adaptive_max_pool3d", ""): _adaptive_pool("adaptive_max_pool3d", 3),
    ("nn.functional.embedding", ""): _embedding,
    ("nn.functional.batch_norm", ""): _batch_norm,
    ("nn.functional.layer_norm", ""): _layer_norm,
    ("nn.functional.group_norm", ""): _group_norm,
}
# Factory OpInfos and in-place-capable activations pass these Python-only flags; False
# changes nothing.
_PYTHON_FLAGS = ("requires_grad", "inplace")


def _default_call(opinfo, sample):
    name = opinfo.aten_name.removeprefix("nn.functional.")
    return name, (sample.input, *sample.args), _drop_false(sample.kwargs, *_PYTHON_FLAGS)


# --- overload resolution and the out overload ---------------------------------------------

_FACTORY_ARGS = {"dtype", "layout", "device", "pin_memory"}


def _is_out(arg) -> bool:
    return arg.kwarg_only and arg.alias_info is not None and arg.alias_info.is_write


@functools.cache
def _functional_overloads(name: str) -> list:
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return []
    overloads = []
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{name}"):
        if any(_is_out(a) for a in schema.arguments) or not schema.returns or any(
                not str(r.type).startswith(("Tensor", "List[Tensor]")) for r in schema.returns):
            continue  # out overloads, and TorchScript's number ops (mul.complex, add.int)
        overload = schema.overload_name or "default"
        if overload in packet.overloads():
            overloads.append(getattr(packet, overload))
    return overloads


def _broadcast_lists(op, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """An int passed for an ``int[N]`` argument as the list it stands for (Python's arg
    parser broadcasts it; the JIT schema check does not)."""
    schema_args = op._schema.arguments
    positional = [a for a in schema_args if not a.kwarg_only]
    by_name = {a.name: a for a in schema_args}

    def fix(arg, v):
        kind = str(arg.type) if arg is not None else ""
        if isinstance(v, int) and not isinstance(v, bool) and "List[int]" in kind:
            return [v] * (arg.N or 1)
        return v
    args = tuple(fix(a, v) for a, v in zip(positional, args)) + tuple(args[len(positional):])
    return args, {k: fix(by_name.get(k), v) for k, v in kwargs.items()}


def resolve(name: str, args: tuple, kwargs: dict):
    """(overload, args, kwargs): what ``torch.ops.aten.<name>(*args, **kwargs)`` calls."""
    for op in _functional_overloads(name):
        fixed_args, fixed_kwargs = _broadcast_lists(op, args, kwargs)
        try:
            if torch._C._check_schema_allow_fake_script_object(
                    op._schema, *fixed_args, **fixed_kwargs):
                return op, fixed_args, fixed_kwargs
        except RuntimeError:
            continue
    return None, args, kwargs


def _signature(args) -> list[tuple[str, str]]:
    return [(a.name, str(a.type)) for a in args if a.name not in _FACTORY_ARGS]


@functools.cache
def out_overload(op):
    """The exporter's out overload of functional ``op`` (None when ATen has none)."""
    schema = op._schema
    name = schema.name.split("::")[1]
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        name += "_copy"  # a view: its out variant lives on the copy op
    if not name.endswith("_copy") and name in _VIEW_COPY_OPS:
        name += "_copy"
    packet = getattr(torch.ops.aten, name, None)
    if packet is None:
        return None
    wanted = _signature(schema.arguments)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        args = candidate._schema.arguments
        if any(_is_out(a) for a in args) and _signature(
                [a for a in args if not _is_out(a)]) == wanted:
            return candidate
    return None


# Views whose schema returns a fresh list (split, unbind) rather than an aliasing Tensor.
_VIEW_COPY_OPS = {"split", "split_with_sizes", "unbind"}


def registry_key(op) -> str:
    return f"{op._schema.name}.{op._schema.overload_name}"


# --- torch values → kernel arguments --------------------------------------------------------


def _is_supported_tensor(t: torch.Tensor) -> bool:
    return t.dtype in NUMPY_DTYPES and t.layout == torch.strided and not t.is_conj()


def _bind_names(op, args: tuple, kwargs: dict) -> dict:
    """Schema argument name → value for a functional call (defaults filled in)."""
    positional = [a for a in op._schema.arguments if not a.kwarg_only]
    bound = {a.name: v for a, v in zip(positional, args)}
    bound.update(kwargs)
    for a in op._schema.arguments:
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _kernel_value(arg, value):
    """One schema argument as the portable calling convention passes it."""
    kind = str(getattr(arg, "real_type", arg.type)).removeprefix("Optional[").removesuffix("]")
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if not _is_supported_tensor(value):
            raise Excluded("unsupported_dtype", str(value.dtype))
        return value.numpy()
    if isinstance(value, (list, tuple)) and value and any(
            isinstance(v, torch.Tensor) for v in value):
        return [_kernel_value(arg, v) for v in value]
    if isinstance(value, torch.dtype):
        if value not in NUMPY_DTYPES:
            raise Excluded("unsupported_dtype", str(value))
        return np.dtype(NUMPY_DTYPES[value])
    if isinstance(value, (torch.layout, torch.device, torch.memory_format)) or kind in (
            "Layout", "Device", "MemoryFormat", "Generator"):
        return None
    if isinstance(value, complex):
        raise Excluded("unsupported_dtype", "complex scalar")
    if kind.startswith("List[") and not isinstance(value, (list, tuple)):
        value = [value] * (arg.N or 1)  # `int[2] padding=0` broadcasts, as the exporter does
    if kind.startswith("List["):
        if "float" in kind:
            return tuple(float(v) for v in value)
        if "bool" in kind:
            return tuple(bool(v) for v in value)
        return tuple(int(v) for v in value)
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _outputs(result) -> list[torch.Tensor]:
    return list(result) if isinstance(result, (list, tuple)) else [result]


def _allocate(arg, ref):
    if isinstance(ref, (list, tuple)):
        return [np.empty(tuple(r.shape), NUMPY_DTYPES[r.dtype]) for r in ref]
    if ref.dtype not in NUMPY_DTYPES:
        raise Excluded("unsupported_dtype", f"result {ref.dtype}")
    return np.empty(tuple(ref.shape), NUMPY_DTYPES[ref.dtype])


# --- one sample, end to end -----------------------------------------------------------------


@dataclass
class Case:
    """One exercised sample: the reference call and the portable kernel's arguments."""

    key: str
    functional: object  # the OpOverload
    args: tuple
    kwargs: dict
    out_op: object

    def kernel_args(self, reference) -> tuple[list, list]:
        """(positional kernel args with fresh outs, the outs in return order)."""
        bound = _bind_names(self.functional, self.args, self.kwargs)
        schema = self.out_op._schema.arguments
        out_args = [a for a in schema if _is_out(a)]
        refs = _outputs(reference)
        if len(out_args) == 1 and isinstance(reference, (list, tuple)):
            refs = [list(reference)]  # a Tensor(a!)[] out
        assert len(out_args) == len(refs), (self.key, len(out_args), len(refs))
        outs = iter([_allocate(a, r) for a, r in zip(out_args, refs)])
        values, out_values = [], []
        for a in schema:
            if _is_out(a):
                values.append(next(outs))
                out_values.append(values[-1])
            elif a.name in bound:
                values.append(_kernel_value(a, bound[a.name]))
            else:
                values.append(_kernel_value(a, a.default_value))
        return values, out_values


def _tensors(sample) -> list[torch.Tensor]:
    found = []
    for v in [sample.input, *sample.args, *sample.kwargs.values()]:
        found += [t for t in (v if isinstance(v, (list, tuple)) else [v])
                  if isinstance(t, torch.Tensor)]
    return found


def to_case(opinfo, sample) -> Case:
    """The Case for ``sample``, or Excluded with the rule that takes it."""
    if sum(t.numel() for t in _tensors(sample)) > MAX_ELEMENTS:
        raise Excluded("over_size_budget")
    adapter = ADAPTERS.get((opinfo.name, opinfo.variant_test_name))
    name, args, kwargs = (adapter(sample) if adapter is not None
                          else _default_call(opinfo, sample))
    for v in [*args, *kwargs.values()]:
        for t in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(t, torch.Tensor) and not _is_supported_tensor(t):
                raise Excluded("unsupported_dtype", str(t.dtype))
            if isinstance(t, torch.dtype) and t not in NUMPY_DTYPES:
                raise Excluded("unsupported_dtype", str(t))
    op, args, kwargs = resolve(name, args, kwargs)
    if op is None and isinstance(sample.input, (int, float)):
        raise Excluded("scalar_self", repr(sample.input))
    assert op is not None, f"{opinfo.name}: no aten::{name} overload takes {sample}"
    out_op = out_overload(op)
    if out_op is None:
        raise Excluded("no_out_overload", registry_key(op))
    key = registry_key(out_op)
    if key not in KERNELS:
        raise Excluded("no_portable_kernel", key)
    return Case(key, op, args, kwargs, out_op)


# --- which OpInfos map to portable kernels ---------------------------------------------------


def _may_map(opinfo) -> bool:
    if (opinfo.name, opinfo.variant_test_name) in ADAPTERS:
        return True
    name = opinfo.aten_name.removeprefix("nn.functional.")
    for op in _functional_overloads(name):
        out_op = out_overload(op)
        if out_op is not None and registry_key(out_op) in KERNELS:
            return True
    return False


def _opinfo_id(o) -> str:
    return f"{o.name}.{o.variant_test_name}".rstrip(".")


# OpInfos whose ATen packet has portable kernels, but none their samples can reach.
NOT_MAPPED = {
    "split.list_args": "split(x, [sizes]) resolves to split.sizes, which has no out overload",
    "std.unbiased": "std(x, unbiased) resolves to std.default, which has no out overload",
    "var.unbiased": "var(x, unbiased) resolves to var.default, which has no out overload",
    "var_mean.unbiased": "var_mean(x, unbiased) resolves to var_mean.default (no out overload)",
    "nn.functional.silu.complex": "its samples are complex only",
}
OPINFOS = {_opinfo_id(o): o for o in op_db if _may_map(o)}
UNREACHED = {i: OPINFOS.pop(i) for i in NOT_MAPPED if i in OPINFOS}


def _samples(opinfo, dtype) -> list:
    """At most MAX_SAMPLES of the OpInfo's reference inputs (its sample inputs followed by
    the extra reference cases, where it has them: Python scalars, extremal values, type
    promotion): the first MAX_SAMPLES // 2 in order, then evenly spaced over the rest."""
    # Seeded here, once: OpInfo's own per-sample seeding (set_seed=True) hashes the name
    # of the calling test (so the coverage test would see other samples) and goes through
    # torch.manual_seed, whose lazy CUDA/XPU/MTIA seeding formats a stack trace per call.
    torch.default_generator.manual_seed(0)
    random.seed(0)
    np.random.seed(0)
    # Each of OpInfo's input iterators also walks the Python stack (inspect, a quarter of
    # this file's run time) to attach the calling test for failure messages: not needed.
    with mock.patch.object(common_utils, "extract_test_fn", lambda: None):
        samples = list(opinfo.reference_inputs("cpu", dtype, requires_grad=False,
                                               set_seed=False))
    head, rest = samples[:MAX_SAMPLES // 2], samples[MAX_SAMPLES // 2:]
    stride = max(1, -(-len(rest) // (MAX_SAMPLES - len(head))))
    return head + rest[::stride]


@functools.cache
def plan(opinfo_id: str) -> tuple[list, Counter, Counter]:
    """(exercised (dtype, sample, case), samples per rule, keys hit per rule)."""
    opinfo = OPINFOS.get(opinfo_id) or UNREACHED[opinfo_id]
    supported = opinfo.supported_dtypes("cpu")
    cases, rules, gaps = [], Counter(), Counter()
    for dtype in DTYPES:
        if dtype not in supported:
            continue
        for sample in _samples(opinfo, dtype):
            try:
                cases.append((dtype, sample, to_case(opinfo, sample)))
            except Excluded as e:
                rules[e.rule] += 1
                if e.rule in ("no_portable_kernel", "no_out_overload"):
                    gaps[str(e).split(": ", 1)[1]] += 1
    return cases, rules, gaps


# --- comparison --------------------------------------------------------------------------

TRANSCENDENTAL = {
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin",
    "acos", "atan", "sinh", "cosh", "tanh", "sigmoid", "erf", "gelu", "silu", "elu",
    "softplus", "pow", "rsqrt", "hardswish", "hardsigmoid",
}
ACCUMULATE = {
    "mm", "bmm", "addmm", "baddbmm", "matmul", "dot", "linear", "convolution", "sum", "mean",
    "prod", "var", "std", "var_mean", "logsumexp", "native_layer_norm", "native_group_norm",
    "_native_batch_norm_legit_no_training", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool2d",
    "_adaptive_avg_pool3d", "_softmax", "_log_softmax",
}
TOLERANCE = {  # (class, dtype) -> (rtol, atol); see the module docstring
    ("exact", torch.float32): (2.4e-7, 1e-6),
    ("exact", torch.float64): (4.5e-16, 1e-14),
    ("exact", torch.float16): (1e-3, 1e-3),
    ("transcendental", torch.float32): (5e-6, 1e-6),
    ("transcendental", torch.float64): (1e-13, 1e-14),
    ("transcendental", torch.float16): (2e-3, 2e-3),
    ("accumulate", torch.float32): (1e-4, 1e-4),
    ("accumulate", torch.float64): (1e-11, 1e-11),
    ("accumulate", torch.float16): (1e-2, 5e-2),
}
# empty and empty_like promise no values: their shape and dtype are compared, values are not.
UNSPECIFIED_VALUES = {"aten::empty.out", "aten::empty_like.out", "aten::empty_permuted.out"}


# Special values. ATen's float32/float16 kernels for formula ops are vectorised, and its
# reductions sum in vector-width order, so at ±inf, NaN and near overflow PyTorch's result
# in the sample's dtype depends on the code path: CPU capability, vector width, a vector's
# tail (see kernel_check.float64_reference). Where it and the same call in float64, rounded
# to the sample's dtype, disagree on whether an element is NaN, +inf, -inf or finite, the
# float64 value is expected: the op's, not one machine's. Everywhere else (every element on
# the machines this was written on) PyTorch in the sample's dtype stays the reference.
LOW_PRECISION = (torch.float32, torch.float16)


def _to_float64(v):
    if isinstance(v, torch.Tensor) and v.dtype in LOW_PRECISION:
        return v.double()
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return type(v)(_to_float64(x) for x in v)
    return v


def _special_class(t: torch.Tensor) -> torch.Tensor:
    """0 NaN, 1 +inf, 2 -inf, 3 finite, per element."""
    return torch.where(t.isnan(), 0, torch.where(t.isposinf(), 1, torch.where(t.isneginf(), 2, 3)))


def expected_outputs(case: Case, reference) -> list:
    """PyTorch's outputs, with float64's at special values where the two disagree."""
    refs = _outputs(reference)
    name = case.key.split("::")[1].split(".")[0]
    if name not in TRANSCENDENTAL | ACCUMULATE or not any(
            isinstance(r, torch.Tensor) and r.dtype in LOW_PRECISION for r in refs):
        return refs
    try:
        refs64 = _outputs(case.functional(*_to_float64(case.args),
                                          **{k: _to_float64(v) for k, v in case.kwargs.items()}))
    except (RuntimeError, TypeError):  # e.g. _softmax(half_to_float=True) takes only float16
        return refs
    expected = []
    for r, r64 in zip(refs, refs64):
        if (isinstance(r, torch.Tensor) and r.dtype in LOW_PRECISION
                and isinstance(r64, torch.Tensor) and r64.is_floating_point()
                and r64.shape == r.shape):
            r64 = r64.to(r.dtype)
            r = torch.where(_special_class(r) != _special_class(r64), r64, r)
        expected.append(r)
    return expected


def tolerance(key: str, dtype: torch.dtype) -> tuple[float, float]:
    if not dtype.is_floating_point:
        return 0.0, 0.0
    name = key.split("::")[1].split(".")[0]
    kind = ("transcendental" if name in TRANSCENDENTAL else
            "accumulate" if name in ACCUMULATE else "exact")
    return TOLERANCE[(kind, dtype)]


# Sorting promises no order among equal values unless stable=True: the indices output is
# checked by what it selects (input gathered at the indices == the values), not compared.
TIE_ORDER_UNSPECIFIED = {"aten::sort.values", "aten::sort.values_stable", "aten::topk.values"}


def _ties_unspecified(case: Case) -> bool:
    if case.key not in TIE_ORDER_UNSPECIFIED:
        return False
    return not _bind_names(case.functional, case.args, case.kwargs).get("stable")


def _check_selected(case: Case, indices: np.ndarray, values: torch.Tensor, where: str):
    bound = _bind_names(case.functional, case.args, case.kwargs)
    x = bound["self"]
    dim = bound.get("dim", -1) if x.dim() else 0
    selected = x.reshape(1) if x.dim() == 0 else x
    picked = torch.gather(selected, dim, torch.from_numpy(indices.copy()).reshape(
        values.shape if x.dim() else (-1,)))
    assert_close(picked.reshape(values.shape).numpy(), values.numpy(), 0, 0, where)


def compare(case: Case, outs: list, reference, how: str) -> None:
    refs = _outputs(reference)
    if len(outs) == 1 and isinstance(outs[0], list):
        outs = outs[0]
    assert len(outs) == len(refs)
    for i, (got, want) in enumerate(zip(outs, refs)):
        where = f"{case.key} ({how}), output {i}"
        assert got.shape == tuple(want.shape), where
        assert got.dtype == NUMPY_DTYPES[want.dtype], where
        if case.key in UNSPECIFIED_VALUES:
            continue
        if i == 1 and _ties_unspecified(case):
            _check_selected(case, got, refs[0], where)
            continue
        assert_close(got, want.numpy(), *tolerance(case.key, want.dtype), where)


def assert_close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float, where: str):
    """|got - want| <= atol + rtol |want| elementwise, NaN matching NaN and inf matching
    itself (NumPy, not torch.isclose: torch's thread pool made that ~100x slower here)."""
    if got.dtype == np.bool_ or rtol == atol == 0:
        bad = got != want
        if got.dtype.kind == "f":
            bad &= ~(np.isnan(got) & np.isnan(want))
    else:
        g, w = got.astype(np.float64), want.astype(np.float64)
        with np.errstate(invalid="ignore"):
            bad = ~((np.abs(g - w) <= atol + rtol * np.abs(w)) | (g == w) |
                    (np.isnan(g) & np.isnan(w)))
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(
            f"{where}: {int(bad.sum())} of {bad.size} elements differ (rtol={rtol}, "
            f"atol={atol}); first at {first}: got {got[first]!r}, want {want[first]!r}")


def _frozen(values: list, outs: list) -> list:
    """Read-only copies of the input arrays (program constants); outs stay as they are."""
    out_ids = {id(o) for o in outs}

    def freeze(v):
        if isinstance(v, np.ndarray) and id(v) not in out_ids:
            v = v.copy()
            v.flags.writeable = False
        elif isinstance(v, list) and v and id(v) not in out_ids:
            return [freeze(x) for x in v]
        return v
    return [freeze(v) for v in values]


def _garbage(outs: list) -> None:
    for out in outs:
        for o in (out if isinstance(out, list) else [out]):
            o.fill(True if o.dtype == np.bool_ else 7)


# out kernels whose result size depends on the input's values: they return the view of the
# result they wrote (the out here is allocated at PyTorch's size, so the whole of it)
SIZED_BY_DATA = frozenset({"aten::nonzero.out", "aten::masked_select.out", "aten::bincount.out"})


def _check_result(case: Case, result, outs: list, bound: bool = False) -> None:
    """What a kernel call returns: None, or (SIZED_BY_DATA) its result's view; a bound
    call's return value is the binding's own for the other kernels."""
    if case.key not in SIZED_BY_DATA:
        assert bound or result is None, f"{case.key} returned {type(result).__name__}"
        return
    assert isinstance(result, np.ndarray) and result.shape == outs[0].shape, \
        f"{case.key}: the view of its result {getattr(result, 'shape', result)} is not the out's"
    assert result.size == 0 or np.shares_memory(result, outs[0]), \
        f"{case.key}: the result is not a view of its out"


def run_case(case: Case) -> None:
    reference = case.functional(*case.args, **case.kwargs)
    expected = expected_outputs(case, reference)
    # unbound
    values, outs = case.kernel_args(reference)
    before = [v.copy() if isinstance(v, np.ndarray) else v for v in values]
    with np.errstate(all="ignore"):
        _check_result(case, KERNELS[case.key](*values), outs)
    compare(case, outs, expected, "unbound")
    out_ids = {id(o) for o in outs}
    for v, b in zip(values, before):
        if isinstance(v, np.ndarray) and id(v) not in out_ids:
            np.testing.assert_array_equal(v, b, err_msg=f"{case.key} wrote an input")
    # bound, on writable inputs and on read-only ones
    bind = getattr(KERNELS[case.key], "bind", None)
    if bind is None:
        return
    for how in ("bound", "bound, read-only inputs"):
        values, outs = case.kernel_args(reference)
        if how != "bound":
            values = _frozen(values, outs)
        fn, args = bind(tuple(values))
        with np.errstate(all="ignore"):
            fn(*args)
            _garbage(outs)
            _check_result(case, fn(*args), outs, bound=True)
        compare(case, outs, expected, how)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """The references are tiny: torch's intra-op threads only spin-wait (measured: a 64K
    torch.isclose 0.1 s with 2 threads, 0.7 ms with 1, on the 2-core machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("opinfo_id", sorted(OPINFOS))
def test_opinfo_samples(opinfo_id):
    cases, rules, gaps = plan(opinfo_id)
    counts = Counter()
    for dtype, sample, case in cases:
        try:
            run_case(case)
        except AssertionError as e:
            raise AssertionError(f"{opinfo_id} {dtype} {sample.summary()}:\n{e}") from None
        counts[case.key] += 1
    print(f"{opinfo_id}: exercised {dict(counts)}; filtered {dict(rules)}; gaps {dict(gaps)}")
    assert cases, f"{opinfo_id}: no sample exercised a portable kernel (filtered: {dict(rules)})"


@pytest.mark.parametrize("opinfo_id", sorted(NOT_MAPPED))
def test_not_mapped_opinfos_still_reach_no_kernel(opinfo_id):
    """An entry of NOT_MAPPED that starts reaching a kernel (a new out kernel) must move
    back into the exercised set: delete it from NOT_MAPPED."""
    assert opinfo_id in UNREACHED, f"{opinfo_id}: no longer an OpInfo that may map"
    cases, _, _ = plan(opinfo_id)
    assert not cases, f"{opinfo_id} now exercises {len(cases)} samples: remove it from NOT_MAPPED"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_special_values_disagreeing_with_float64_are_expected_from_float64(dtype):
    """What a CPU's vectorised GELU may give (NaN at +inf, inf at 1e4 from an overflowing
    intermediate) is replaced; agreeing elements keep PyTorch's value."""
    op = torch.ops.aten.gelu.default
    x = torch.tensor([np.inf, -np.inf, np.nan, 1e4, 1.0, -3.0], dtype=dtype)
    case = Case("aten::gelu.out", op, (x,), {}, out_overload(op))
    assert expected_outputs(case, op(x))[0][0] == np.inf  # whatever this machine gives
    exact = op(x.double()).to(dtype)
    machine = exact.clone()
    machine[0], machine[3] = np.nan, np.inf
    machine[4] = exact[4] * (1 + 2e-6)  # a finite difference stays PyTorch's: tolerances judge it
    (expected,) = expected_outputs(case, machine)
    assert expected[0] == np.inf and expected[3] == 1e4 and expected[4] == machine[4]
    assert torch.isnan(expected[1:3]).all() and expected[5] == exact[5]
    (same,) = expected_outputs(case, exact)
    torch.testing.assert_close(same, exact, rtol=0, atol=0, equal_nan=True)


# --- keys no OpInfo sample reaches --------------------------------------------------------


def _ints(*shape, seed=0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(-9, 10, shape))


# Scalar-self overloads (OpInfo puts Python numbers first only for ops without them) and
# the identity copies the exporter emits, run through the same machinery as the samples.
EXTRA_CALLS = {
    "aten::bitwise_and.Scalar_Tensor_out": (torch.ops.aten.bitwise_and.Scalar_Tensor,
                                            (6, _ints(3, 4))),
    "aten::bitwise_or.Scalar_Tensor_out": (torch.ops.aten.bitwise_or.Scalar_Tensor,
                                           (-6, _ints(3, 4).to(torch.int32))),
    "aten::bitwise_xor.Scalar_Tensor_out": (torch.ops.aten.bitwise_xor.Scalar_Tensor,
                                            (True, _ints(5) > 0)),
    "aten::remainder.Scalar_Tensor_out": (torch.ops.aten.remainder.Scalar_Tensor,
                                          (5.5, torch.linspace(-4, 4, 12).reshape(3, 4))),
    "aten::detach_copy.out": (torch.ops.aten.detach_copy.default, (_ints(2, 3).t(),)),
    "aten::lift_fresh_copy.out": (torch.ops.aten.lift_fresh_copy.default,
                                  (torch.linspace(-1, 1, 6, dtype=torch.float16),)),
}


@pytest.mark.parametrize("key", sorted(EXTRA_CALLS))
def test_keys_no_sample_reaches(key):
    op, args = EXTRA_CALLS[key]
    out_op = out_overload(op)
    assert registry_key(out_op) == key
    run_case(Case(key, op, args, {}, out_op))


# Portable keys that no OpInfo sample reaches, and the test file that covers each.
COVERED_ELSEWHERE = {
    "aten::_embedding_bag.out": "tests/torch/test_kernels_more.py",
    "aten::_to_copy.out": "tests/torch/test_kernels_layout.py",
    "aten::_unsafe_view.out": "tests/torch/test_kernels_layout.py",
    "aten::copy.out": "tests/torch/test_kernels_layout.py",
    "aten::index.Tensor_out": "tests/torch/test_kernels_layout.py",
    "aten::view_copy.dtype_out": "tests/torch/test_kernels_layout.py",
    "aten::clamp.out": "tests/torch/test_kernels_unary.py",
    "aten::clamp_max.out": "tests/torch/test_kernels_unary.py",
    "aten::clamp_min.out": "tests/torch/test_kernels_unary.py",
    "aten::pow.Scalar_out": "tests/torch/test_kernels_arithmetic.py",
    # the quantization reference kernels: bit-exact against torch's own, in tests/quantize
    **{key: "tests/quantize/test_kernels.py" for key in (
        "quantized_decomposed::quantize_per_tensor.out",
        "quantized_decomposed::dequantize_per_tensor.out",
        "quantized_decomposed::quantize_per_channel.out",
        "quantized_decomposed::dequantize_per_channel.out",
        "torchao::quantize_affine.out", "torchao::dequantize_affine.out")},
    **{f"aten::{name}": "tests/torch/test_kernels_resample.py" for name in (
        "_upsample_nearest_exact1d.out", "_upsample_nearest_exact2d.out",
        "_upsample_nearest_exact3d.out", "upsample_nearest1d.out", "upsample_nearest2d.out",
        "upsample_nearest2d.vec_out", "upsample_nearest3d.out", "upsample_linear1d.out",
        "upsample_bilinear2d.out", "upsample_bilinear2d.vec_out",
        "upsample_trilinear3d.out")},
    **{key: "tests/torch/test_kernels_opinfo.py" for key in EXTRA_CALLS},
    # transformers' grouped matmul (the library is not a test dependency): against eager
    "transformers::grouped_mm_fallback.out": "tests/torch/test_moe.py",
}


def test_every_portable_kernel_is_covered():
    """Each portable key is reached by an OpInfo sample here, or listed in COVERED_ELSEWHERE
    with a test file that names its op; a key in both is a stale entry."""
    from pathlib import Path

    reached = {case.key for opinfo_id in OPINFOS for _, _, case in plan(opinfo_id)[0]}
    missing = sorted(set(KERNELS) - reached - set(COVERED_ELSEWHERE))
    assert not missing, f"portable kernels no test covers: {missing} — add an OpInfo adapter, " \
                        "or a test and a COVERED_ELSEWHERE entry"
    stale = sorted(k for k in COVERED_ELSEWHERE if k in reached or k not in KERNELS)
    assert not stale, f"COVERED_ELSEWHERE entries now reached by OpInfo or gone: {stale}"
    root = Path(__file__).resolve().parents[2]
    for key, test_file in COVERED_ELSEWHERE.items():
        op = key.split("::")[1].split(".")[0]
        assert op in (root / test_file).read_text(), f"{key}: {test_file} never names {op}"
