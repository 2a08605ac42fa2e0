"""Closing a cpu delegate while another thread is inside a call (opforge/runtime/delegates.py,
"Closing while a call runs"): close() waits for the call, a later call is refused, and
interpreter exit never frees an engine a daemon thread is still running (it was a SIGSEGV
on both call paths: the exit-time finalizer destroyed the engine under ``ofc_execute``)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu import fastcall
from opforge.errors import OpforgeError
from opforge.export import export
from opforge.program import save
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")


class Mlp(nn.Module):  # a call of a few ms: a thread calling in a loop is nearly always inside
    def __init__(self):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(512, 512), nn.Linear(512, 512)

    def forward(self, x):
        return torch.tanh(self.fc2(torch.relu(self.fc(x)))) * 1.5


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("close") / "mlp.opf"
    save(export(Mlp().eval(), (torch.randn(256, 512),), backends=["cpu"]), path)
    return path


# the main thread returns while a daemon thread calls the method in a loop: the finalizer
# runs at exit with a call in flight. wait: how long exit waits for it (0: never, so the
# engine is left to the call, the path a call longer than EXIT_WAIT_S takes)
_EXIT = textwrap.dedent("""
    import sys, threading
    import numpy as np
    from opforge.runtime import delegates, load
    if sys.argv[2] != "default":
        delegates.EXIT_WAIT_S = float(sys.argv[2])
    method = load(sys.argv[1]).method("forward")
    assert (method._native is not None) == (sys.argv[3] == "native"), method._native
    x = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    called = threading.Event()
    def loop():
        while True:
            method(x)
            called.set()
    threading.Thread(target=loop, daemon=True).start()
    called.wait()
    print("main returns", flush=True)
""")


@pytest.mark.parametrize("wait", ["default", "0"])
@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_exit_with_a_daemon_thread_inside_a_call_does_not_crash(program, path, wait):
    if path == "native" and fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    env = {**__import__("os").environ, "OPFORGE_CPU_FASTCALL": "1" if path == "native" else "0"}
    for _ in range(3):  # it crashed 3 times in 3 before the fix
        done = subprocess.run([sys.executable, "-c", _EXIT, str(program), wait, path],
                              capture_output=True, text=True, timeout=120, env=env)
        assert done.returncode == 0, (done.returncode, done.stderr[-3000:])
        assert "main returns" in done.stdout
        assert "Fatal Python error" not in done.stderr and "Traceback" not in done.stderr, \
            done.stderr[-3000:]


def test_close_waits_for_the_call_in_flight_and_a_later_call_is_refused(program):
    loaded = load(program)
    method = loaded.method("forward")
    x = np.ones((256, 512), np.float32)
    method(x)
    delegates = loaded.delegates
    index = next(i for i, h in enumerate(delegates.handles) if h is not None)
    lock = delegates.locks[index]
    lock.acquire()  # what a call in flight holds
    closer = threading.Thread(target=delegates.close)
    closer.start()
    time.sleep(0.3)
    assert closer.is_alive()  # waiting for the "call"
    assert not delegates.handles[index].closed
    lock.release()
    closer.join(10)
    assert not closer.is_alive() and delegates.handles[index].closed
    with pytest.raises(OpforgeError, match="closed"):
        method(x)


@pytest.mark.parametrize("path", ["native", "ctypes"])
def test_close_from_another_thread_while_calling_in_a_loop(program, monkeypatch, path):
    if path == "native" and fastcall.module() is None:
        pytest.skip(f"no extension: {fastcall.problem()}")
    monkeypatch.setenv(fastcall.DISABLE_ENV, "1" if path == "native" else "0")
    loaded = load(program)
    method = loaded.method("forward")
    assert (method._native is not None) == (path == "native")
    x = np.ones((256, 512), np.float32)
    want = method(x)[0]
    errors, calls = [], [0]
    started = threading.Event()

    def loop():
        try:
            while True:
                np.testing.assert_array_equal(method(x)[0], want)
                calls[0] += 1
                started.set()
        except OpforgeError as e:
            errors.append(e)
    worker = threading.Thread(target=loop)
    worker.start()
    started.wait(30)
    loaded.delegates.close()
    worker.join(30)
    assert not worker.is_alive() and calls[0] >= 1
    assert len(errors) == 1 and "closed" in str(errors[0])


def test_a_call_from_an_atexit_function_after_the_delegates_are_destroyed_is_refused(program):
    """An atexit function registered before the program was loaded runs after the exit
    finalizer destroyed its delegates: its call is refused (no hang on the delegate's lock,
    no freed engine)."""
    code = textwrap.dedent("""
        import atexit, sys
        import numpy as np
        from opforge.errors import OpforgeError
        holder = {}
        def late():
            try:
                holder["m"](np.ones((256, 512), np.float32))
                print("ran")
            except OpforgeError as e:
                print("refused", "closed" in str(e))
        atexit.register(late)
        from opforge.runtime import load
        holder["m"] = load(sys.argv[1]).method("forward")
        holder["m"](np.ones((256, 512), np.float32))
    """)
    done = subprocess.run([sys.executable, "-c", code, str(program)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "refused True", (done.stdout, done.stderr[-2000:])
