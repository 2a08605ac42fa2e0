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

# --- the semantic operators' run (issue 45; docs/testing.md, run S) -----------------------------
_SOFTMAX = "opforge/backends/cpu/native/softmax.cpp"
_GUARD = "opforge/backends/cpu/native/guard.cpp"
_WINOGRAD = "opforge/backends/cpu/native/winograd.cpp"
_TEAM_PATH = ("which of Winograd's two ways of splitting the work runs (the whole team on "
              "each block, or a block per thread): each computes every tile of every block "
              "with the same instructions, so the same values; the choice is only speed")
_EXACT_PATH = ("the row goes to the exact loop instead of taking oneDNN's result (with each "
               "masked element set to 0): the exact loop computes the same softmax (torch's "
               "algorithm, every masked element exactly 0), only slower")
_NAN_APART = ("`m = max(m, v)` with its operands swapped: the two differ only for NaN (and "
              "in the sign of a zero max, which x - max does not see), and a NaN is found by "
              "the unordered compare beside it, which sends the row to the exact loop")
_STEP_16 = ("`j < full - 1` for `j < full`: j steps by 16 from 0 and full is a multiple of "
            "16, so j < full and j < full - 1 hold for the same j")
_MASKED_LAST = ("the loop setting each masked element of oneDNN's result to exactly 0 skips "
                "the last element: oneDNN's softmax (2023.2) gives exactly 0 at -inf on this "
                "machine's kernels (AVX-512, checked by every masked-row test), so the fix-up "
                "changes nothing here; on a CPU where oneDNN's exp of -inf were not 0 the "
                "mutant would leave that value (not killable on this machine)")
_HUGE_IS_NONE = ("an out_bound above kLimit is no proof to any reader (each reader tests "
                 "`out_bound <= kLimit`, or scans, as for inf): the same decisions as inf")
_UNBOUNDED_IS_INF = ("an op that is not `bounded` has out_bound inf on every call (its "
                     "initial value; link_guards and guard_note set inf wherever they clear "
                     "`bounded`), so `out_bound <= kLimit` already fails")
_MORE_SCANS = ("it scans an operand where the original takes its producer's bound or none: "
               "a scan is a proof too (the largest magnitude this call), never larger than "
               "a producer's bound, so the decisions stay sound; only more scans")
EQUIVALENT.update({
    f"{_SOFTMAX}::scan_row::drop update: `masked += b == kNegInfBits`": _EXACT_PATH,
    f"{_SOFTMAX}::exact_row::drop check: `r.nonfinite == 0` of `r.nonfinite == 0 || "
    "(!log && r.nonfinite == r.masked && r.masked < n)`": "a finite log-softmax row is "
    "recomputed by the exact loop instead of keeping oneDNN's result: the same log-softmax, "
    "only slower (finite softmax rows still take the other condition)",
    f"{_SOFTMAX}::exact_row::drop check: `(!log && r.nonfinite == r.masked && r.masked < n)` "
    "of `r.nonfinite == 0 || (!log && r.nonfinite == r.masked && r.masked < n)`": _EXACT_PATH,
    f"{_SOFTMAX}::exact_row::drop check: `m != -INFINITY` of `v == -INFINITY && m != "
    "-INFINITY`": "m is -inf only when every element is -inf (a NaN would be m): such a "
    "safe row returned zeros above; otherwise exp(-inf - -inf) is NaN and so is 0 / 0 "
    "(softmax) or -inf - -inf - log 0 (log): NaN either way, as torch gives",
    f"{_SOFTMAX}::exact_row::shrink bound: `j < n` -> `... n - 1`": _MASKED_LAST,
    f"{_SOFTMAX}::exact_row::shrink bound: `j < n` -> `... n - 1` #2": _MASKED_LAST,
    f"{_SOFTMAX}::fast_row::swap operands: `_mm512_max_ps(m, v)`": _NAN_APART,
    f"{_SOFTMAX}::fast_row::swap operands: `_mm512_max_ps(m, v)` #2": _NAN_APART,
    f"{_SOFTMAX}::fast_row::shrink bound: `j < full` -> `... full - 1`": _STEP_16,
    f"{_SOFTMAX}::fast_row::shrink bound: `j < full` -> `... full - 1` #2": _STEP_16,
    f"{_SOFTMAX}::fast_row::shrink bound: `j < full` -> `... full - 1` #3": _STEP_16,
    f"{_GUARD}::guard_run::drop check: `b <= kLimit` of `peak <= kLimit && b <= kLimit`":
        _HUGE_IS_NONE,
    f"{_GUARD}::guard_note::drop check: `b <= kLimit` of `peak <= kLimit && b <= kLimit`":
        _HUGE_IS_NONE,
    f"{_GUARD}::special_input::drop check: `op.in_from->bounded` of `op.in_from != nullptr "
    "&& op.in_from->bounded`": _UNBOUNDED_IS_INF,
    f"{_GUARD}::input_bound::drop check: `op.in_from->bounded` of `op.in_from != nullptr && "
    "op.in_from->bounded`": _UNBOUNDED_IS_INF,
    f"{_GUARD}::operand::drop check: `b <= kLimit` of `b <= kLimit || !scan`": _MORE_SCANS,
    f"{_GUARD}::operand::drop check: `!scan` of `b <= kLimit || !scan`": _MORE_SCANS,
    f"{_GUARD}::walk::drop check: `scan` of `scan && i < proved`": _MORE_SCANS,
    f"{_GUARD}::walk::drop check: `i < proved` of `scan && i < proved`": _MORE_SCANS,
    f"{_GUARD}::walk::swap operands: `std::max(std::fabs(t.alpha), std::fabs(t.beta))`":
        "a clip's limits are numbers or ±inf, never NaN: max of two non-NaN values either way",
    f"{_GUARD}::walk::swap operands: `std::min(b, cap)`": "they differ only for a NaN b "
    "(inf · 0 of a multiply before the clip): a clip is NaN-unsafe, so every term up to it "
    "is in the proved part, where the NaN already stuck in `top` (no proof) before the clip",
    f"{_WINOGRAD}::run::drop check: `team > 1` of `team > 1 && large`": _TEAM_PATH,
    f"{_WINOGRAD}::run::drop check: `large` of `team > 1 && large`": _TEAM_PATH,
})
