"""The cpu backend's contract: compile specs and threads, custom ops inside and beside a
delegate (native kernels called from C++ through the kernel ABI), a missing oneDNN, bad
run-time arrays, and corrupt blobs (refused cleanly, never a crash)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

import opforge.backends.cpu.engine as engine_module
from opforge.backends import get_backend
from opforge.backends.cpu import blob
from opforge.errors import BackendError, OpforgeError
from opforge.examples.custom_model import custom_op_model
from opforge.examples.my_ops import manifest_path
from opforge.export import delegation_report, export
from opforge.native import build_library
from opforge.program import Segment, to_bytes
from opforge.runtime import load


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.conv(x)).mean((2, 3))
        return torch.sigmoid(self.fc(y))


def _small():
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    sources = sorted((manifest_path().parent / "kernels").glob("*.cpp"))
    out = tmp_path_factory.mktemp("lib") / "libmy_ops.so"
    return build_library(manifest_path(), sources, out,
                         cache_root=tmp_path_factory.getbasetemp() / "opforge-cache")


def test_compile_specs_are_checked_at_export():
    model, inputs = _small()
    with pytest.raises(BackendError, match="unknown compile spec.*'threads'.*valid: num_threads"):
        export(model, inputs, backends=[("cpu", {"threads": 2})])
    with pytest.raises(BackendError, match="num_threads.*negative"):
        export(model, inputs, backends=[("cpu", {"num_threads": -1})])
    with pytest.raises(BackendError, match="custom_ops.*not a JSON list"):
        export(model, inputs, backends=[("cpu", {"custom_ops": '"my_ops::mul3"'})])


@pytest.mark.parametrize("threads", [1, 2])
def test_thread_counts_give_the_same_results(threads, monkeypatch):
    model, inputs = _small()
    program = export(model, inputs, backends=[("cpu", {"num_threads": threads})])
    assert dict(program.delegates[0].compile_specs)["num_threads"] == f"i:{threads}".encode()
    got = load(program).method("forward")(inputs[0].numpy())[0]
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_opforge_num_threads_zero_is_refused_at_load(monkeypatch):
    model, inputs = _small()
    program = export(model, inputs, backends=["cpu"])
    monkeypatch.setenv("OPFORGE_NUM_THREADS", "0")
    # the runtime's thread setting (opforge.runtime.threads) refuses it before the backend
    with pytest.raises(OpforgeError, match="OPFORGE_NUM_THREADS='0' — valid: a count"):
        load(program)
    monkeypatch.setenv("OPFORGE_NUM_THREADS", "auto")
    assert load(program).method("forward")(inputs[0].numpy())[0].shape == (2, 4)


def test_missing_onednn_fails_export_and_load_clearly_and_lean_keeps_working(monkeypatch):
    model, inputs = _small()
    delegated = to_bytes(export(model, inputs, backends=["cpu"]))
    plain = to_bytes(export(model, inputs))
    monkeypatch.setattr(engine_module, "onednn_prefix", lambda: None)
    with pytest.raises(BackendError, match="oneDNN is not installed.*pip install 'opforge\\[cpu\\]'.*"
                                           "onednn-cpu-gomp==2023.2.0"):
        export(model, inputs, backends=["cpu"])
    with pytest.raises(BackendError, match="needs backend 'cpu', which cannot run here: oneDNN"):
        load(delegated)
    assert load(plain).method("forward")(inputs[0].numpy())[0].shape == (2, 4)


def test_run_time_arrays_must_match_the_delegate():
    model, inputs = _small()
    program = export(model, inputs, backends=["cpu"])
    backend = get_backend("cpu")
    loaded = load(program)
    handle = loaded.delegates.handles[0]
    good_in, good_out = np.zeros((2, 3, 8, 8), np.float32), np.zeros((2, 4), np.float32)
    for bad_in, bad_out, why in [
        (np.zeros((2, 3, 8, 9), np.float32), good_out, "float32\\[2, 3, 8, 8\\]"),
        (good_in.astype(np.float64), good_out, "float32\\[2, 3, 8, 8\\]"),
        (good_in, good_out[:, ::2].copy()[:, :1], "float32\\[2, 4\\]"),
        (np.zeros((2, 8, 8, 3), np.float32).transpose(0, 3, 1, 2), good_out, "C-contiguous"),
    ]:
        with pytest.raises(BackendError, match=why):
            backend.bind(handle, [bad_in], [bad_out])
    backend.bind(handle, [good_in], [good_out])()
    assert np.all(np.isfinite(good_out))


def test_custom_ops_inside_the_delegate_call_their_native_kernels(library):
    model, inputs = custom_op_model(0)
    custom = ["my_ops::mul3", "my_ops::mul4", "my_ops::minmax", "my_ops::scaled_sum"]
    program = export(model, inputs, kernels=["portable", set(library.ops)],
                     backends=[("cpu", {"custom_ops": custom})])
    instructions = program.method("forward").instructions
    assert [type(i).__name__ for i in instructions] == ["DelegateCall"]
    report = delegation_report(program)["forward"]
    assert not report["rejected"]
    view = get_backend("cpu").describe_blob(program.segments[program.delegates[0].segment].data,
                                            {"num_threads": 0})
    impls = {row["op"]: row["impl"] for row in view["nodes"]}
    assert impls["my_ops::mul3.default"] == "native kernel (kernel ABI)"
    forward = load(program, kernels=[library.path]).method("forward")
    with torch.no_grad():
        want = model(*inputs).numpy()
    # the Linear's sums in another order than eager's BLAS, then ×3 and sums of 8: a few ulp
    np.testing.assert_allclose(forward(inputs[0].numpy())[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(BackendError, match="custom op my_ops::mul3.out through its native kernel.*"
                                           "--kernels LIB.so"):
        load(program)


def test_custom_ops_not_listed_stay_beside_the_delegate(library):
    model, inputs = custom_op_model(0)
    program = export(model, inputs, kernels=["portable", set(library.ops)], backends=["cpu"])
    report = delegation_report(program)["forward"]
    reasons = {r["op"]: r for r in report["rejected"]}
    assert reasons["my_ops::mul3.default"]["kind"] == "compile_spec"
    assert "custom_ops" in reasons["my_ops::mul3.default"]["reason"]
    kinds = {type(i).__name__ for i in program.method("forward").instructions}
    assert kinds == {"DelegateCall", "KernelCall"}
    forward = load(program, kernels=[library.path]).method("forward")
    with torch.no_grad():
        want = model(*inputs).numpy()
    np.testing.assert_allclose(forward(inputs[0].numpy())[0], want, rtol=1e-5, atol=1e-5)


def _with_blob(program, data: bytes):
    seg = program.delegates[0].segment
    segments = tuple(Segment(data) if i == seg else s for i, s in enumerate(program.segments))
    return to_bytes(dataclasses.replace(program, segments=segments))


def test_corrupt_blobs_are_refused():
    model, inputs = _small()
    program = export(model, inputs, backends=["cpu"])
    raw = bytes(program.segments[program.delegates[0].segment].data)
    cases = [
        (raw[:20], "shorter than its 32-byte header"),
        (b"XXXXXXXX" + raw[8:], "magic"),
        (raw[:8] + (9).to_bytes(4, "little") + raw[12:], "format version 9"),
        (raw[:-1], "do not add up"),
        (raw[:40] + bytes([raw[40] ^ 0xFF]) + raw[41:], "CRC-32"),
    ]
    for data, why in cases:
        with pytest.raises(BackendError, match=why):
            load(_with_blob(program, data))


def test_valid_json_with_hostile_fields_is_refused():
    model, inputs = _small()
    program = export(model, inputs, backends=["cpu"])
    doc, data = blob.parse(program.segments[program.delegates[0].segment].data)

    def reencode(mutate):
        import copy
        import json
        import struct
        import zlib

        d = copy.deepcopy(doc)
        mutate(d)
        text = json.dumps(d).encode()
        pad = bytes((-(blob.HEADER.size + len(text))) % 64)
        body = bytes(data)
        head = blob.HEADER.pack(blob.MAGIC, blob.VERSION, len(text), len(body),
                                zlib.crc32(text + body), 0)
        return head + text + pad + body

    temps = [i for i, t in enumerate(doc["tensors"]) if t["role"] == "temp"]
    cases = [
        (lambda d: d["ops"][0].update({"in": [10 ** 6]}), "ops\\[0\\].in item"),
        (lambda d: d["tensors"][temps[0]].update({"role": "dead"}), "has no memory"),
        (lambda d: d["tensors"][d["inputs"][0]].update({"strides": [1, 1, 1, 1]}), "not row-major"),
        (lambda d: d["ops"][-1].update({"kind": "launch_missiles"}), "known kind"),
        (lambda d: d["tensors"][temps[0]].update({"dims": [1 << 40, 1 << 40]}), "strides|too large|dims"),
        (lambda d: d["ops"].append({"kind": "copy", "in": [d["inputs"][0]], "out": [temps[0]],
                                    "ia": [1, 10 ** 9, 1, 0, 1, 0], "fa": [], "post": [], "name": "x"}),
         "outside its tensor"),
        (lambda d: next(t for t in d["tensors"] if "data" in t).update({"data": []}),
         "has 0 items, not \\[offset, nbytes\\]"),
        (lambda d: next(t for t in d["tensors"] if "data" in t).update({"data": [0]}),
         "has 1 items, not \\[offset, nbytes\\]"),
    ]
    for mutate, why in cases:
        with pytest.raises(BackendError, match=why):
            load(_with_blob(program, reencode(mutate)))


def test_byte_flipped_blobs_never_crash_the_process(tmp_path):
    # In a child process: a crash (segfault) fails this test instead of killing pytest.
    # The flips are resealed (CRC recomputed) so they reach the JSON parser, the field
    # checks and the engine's own checks, not only the checksum.
    model, inputs = _small()
    path = tmp_path / "m.opf"
    from opforge.program import save

    save(export(model, inputs, backends=["cpu"]), path)
    code = textwrap.dedent(f"""
        import dataclasses, random, zlib, struct, collections
        import numpy as np
        from opforge.program import load as load_file, to_bytes, Segment
        from opforge.runtime import load
        from opforge.errors import OpforgeError
        from opforge.backends.cpu import blob as B
        program = load_file({str(path)!r})
        seg = program.delegates[0].segment
        raw = bytearray(program.segments[seg].data)
        _, _, plan_len, data_len, _, _ = B.HEADER.unpack_from(raw, 0)
        rng = random.Random(3)
        outcomes = collections.Counter()
        x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
        for n in range(300):
            data = bytearray(raw)
            for _ in range(rng.randint(1, 4)):
                i = rng.randrange(B.HEADER.size, B.HEADER.size + plan_len)
                data[i] = rng.choice(b"0123456789-[]{{}},:\\"e") if rng.random() < 0.7 else rng.randrange(256)
            start = B.align if False else None
            body = bytes(data[B.HEADER.size:B.HEADER.size + plan_len]) + bytes(data[len(raw) - data_len:])
            struct.pack_into("<I", data, 24, zlib.crc32(body))
            segments = tuple(Segment(bytes(data)) if i == seg else s for i, s in enumerate(program.segments))
            try:
                load(to_bytes(dataclasses.replace(program, segments=segments))).method("forward")(x)
                outcomes["ran"] += 1
            except OpforgeError as e:
                outcomes[type(e).__name__] += 1
        print(dict(outcomes))
        assert outcomes["ran"] > 5 and sum(outcomes.values()) == 300, outcomes
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BackendError" in proc.stdout, proc.stdout
