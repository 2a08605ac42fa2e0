"""The portable kernels on the native runtime's thread pool (num_threads > 1), and the
memory limit reaching the kernels' scratch (the GEMM's packing buffers, convolution's
columns).

Threads split a product over blocks of rows or columns, never over the sum, so two threads
must give the bits of one: compared byte for byte. Each product is also held to float64
NumPy (|error| <= k * eps * sum|a||b|, the bound of any float sum), so a wrong split that
is merely deterministic fails too. Programs are hand-built (no torch): one kernel call each.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from opforge.errors import OpforgeError
from opforge.program import BoolValue, IntListValue, IntValue, NoneValue, Program, ScalarType, save
from opforge.program._sample import one_kernel_program
from opforge.runtime import load

F32, F64 = ScalarType.FLOAT32, ScalarType.FLOAT64


_one_op = one_kernel_program


def _mm(m: int, n: int, k: int, dtype=F32) -> Program:
    return _one_op("aten::mm", "out", [(dtype, (m, k)), (dtype, (k, n)), (dtype, (m, n))], [0, 1], [2])


def _linear(m: int, n: int, k: int) -> Program:  # x @ W^T: the GEMM's transposed-B paths
    return _one_op("aten::linear", "out", [(F32, (m, k)), (F32, (n, k)), NoneValue(), (F32, (m, n))],
                   [0, 1], [3])


def _conv(x_shape, w_shape, y_shape, *, stride=1, padding=0, groups=1) -> Program:
    return _one_op("aten::convolution", "out",
                   [(F32, x_shape), (F32, w_shape), NoneValue(), IntListValue((stride, stride)),
                    IntListValue((padding, padding)), IntListValue((1, 1)), BoolValue(False),
                    IntListValue((0, 0)), IntValue(groups), (F32, y_shape)], [0, 1], [9])


def _run(program: Program, inputs, *, threads: int, max_memory: int | None = None) -> np.ndarray:
    native = load(program, executor="native", num_threads=threads, max_memory=max_memory)
    (out,) = native.method("forward")(*inputs)
    return out


def _check_product(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    exact = a.astype(np.float64) @ b.astype(np.float64)
    bound = a.shape[1] * np.finfo(a.dtype).eps * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64))
    assert np.all(np.abs(got - exact) <= bound + 1e-30)


# (m, n, k): few rows (the unpacked paths, split over columns at 64), packed split over
# columns (m <= n), packed split over rows (m > n), a panel edge past NC = 2048 columns,
# sizes that are no multiple of any tile
PRODUCTS = [(1, 3072, 768), (3, 1001, 257), (64, 700, 200), (700, 96, 300), (37, 2100, 65)]


@pytest.mark.parametrize("m, n, k", PRODUCTS)
@pytest.mark.parametrize("dtype", [F32, F64])
def test_a_product_on_two_threads_has_the_bits_of_one(m, n, k, dtype):
    rng = np.random.default_rng(m * n + k)
    np_dtype = np.float32 if dtype == F32 else np.float64
    a = rng.standard_normal((m, k)).astype(np_dtype)
    b = rng.standard_normal((k, n)).astype(np_dtype)
    one = _run(_mm(m, n, k, dtype), (a, b), threads=1)
    two = _run(_mm(m, n, k, dtype), (a, b), threads=2)
    assert one.tobytes() == two.tobytes()
    _check_product(two, a, b)


@pytest.mark.parametrize("m, n, k", [(1, 3072, 768), (4, 1000, 300), (200, 384, 256)])
def test_a_linear_on_two_threads_has_the_bits_of_one(m, n, k):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    one = _run(_linear(m, n, k), (x, w), threads=1)
    three = _run(_linear(m, n, k), (x, w), threads=3)
    assert one.tobytes() == three.tobytes()
    _check_product(three, x, w.T)


def test_a_batch_of_small_products_is_split_over_its_products():
    # attention's heads: 12 products of 64 x 64 by 64, each too small to split itself
    rng = np.random.default_rng(11)
    a = rng.standard_normal((12, 64, 64)).astype(np.float32)
    b = rng.standard_normal((12, 64, 48)).astype(np.float32)
    program = _one_op("aten::bmm", "out", [(F32, (12, 64, 64)), (F32, (12, 64, 48)), (F32, (12, 64, 48))],
                      [0, 1], [2])
    one = _run(program, (a, b), threads=1)
    two = _run(program, (a, b), threads=2)
    assert one.tobytes() == two.tobytes()
    for head in range(12):
        _check_product(two[head], a[head], b[head])


@pytest.mark.parametrize("case", ["im2col", "depthwise"])
def test_a_convolution_on_two_threads_has_the_bits_of_one(case):
    rng = np.random.default_rng(3)
    if case == "im2col":
        program = _conv((1, 16, 40, 40), (32, 16, 3, 3), (1, 32, 40, 40), padding=1)
        x, w = rng.standard_normal((1, 16, 40, 40)), rng.standard_normal((32, 16, 3, 3))
    else:
        program = _conv((2, 64, 48, 48), (64, 1, 3, 3), (2, 64, 24, 24), stride=2, padding=1, groups=64)
        x, w = rng.standard_normal((2, 64, 48, 48)), rng.standard_normal((64, 1, 3, 3))
    x, w = x.astype(np.float32), w.astype(np.float32)
    one = _run(program, (x, w), threads=1)
    two = _run(program, (x, w), threads=2)
    assert one.tobytes() == two.tobytes()
    lean = load(program).method("forward")(x, w)[0]  # the NumPy kernel: the specification
    np.testing.assert_allclose(two, lean, rtol=1e-4, atol=1e-4)  # float32 sums of 144 terms


def _unary(op: str, n: int) -> Program:
    return _one_op(op, "out", [(F32, (n,)), (F32, (n,))], [0], [1])


@pytest.mark.parametrize("op", ["aten::exp", "aten::tanh", "aten::sigmoid"])
def test_a_long_elementwise_row_on_two_threads_has_the_bits_of_one(op):
    # one row of 2^20 + 37 elements, split within the row: each block's vector body and
    # tail must fall as unsplit (the vectorized formulas and their scalar tails)
    n = (1 << 20) + 37
    x = np.random.default_rng(5).uniform(-20, 20, n).astype(np.float32)
    one = _run(_unary(op, n), (x,), threads=1)
    two = _run(_unary(op, n), (x,), threads=2)
    assert one.tobytes() == two.tobytes()
    lean = load(_unary(op, n)).method("forward")(x)[0]
    np.testing.assert_allclose(two, lean, rtol=4e-7, atol=1e-30)  # the C++ kernels' <= 1-2 ulp


def test_broadcast_rows_and_a_reduction_over_many_outputs_on_three_threads():
    rng = np.random.default_rng(9)
    x = rng.standard_normal((1000, 999)).astype(np.float32)
    y = rng.standard_normal((999,)).astype(np.float32)
    add = _one_op("aten::add", "out", [(F32, (1000, 999)), (F32, (999,)), IntValue(3),
                                       (F32, (1000, 999))], [0, 1], [3])
    total = _one_op("aten::sum", "IntList_out", [(F32, (1000, 999)), IntListValue((1,)), BoolValue(False),
                                                 NoneValue(), (F32, (1000,))], [0], [4])
    for program, inputs in ((add, (x, y)), (total, (x,))):
        one = _run(program, inputs, threads=1)
        three = _run(program, inputs, threads=3)
        assert one.tobytes() == three.tobytes()
        lean = load(program).method("forward")(*inputs)[0]
        np.testing.assert_allclose(three, lean, rtol=1e-5, atol=1e-4)  # float32 sums of 999


def _threads_of_this_process() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_a_method_instance_owns_its_pool_and_opforge_num_threads_sizes_it(monkeypatch):
    program = _mm(8, 8, 8)
    before = _threads_of_this_process()
    method = load(program, executor="native", num_threads=3).method("forward")
    assert _threads_of_this_process() == before + 2  # the caller is the third thread
    del method
    monkeypatch.setenv("OPFORGE_NUM_THREADS", "2")
    method = load(program, executor="native").method("forward")
    assert _threads_of_this_process() == before + 1
    monkeypatch.delenv("OPFORGE_NUM_THREADS")
    one = load(program, executor="native").method("forward")  # unset: one thread, no pool
    assert _threads_of_this_process() == before + 1
    del method, one


def test_the_memory_limit_bounds_the_products_packing_buffers():
    # 64 x 4096 by 512 packs B panels of 256 x 2048 floats (2 MiB) and A blocks of
    # 256 x 128: about 2.2 MiB on one thread; the arena takes 1.3 MiB of the limit
    m, n, k = 64, 4096, 512
    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    program = _mm(m, n, k)
    arena = program.methods[0].memory_plan.arena_sizes[0]
    with pytest.raises(OpforgeError, match=r"aten::mm.out: the matrix product's packing workspace "
                                           r"\(64 x 4096 by 512\) — \d+ bytes — valid: at most \d+ bytes"):
        _run(program, (a, b), threads=1, max_memory=arena + (1 << 20))
    # room for one thread's buffers but not two: the product runs on one, same bits
    roomy = _run(program, (a, b), threads=1, max_memory=arena + (3 << 20))
    tight_two = _run(program, (a, b), threads=2, max_memory=arena + (3 << 20))
    assert roomy.tobytes() == tight_two.tobytes()


def test_the_memory_limit_bounds_convolutions_columns():
    # 3x3 over 64 x 64 x 64: the columns alone are 576 x 4096 floats (9 MiB)
    program = _conv((1, 64, 64, 64), (8, 64, 3, 3), (1, 8, 64, 64), padding=1)
    x = np.ones((1, 64, 64, 64), np.float32)
    w = np.ones((8, 64, 3, 3), np.float32)
    arena = program.methods[0].memory_plan.arena_sizes[0]
    with pytest.raises(OpforgeError, match=r"aten::convolution.out: the workspace .* over the memory limit"):
        _run(program, (x, w), threads=1, max_memory=arena + (4 << 20))
    assert _run(program, (x, w), threads=1, max_memory=arena + (64 << 20))[0, 0, 1, 1] == 576.0


@pytest.mark.parametrize("value, ok", [("2", True), ("auto", True), (" 1 ", True), ("two", False),
                                       ("0", False), ("-1", False), ("99999", False)])
def test_the_runtime_reads_opforge_num_threads_as_the_python_runtime_does(tmp_path, native_runtime, value, ok):
    # from C (opforge-run in a fresh process): the Python binding resolves the variable itself
    save(_mm(2, 2, 2), tmp_path / "mm.opf")
    for name in ("a", "b"):
        np.save(tmp_path / f"{name}.npy", np.eye(2, dtype=np.float32))
    result = subprocess.run([str(native_runtime.tool("opforge-run")), str(tmp_path / "mm.opf"),
                             "--input", str(tmp_path / "a.npy"), "--input", str(tmp_path / "b.npy")],
                            capture_output=True, text=True, timeout=60,
                            env={**os.environ, "OPFORGE_NUM_THREADS": value})
    if ok:
        assert result.returncode == 0, result.stdout + result.stderr
    else:
        assert result.returncode == 1
        assert "OPFORGE_NUM_THREADS" in result.stderr and "valid: a count from 1 to 1024" in result.stderr


@pytest.mark.slow  # the ASan + UBSan build of the runtime (minutes the first time)
def test_the_threaded_kernels_run_clean_under_the_sanitizers(tmp_path):
    from opforge.native_runtime.build import build_runtime

    tool = build_runtime(sanitize=True).tool("opforge-run")
    rng = np.random.default_rng(2)
    cases = {
        "mm": (_mm(96, 700, 200), (rng.standard_normal((96, 200)), rng.standard_normal((200, 700)))),
        "few_rows": (_linear(2, 3000, 200), (rng.standard_normal((2, 200)), rng.standard_normal((3000, 200)))),
        "im2col": (_conv((1, 16, 40, 40), (32, 16, 3, 3), (1, 32, 40, 40), padding=1),
                   (rng.standard_normal((1, 16, 40, 40)), rng.standard_normal((32, 16, 3, 3)))),
        "depthwise": (_conv((2, 64, 48, 48), (64, 1, 3, 3), (2, 64, 24, 24), stride=2, padding=1, groups=64),
                      (rng.standard_normal((2, 64, 48, 48)), rng.standard_normal((64, 1, 3, 3)))),
        "exp": (_unary("aten::exp", (1 << 18) + 5), (rng.standard_normal((1 << 18) + 5),)),
    }
    for name, (program, inputs) in cases.items():
        inputs = tuple(np.asarray(x, np.float32) for x in inputs)
        save(program, tmp_path / f"{name}.opf")
        args = [str(tool), str(tmp_path / f"{name}.opf"), "--output-dir", str(tmp_path / name)]
        for i, x in enumerate(inputs):
            np.save(tmp_path / f"{name}_{i}.npy", x)
            args += ["--input", str(tmp_path / f"{name}_{i}.npy")]
        outputs = []
        for threads in ("1", "3"):
            result = subprocess.run(args, capture_output=True, text=True, timeout=300,
                                    env={**os.environ, "OPFORGE_NUM_THREADS": threads})
            assert result.returncode == 0 and "Sanitizer" not in result.stderr, result.stderr[-3000:]
            outputs.append(np.load(tmp_path / name / "output_0.npy"))
        # bits against the same build's one thread (-O1 forms fewer FMAs than the release
        # build); against the release build within float32 rounding of k-term sums
        assert outputs[0].tobytes() == outputs[1].tobytes(), name
        np.testing.assert_allclose(outputs[1], _run(program, inputs, threads=1), rtol=1e-4, atol=1e-4)
