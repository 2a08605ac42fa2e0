"""The portable C++ elementwise kernels against the NumPy kernels of the same keys.

The NumPy library (``opforge.kernels.portable.portable_kernels()``) is the specification:
each C++ kernel is called through the kernel ABI bridge (``NativeLibrary``) on the same
arguments as the NumPy kernel, over broadcasting shapes, zero-dim and empty tensors,
strided views, every dtype the runtime computes in and the special values (NaN, +-inf,
-0.0, integer zero divisors, INT_MIN / -1), and the two outs are compared: bit for bit
(NaN payloads aside) for everything but the transcendental functions; a failure the NumPy
kernel reports must be a failure of the C++ kernel too. This file: binary arithmetic,
comparisons, where / masked_fill, logical and bitwise ops, the key set and kinds strings,
and whole zoo programs; test_portable_elementwise_math.py: unary math and activations.
"""

from __future__ import annotations

import numpy as np
import pytest

from opforge.errors import KernelError
from opforge.runtime.native import NativeLibrary
from tests.native_runtime.elementwise_support import (
    DTYPES, FLOATS, SHAPES, SPEC, compare, same, torch_dtype_result, values,
)


@pytest.fixture(scope="module")
def lib(native_runtime):
    return NativeLibrary(native_runtime.portable_library)


# --- binary arithmetic --------------------------------------------------------------------

ARITH = ["aten::add.out", "aten::sub.out", "aten::mul.out", "aten::rsub.Tensor_out",
         "aten::div.out", "aten::maximum.out", "aten::minimum.out", "aten::max.out",
         "aten::min.out", "aten::atan2.out", "aten::floor_divide.out",
         "aten::remainder.Tensor_out", "aten::fmod.Tensor_out", "aten::pow.Tensor_Tensor_out"]
ALPHA = {"aten::add.out", "aten::sub.out", "aten::rsub.Tensor_out"}
# The libm functions: the C++ kernels call the C library's (glibc: atan2f and powf within
# 1 ulp of the exact value); NumPy's float32 SIMD atan2 is up to 3 ulp off (measured on 1e5
# integer pairs), so the two may differ by 3 + 1 ulp; pow by 1 + 1.
LIBM_ULPS = {"aten::atan2.out": 4, "aten::pow.Tensor_Tensor_out": 2}
FLOAT_RESULT = {"aten::div.out", "aten::atan2.out"}


def out_dtype_of(key: str, *operands) -> np.dtype:
    ct = torch_dtype_result(*operands)
    if key in FLOAT_RESULT and ct.kind != "f":
        return np.dtype(np.float32)
    return ct


@pytest.mark.parametrize("key", ARITH)
@pytest.mark.parametrize("dtype", DTYPES)
def test_binary_same_dtype(lib, key, dtype):
    rng = np.random.default_rng(hash((key, dtype)) % 2**32)
    for sa, sb in SHAPES:
        a = values(dtype, sa, rng)
        nonzero = key in ("aten::floor_divide.out", "aten::remainder.Tensor_out",
                          "aten::fmod.Tensor_out")
        b = values(dtype, sb, rng, nonzero=nonzero)
        if key == "aten::pow.Tensor_Tensor_out" and np.dtype(dtype).kind in "iu":
            b = np.asarray(np.abs(b.astype(np.int64)) % 9
                           - (2 if np.dtype(dtype).kind == "i" else 0)).astype(dtype)
        extra = (2,) if key in ALPHA else ()
        shape = np.broadcast_shapes(sa, sb)
        compare(lib, key, a, b, *extra, out_dtype=out_dtype_of(key, a, b), out_shape=shape,
                ulps=LIBM_ULPS.get(key, 0))
        if key in ALPHA:  # alpha == 1 is a path of its own
            compare(lib, key, a, b, 1, out_dtype=out_dtype_of(key, a, b), out_shape=shape)


SCALAR_KEYS = {  # key: (position of the Scalar, has alpha)
    "aten::add.Scalar_out": (1, True), "aten::sub.Scalar_out": (1, True),
    "aten::rsub.Scalar_out": (1, True), "aten::mul.Scalar_out": (1, False),
    "aten::div.Scalar_out": (1, False), "aten::floor_divide.Scalar_out": (1, False),
    "aten::remainder.Scalar_out": (1, False), "aten::remainder.Scalar_Tensor_out": (0, False),
    "aten::fmod.Scalar_out": (1, False), "aten::pow.Tensor_Scalar_out": (1, False),
    "aten::pow.Scalar_out": (0, False),
}
SCALARS = [True, False, 3, -2, 0, 300, 2.5, -0.0, float("nan"), float("inf"), 1e10]


@pytest.mark.parametrize("key", sorted(SCALAR_KEYS))
def test_binary_scalar_overloads(lib, key):
    """Wrapped-number promotion: an int scalar keeps an int8 tensor int8 (300 wraps), a
    float one makes an integer tensor float32 and leaves float64 float64."""
    position, alpha = SCALAR_KEYS[key]
    rng = np.random.default_rng(1)
    for dtype in DTYPES:
        for scalar in SCALARS:
            for shape in [(), (5,), (2, 33)]:
                t = values(dtype, shape, rng)
                args = [scalar, t] if position == 0 else [t, scalar]
                out = out_dtype_of("aten::div.out" if key == "aten::div.Scalar_out" else key, *args)
                compare(lib, key, *args, *((2.5,) if alpha and scalar != 0 else (1,) if alpha else ()),
                        out_dtype=out, out_shape=shape,
                        ulps=2 if "pow" in key else 0)


MIXED = [("int32", "float32"), ("uint8", "int8"), ("bool", "int64"), ("float32", "float64"),
         ("int64", "float32"), ("bool", "float32"), ("uint8", "int32"), ("int8", "bool")]


@pytest.mark.parametrize("key", ARITH)
def test_binary_mixed_dtypes(lib, key):
    """Promotion between tensors, and a zero-dim tensor that does not promote a dimensioned
    one of the same category (int64 0-d with int8 stays int8; float 0-d with int is float)."""
    rng = np.random.default_rng(2)
    nonzero = key in ("aten::floor_divide.out", "aten::remainder.Tensor_out", "aten::fmod.Tensor_out")
    for da, db in MIXED + [(b, a) for a, b in MIXED]:
        for sa, sb in [((4, 5), (4, 5)), ((4, 5), ()), ((), (3,)), ((2, 1), (1, 3))]:
            a = values(da, sa, rng)
            b = values(db, sb, rng, nonzero=nonzero)
            if "pow" in key:
                b = np.asarray(np.abs(b.astype(np.float64)) % 5).astype(db)
            extra = (2,) if key in ALPHA else ()
            compare(lib, key, a, b, *extra, out_dtype=out_dtype_of(key, a, b),
                    out_shape=np.broadcast_shapes(sa, sb), ulps=LIBM_ULPS.get(key, 0))


def test_binary_into_other_out_dtypes(lib):
    """The result is cast into whatever dtype out has (NumPy's unsafe cast)."""
    rng = np.random.default_rng(3)
    a, b = values("float32", (3, 9), rng, special=False), values("float32", (9,), rng, special=False)
    for out in ["float64", "int32", "int8", "bool", "float16"]:
        compare(lib, "aten::add.out", a, b, 1, out_dtype=out, out_shape=(3, 9))
    i = values("int32", (3, 9), rng)
    compare(lib, "aten::mul.out", i, i, out_dtype="int64", out_shape=(3, 9))


def test_binary_strided_views(lib):
    """Transposed, sliced and reversed views, and an out that is itself a view."""
    rng = np.random.default_rng(4)
    base = values("float32", (6, 8), rng)
    other = values("float32", (8, 6), rng)
    for a, b in [(base.T, other), (base[::2, 1::3], other[:3, ::-3][:, :3].repeat(1, 0)[:, [0, 1, 1]]), (base[:, ::-1], other.T)]:
        for key in ["aten::add.out", "aten::mul.out", "aten::div.out", "aten::maximum.out"]:
            extra = (3,) if key in ALPHA else ()
            compare(lib, key, a, b, *extra, out_dtype="float32", out_shape=np.broadcast_shapes(a.shape, b.shape))
    want = np.zeros((8, 6), np.float32)
    got = np.zeros((8, 6), np.float32)
    SPEC["aten::add.out"](base.T, other, 1, want.T.T[:, :])
    lib.kernel("aten::add.out")(base.T, other, 1, got[:, :])
    same(got, want)
    got_t = np.zeros((6, 8), np.float32).T  # an out in column-major order
    lib.kernel("aten::add.out")(base.T, other, 1, got_t)
    same(np.ascontiguousarray(got_t), want)


def test_integer_division_edges(lib):
    """INT_MIN // -1 and INT_MIN % -1 as NumPy gives them; a zero divisor is refused."""
    for dt in ["int8", "int32", "int64"]:
        info = np.iinfo(dt)
        a = np.array([info.min, info.min, info.max, -7, 7, -7, 7, 0], dt)
        b = np.array([-1, 1, -1, 2, -2, -2, 2, -3], dt)
        for key in ["aten::floor_divide.out", "aten::remainder.Tensor_out", "aten::fmod.Tensor_out"]:
            compare(lib, key, a, b, out_dtype=dt, out_shape=a.shape)
        for mode in ["floor", "trunc", None]:
            compare(lib, "aten::div.out_mode", a, b, mode, out_dtype=dt if mode else "float32",
                    out_shape=a.shape)
        zero = b.copy()
        zero[3] = 0
        for key in ["aten::floor_divide.out", "aten::remainder.Tensor_out", "aten::fmod.Tensor_out"]:
            assert compare(lib, key, a, zero, out_dtype=dt, out_shape=a.shape) is KernelError
        assert compare(lib, "aten::div.Scalar_mode_out", a, 0, "trunc", out_dtype=dt,
                       out_shape=a.shape) is KernelError
    # A divisor that is zero only once converted to the compute dtype (256 into uint8): the
    # C++ kernel refuses it as ATen does; the NumPy kernel checks before converting and
    # writes NumPy's 0 with a RuntimeWarning (a documented difference).
    with pytest.raises(KernelError, match="divisor is zero"):
        lib.kernel("aten::remainder.Tensor_out")(np.arange(4, dtype=np.uint8), np.array(256),
                                                 np.empty(4, np.uint8))


@pytest.mark.parametrize("mode", [None, "floor", "trunc"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_div_modes(lib, mode, dtype):
    rng = np.random.default_rng(5)
    for sa, sb in SHAPES[:6]:
        a, b = values(dtype, sa, rng), values(dtype, sb, rng, nonzero=dtype not in FLOATS)
        ct = torch_dtype_result(a, b)
        out = "float32" if mode is None and ct.kind != "f" else ct
        compare(lib, "aten::div.out_mode", a, b, mode, out_dtype=out, out_shape=np.broadcast_shapes(sa, sb))
        compare(lib, "aten::div.Scalar_mode_out", a, 2.5, mode,
                out_dtype=out_dtype_of("aten::div.out", a, 2.5) if mode is None else torch_dtype_result(a, 2.5),
                out_shape=sa)
    assert compare(lib, "aten::div.out_mode", a, b, "round", out_dtype=out,
                   out_shape=np.broadcast_shapes(a.shape, b.shape)) is KernelError


def test_integer_power_edges(lib):
    base = np.array([2, 3, -1, -1, 1, 5, 0, 7], np.int32)
    exponent = np.array([-1, 2, -3, -4, -5, 40, 0, 13], np.int32)
    compare(lib, "aten::pow.Tensor_Tensor_out", base, exponent, out_dtype="int32", out_shape=(8,))
    assert compare(lib, "aten::pow.Tensor_Scalar_out", base, -1, out_dtype="int32",
                   out_shape=(8,)) is KernelError
    compare(lib, "aten::pow.Tensor_Scalar_out", base.astype(np.uint8), -1, out_dtype="uint8",
            out_shape=(8,))  # -1 is 255 in uint8: not negative
    compare(lib, "aten::pow.Scalar_out", 2, exponent, out_dtype="int64", out_shape=(8,))


def test_broadcast_refusals(lib):
    a, b = np.ones((3, 4), np.float32), np.ones((5,), np.float32)
    with pytest.raises(KernelError, match="broadcast"):
        lib.kernel("aten::add.out")(a, b, 1, np.empty((3, 4), np.float32))
    with pytest.raises(KernelError, match="shape"):
        lib.kernel("aten::add.out")(a, a, 1, np.empty((4, 3), np.float32))
    with pytest.raises(KernelError, match="bool"):
        lib.kernel("aten::sub.out")(a > 0, a > 0, 1, np.empty((3, 4), bool))


# --- comparisons, where, masked_fill, logical and bitwise ---------------------------------

COMPARISONS = ["eq", "ne", "lt", "le", "gt", "ge"]


@pytest.mark.parametrize("name", COMPARISONS)
def test_comparisons(lib, name):
    """Compared in the promoted dtype: int32 against 2.5 in float32, an int64 tensor against
    a float32 one in float32 (large ints round first), NaN unequal to itself."""
    rng = np.random.default_rng(6)
    pairs = [(d, d) for d in DTYPES] + MIXED
    for da, db in pairs:
        for sa, sb in SHAPES[:8]:
            a, b = values(da, sa, rng), values(db, sb, rng)
            if a.size and b.size and a.dtype == b.dtype:  # equal elements too
                b.reshape(-1)[:1] = a.reshape(-1)[:1]
            compare(lib, f"aten::{name}.Tensor_out", a, b, out_dtype="bool",
                    out_shape=np.broadcast_shapes(sa, sb))
        for scalar in SCALARS:
            a = values(da, (3, 5), rng)
            compare(lib, f"aten::{name}.Scalar_out", a, scalar, out_dtype="bool", out_shape=(3, 5))
    big = np.array([2**24 + 1, 2**62], np.int64)
    compare(lib, f"aten::{name}.Tensor_out", big, np.array([2**24], np.float32), out_dtype="bool",
            out_shape=(2,))
    compare(lib, f"aten::{name}.Scalar_out", big, 2, out_dtype="float32", out_shape=(2,))


def test_where_and_masked_fill(lib):
    rng = np.random.default_rng(7)
    for dtype in DTYPES:
        for cond_dtype in ["bool", "uint8", "float32"]:
            cond = values(cond_dtype, (3, 1, 4), rng, special=False)
            x, y = values(dtype, (2, 4), rng), values(dtype, (1,), rng)
            compare(lib, "aten::where.self_out", cond, x, y, out_dtype=dtype, out_shape=(3, 2, 4))
            compare(lib, "aten::where.self_out", cond, x, y, out_dtype="float64", out_shape=(3, 2, 4))
        self = values(dtype, (3, 2, 4), rng)
        mask = values("bool", (2, 1), rng)
        for value in [True, 7, -1.5, float("nan"), 300]:
            compare(lib, "aten::masked_fill.Scalar_out", self, mask, value, out_dtype=dtype,
                    out_shape=self.shape)
        compare(lib, "aten::masked_fill.Tensor_out", self, mask, values("float64", (), rng),
                out_dtype=dtype, out_shape=self.shape)


@pytest.mark.parametrize("name", ["and", "or", "xor"])
def test_logical_and_bitwise(lib, name):
    rng = np.random.default_rng(8)
    for da, db in [(d, d) for d in DTYPES] + MIXED:
        for sa, sb in SHAPES[:8]:
            a, b = values(da, sa, rng), values(db, sb, rng)
            shape = np.broadcast_shapes(sa, sb)
            compare(lib, f"aten::logical_{name}.out", a, b, out_dtype="bool", out_shape=shape)
            compare(lib, f"aten::logical_{name}.out", a, b, out_dtype="float32", out_shape=shape)
            ct = torch_dtype_result(a, b)
            compare(lib, f"aten::bitwise_{name}.Tensor_out", a, b, out_dtype=ct, out_shape=shape)
        a = values(da, (4, 3), rng)
        for scalar in [True, 5, -3, 300]:
            ct = torch_dtype_result(a, scalar)
            compare(lib, f"aten::bitwise_{name}.Scalar_out", a, scalar, out_dtype=ct, out_shape=a.shape)
            compare(lib, f"aten::bitwise_{name}.Scalar_Tensor_out", scalar, a, out_dtype=ct,
                    out_shape=a.shape)


def test_not(lib):
    rng = np.random.default_rng(9)
    for dtype in DTYPES:
        a = values(dtype, (5, 7), rng)[:, ::2]
        compare(lib, "aten::logical_not.out", a, out_dtype="bool", out_shape=a.shape)
        compare(lib, "aten::logical_not.out", a, out_dtype="int32", out_shape=a.shape)
        compare(lib, "aten::bitwise_not.out", a, out_dtype=dtype, out_shape=a.shape)


# --- the key set and the kinds strings -------------------------------------------------------

FAMILIES = ("binary", "comparison", "logical", "unary", "activation")


def elementwise_entries(native_runtime):
    from opforge.runtime.native import kernel_table

    return [e for e in kernel_table(native_runtime.portable_library)
            if e.source in FAMILIES]


def test_keys_match_the_numpy_modules(native_runtime):
    """Every key of these families is a NumPy kernel (the specification), and every kernel
    of the NumPy modules they restate has a C++ kernel here."""
    from opforge.kernels.portable import activation, arithmetic, comparison, unary

    ours = {e.key for e in elementwise_entries(native_runtime)}
    spec = set().union(*(m.KERNELS for m in (arithmetic, comparison, unary, activation)))
    assert ours - set(SPEC) == set()
    assert spec - ours == set()


def test_kinds_match_the_schemas(native_runtime):
    """One kind per schema argument, outs included, and each kind fits the argument's type
    (base kind, optional, out) — the kinds strings of the families' tables, checked against
    torch's schemas of the out overloads."""
    torch = pytest.importorskip("torch")
    from opforge.native.abi import KIND_OPTIONAL, KIND_SCALAR, ArgTag

    base_of = {"Tensor": ArgTag.TENSOR, "Scalar": KIND_SCALAR, "number": KIND_SCALAR, "int": ArgTag.INT,
               "float": ArgTag.DOUBLE, "bool": ArgTag.BOOL, "str": ArgTag.STRING}
    for entry in elementwise_entries(native_runtime):
        op, overload = entry.key.split("::")[1].split(".")
        schema = getattr(getattr(torch.ops.aten, op), overload)._schema
        assert len(entry.arg_kinds) == len(schema.arguments), (entry.key, str(schema))
        for kind, argument in zip(entry.arg_kinds, schema.arguments):
            optional = isinstance(argument.type, torch.OptionalType)
            base = argument.type.getElementType() if optional else argument.type
            assert kind & 0xFF == base_of[str(base)], (entry.key, argument.name)
            assert bool(kind & KIND_OPTIONAL) == optional, (entry.key, argument.name)
            assert bool(kind & 0x200) == argument.is_out, (entry.key, argument.name)


# --- whole programs -------------------------------------------------------------------------

def _operator_keys(program) -> set[str]:
    return {f"{o.name}.{o.overload}" for m in program.methods for o in m.operators}


@pytest.mark.parametrize("name", ["mlp", "cnn", "resnet_block", "depthwise_separable",
                                  "transformer_layer", "gpt_decoder"])
def test_zoo_program_on_the_cpp_kernels(native_runtime, name):
    """A zoo model on the C++ portable library (its kernels override the NumPy ones of the
    same keys) against the lean NumPy runtime. Skipped while a kernel of the model's is not
    in the C++ library yet (the shape and linear-algebra families come from other
    engineers). Tolerance: the two sides sum matrix products in different orders (blocked
    C++ GEMM, NumPy's BLAS) and the lean runtime's bound GELU looks Phi up in a table
    (8e-8 absolute), so float32 outputs agree to ~1e-6 of their scale, not bit for bit."""
    pytest.importorskip("torch")
    from opforge.examples.zoo import ZOO
    from opforge.export import export
    from opforge.runtime import load
    from opforge.runtime.native import kernel_table

    model, inputs = ZOO[name]()
    program = export(model, inputs)
    keys = {e.key for e in kernel_table(native_runtime.portable_library)}
    missing = sorted(_operator_keys(program) - keys)
    if missing:
        pytest.skip(f"{name}: no C++ kernel yet for {', '.join(missing)}")
    args = [x.numpy() for x in inputs]
    want = load(program).method("forward")(*args)
    got = load(program, kernels=[str(native_runtime.portable_library)]).method("forward")(*args)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        scale = float(np.max(np.abs(w))) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * max(scale, 1.0), err_msg=name)


def test_numbers_in_tensor_arguments(lib):
    """A Python number where the schema has a Tensor promotes as a wrapped number (an int32
    tensor times 0.5 is float32, not float64), as the NumPy kernels treat it."""
    rng = np.random.default_rng(15)
    i, f = values("int32", (3, 4), rng), values("float32", (3, 4), rng)
    for key, args, out in [("aten::mul.out", (i, 0.5), "float32"), ("aten::mul.out", (f, 3), "float32"),
                           ("aten::add.out", (i, 2.5, 1), "float32"), ("aten::div.out", (7, f), "float32"),
                           ("aten::eq.Tensor_out", (i, 2), "bool"), ("aten::sub.out", (True, i, 1), "int32"),
                           ("aten::where.self_out", (f > 0, f, 0.0), "float32"),
                           ("aten::where.self_out", (f > 0, -1, i), "int32")]:
        compare(lib, key, *args, out_dtype=out, out_shape=(3, 4))
