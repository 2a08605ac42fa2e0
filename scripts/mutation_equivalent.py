"""The equivalent mutants of scripts/mutation_test.py: survivors that compute exactly what
the original computes, keyed ``path::function::what`` (``what`` as the mutant list prints
it, ``#n`` for the n-th identical mutation in that function), each with the reason.
docs/testing.md lists them."""

_ARG_RECHECK = ("the test before `_index` only decides whether `_index` runs; `_index` "
                "repeats the whole check (an int, 0 <= index < n), and the mutant only "
                "makes it run more often")
_FIRST_SET = ("every planned node has its first step set before this line: user inputs "
              "at 0, each alloc as the out argument of the call that writes it")
_READ_ONLY_COPY = ("`astype(..., copy=False)` -> `copy=True`: the array is only read "
                   "afterwards, so a copy changes the time, not the values")
_BIND = "opforge/kernels/portable/_binding.py"
_BIGGER_BUFFER = ("`max(size, 2)` / `max(size, 0)`: the shared buffer is one element larger "
                  "or, for a size-0 request, empty; every view handed out has the same values")
_INF_SIGN = ("in the ord = ±inf branch p is +inf or -inf: `p > 0`, `p >= 0`, `p > 1` and "
             "`p > -1` all tell them apart the same way")
_NORM = "opforge/kernels/portable/normalization.py"
_ACT = "opforge/kernels/portable/activation.py"
_RED = "opforge/kernels/portable/reduction.py"
_ENGINE = "opforge/backends/cpu/native/validate.cpp"
_ABS_AT_ZERO = ("`|stride|` as `s <= 0 ? -s : s` or `s < 1 ? -s : s`: integer strides differ "
                "from `s < 0` only at s = 0, where -0 is 0")
_ZERO_REACH = ("`reach <= 0` / `reach < 1`: a reach of 0 (a size-1 dim, a stride of 0) is "
               "added to `lo` instead of `hi`; adding 0 changes neither")
_CPU_BN = "opforge/backends/cpu/lowering/normalization.py::lower_batch_norm"
_USERS_DEFAULT = ("the default of `L.users.get(x, 0)`, never used: `Lowering.run` counts "
                  "every input of every node, and x is an input of this very batch norm")
_SIZE1_STRIDE = ("the stride given to a size-1 dim of the (1, C, 1, ...) scale and shift: "
                 "`new_tensor` replaces it (`_tidy_strides` gives every size-1 dim the "
                 "stride of a dense layout), so the plan has the same strides")
_FUSION = "opforge/backends/cpu/lowering/fusion.py"
_ROOT_HOPS = ("the hop count only bounds the walk against a cycle; every alias names its root "
              "directly (`Lowering.alias`, the one place aliases are made, re-bases an alias "
              "of an alias), so the loop runs at most once whatever the count")
_ONE_ALGORITHM = ("`nxt['ia'][-1]`: eltwise and binary ops have one integer attribute, their "
                  "algorithm (elementwise.py, normalization.py)")
EQUIVALENT: dict[str, str] = {
    **{f"{_FUSION}::_root::{what}": _ROOT_HOPS for what in (
        "off by one: `0` -> `1`", "off by one: `0` -> `-1`", "off by one: `1` -> `2`",
        "off by one: `1` -> `0`", "compare: `seen < len(plan.tensors)` -> `seen <= "
        "len(plan.tensors)`", "arithmetic: `seen + 1` -> `seen - 1`",
        "drop operand: `seen + 1` -> `seen`")},
    **{f"{_FUSION}::_last_write::off by one: `1` -> `{n}`": "the default for an operand no "
       "op writes (a constant, an input): `_last_write(...) > i` is false for every op "
       "index i >= 0 with -1, -2 or 0 alike" for n in (2, 0)},
    f"{_FUSION}::_fuse::off by one: `0` -> `-1`": "`op['out'][-1]`: the line before skips "
    "every op without exactly one output",
    f"{_FUSION}::_fuse::off by one: `0` -> `-1` #2": "`readers[-1]`: the line before skips "
    "every result without exactly one reader",
    f"{_FUSION}::_fuse::off by one: `0` -> `-1` #3": "`nxt['out'][-1]`: only eltwise and "
    "binary readers are fused, and they have one output; for any other reader the layout "
    "check's outcome is not used (it is skipped below)",
    **{f"{_FUSION}::_fuse::off by one: `0` -> `-1` #{n}": _ONE_ALGORITHM for n in (5, 7, 11, 13)},
    f"{_FUSION}::_fuse::compare: `_last_write(plan, other) > i` -> `_last_write(plan, other) "
    ">= i`": "op i writes only t, a temporary no alias views (both checked above), and "
    "other is not t: no operand's storage is last written by op i itself",
    f"{_FUSION}::_starts_chain::off by one: `0` -> `-1`": "`op['out'][-1]`: an eltwise op "
    "has one output",
    f"{_FUSION}::_starts_chain::off by one: `0` -> `-1` #2": "`readers[-1]`: the guard "
    "before returns unless there is exactly one reader",
    f"{_FUSION}::_starts_chain::off by one: `0` -> `-1` #3": "`op['in'][-1]`: an eltwise op "
    "has one input",
    f"{_FUSION}::_starts_chain::off by one: `0` -> `-1` #4": "`nxt['out'][-1]`: read only "
    "when nxt is an eltwise op (the `and` before), which has one output",
    f"{_CPU_BN}::off by one: `0` -> `1` #4": _USERS_DEFAULT,
    f"{_CPU_BN}::off by one: `0` -> `-1` #4": _USERS_DEFAULT,
    f"{_CPU_BN}::off by one: `1` -> `2` #15": "`writer['ia'][-1] = 2`: the convolution's "
    "has_bias attribute, which the engine reads as `!= 0` (convolution.cpp's contract_conv)",
    f"{_CPU_BN}::off by one: `0` -> `1` #6": _SIZE1_STRIDE,
    f"{_CPU_BN}::off by one: `0` -> `-1` #6": _SIZE1_STRIDE,
    f"{_CPU_BN}::off by one: `7` -> `8`":
        "`args[:8]`: `_native_batch_norm_legit_no_training`, the one op lowered here, has "
        "exactly 7 arguments, all positional and required: the same 7",
    f"{_ENGINE}::check_reach::operator: `<` -> `<=` #4": _ZERO_REACH,
    f"{_ENGINE}::check_reach::off by one: `0` -> `1` #5": _ZERO_REACH,
    f"{_ENGINE}::injective::operator: `<` -> `<=` #2": _ABS_AT_ZERO,
    f"{_ENGINE}::injective::off by one: `0` -> `1` #3": _ABS_AT_ZERO,
    "opforge/mindspore/custom.py::_fake::off by one: `0` -> `-1`": "`inputs[-1].new_empty(shape, "
    "dtype=...)`: new_empty takes only the device (and fake mode) from the tensor it is called "
    "on, and every input of one call shares them; shape and dtype are given",
    "opforge/mindspore/custom.py::_fake::off by one: `0` -> `-1` #2": "`outs[-1] if len(outs) "
    "== 1`: the last element of a one-element list is its first",
    f"{_NORM}::_shifted::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_NORM}::native_layer_norm_out::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_NORM}::batch_norm_batch_stats_out::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_NORM}::batch_norm_batch_stats_out::flip bool: `False` -> `True` #2": _READ_ONLY_COPY,
    f"{_NORM}::batch_norm_batch_stats_out::flip bool: `False` -> `True` #3": _READ_ONLY_COPY,
    f"{_NORM}::native_group_norm_out::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_NORM}::_per_channel::off by one: `1` -> `2` #2": "`reshape((1, -2) + ...)`: NumPy "
    "takes any negative size as the inferred dimension, like -1",
    f"{_NORM}::_floating_same::off by one: `0` -> `-1`": "`arrays[-1].dtype`: the test is "
    "that every array has one floating dtype, whichever array it is read from (the last "
    "array is always an out, never None)",
    f"{_NORM}::_bind_layer_norm::and/or: `out1.size != int(np.prod(keep)) or out2.size != "
    "out1.size` -> `out1.size != int(np.prod(keep)) and out2.size != out1.size`":
        "mean and rstd outs always have ATen's (..., 1, ...) shape: the guard never fires",
    f"{_NORM}::_bind_layer_norm::compare: `input.size <= _SMALL` -> `input.size < _SMALL`":
        "only where constant weight and bias are broadcast (at bind, or per call by the "
        "ufunc): the same products either way",
    f"{_NORM}::_bind_layer_norm::off by one: `0` -> `-1` #2": "`k == -1`: normalized_shape "
    "is never empty in ATen's layer norm (it refuses []); for k = 0 both paths give "
    "(x - x) * rstd anyway",
    f"{_NORM}::_bind_batch_stats::off by one: `2` -> `1`": "`input.ndim < 1`: batch norm "
    "inputs have at least 2 dims (N, C): ATen refuses fewer",
    f"{_NORM}::_bind_batch_stats::off by one: `1` -> `0` #2": "`max(C, 0)` = `max(C, 1)`: "
    "C >= 1 here, empty inputs go to the general kernel",
    f"{_NORM}::_bind_batch_norm::off by one: `2` -> `1`": "`input.ndim < 1`: batch norm "
    "inputs have at least 2 dims (N, C): ATen refuses fewer",
    f"{_ACT}::leaky_relu_out::compare: `x > 0` -> `x >= 0`": "at x = ±0 both branches "
    "give x (0 * slope is 0 with x's sign); NaN takes the same branch",
    f"{_ACT}::elu_out::compare: `x > 0` -> `x >= 0`": "at x = ±0 both branches give x "
    "(alpha * expm1(±0) is ±0); NaN takes the same branch",
    f"{_ACT}::_gelu_tanh_steps::flip bool: `False` -> `True`": "the default of `large`, "
    "which the tanh steps never read",
    f"{_ACT}::_gelu_tanh_steps::compare: `out.dtype == ct` -> `out.dtype != ct`": "swaps "
    "`np.divide` and `np.divide(..., casting='same_kind')`, NumPy's default casting: the "
    "same division",
    f"{_RED}::axes::off by one: `1` -> `0`": "`max(ndim, 0)` = `max(ndim, 1)`: the branch "
    "runs only for ndim >= 1",
    f"{_RED}::prod_dim_out::off by one: `1` -> `0`": "`max(ndim, 0)` = `max(ndim, 1)`: the "
    "branch runs only for ndim >= 1",
    f"{_RED}::mean_out::flip bool: `False` -> `True`": "keepdim: `_store` reshapes the "
    "result to out's shape whatever keepdim says",
    f"{_RED}::logsumexp_out::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_RED}::logsumexp_out::off by one: `0` -> `1`": "the stand-in peak of a row whose "
    "maximum is ±inf or nan: exp(x - c) is then 0, inf or nan and log(...) + c gives "
    "-inf, inf or nan for any finite c",
    f"{_RED}::logsumexp_out::off by one: `0` -> `-1`": "the stand-in peak of a row whose "
    "maximum is ±inf or nan: any finite c gives the same -inf, inf or nan",
    f"{_RED}::linalg_vector_norm_out::flip bool: `False` -> `True`": _READ_ONLY_COPY,
    f"{_RED}::linalg_vector_norm_out::flip bool: `False` -> `True` #2": _READ_ONLY_COPY,
    f"{_BIND}::constant_operand::off by one: `1` -> `0`": "`key[0] == bytes(...)` is never "
    "true (a dtype string against bytes): zeros then come from np.full instead of np.zeros, "
    "the same values (only not calloc's shared zero page)",
    f"{_BIND}::constant_operand::off by one: `1` -> `2` #2": _BIGGER_BUFFER,
    f"{_BIND}::constant_operand::off by one: `1` -> `0` #2": _BIGGER_BUFFER,
    f"{_BIND}::constant_operand::off by one: `1` -> `2` #3": _BIGGER_BUFFER,
    f"{_BIND}::constant_operand::off by one: `1` -> `0` #3": _BIGGER_BUFFER,
    f"{_BIND}::_slice::off by one: `1` -> `2`": "`reshape(-2)`: NumPy takes any negative "
    "size as the inferred one, like -1",
    f"{_BIND}::steps::off by one: `0` -> `-1`": "`pairs[-1]` of a one-pair list is "
    "`pairs[0]`",
    f"{_RED}::_bind_sum::off by one: `1` -> `0`": "`max(out.size, 0)` = `max(out.size, 1)`: "
    "a non-empty input reduces into a non-empty out",
    f"{_RED}::linalg_vector_norm_out::compare: `p > 0` -> `p >= 0`": _INF_SIGN,
    f"{_RED}::linalg_vector_norm_out::off by one: `0` -> `1` #2": _INF_SIGN,
    f"{_RED}::linalg_vector_norm_out::off by one: `0` -> `-1` #2": _INF_SIGN,
    f"{_RED}::linalg_vector_norm_out::off by one: `1` -> `2`": "`elif p == 2` after "
    "`if p == 2` never runs; ord 1 then takes the general p-norm, (sum |x|^1)^(1/1), the "
    "same sum",
    f"{_NORM}::_row_sum::off by one: `1` -> `2`": "`reshape(-2, n)`: NumPy takes any "
    "negative size as the one inferred dimension, like -1",
    f"{_NORM}::_row_sum::off by one: `1` -> `2` #2": "`reshape(-2)`: as `reshape(-1)` (any "
    "negative size is the inferred one)",
    f"{_NORM}::_row_max::off by one: `1` -> `2`": "`n = ... if a.ndim else 2`: unreachable, "
    "`_softmax_workspace` sends 0-d inputs to the general kernel",
    f"{_NORM}::_row_max::off by one: `1` -> `0`": "`n = ... if a.ndim else 0`: unreachable, "
    "`_softmax_workspace` sends 0-d inputs to the general kernel",
    f"{_NORM}::_row_max::off by one: `1` -> `0` #2": "`max(n, 0)` = `max(n, 1)`: n >= 1 here, "
    "empty inputs go to the general kernel",
    "opforge/program/verify.py::_verify_instructions::compare: `type(arg) is not int` -> "
    "`type(arg) is int`": _ARG_RECHECK,
    "opforge/program/verify.py::_verify_instructions::compare: `0 <= arg < n` -> "
    "`0 < arg < n`": _ARG_RECHECK,
    "opforge/program/verify.py::_verify_instructions::off by one: `0` -> `1`": _ARG_RECHECK,
    "opforge/export/passes/plan_memory.py::_nbytes::and/or: `table and any((not isinstance(s, "
    "int) for s in fake.shape))` -> `table or any((not isinstance(s, int) for s in "
    "fake.shape))`": "a static shape's upper sizes are its sizes (`upper_sizes` keeps every "
    "int), and a symbolic size comes only with a symbol table: the same bytes either way",
    "opforge/export/passes/plan_memory.py::tensor_lifetimes::drop statement: "
    "`first.setdefault(value.name, end)` -> `pass`": _FIRST_SET + " (an output is one of these)",
    "opforge/export/passes/plan_memory.py::tensor_lifetimes::off by one: `0` -> `1` #2":
        _FIRST_SET + ": the default of `first.get` is never used",
    "opforge/export/passes/plan_memory.py::tensor_lifetimes::off by one: `0` -> `-1` #2":
        _FIRST_SET + ": the default of `first.get` is never used",
}
