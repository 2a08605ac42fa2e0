"""opforge.check without a compiler: the samples per argument kind, the child-process runner
(crash, hang, guard zones, unwritten outputs), whole mismatch texts, and check_op on Python
kernels, with PyTorch's own op as the reference of an ATen op (issue 16, item 1)."""

from __future__ import annotations

import ctypes
import time

import numpy as np
import pytest
import torch

from opforge.check import check_op, compare, generate_samples
from opforge.check.isolation import Job, run_isolated
from opforge.check.samples import NoSamples, user_samples
from opforge.manifest import parse_manifest
from opforge.schema import FunctionSchema


def samples(schema: str):
    return list(generate_samples(FunctionSchema.parse(schema)))


def test_dims_of_both_signs_and_small_ints():
    got = samples("t::f(Tensor x, int dim, int k) -> Tensor")
    dims = {s.args[1] for s in got if s.args[0].dim() == 3}
    assert dims == {-3, -2, -1, 0, 1, 2}
    assert {s.args[2] for s in got} == {0, 1, 2, 3, 5}
    assert {s.args[1] for s in got if s.args[0].dim() == 0} == {0, -1}


def test_none_for_optionals_and_scalars_of_each_type():
    got = samples("t::f(Tensor x, Tensor? w, int? k, Scalar s, float f=0.25, bool b=False) "
                  "-> Tensor")
    assert any(s.args[1] is None for s in got) and any(s.args[1] is not None for s in got)
    assert None in {s.args[2] for s in got}
    assert {type(s.args[3]) for s in got} == {int, float, bool}
    assert got[0].args[4] == 0.25 and got[0].args[5] is False  # defaults come first


def test_layouts_broadcast_and_zero_size():
    got = samples("t::f(Tensor a, Tensor b) -> Tensor")
    tensors = [s.args[0] for s in got]
    assert any(0 in t.stride() and t.numel() > 1 for t in tensors)  # expanded
    assert any(not t.is_contiguous() and 0 not in t.stride() for t in tensors)  # strided
    assert any(t.numel() == 0 for t in tensors)
    assert any(s.args[0].shape != s.args[1].shape for s in got)  # broadcast / per argument
    assert {s.dtype for s in got} == {"float32", "float64", "int32", "int64"}


def test_an_argument_without_values_needs_user_samples():
    with pytest.raises(NoSamples, match="'mode' of type str"):
        samples("t::f(Tensor x, str mode) -> Tensor")
    schema = FunctionSchema.parse("t::f(Tensor x, str mode, int k=2) -> Tensor")
    x = torch.ones(2)
    user = user_samples(lambda: [((x,), {"mode": "a"}), ((x, "b", 3), {})], schema, "hook")
    assert [s.args[1:] for s in user] == [["a", 2], ["b", 3]]
    assert user[0].from_user and user[0].dtype == "float32"


# --- the child-process runner -----------------------------------------------------

def _jobs(n: int):
    return [Job([np.full(3, float(i), np.float32)], [((3,), np.dtype(np.float32))])
            for i in range(n)]


def test_a_crash_is_a_result_and_the_rest_still_run():
    def kernel(x, out):
        if x[0] == 1:
            ctypes.string_at(0)  # SIGSEGV
        out[...] = x * 2

    runs = run_isolated(kernel, _jobs(3))
    assert runs[1].crash == "SIGSEGV" and runs[1].outs is None
    assert runs[0].outs[0].tolist() == [0, 0, 0] and runs[2].outs[0].tolist() == [4, 4, 4]


def test_a_hang_times_out():
    def kernel(x, out):
        if x[0] == 0:
            time.sleep(30)
        out[...] = x

    start = time.monotonic()
    runs = run_isolated(kernel, _jobs(2), timeout=0.5)
    assert runs[0].crash == "timed out after 0.5 s" and runs[1].outs is not None
    assert time.monotonic() - start < 10


def test_writes_past_the_end_into_inputs_and_unwritten_elements():
    def past_end(x, out):
        out[...] = x
        np.lib.stride_tricks.as_strided(out, shape=(out.size + 1,))[-1] = 7

    def into_input(x, out):
        out[...] = x
        x[0] = 99

    def first_only(x, out):
        out[0] = x[0]

    assert "wrote after the end of the output float32[3]" in run_isolated(past_end, _jobs(1))[0].problems[0]
    assert "argument 0: the kernel changed an input" in run_isolated(into_input, _jobs(1))[0].problems
    problem = run_isolated(first_only, _jobs(1))[0].problems[0]
    assert "2 of 3 element(s) differ between two runs" in problem and "index (1,)" in problem


def test_mismatch_text_is_whole():
    want = np.arange(30, dtype=np.float32).reshape(5, 6)
    got = want.copy()
    got[2, 3] = -1
    text = compare(got, want)
    assert text.startswith("1 of 30 element(s) differ; max abs error 16, max rel error 1.06667")
    assert "first at index (2, 3): expected np.float32(15.0), got np.float32(-1.0)" in text
    assert compare(want, want) is None
    assert compare(np.zeros(3), np.zeros(4)) == "shape [3], expected [4]"


# --- check_op on Python kernels ---------------------------------------------------

ATEN_ADD = "- op: add.out\n  kernels:\n    - arg_meta: null\n      kernel_name: py::add_out\n"


def _add(self, other, alpha, out):
    with np.errstate(all="ignore"):  # inf - inf in the edge values
        out[...] = self + alpha * other


def _wrong_add(self, other, alpha, out):
    with np.errstate(all="ignore"):
        out[...] = self - alpha * other


def test_an_aten_op_is_checked_against_torch():
    opdef = parse_manifest(ATEN_ADD, "add.yaml")[0]
    good = check_op(opdef, _add, isolate=False)
    assert good.ok and good.verified and good.reference == "torch: aten::add.Tensor", good.messages
    assert good.skipped > 0  # shapes that do not broadcast, int tensors with a float alpha
    wrong = check_op(opdef, _wrong_add, isolate=False)
    assert not wrong.ok and "native" in wrong.failures


def test_without_a_reference_the_report_says_so():
    opdef = parse_manifest("- func: chk_noref::twice(Tensor x) -> Tensor\n", "noref.yaml")[0]

    def five_times(x, out):
        out[...] = x * 5  # wrong, and nothing to compare it with

    report = check_op(opdef, five_times, eager=False, isolate=False)
    assert report.ok and not report.verified
    assert report.warnings[0].startswith("no reference: only consistency checked (kernel vs "
                                         "fake shapes, eager vs lean")
    assert report.to_json()["verified"] is False


def test_register_samples_of_a_python_op_reaches_a_bug_the_generator_misses():
    import opforge

    @opforge.op("chk_py::mul_k(Tensor x, int k) -> Tensor")
    def mul_k(x, k):
        return x * k

    def kernel(x, k, out):
        out[...] = x * k + (k == 7)  # wrong for k == 7 only

    assert check_op(mul_k.opdef, kernel, eager=False, isolate=False).ok

    @mul_k.register_samples
    def samples():
        return [((torch.ones(2, 3), 7), {})]

    report = check_op(mul_k.opdef, kernel, eager=False, isolate=False)
    assert report.failed == 1 and "(samples: " in report.messages[0]
    assert "k=7" in report.messages[0]


def test_shapes_per_argument_come_from_the_fake():
    import opforge

    @opforge.op("chk_mm::mm(Tensor a, Tensor b) -> Tensor")
    def mm(a, b):
        return a @ b

    @mm.register_fake
    def mm_fake(a, b):
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
            raise ValueError("mm: (n, k) @ (k, m)")
        return a.new_empty((a.shape[0], b.shape[1]))

    def kernel(a, b, out):
        out[...] = a @ b

    def wrong(a, b, out):
        out[...] = a @ b
        out[..., -1:] = 0  # the last column lost

    report = check_op(mm.opdef, kernel, eager=False, isolate=False)
    # of the same-shape and broadcast samples only (3, 1) @ (1, 4) is valid (once per dtype):
    # the others are (n, k) @ (k, m) pairs of the per-argument pool
    assert report.ok and report.passed > 8 and report.skipped > report.passed, report.messages
    bad = check_op(mm.opdef, wrong, eager=False, isolate=False)
    assert not bad.ok and bad.failed > 8
    assert any("(generated, per-argument)" in m for m in bad.messages)


def test_a_wrong_fake_is_a_fake_vs_real_failure_even_when_the_kernel_refuses_the_sample():
    import opforge
    from opforge.errors import KernelError

    @opforge.op("chk_fake::gelu_mul(Tensor w, Tensor x) -> Tensor")
    def gelu_mul(w, x):  # no fake: the default one shapes the output like w (wrong here)
        return torch.nn.functional.gelu(w) * x

    def kernel(w, x, out):  # a careful kernel: refuses an output that does not broadcast
        shape = np.broadcast_shapes(w.shape, x.shape)
        if out.shape != shape:
            raise KernelError(f"gelu_mul: out {out.shape}, inputs broadcast to {shape}")
        out[...] = (torch.nn.functional.gelu(torch.from_numpy(np.ascontiguousarray(w)))
                    * torch.from_numpy(np.ascontiguousarray(x))).numpy()

    report = check_op(gelu_mul.opdef, kernel, eager=False, isolate=False)
    assert not report.ok and "fake" in report.failures, (report.failures, report.notes)
    assert report.refused == 0 and not any("refused sample" in n for n in report.notes)
    message = report.failures["fake"]
    assert "fake vs real: fake [((3, 1), 'float32')], reference [((3, 4), 'float32')]" in message
    assert "the kernel refused outputs of the fake's shapes (gelu_mul: out (3, 1)" in message
    assert "and ran on outputs of the reference's" in message


def test_a_sample_the_kernel_refuses_whatever_the_outputs_stays_a_refusal():
    """AddCustom's way: the op does not broadcast (its kernel refuses x[3, 1] + y[1, 4]
    whatever outputs it is given), its fake shapes z like x, and a broadcasting reference
    is wider than the op. The fake is judged on samples the kernel takes."""
    import opforge
    from opforge.errors import KernelError

    @opforge.op("chk_fake::same_add(Tensor x, Tensor y) -> Tensor")
    def same_add(x, y):
        return x + y

    def kernel(x, y, out):
        if x.shape != y.shape or out.shape != x.shape:
            raise KernelError(f"same_add: shapes {x.shape}, {y.shape} -> {out.shape}")
        out[...] = x + y

    report = check_op(same_add.opdef, kernel, eager=False, isolate=False)
    assert report.ok and "fake" not in report.failures, report.failures
    assert report.refused > 0
    assert any("the kernel refused outputs of the reference's shapes too" in n
               for n in report.notes), report.notes
