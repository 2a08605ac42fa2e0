"""The cpu backend's post-op fusion decisions, on plans written by hand: which elementwise
ops a convolution, matmul or binary absorbs (in order, with their attributes), which it
must not (an operand computed later, a result someone else reads, views, outputs, other
layouts, ``c - t``), the post-op limit, and eltwise chains that start as ``binary add`` of
a zero. test_cpu_positions.py checks the values of fused models against float64; this file
checks that fusion happens where it should and nowhere else (a missed fusion computes the
right values, slower).
"""

from __future__ import annotations

import pytest
import torch

from opforge.backends.cpu.lowering.core import (
    B_ADD, B_DIV, B_MUL, B_SUB, RELU, TANH, Plan, TensorSpec, row_major,
)
from opforge.backends.cpu.lowering.fusion import MAX_POST_OPS, fuse

# attributes with alpha != beta, so a swapped or repeated attribute shows
RELU_POST = [0, RELU, 0.25, 0.5, -1]
TANH_POST = [0, TANH, 1.5, 2.5, -1]


def tensor(plan: Plan, role: str = "temp", dims=(2, 3), strides=None, base: int = -1) -> int:
    plan.tensors.append(TensorSpec(torch.float32, tuple(dims), tuple(strides or row_major(dims)),
                                   role, base=base))
    tid = len(plan.tensors) - 1
    if role == "input":
        plan.inputs.append(tid)
    if role == "output":
        plan.outputs.append(tid)
    return tid


def op(plan: Plan, kind: str, ins, outs, ia=(), fa=(), name=None, post=None) -> None:
    plan.ops.append({"kind": kind, "in": list(ins), "out": list(outs), "ia": list(ia),
                     "fa": list(fa), "post": [list(p) for p in post or []],
                     "name": name or kind})


def relu(plan, src, dst):
    op(plan, "eltwise", [src], [dst], [RELU], RELU_POST[2:4], "relu")


def tanh(plan, src, dst):
    op(plan, "eltwise", [src], [dst], [TANH], TANH_POST[2:4], "tanh")


def summary(plan: Plan) -> list[tuple]:
    return [(o["kind"], o["in"], o["out"], o["post"], o["name"]) for o in plan.ops]


def test_a_convolution_absorbs_an_eltwise_chain_in_order():
    p = Plan()
    x, w, t, u, y = (tensor(p, r) for r in ("input", "const", "temp", "temp", "output"))
    op(p, "conv", [x, w], [t])
    relu(p, t, u)
    tanh(p, u, y)
    fuse(p)
    assert summary(p) == [("conv", [x, w], [y], [RELU_POST, TANH_POST], "conv+relu+tanh")]
    assert p.tensors[t].role == p.tensors[u].role == "dead"


def test_at_most_max_post_ops_then_the_rest_starts_its_own_chain():
    p = Plan()
    x, w = tensor(p, "input"), tensor(p, "const")
    src = tensor(p)
    op(p, "conv", [x, w], [src])
    for k in range(MAX_POST_OPS + 3):
        dst = tensor(p, "output" if k == MAX_POST_OPS + 2 else "temp")
        relu(p, src, dst)
        src = dst
    fuse(p)
    assert [(o["kind"], len(o["post"])) for o in p.ops] == [("conv", MAX_POST_OPS), ("binary", 3)]


@pytest.mark.parametrize("alg", [B_ADD, B_SUB, B_MUL, B_DIV])
def test_a_binary_reading_the_result_first_becomes_a_post_op(alg):
    p = Plan()
    x, t, y, w, c = (tensor(p, r) for r in ("input", "temp", "output", "const", "const"))
    op(p, "conv", [x, w], [t])
    op(p, "binary", [t, c], [y], [alg], name="bin")
    fuse(p)
    assert summary(p) == [("conv", [x, w], [y], [[1, alg, 0.0, 0.0, c]], "conv+bin")]


@pytest.mark.parametrize("alg, fused", [(B_ADD, True), (B_MUL, True), (B_SUB, False),
                                        (B_DIV, False)])
def test_a_binary_reading_the_result_second_only_when_it_commutes(alg, fused):
    # c - t and c / t are not a post-op on t
    p = Plan()
    x, t, y, w, c = (tensor(p, r) for r in ("input", "temp", "output", "const", "const"))
    op(p, "conv", [x, w], [t])
    op(p, "binary", [c, t], [y], [alg], name="bin")
    fuse(p)
    if fused:
        assert summary(p) == [("conv", [x, w], [y], [[1, alg, 0.0, 0.0, c]], "conv+bin")]
    else:
        assert [(o["kind"], o["post"]) for o in p.ops] == [("conv", []), ("binary", [])]


def test_a_binary_of_the_result_with_itself_is_not_fused():
    p = Plan()
    x, t, y, w = (tensor(p, r) for r in ("input", "temp", "output", "const"))
    op(p, "conv", [x, w], [t])
    op(p, "binary", [t, t], [y], [B_MUL])
    fuse(p)
    assert [(o["kind"], o["post"]) for o in p.ops] == [("conv", []), ("binary", [])]


@pytest.mark.parametrize("through_view", [False, True])
def test_an_operand_computed_after_the_producer_is_not_fused(through_view):
    # u is written by op 1, after the convolution (op 0) that would take the add
    p = Plan()
    x, x2, t, u, y, w = (tensor(p, r) for r in ("input", "input", "temp", "temp", "output",
                                                "const"))
    op(p, "conv", [x, w], [t])
    relu(p, x2, u)
    other = tensor(p, "alias", base=u) if through_view else u
    op(p, "binary", [t, other], [y], [B_ADD])
    fuse(p)
    if through_view:
        assert [(o["kind"], o["post"]) for o in p.ops] == [("conv", []), ("eltwise", []),
                                                           ("binary", [])]
    else:  # the relu starts a chain (a binary add of a zero) that takes the add, t before it
        assert [(o["kind"], o["post"]) for o in p.ops] == [
            ("conv", []), ("binary", [[0, RELU, *RELU_POST[2:4], -1], [1, B_ADD, 0.0, 0.0, t]])]


def test_a_binary_and_a_convolution_take_several_binary_post_ops():
    # oneDNN 3.2 runs a binary with several binary post-ops on its jit kernel (jit:uni, one
    # pass: 548 µs on 1M floats with three, against three passes of ~1.1 ms)
    p = Plan()
    x, t0, t1, y, c1, c2, c3 = (tensor(p, r) for r in ("input", "temp", "temp", "output",
                                                       "const", "const", "const"))
    op(p, "binary", [x, c1], [t0], [B_ADD], name="add")
    op(p, "binary", [t0, c2], [t1], [B_MUL], name="mul")
    op(p, "binary", [t1, c3], [y], [B_ADD], name="add2")
    fuse(p)
    assert summary(p) == [("binary", [x, c1], [y], [[1, B_MUL, 0.0, 0.0, c2],
                                                    [1, B_ADD, 0.0, 0.0, c3]], "add+mul+add2")]
    p = Plan()
    x, t0, t1, y, w, c1, c2 = (tensor(p, r) for r in ("input", "temp", "temp", "output",
                                                      "const", "const", "const"))
    op(p, "conv", [x, w], [t0])
    op(p, "binary", [t0, c1], [t1], [B_ADD], name="add")
    op(p, "binary", [t1, c2], [y], [B_MUL], name="mul")
    fuse(p)
    assert summary(p) == [("conv", [x, w], [y], [[1, B_ADD, 0.0, 0.0, c1],
                                                 [1, B_MUL, 0.0, 0.0, c2]], "conv+add+mul")]


def test_a_binary_post_op_then_an_eltwise_and_an_eltwise_then_a_binary():
    p = Plan()
    x, t0, t1, y, c1, c2 = (tensor(p, r) for r in ("input", "temp", "temp", "output",
                                                   "const", "const"))
    op(p, "binary", [x, c1], [t0], [B_ADD], name="add")
    op(p, "binary", [t0, c2], [t1], [B_MUL], name="mul")
    relu(p, t1, y)
    fuse(p)
    assert summary(p) == [("binary", [x, c1], [y], [[1, B_MUL, 0.0, 0.0, c2], RELU_POST],
                           "add+mul+relu")]
    p = Plan()
    x, t0, t1, y, c1, c2 = (tensor(p, r) for r in ("input", "temp", "temp", "output",
                                                   "const", "const"))
    op(p, "binary", [x, c1], [t0], [B_ADD], name="add")
    relu(p, t0, t1)
    op(p, "binary", [t1, c2], [y], [B_MUL], name="mul")
    fuse(p)
    assert summary(p) == [("binary", [x, c1], [y], [RELU_POST, [1, B_MUL, 0.0, 0.0, c2]],
                           "add+relu+mul")]


def test_a_result_also_read_by_a_post_op_elsewhere_is_not_fused():
    p = Plan()
    x, w, y1, y2, t = (tensor(p, r) for r in ("input", "const", "output", "output", "temp"))
    op(p, "conv", [x, w], [t])
    relu(p, t, y1)
    op(p, "conv", [x, w], [y2], post=[[1, B_ADD, 0.0, 0.0, t]])
    fuse(p)
    assert [(o["kind"], o["post"]) for o in p.ops] == [
        ("conv", []), ("eltwise", []), ("conv", [[1, B_ADD, 0.0, 0.0, t]])]


def test_an_eltwise_reading_a_reshape_of_the_result_is_fused_under_the_result_s_shape():
    # a linear's rows [6, 4] read as [2, 3, 4] by its activation: the matmul writes the
    # activation's output, under the rows' shape (an alias of it)
    p = Plan()
    x, w = tensor(p, "input", dims=(6, 5)), tensor(p, "const", dims=(5, 4))
    t = tensor(p, "temp", dims=(6, 4))
    seen = tensor(p, "alias", dims=(2, 3, 4), base=t)
    y = tensor(p, "output", dims=(2, 3, 4))
    op(p, "matmul", [x, w], [t])
    relu(p, seen, y)
    fuse(p)
    (fused,) = p.ops
    assert fused["kind"] == "matmul" and fused["post"] == [RELU_POST]
    out = p.tensors[fused["out"][0]]
    assert out.role == "alias" and out.base == y and out.dims == (6, 4)
    assert p.tensors[t].role == "dead"


def test_a_binary_reading_a_reshape_takes_its_operand_under_the_result_s_shape():
    p = Plan()
    x, w = tensor(p, "input", dims=(6, 5)), tensor(p, "const", dims=(5, 4))
    res = tensor(p, "input", dims=(2, 3, 4))
    t = tensor(p, "temp", dims=(6, 4))
    seen = tensor(p, "alias", dims=(2, 3, 4), base=t)
    y = tensor(p, "output", dims=(2, 3, 4))
    op(p, "matmul", [x, w], [t])
    op(p, "binary", [res, seen], [y], [B_ADD])  # residual + linear(x)
    fuse(p)
    (fused,) = p.ops
    operand = p.tensors[fused["post"][0][4]]
    assert fused["post"][0][:4] == [1, B_ADD, 0.0, 0.0]
    assert operand.role == "alias" and operand.base == res and operand.dims == (6, 4)


@pytest.mark.parametrize("view", ["slice", "transpose"])
def test_no_fusion_through_a_view_that_is_not_a_whole_reshape(view):
    p = Plan()
    x, w = tensor(p, "input", dims=(6, 5)), tensor(p, "const", dims=(5, 4))
    t = tensor(p, "temp", dims=(6, 4))
    if view == "slice":
        seen = tensor(p, "alias", dims=(3, 4), base=t)
        y = tensor(p, "output", dims=(3, 4))
    else:
        seen = tensor(p, "alias", dims=(4, 6), strides=(1, 4), base=t)
        y = tensor(p, "output", dims=(4, 6), strides=(1, 4))
    op(p, "matmul", [x, w], [t])
    relu(p, seen, y)
    fuse(p)
    assert [o["kind"] for o in p.ops] == ["matmul", "eltwise"]


@pytest.mark.parametrize("case", ["graph_output", "viewed", "two_readers", "other_layout",
                                  "not_elementwise"])
def test_no_fusion_into_a_result_that(case):
    p = Plan()
    x, w = tensor(p, "input"), tensor(p, "const")
    t = tensor(p, "output" if case == "graph_output" else "temp")
    y = tensor(p, "output", strides=(1, 2) if case == "other_layout" else None)
    op(p, "conv", [x, w], [t])
    if case == "not_elementwise":
        op(p, "softmax", [t], [y], [1, 0])
    else:
        relu(p, t, y)
    if case == "viewed":  # a reshape of the result that another op reads
        tanh(p, tensor(p, "alias", dims=(3, 2), base=t), tensor(p, "output", dims=(3, 2)))
    if case == "two_readers":
        tanh(p, t, tensor(p, "output"))
    before = [(o["kind"], o["in"], o["out"]) for o in p.ops]
    fuse(p)
    assert [(o["kind"], o["in"], o["out"], o["post"]) for o in p.ops] == \
        [(*b, []) for b in before]


def test_an_eltwise_chain_starts_as_a_binary_add_of_zero():
    p = Plan()
    x, t, y = tensor(p, "input"), tensor(p), tensor(p, "output")
    tensor(p, "alias", base=x)  # an unrelated view changes nothing
    relu(p, x, t)
    tanh(p, t, y)
    fuse(p)
    ((kind, ins, outs, post, name),) = summary(p)
    assert (kind, ins[0], outs, post, name) == ("binary", x, [y], [RELU_POST, TANH_POST],
                                                "relu+tanh")
    assert p.ops[0]["ia"] == [B_ADD] and p.ops[0]["fa"] == []
    zero = p.tensors[ins[1]]
    assert zero.role == "const" and zero.dims == (1, 1) and zero.data == bytes(4)


@pytest.mark.parametrize("case", ["lone", "two_readers", "viewed", "not_eltwise_reader",
                                  "strided_source"])
def test_an_eltwise_that_starts_no_chain_stays_an_eltwise(case):
    # a lone eltwise primitive is as fast as a binary; a chain needs one same-layout reader
    p = Plan()
    x = tensor(p, "input", strides=(1, 2) if case == "strided_source" else None)
    t = tensor(p, "output" if case == "lone" else "temp")
    relu(p, x, t)
    if case == "not_eltwise_reader":
        op(p, "softmax", [t], [tensor(p, "output")], [1, 0])
    elif case != "lone":
        tanh(p, t, tensor(p, "output"))
    if case == "two_readers":
        tanh(p, t, tensor(p, "output"))
    if case == "viewed":  # a reshape of the result that another op reads
        tanh(p, tensor(p, "alias", dims=(3, 2), base=t), tensor(p, "output", dims=(3, 2)))
    kinds = [o["kind"] for o in p.ops]
    fuse(p)
    assert [o["kind"] for o in p.ops] == kinds and all(not o["post"] for o in p.ops)


def test_a_binary_that_took_post_ops_joins_the_chain_before_it_with_them():
    # relu → sub(·, x) → tanh → mul(·, x): the first pass fuses the sub with the tanh and
    # the mul; the relu then starts a chain (binary add of a zero) and takes the sub with
    # its post-ops, in order: one op, its operands all computed before it
    p = Plan()
    x, t0, t1, t2, y = (tensor(p, r) for r in ("input", "temp", "temp", "temp", "output"))
    relu(p, x, t0)
    op(p, "binary", [t0, x], [t1], [B_SUB], name="sub")
    tanh(p, t1, t2)
    op(p, "binary", [t2, x], [y], [B_MUL], name="mul")
    fuse(p)
    (kind, ins, outs, post, name), = summary(p)
    assert (kind, ins[0], outs, name) == ("binary", x, [y], "relu+sub+tanh+mul")
    assert post == [[0, RELU, *RELU_POST[2:4], -1], [1, B_SUB, 0.0, 0.0, x], TANH_POST,
                    [1, B_MUL, 0.0, 0.0, x]]


def test_a_binary_whose_post_op_operand_comes_later_stays_apart():
    # sub(t0, x) took mul(·, u) with u computed after the relu that writes t0: the relu
    # cannot take the sub with that post-op (u does not exist yet when it runs)
    p = Plan()
    x, t0, u, t1, y = (tensor(p, r) for r in ("input", "temp", "temp", "temp", "output"))
    relu(p, x, t0)
    tanh(p, x, u)
    op(p, "binary", [t0, x], [t1], [B_SUB], name="sub")
    op(p, "binary", [t1, u], [y], [B_MUL], name="mul")
    fuse(p)
    assert [(o["name"], o["out"]) for o in p.ops] == [("relu", [t0]), ("tanh", [u]),
                                                      ("sub+mul", [y])]
