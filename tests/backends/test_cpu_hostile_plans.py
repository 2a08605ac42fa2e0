"""Hostile plans against the cpu backend's engine: each case is a blob a fuzzer or an
attacker could write (a valid CRC, every field in parse()'s ranges), built directly as a
plan and sealed with blob.py's format. Each one crashed, hung or corrupted memory before
the engine's validation layer; now it is refused with a BackendError, or runs correctly.

Every case runs in a child process (``python this_file.py CASE``), so a regression shows
as a failed test, not a dead pytest; test_cpu_sanitized.py runs the same cases under
AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import re
import resource
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import numpy as np
import pytest

from opforge.backends.cpu import blob
from opforge.backends.cpu import engine as cpu_engine
from opforge.backends.cpu.binding import Binding
from opforge.errors import BackendError, OpforgeError

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None,
                                reason=f"cpu backend: {cpu_engine.missing()}")

U8, I8, I32, I64, F32, BOOL = 0, 1, 3, 4, 6, 11
NUMPY = {U8: np.uint8, I8: np.int8, I32: np.int32, I64: np.int64, F32: np.float32, BOOL: np.bool_}
EW = {"div": 3, "where": 10, "fill": 18}
RELU, B_ADD = 0, 100


@pytest.fixture(params=["native", "default"])
def capability(request, monkeypatch):
    """The path a plan built now takes: the engine's own kernels where the CPU has their
    instructions ("native": the softmax row kernel, the int8 depthwise kernel, the few-row
    matmul, the copy transposes and interleaves, the AVX-512 quantize), oneDNN's primitives and the plain loops everywhere ("default",
    OPFORGE_CPU_CAPABILITY=default). Case files use it as ``capability = hostile.capability``."""
    if request.param == "default":
        monkeypatch.setenv("OPFORGE_CPU_CAPABILITY", "default")
    else:
        monkeypatch.delenv("OPFORGE_CPU_CAPABILITY", raising=False)
    return request.param


def row_major(dims):
    strides, step = [], 1
    for d in reversed(dims):
        strides.append(step)
        step *= max(d, 1)
    return list(reversed(strides))


class Plan:
    """A cpu-backend plan written by hand: tensors, ops, constants' bytes."""

    def __init__(self) -> None:
        self.tensors: list[dict] = []
        self.ops: list[dict] = []
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.data = bytearray()
        self.symbols: list[list] = []  # a dynamic plan's [name, min, max] (cpu/dynamic.py)

    def tensor(self, dtype, dims, strides=None, role="temp", **extra) -> int:
        t = {"dtype": dtype, "dims": list(dims),
             "strides": list(row_major(dims) if strides is None else strides), "role": role, **extra}
        self.tensors.append(t)
        tid = len(self.tensors) - 1
        if role == "input":
            self.inputs.append(tid)
        if role == "output":
            self.outputs.append(tid)
        return tid

    def const(self, array, dims=None, strides=None) -> int:
        array = np.ascontiguousarray(array)
        dtype = {v: k for k, v in NUMPY.items()}[array.dtype.type]
        self.data += bytes(-len(self.data) % 64)
        offset = len(self.data)
        self.data += array.tobytes()
        return self.tensor(dtype, array.shape if dims is None else dims, strides, "const",
                           data=[offset, array.nbytes])

    def alias(self, base, dims, strides, offset=0) -> int:
        return self.tensor(self.tensors[base]["dtype"], dims, strides, "alias", base=base,
                           offset=offset)

    def op(self, kind, ins, outs, ia=(), fa=(), post=(), name="") -> None:
        self.ops.append({"kind": kind, "in": list(ins), "out": list(outs), "ia": list(ia),
                         "fa": list(fa), "post": [list(p) for p in post], "name": name})

    def document(self) -> dict:
        """The plan's JSON document (a subclass adds its fields)."""
        doc = {"tensors": self.tensors, "ops": self.ops, "inputs": self.inputs,
               "outputs": self.outputs, "impls": []}
        if self.symbols:
            doc["symbols"] = self.symbols
        return doc

    def blob(self) -> bytes:
        text = json.dumps(self.document()).encode()
        pad = bytes(-(blob.HEADER.size + len(text)) % 64)
        body = bytes(self.data)
        head = blob.HEADER.pack(blob.MAGIC, blob.VERSION, len(text), len(body),
                                zlib.crc32(text + body), 0)
        return head + text + pad + body

    def handle(self, threads=1, max_memory=0) -> cpu_engine.EngineHandle:
        plan, data = blob.parse(self.blob())
        return cpu_engine.EngineHandle(plan, data, threads, max_memory, None, {})


def run(handle, *inputs):
    outputs = [np.zeros(dims, NUMPY[dtype]) for dims, dtype in handle.outputs]
    Binding(handle, list(inputs), outputs)()
    return outputs


def copy_ia(dims, in_strides, in_off, out_strides, out_off):
    return [len(dims), *dims, *in_strides, in_off, *out_strides, out_off]


# --- the cases: each returns a short description of what ran; a refusal raises ------------

def reach_overflow():
    # item 1: three strides of 2^62 wrapped the reach check's sum, a fourth wrote far past
    p = Plan()
    x = p.tensor(F32, [16], role="input")
    t = p.tensor(F32, [16])
    y = p.tensor(F32, [16], role="output")
    p.op("copy", [x], [t], copy_ia([2, 2, 2, 2], [0, 0, 0, 1], 0, [2**62, 2**62, 2**62, 2**28], 0))
    p.op("copy", [t], [y], copy_ia([16], [1], 0, [1], 0))
    run(p.handle(), np.ones(16, np.float32))
    return "ran"


def tensor_span_overflow():
    # item 1: a tensor whose (dims-1)*strides wraps int64 had a negative span
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    t = p.tensor(F32, [2**40, 2**40], [2**40, 2**40])
    y = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [t], copy_ia([4], [1], 0, [1], 0))
    p.op("copy", [x], [y], copy_ia([4], [1], 0, [1], 0))
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def copy_boundary(in_off):
    p = Plan()
    x = p.tensor(F32, [8], role="input")
    y = p.tensor(F32, [1], role="output")
    p.op("copy", [x], [y], copy_ia([1], [1], in_off, [1], 0))
    return run(p.handle(), np.arange(8, dtype=np.float32))[0]


def copy_at_end():
    return f"ran {copy_boundary(7).tolist()}"


def copy_one_past_end():
    return f"ran {copy_boundary(8).tolist()}"


def copy_walk(dims, out_strides, out_dims):
    """A copy of arange(n) (row-major over ``dims``) written through ``out_strides``: the
    output-walk check (no element written twice) at its edges."""
    n = int(np.prod(dims))
    p = Plan()
    x = p.tensor(F32, [max(n, 1)], role="input")
    y = p.tensor(F32, out_dims, role="output")
    p.op("copy", [x], [y], copy_ia(dims, row_major(dims), 0, out_strides, 0))
    return f"ran {run(p.handle(), np.arange(max(n, 1), dtype=np.float32))[0].tolist()}"


def copy_unit_dim_stride0():
    # a size-1 dim's stride is never used, 0 included (torch gives such dims any stride)
    return copy_walk([4, 1], [1, 0], [4])


def copy_empty():
    # no element at all, the outermost dim included: nothing is reached, nothing refused
    return copy_walk([0, 4], [4, 1], [0, 4])


def copy_twice_beside_unit_dim():
    # a size-1 dim does not make an overlapping walk injective
    return copy_walk([1, 4], [0, 0], [4])


def copy_twice_over_size2():
    # the smallest extent that can write an element twice
    return copy_walk([2, 3], [0, 1], [3])


def copy_overlap_by_one():
    # rows 2 apart of 3 elements each: element 2 is written twice
    return copy_walk([2, 3], [2, 1], [5])


def ew_boundary(n):
    # an elementwise input walk with stride 2 over 4 elements reaches element 6
    p = Plan()
    x = p.tensor(F32, [n], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("ew", [x, x], [y], [0, 0, 1, 4, 1, 2, 2], [1.0])
    return run(p.handle(), np.arange(n, dtype=np.float32))[0]


def ew_at_end():
    return f"ran {ew_boundary(7).tolist()}"


def ew_one_past_end():
    return f"ran {ew_boundary(6).tolist()}"


def package_op_span():
    # item 2: a call-out got the blob's dims of a stride-0 temporary (4 bytes of storage)
    # and wrote 512 MiB into it; the engine now refuses before the call-out is ever called
    return _callout_writing([2**27], [0])


def package_op_row_gap():
    # a call-out is passed sizes only, so it would write rows 3 apart into rows 4 apart:
    # the outermost dim's stride is checked like the others
    return _callout_writing([2, 3], [4, 1])


def package_op_transposed():
    # dense (6 elements in a span of 6) but column-major
    return _callout_writing([3, 2], [1, 3])


def package_op_unit_dims():
    # row-major: the stride of a size-1 dim is never used, whatever it says
    return _callout_writing([2, 1, 3], [3, 7, 1])


def package_op_empty():
    # a zero-size tensor with torch's strides (a size-0 dim counts as 1 in them) is row-major
    return _callout_writing([2, 0], [1, 1])


def _callout_writing(dims, strides):
    """A plan whose call-out writes a temporary of ``dims`` and ``strides``."""
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    t = p.tensor(F32, dims, strides)
    y = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [y], copy_ia([4], [1], 0, [1], 0))
    lib = cpu_engine.library()
    h = p.handle()  # a finalized engine; call-outs are added on a fresh one below
    h.close()
    calls = []
    proto = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32,
                             ctypes.c_void_p, ctypes.c_int32, ctypes.c_char_p, ctypes.c_int32)

    @proto
    def fn(state, ins, n_in, outs, n_out, error, size):
        calls.append(1)
        return 0

    err = ctypes.create_string_buffer(1024)
    ptr = lib.ofc_new(1, 0, err, 1024)
    try:
        for i, tensor in enumerate(p.tensors):
            dims, strides = tensor["dims"], tensor["strides"]
            storage = {"temp": 1, "input": 2}.get(tensor["role"], 0)
            rid = lib.ofc_add_tensor(ptr, tensor["dtype"], len(dims),
                                     (ctypes.c_int64 * len(dims))(*dims),
                                     (ctypes.c_int64 * len(dims))(*strides), None, 0, -1, 0,
                                     storage, err, 1024)
            assert rid == i, err.value
        rc = lib.ofc_add_external(ptr, fn, None, b"pkg::write", (ctypes.c_int32 * 1)(x), 1,
                                  (ctypes.c_int32 * 1)(t), 1, err, 1024)
        if rc:
            raise BackendError(err.value.decode())
        assert lib.ofc_finalize(ptr, (ctypes.c_int32 * 1)(x), 1, (ctypes.c_int32 * 1)(y), 1, err, 1024) == 0
        return f"ran, call-out accepted ({len(calls)} calls)"
    finally:
        lib.ofc_destroy(ptr)


def overlapping_activation():
    # item 3: a stride-0 binary output (4 bytes of storage) passed every check, then
    # oneDNN wrote its 256 KiB densely over the heap
    p = Plan()
    x = p.tensor(F32, [256, 256], role="input")
    z = p.const(np.zeros((1, 1), np.float32))
    t = p.tensor(F32, [256, 256], [0, 0])
    y = p.tensor(F32, [1], role="output")
    p.op("binary", [x, z], [t], [B_ADD])
    p.op("copy", [t], [y], copy_ia([1], [1], 0, [1], 0))
    run(p.handle(), np.ones((256, 256), np.float32))
    return "ran"


def pool_rank1():
    # item 4: pooling on rank-1 tensors reached oneDNN (stack smashing)
    p = Plan()
    x = p.tensor(F32, [8], role="input")
    y = p.tensor(F32, [7], role="output")
    p.op("pool", [x], [y], [0, 1, 2, 1, 0, 0, 1])
    run(p.handle(), np.ones(8, np.float32))
    return "ran"


def write_read_only_input():
    # item 5: a delegate input may be a program constant in a read-only mapping
    p = Plan()
    x = p.tensor(F32, [1024], role="input")
    y = p.tensor(F32, [1024], role="output")
    view = p.alias(x, [1024], [1])
    p.op("ew", [x], [view], [13, 0, 1, 1024, 1, 1], [1.0])  # neg, in place into the input
    p.op("copy", [x], [y], copy_ia([1024], [1], 0, [1], 0))
    with tempfile.TemporaryFile() as f:
        f.write(np.ones(1024, np.float32).tobytes())
        f.flush()
        m = mmap.mmap(f.fileno(), 4096, prot=mmap.PROT_READ)
        run(p.handle(), np.frombuffer(m, np.float32))
    return "ran"


def write_constant_through_aliases():
    # item 5: no op writes a constant, however many aliases away
    p = Plan()
    c = p.const(np.ones(8, np.float32))
    a1 = p.alias(c, [8], [1])
    a2 = p.alias(a1, [4], [1], offset=2)
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [a2], copy_ia([4], [1], 0, [1], 0))
    p.op("copy", [x], [y], copy_ia([4], [1], 0, [1], 0))
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def alias_of_alias_constant():
    # item 6: freeing unread constants followed one level of aliases; an alias of an alias
    # then read freed (NULL) memory
    p = Plan()
    c = p.const(np.arange(8, dtype=np.float32))
    a1 = p.alias(c, [6], [1], offset=1)
    a2 = p.alias(a1, [4], [1], offset=2)
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("ew", [x, a2], [y], [0, 0, 1, 4, 1, 1, 1], [1.0])
    return f"ran {run(p.handle(), np.zeros(4, np.float32))[0].tolist()}"


def conv_bias_not_constant():
    # item 7: a convolution bias that is an input was reordered at init (a NULL read)
    p = Plan()
    x = p.tensor(F32, [1, 2, 4, 4], role="input")
    b = p.tensor(F32, [3], role="input")
    w = p.const(np.ones((3, 2, 1, 1), np.float32))
    y = p.tensor(F32, [1, 3, 4, 4], role="output")
    p.op("conv", [x, w, b], [y], [2, 1, 1, 0, 0, 0, 0, 1, 1, 1])
    run(p.handle(), np.ones((1, 2, 4, 4), np.float32), np.ones(3, np.float32))
    return "ran"


def int8_bias_not_constant():
    p = Plan()
    x = p.tensor(U8, [2, 4], role="input")
    w = p.const(np.ones((4, 8), np.int8))
    s = p.const(np.ones(8, np.float32))
    b = p.tensor(F32, [1, 8], role="input")
    y = p.tensor(U8, [2, 8], role="output")
    p.op("qmatmul", [x, w, s, b], [y], [0, 0, 2, 1], [1.0, 1.0])
    run(p.handle(), np.ones((2, 4), np.uint8), np.ones((1, 8), np.float32))
    return "ran"


def where_one_operand():
    # item 8: `where` with one operand read ins[1] past the operand list
    p = Plan()
    m = p.tensor(BOOL, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("ew", [m], [y], [EW["where"], 0, 1, 4, 1, 1], [1.0])
    run(p.handle(), np.ones(4, np.bool_))
    return "ran"


def int_division(a, b):
    p = Plan()
    x = p.tensor(I64, [len(a)], role="input")
    d = p.tensor(I64, [len(b)], role="input")
    y = p.tensor(I64, [len(a)], role="output")
    p.op("ew", [x, d], [y], [EW["div"], 1, 1, len(a), 1, 1, 1], [1.0])
    return run(p.handle(), np.array(a, np.int64), np.array(b, np.int64))[0].tolist()


def int_division_by_zero():
    # item 9: SIGFPE; PyTorch raises for an integer division by zero
    return f"ran {int_division([7, 1], [2, 0])}"


def int_division_min_by_minus_one():
    # item 9: INT64_MIN / -1 also traps in hardware; PyTorch wraps it to INT64_MIN
    return f"ran {int_division([-2**63, 9, -9], [-1, -2, 2])}"


def call_after_close():
    # item 10: a Method called after LoadedProgram.delegates.close() used freed memory
    import torch

    from opforge.export import export
    from opforge.runtime import load

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).eval()
    x = torch.randn(2, 8)
    loaded = load(export(model, (x,), backends=["cpu"]))
    method = loaded.method("forward")
    method(x.numpy())
    loaded.delegates.close()
    method(x.numpy())
    return "ran"


def hang_copy():
    # item 11: dims of 2^40 with stride 0: 10^12 iterations on one element of storage
    p = Plan()
    x = p.tensor(F32, [1], role="input")
    t = p.tensor(F32, [1])
    y = p.tensor(F32, [1], role="output")
    p.op("copy", [x], [t], copy_ia([2**40], [0], 0, [0], 0))
    p.op("copy", [t], [y], copy_ia([1], [1], 0, [1], 0))
    run(p.handle(), np.ones(1, np.float32))
    return "ran"


def hang_ew():
    p = Plan()
    x = p.tensor(F32, [1], role="input")
    y = p.tensor(F32, [1], role="output")
    p.op("ew", [x, x], [y], [0, 0, 2, 2**20, 2**20, 0, 0, 0, 0, 0, 0], [1.0])
    run(p.handle(), np.ones(1, np.float32))
    return "ran"


def hang_reduce():
    p = Plan()
    x = p.tensor(F32, [1], role="input")
    y = p.tensor(F32, [1], role="output")
    p.op("reduce", [x], [y], [0, 1, 2**40, 0, 0, 1])
    run(p.handle(), np.ones(1, np.float32))
    return "ran"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def stride0_weight_memory():
    # item 12: a 4-byte stride-0 constant weight was reordered dense at init: ~1 GiB of RSS
    # with a 64 MiB memory limit
    p = Plan()
    x = p.tensor(F32, [1, 256, 8, 8], role="input")
    w = p.const(np.ones(1, np.float32), dims=[1024, 256, 32, 32], strides=[0, 0, 0, 0])
    y = p.tensor(F32, [1, 1024, 8, 8], role="output")
    p.op("conv", [x, w], [y], [2, 1, 1, 15, 15, 16, 16, 1, 1, 0])
    before = _rss_mib()
    try:
        p.handle(max_memory=64 << 20)
    finally:
        print(f"RSS growth: {_rss_mib() - before:.0f} MiB")
    return "ran"


def weights_over_memory_limit():
    # item 12: every allocation at init (copied constants, reordered weights, scratchpads,
    # the arena) counts; a constant borrowed from the blob (read in place) allocates nothing
    p = Plan()
    x = p.tensor(F32, [2, 256], role="input")
    w = p.const(np.ones((256, 1024), np.float32))  # 1 MiB, reordered into another 1 MiB
    y = p.tensor(F32, [2, 1024], role="output")
    p.op("matmul", [x, w], [y])
    p.handle(max_memory=(1 << 19) + (1 << 18))
    return "ran"


def many_threads():
    # item 13: 20,000 threads from the blob's num_threads killed the process
    p = Plan()
    x = p.tensor(F32, [64, 64], role="input")
    w = p.const(np.ones((64, 64), np.float32))
    y = p.tensor(F32, [64, 64], role="output")
    p.op("matmul", [x, w], [y])
    h = p.handle(threads=20000)
    out = run(h, np.ones((64, 64), np.float32))[0]
    return f"ran with {cpu_engine.library().ofc_threads(h.ptr)} threads, sum {float(out.sum())}"


def short_int8_scales():
    # item 14: 2 per-channel weight scales for 8 channels; oneDNN read 6 floats past them
    p = Plan()
    x = p.tensor(U8, [2, 4], role="input")
    w = p.const(np.ones((4, 8), np.int8))
    s = p.const(np.ones(2, np.float32))
    y = p.tensor(U8, [2, 8], role="output")
    p.op("qmatmul", [x, w, s], [y], [0, 0, 2, 0], [1.0, 1.0])
    run(p.handle(), np.ones((2, 4), np.uint8))
    return "ran"


def eltwise_with_binary_algorithm():
    # an algorithm code of the wrong family, and a post-op of a kind that takes none
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("eltwise", [x], [y], [B_ADD], [0.0, 0.0])
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def eltwise_two_inputs():
    # operand counts are exact: a second input is refused, not ignored
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("eltwise", [x, x], [y], [RELU], [0.0, 0.0])
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def copy_two_outputs():
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    z = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [y, z], copy_ia([4], [1], 0, [1], 0))
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def post_op_on_copy():
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    y = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [y], copy_ia([4], [1], 0, [1], 0), post=[[0, RELU, 0.0, 0.0, -1]])
    run(p.handle(), np.ones(4, np.float32))
    return "ran"


def long_alias_chain():
    # aliases of aliases 50,000 deep: the engine once followed them recursively per call
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    t = p.tensor(F32, [4])
    prev = t
    for _ in range(50000):
        prev = p.alias(prev, [4], [1])
    y = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [prev], copy_ia([4], [1], 0, [1], 0))
    p.op("copy", [t], [y], copy_ia([4], [1], 0, [1], 0))
    return f"ran {run(p.handle(), np.arange(4, dtype=np.float32))[0].tolist()}"


# --- normal plans: every op family once, checked against NumPy (the sanitized run's
# baseline: a sanitizer report here is a bug in the engine, not in a hostile blob) --------

def _close(got, want, tol=1e-4):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def normal_conv_pool_relu():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 6, 6)).astype(np.float32)
    wt = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(4).astype(np.float32)
    p = Plan()
    xi = p.tensor(F32, x.shape, role="input")
    w = p.const(wt)
    b = p.const(bias)
    t = p.tensor(F32, [1, 4, 4, 4])
    y = p.tensor(F32, [1, 4, 2, 2], role="output")
    p.op("conv", [xi, w, b], [t], [2, 1, 1, 0, 0, 0, 0, 1, 1, 1], post=[[0, RELU, 0.0, 0.0, -1]])
    p.op("pool", [t], [y], [0, 2, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1])
    got = run(p.handle(), x)[0]
    conv = np.zeros((1, 4, 4, 4), np.float32)
    for i in range(4):
        for j in range(4):
            conv[0, :, i, j] = np.tensordot(wt, x[0, :, i:i + 3, j:j + 3], 3) + bias
    want = np.maximum(conv, 0).reshape(1, 4, 2, 2, 2, 2).max((3, 5))
    _close(got, want)
    return "ran ok"


def normal_matmul_binary_softmax():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((3, 5)).astype(np.float32)
    wt = rng.standard_normal((5, 4)).astype(np.float32)
    bias = rng.standard_normal((1, 4)).astype(np.float32)
    p = Plan()
    ai = p.tensor(F32, a.shape, role="input")
    w = p.const(wt)
    b = p.const(bias)
    t = p.tensor(F32, [3, 4])
    u = p.tensor(F32, [3, 4])
    y = p.tensor(F32, [3, 4], role="output")
    p.op("matmul", [ai, w, b], [t])
    p.op("binary", [t, b], [u], [B_ADD])
    p.op("softmax", [u], [y], [1, 0])
    got = run(p.handle(), a)[0]
    z = a @ wt + 2 * bias
    e = np.exp(z - z.max(1, keepdims=True))
    _close(got, e / e.sum(1, keepdims=True))
    return "ran ok"


def normal_loops():
    # copy (transpose), ew (where with a broadcast scalar), reduce, embedding, group norm
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    idx = np.array([3, 0, 2], np.int64)
    p = Plan()
    xi = p.tensor(F32, x.shape, role="input")
    ii = p.tensor(I64, idx.shape, role="input")
    tr = p.tensor(F32, [6, 4], role="output")
    mask = p.tensor(BOOL, [4, 6])
    sel = p.tensor(F32, [4, 6], role="output")
    red = p.tensor(F32, [4, 1], role="output")
    emb = p.tensor(F32, [3, 6], role="output")
    gn = p.tensor(F32, [4, 6], role="output")
    p.op("copy", [xi], [tr], copy_ia([6, 4], [1, 6], 0, [4, 1], 0))
    p.op("ew", [xi, xi], [mask], [8, 0, 2, 4, 6, 6, 1, 6, 1, 0, 0], [1.0])  # x > x[0, 0]
    p.op("ew", [mask, xi], [sel], [EW["where"], 0, 2, 4, 6, 6, 1, 6, 1, 6, 1], [1.0, -1.0])
    p.op("reduce", [xi], [red], [0, 2, 4, 6, 6, 1, 1, 0, 6])
    p.op("embedding", [xi, ii], [emb])
    p.op("group_norm", [xi], [gn], [2, 0, 0], [1e-5])
    tr_, sel_, red_, emb_, gn_ = run(p.handle(), x, idx)
    _close(tr_, x.T)
    _close(sel_, np.where(x > x[0, 0], x, -1.0))
    _close(red_, x.sum(1, keepdims=True))
    _close(emb_, x[idx])
    g = x.reshape(4, 2, 3)
    _close(gn_, ((g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + 1e-5)).reshape(4, 6))
    return "ran ok"


def normal_int8():
    x = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.uint8)
    wt = np.arange(-16, 16, dtype=np.int8).reshape(4, 8)
    scales = np.full(8, 0.5, np.float32)
    p = Plan()
    xi = p.tensor(U8, x.shape, role="input")
    w = p.const(wt)
    s = p.const(scales)
    q = p.tensor(U8, [2, 8])
    y = p.tensor(F32, [2, 8], role="output")
    p.op("qmatmul", [xi, w, s], [q], [0, 128, 2, 0], [1.0, 1.0], post=[[0, RELU, 0.0, 0.0, -1]])
    p.op("quant", [q], [y], [1, 0, 255], [1.0, 128.0])
    got = run(p.handle(), x)[0]
    acc = np.maximum(x.astype(np.float32) @ wt.astype(np.float32) * 0.5, 0)  # relu post-op
    want = np.clip(np.round(acc) + 128, 0, 255) - 128
    _close(got, want)
    return "ran ok"


def normal_nan_paths():
    # the engine's own NaN-exact paths: a post-op epilogue (clip, max with a broadcast
    # operand, then a oneDNN in-place linear), max pooling, a max reduction, softmax
    x = np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4) - 10
    x[0, 0, 1, 1] = np.nan
    x[0, 1, 2, 3] = np.inf
    p = Plan()
    xi = p.tensor(F32, x.shape, role="input")
    zero = p.const(np.zeros((1, 1, 1, 1), np.float32))
    b = p.const(np.array([1.0, np.nan, -1.0, 2.0], np.float32).reshape(1, 1, 1, 4))
    ep = p.tensor(F32, x.shape, role="output")
    pool = p.tensor(F32, [1, 2, 2, 2], role="output")
    red = p.tensor(F32, [1, 2, 4, 1], role="output")
    soft = p.tensor(F32, x.shape, role="output")
    p.op("binary", [xi, zero], [ep], [B_ADD],
         post=[[0, 13, -5.0, 5.0, -1], [1, 104, 0.0, 0.0, b], [0, 6, 2.0, 1.0, -1]])
    p.op("pool", [xi], [pool], [0, 2, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1])
    p.op("reduction", [xi], [red], [2])
    p.op("softmax", [xi], [soft], [3, 0])
    ep_, pool_, red_, soft_ = run(p.handle(), x)
    _close(ep_, 2 * np.maximum(np.clip(x, -5, 5), np.array([1, np.nan, -1, 2], np.float32)) + 1)
    _close(pool_, x.reshape(1, 2, 2, 2, 2, 2).max((3, 5)))
    _close(red_, x.max(3, keepdims=True))
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(3, keepdims=True))
    _close(soft_, e / e.sum(3, keepdims=True))
    return "ran ok"


def normal_safe_softmax():
    # attention's safe softmax: a row of only -inf gives zeros (plain softmax: NaN); a row
    # with a NaN stays NaN; -inf beside finite values is 0; rows of plain numbers as usual
    # (rows of 20: the AVX-512 row kernel's 16-lane body and a masked tail)
    x = np.arange(120, dtype=np.float32).reshape(2, 3, 20) / 7 - 1
    x[0, 1] = -np.inf
    x[1, 0, 2] = np.nan
    x[1, 2, :3] = -np.inf
    p = Plan()
    xi = p.tensor(F32, x.shape, role="input")
    safe = p.tensor(F32, x.shape, role="output")
    plain = p.tensor(F32, x.shape, role="output")
    p.op("softmax", [xi], [safe], [2, 0, 1])
    p.op("softmax", [xi], [plain], [2, 0, 0])
    safe_, plain_ = run(p.handle(), x)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(2, keepdims=True))
        want = e / e.sum(2, keepdims=True)
    _close(plain_, want)
    want[0, 1] = 0.0
    _close(safe_, want)
    return "ran ok"


def normal_planned_intermediates():
    # a chain through six intermediates, each live for two ops: the planned arena holds two
    # or three at a time, not six, and a value read three ops after it was written (t0 in
    # the last add) keeps its bytes while the others reuse theirs
    x = np.arange(64, dtype=np.float32).reshape(8, 8) / 9 - 3
    p = Plan()
    xi = p.tensor(F32, x.shape, role="input")
    t = [p.tensor(F32, x.shape) for _ in range(6)]
    y = p.tensor(F32, x.shape, role="output")
    p.op("eltwise", [xi], [t[0]], [RELU], [0.0, 0.0])
    p.op("binary", [t[0], xi], [t[1]], [B_ADD])
    for k in range(2, 6):
        p.op("eltwise", [t[k - 1]], [t[k]], [6], [1.5, 0.25])  # linear: 1.5 x + 0.25
    p.op("binary", [t[5], t[0]], [y], [B_ADD])
    h = p.handle()
    got = run(h, x)[0]
    want = np.maximum(x, 0) + x
    for _ in range(4):
        want = 1.5 * want + 0.25
    _close(got, want + np.maximum(x, 0))
    memory = h.memory()
    assert memory["intermediates"] == 6 * 256 and memory["arena"] <= 3 * 256, memory
    return "ran ok"


def read_before_written():
    # an intermediate no op writes, read by a copy: zeros (its own memory), never the bytes
    # of an intermediate the arena placed at the same offset
    p = Plan()
    x = p.tensor(F32, [4], role="input")
    a = p.tensor(F32, [4])
    b = p.tensor(F32, [4])
    y = p.tensor(F32, [4], role="output")
    z = p.tensor(F32, [4], role="output")
    p.op("copy", [x], [a], copy_ia([4], [1], 0, [1], 0))
    p.op("copy", [a], [z], copy_ia([4], [1], 0, [1], 0))
    p.op("copy", [b], [y], copy_ia([4], [1], 0, [1], 0))
    h = p.handle()
    y_, z_ = run(h, np.arange(1, 5, dtype=np.float32))
    return f"ran {y_.tolist()} {z_.tolist()} unplanned {h.memory()['unplanned']}"


def safe_log_softmax():
    # `safe` is defined for softmax only, and is a flag
    p = Plan()
    x = p.tensor(F32, [2, 4], role="input")
    y = p.tensor(F32, [2, 4], role="output")
    p.op("softmax", [x], [y], [1, 1, 1])
    run(p.handle(), np.ones((2, 4), np.float32))
    return "ran"


def safe_softmax_flag_two():
    p = Plan()
    x = p.tensor(F32, [2, 4], role="input")
    y = p.tensor(F32, [2, 4], role="output")
    p.op("softmax", [x], [y], [1, 0, 2])
    run(p.handle(), np.ones((2, 4), np.float32))
    return "ran"


# --- dynamic plans (size expressions, engines per shape sharing borrowed weights) ------------

def dynamic_matmul_plan(offset=None):
    """y[n, 3] = relu(x[n, 4] @ w) + copy of x's first column, n in [1, 9]; ``offset``: an
    extra alias of x at that offset expression."""
    p = Plan()
    p.symbols = [["n", 1, 9]]
    x = p.tensor(F32, ["n", 4], ["4", 1], role="input")
    w = p.const(np.arange(12, dtype=np.float32).reshape(4, 3) / 10)
    t = p.tensor(F32, ["n", 3], [3, 1])
    y = p.tensor(F32, ["n", 3], [3, 1], role="output")
    p.op("matmul", [x, w], [t], post=[[0, RELU, 0.0, 0.0, -1]])
    p.op("copy", [t], [y], copy_ia(["n", 3], [3, 1], 0, [3, 1], 0))
    if offset is not None:
        p.alias(x, [1, 4], [4, 1], offset)
    return p


def dynamic_handle(p, capacity=8):
    from opforge.backends.cpu.dynamic import DynamicHandle

    plan, data = blob.parse(p.blob())
    return DynamicHandle(plan, data, 1, 0, None, {}, capacity=capacity)


def run_dynamic(handle, x):
    y = np.zeros((x.shape[0], 3), np.float32)
    handle.bind([x], [y])()
    return y


def normal_dynamic():
    handle = dynamic_handle(dynamic_matmul_plan(), capacity=2)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    for n in (1, 5, 9, 1, 5, 9, 2):  # every call after the second evicts: weights stay shared
        x = np.arange(4 * n, dtype=np.float32).reshape(n, 4) - 7
        got = run_dynamic(handle, x)
        if not np.allclose(got, np.maximum(x @ w, 0), rtol=1e-6, atol=1e-6):
            return f"wrong at n={n}: {got.tolist()}"
    stats = handle.stats()
    handle.close()
    return "ran ok" if stats["evictions"] == 5 and stats["shared_weight_bytes"] > 0 else f"{stats}"


def dynamic_symbol_past_bound():
    handle = dynamic_handle(dynamic_matmul_plan())
    run_dynamic(handle, np.ones((10, 4), np.float32))
    return "ran"


def dynamic_alias_leaves_base():
    # inside its base at n = 1 (offset 0), outside at n = 9 (offset 72 of 36 elements)
    handle = dynamic_handle(dynamic_matmul_plan("(n * (n - 1))"))
    run_dynamic(handle, np.ones((1, 4), np.float32))
    run_dynamic(handle, np.ones((9, 4), np.float32))
    return "ran"


def dynamic_expression_overflows():
    dynamic_handle(dynamic_matmul_plan("(((n * n) * n) * 4611686018427387904)"))
    return "ran"


NORMAL = ["normal_conv_pool_relu", "normal_matmul_binary_softmax", "normal_loops", "normal_int8",
          "normal_nan_paths", "normal_safe_softmax", "normal_planned_intermediates",
          "normal_dynamic"]

CASES = {f.__name__: f for f in [
    normal_conv_pool_relu, normal_matmul_binary_softmax, normal_loops, normal_int8,
    normal_nan_paths, normal_safe_softmax, safe_log_softmax, safe_softmax_flag_two,
    normal_planned_intermediates, read_before_written,
    reach_overflow, tensor_span_overflow, copy_at_end, copy_one_past_end, copy_unit_dim_stride0,
    copy_empty, copy_twice_beside_unit_dim, copy_twice_over_size2, copy_overlap_by_one, ew_at_end,
    ew_one_past_end, package_op_span, package_op_row_gap, package_op_transposed,
    package_op_unit_dims, package_op_empty, overlapping_activation, pool_rank1,
    write_read_only_input, write_constant_through_aliases, alias_of_alias_constant,
    conv_bias_not_constant, int8_bias_not_constant, where_one_operand, int_division_by_zero,
    int_division_min_by_minus_one, call_after_close, hang_copy, hang_ew, hang_reduce,
    stride0_weight_memory, weights_over_memory_limit, many_threads, short_int8_scales,
    eltwise_with_binary_algorithm, eltwise_two_inputs, copy_two_outputs, post_op_on_copy,
    long_alias_chain, normal_dynamic, dynamic_symbol_past_bound, dynamic_alias_leaves_base,
    dynamic_expression_overflows]}

# what each case must end with: "refused: <regex>" (a BackendError) or "ran <regex>"
EXPECT = {
    "reach_overflow": "refused: .*(overflows|outside its tensor)",
    "tensor_span_overflow": "refused: .*(overflows|too large)",
    "copy_at_end": r"ran \[7\.0\]",
    "copy_one_past_end": "refused: .*copy source: reads or writes outside its tensor",
    "copy_unit_dim_stride0": r"ran \[0\.0, 1\.0, 2\.0, 3\.0\]",
    "copy_empty": r"ran \[\]",
    "copy_twice_beside_unit_dim": "refused: .*writes an element twice",
    "copy_twice_over_size2": "refused: .*writes an element twice",
    "copy_overlap_by_one": "refused: .*writes an element twice",
    "ew_at_end": r"ran \[0\.0, 4\.0, 8\.0, 12\.0\]",
    "ew_one_past_end": "refused: .*ew input: reads or writes outside its tensor",
    "package_op_span": "refused: .*not C-contiguous within its storage",
    "package_op_row_gap": "refused: .*tensor 1 is not C-contiguous within its storage",
    "package_op_transposed": "refused: .*tensor 1 is not C-contiguous within its storage",
    "package_op_unit_dims": r"ran, call-out accepted \(0 calls\)",
    "package_op_empty": r"ran, call-out accepted \(0 calls\)",
    "overlapping_activation": "refused: .*overlapping strides",
    "pool_rank1": "refused: .*pool: the source has rank 1, valid: 3$",  # not "3..3"
    "write_read_only_input": "refused: .*writes tensor 2, which is a delegate input",
    "write_constant_through_aliases": "refused: .*writes tensor 2, which is a constant",
    "alias_of_alias_constant": r"ran \[3\.0, 4\.0, 5\.0, 6\.0\]",
    "conv_bias_not_constant": "refused: .*the bias must be a constant",
    "int8_bias_not_constant": "refused: .*the bias must be an f32 constant",
    "where_one_operand": "refused: .*code 10 takes 3 operands",
    "int_division_by_zero": "refused: .*integer division by zero",
    "int_division_min_by_minus_one": r"ran \[-9223372036854775808, -4, -4\]",
    "call_after_close": "refused: .*BackendError: cpu backend: a call on a delegate that was closed",
    "hang_copy": "refused: .*writes an element twice",
    "hang_ew": "refused: .*writes an element twice",
    "hang_reduce": "refused: .*reaches an element twice",
    "stride0_weight_memory": "refused: .*(overlapping strides|memory limit)",
    # the constant is borrowed where the blob's bytes happen to be 64-byte aligned, else copied
    "weights_over_memory_limit": "refused: .*(reordered constant needs 1048576|a constant needs 1048640) bytes, over the delegate's memory limit",
    "many_threads": rf"ran with {len(os.sched_getaffinity(0))} threads, sum 262144\.0",
    "short_int8_scales": "refused: .*weight scales: dense, rank 1, 8 values",
    "eltwise_with_binary_algorithm": "refused: .*algorithm code out of range",
    "eltwise_two_inputs": "refused: .*eltwise: 2 inputs and 1 outputs, valid: 1 and 1",
    "copy_two_outputs": "refused: .*copy: 1 inputs and 2 outputs, valid: 1 and 1",
    "post_op_on_copy": "refused: .*copy: takes no post-ops",
    "long_alias_chain": r"ran \[0\.0, 1\.0, 2\.0, 3\.0\]",
    "read_before_written": r"ran \[0\.0, 0\.0, 0\.0, 0\.0\] \[1\.0, 2\.0, 3\.0, 4\.0\] unplanned 64",
    "safe_log_softmax": "refused: .*safe must be 0 or 1, and 0 with log",
    "safe_softmax_flag_two": "refused: .*safe must be 0 or 1, and 0 with log",
    "dynamic_symbol_past_bound": r"refused: .*found size 10 — valid: 1 \* n \+ 0 with n in \[1, 9\]",
    "dynamic_alias_leaves_base": "refused: .*alias outside its base",
    "dynamic_expression_overflows": r"refused: .*spans \[.*\] over the symbols' ranges, outside",
}
EXPECT.update({name: "ran ok$" for name in NORMAL})
HOSTILE = sorted(set(EXPECT) - set(NORMAL))


# A case file (this one, test_cpu_state_plans.py, ...) has CASES (name → a function that
# returns what ran, or raises for a refusal) and EXPECT (name → a pattern its outcome must
# match); its cases run in a child process (``run_case_file``), which reports each one
# (``report_cases``) for ``check_output`` to match.

def outcome_of(cases: dict, name: str) -> str:
    try:
        return str(cases[name]())
    except OpforgeError as e:  # a BackendError, or one the runtime wraps (KernelError)
        return f"refused: {e}"


def run_case_file(path, names, env=None, timeout=120) -> subprocess.CompletedProcess:
    """Run a case file's cases in one child process: one line "CASE <name> <outcome>" each."""
    return subprocess.run([sys.executable, str(path), *names], capture_output=True, text=True,
                          timeout=timeout, env=env)


def report_cases(cases: dict, names) -> None:
    """A case file's child: run each named case and print its outcome line."""
    for case in names:
        print(f"CASE {case} {outcome_of(cases, case)}", flush=True)


def check_case_file(path, names, expect: dict, timeout=300) -> None:
    """Run a case file's cases (``names``) in one child and check each outcome line."""
    check_output(names, run_case_file(path, names, timeout=timeout), expect)


def ran_ok_cases(cases: dict) -> tuple[dict, dict]:
    """A case file's cases made from one function (lambdas), each renamed after its key (a
    crash report names the frame), and their outcomes: every one "ran ok"."""
    for name, case in cases.items():
        case.__name__ = name
    return cases, {name: "ran ok$" for name in cases}


def case_file_test(path, cases: dict, expect: dict):
    """The plain run's test of a case file: all its cases in one child, each as expected."""
    def test_the_case_file_runs():
        check_case_file(path, list(cases), expect)
    return test_the_case_file_runs


def cpu_flags() -> set[str]:
    """This CPU's feature flags (/proc/cpuinfo), empty where they cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((l for l in text.splitlines() if l.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def outcome(name: str) -> str:
    return outcome_of(CASES, name)


def run_cases(names, env=None, timeout=120) -> subprocess.CompletedProcess:
    return run_case_file(__file__, names, env, timeout)


def check_output(names, proc, expect: dict | None = None) -> None:
    """Each case of ``names`` reported a line matching its ``expect`` pattern (this file's
    ``EXPECT`` unless given: another case file passes its own)."""
    expect = EXPECT if expect is None else expect
    lines = {m.group(1): m.group(2) for m in re.finditer(r"^CASE (\S+) (.*)$", proc.stdout, re.M)}
    for name in names:
        assert name in lines, (f"{name}: the child died (exit {proc.returncode}) before it "
                               f"reported:\n{proc.stderr[-3000:]}")
        assert re.match(expect[name], lines[name], re.S), f"{name}: {lines[name]}"
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("name", HOSTILE)
def test_hostile_plan_is_refused_or_runs_correctly(name):
    check_output([name], run_cases([name]))


def test_normal_plans_of_every_family_match_numpy():
    check_output(NORMAL, run_cases(NORMAL))


def test_a_stride0_weight_does_not_grow_memory_past_the_limit():
    proc = run_cases(["stride0_weight_memory"])
    check_output(["stride0_weight_memory"], proc)
    growth = float(re.search(r"RSS growth: (\d+) MiB", proc.stdout).group(1))
    assert growth < 64, proc.stdout


if __name__ == "__main__":
    report_cases(CASES, sys.argv[1:])


def test_a_uint8_binary_post_op_operand_is_refused_on_a_float_op():
    # int8 convolutions/matmuls take a uint8 residual as a binary post-op (every post-op
    # runs in oneDNN there); a float op's post-ops may run in the NaN-exact epilogue, which
    # reads its operand as float32: a uint8 one would be read past its end
    p = Plan()
    x = p.tensor(F32, [1, 64], role="input")
    b = p.tensor(U8, [1, 64], role="input")
    zero = p.const(np.zeros((1, 1), np.float32))
    y = p.tensor(F32, [1, 64], role="output")
    p.op("binary", [x, zero], [y], [B_ADD], post=[[1, B_ADD, 0.0, 0.0, b]])
    with pytest.raises(BackendError, match="not float32"):
        p.handle()
