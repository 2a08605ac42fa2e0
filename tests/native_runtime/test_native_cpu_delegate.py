"""The native runtime's cpu backend (src/backend_cpu*.cpp): the blob read in C++ and the
engine built and called through its C functions, no Python in the call path.

Each delegate of a program exported with ``backends=["cpu"]`` is run twice on the same
inputs: through the native backend (``DelegateSet``, via the probe library
cpu_delegate_probe.cpp, which hands it a program made in memory as the loader would) and
through the Python backend (``CpuBackend.init`` + ``execute``: engine.py building the same
engine with ctypes). Both build the same engine from the same plan and run the same
kernels, so the outputs must be equal bit for bit (no tolerance). Hostile blobs must be
refused with a message, never a crash. Skipped where the engine cannot run.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import re
import sys
import warnings
import zlib
from pathlib import Path

import numpy as np
import pytest

from opforge.backends import get_backend

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend's engine cannot run here")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

NUMPY = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 6: np.float32,
         7: np.float64, 11: np.bool_}


class Tensor(ctypes.Structure):
    """opforge_tensor (kernel_abi.h)."""
    _fields_ = [("data", ctypes.c_void_p), ("sizes", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("dtype", ctypes.c_int32),
                ("rank", ctypes.c_int32)]


def _engine_path() -> Path:
    """The engine the Python backend loads (and, with it, oneDNN into the process)."""
    from opforge.backends.cpu import engine

    engine.library()
    path = engine.installed_library()
    if path is None:  # a development checkout whose engine is compiled into the cache
        from opforge.native.shared_library import compile_shared  # noqa: F401

        pytest.skip("the engine is not installed for these sources (pip install -e .)")
    return path


def build_probe(native_runtime, folder: Path, flags=("-O2",)) -> ctypes.CDLL:
    """The probe library linked against the static runtime, set to the installed engine
    (``flags``: e.g. the sanitizers of ``build_runtime(sanitize=True)``)."""
    src = ROOT / "opforge" / "native_runtime"
    out = folder / "libprobe.so"
    includes = [src / "include", src / "src", src / "kernels", ROOT / "opforge" / "native" / "include"]
    cmd = ["g++", "-std=c++17", *flags, "-shared", "-fPIC", str(HERE / "cpu_delegate_probe.cpp"),
           *[f"-I{p}" for p in includes], str(native_runtime.static_library), "-ldl", "-lpthread",
           "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True)
    lib = ctypes.CDLL(str(out))
    P, I64, I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
    CPP = ctypes.POINTER(ctypes.c_char_p)
    lib.probe_new.argtypes = [ctypes.c_char_p, P, I64, CPP, CPP, ctypes.POINTER(I64), I64, CPP,
                              ctypes.POINTER(P), ctypes.POINTER(I64), I64, I64,
                              ctypes.POINTER(I32), ctypes.c_char_p, I64]
    lib.probe_new.restype = P
    lib.probe_call.argtypes = [P, ctypes.POINTER(Tensor), I64, ctypes.c_char_p, I64]
    lib.probe_call.restype = I32
    lib.probe_free.argtypes = [P]
    lib.probe_bench.argtypes = [P, ctypes.POINTER(Tensor), I64, I64]
    lib.probe_bench.restype = ctypes.c_double
    lib.probe_set_kernels.argtypes = [ctypes.c_char_p]
    lib.probe_set_kernels.restype = I32
    lib.opf_backend_set_library.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.opf_backend_set_library.restype = I32
    assert lib.opf_backend_set_library(b"cpu", str(_engine_path()).encode()) == 0
    return lib


@pytest.fixture(scope="module")
def probe(native_runtime, tmp_path_factory):
    return build_probe(native_runtime, tmp_path_factory.mktemp("probe"))


class NativeDelegate:
    """One delegate inited by the native runtime's DelegateSet (through the probe)."""

    def __init__(self, lib, blob: bytes, specs, named: dict[str, bytes], backend: str = "cpu",
                 max_memory: int = 1 << 32) -> None:
        self.lib = lib
        self.keep = [blob, named]
        keys = (ctypes.c_char_p * max(len(specs), 1))(*[k.encode() for k, _ in specs])
        values = (ctypes.c_char_p * max(len(specs), 1))(*[bytes(v) for _, v in specs])
        sizes = (ctypes.c_int64 * max(len(specs), 1))(*[len(v) for _, v in specs])
        # named data 64-byte aligned, as a mapped program file's segments are
        arrays = [_aligned(v) for v in named.values()]
        self.keep.append(arrays)
        nkeys = (ctypes.c_char_p * max(len(named), 1))(*[k.encode() for k in named])
        ndata = (ctypes.c_void_p * max(len(named), 1))(*[a.ctypes.data for a in arrays])
        nsizes = (ctypes.c_int64 * max(len(named), 1))(*[a.nbytes for a in arrays])
        self.blob = _aligned(blob)
        status, err = ctypes.c_int32(), ctypes.create_string_buffer(4096)
        self.ptr = lib.probe_new(backend.encode(), self.blob.ctypes.data, self.blob.nbytes, keys, values,
                                 sizes, len(specs), nkeys, ndata, nsizes, len(named), max_memory,
                                 ctypes.byref(status), err, 4096)
        self.status, self.error = status.value, err.value.decode(errors="replace")

    def __call__(self, inputs, outputs) -> tuple[int, str]:
        views = (Tensor * max(len(inputs) + len(outputs), 1))()
        keep = []
        for k, a in enumerate([*inputs, *outputs]):
            sizes = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
            keep.append(sizes)
            views[k] = Tensor(a.ctypes.data, sizes, None, _dtype_number(a.dtype), a.ndim)
        err = ctypes.create_string_buffer(4096)
        rc = self.lib.probe_call(self.ptr, views, len(inputs) + len(outputs), err, 4096)
        return rc, err.value.decode(errors="replace")

    def close(self) -> None:
        if self.ptr:
            self.lib.probe_free(self.ptr)
            self.ptr = None


def _aligned(data) -> np.ndarray:
    raw = np.frombuffer(bytes(data), np.uint8)
    buffer = np.empty(raw.nbytes + 64, np.uint8)
    start = -buffer.ctypes.data % 64
    out = buffer[start:start + raw.nbytes]
    out[:] = raw
    return out


def _dtype_number(dtype) -> int:
    return {np.dtype(v): k for k, v in NUMPY.items()}[np.dtype(dtype)]


def _export(model, inputs, **kwargs):
    from opforge.export import export
    from opforge.program import from_bytes, to_bytes

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return from_bytes(to_bytes(export(model, inputs, kernels="portable", backends=["cpu"], **kwargs)))


def _python_delegate(program, index):
    """The Python backend's handle for delegates[index], with the program's named data."""
    from opforge.backends import decode_specs
    from opforge.backends.base import BackendContext
    from opforge.backends.named_data import NamedDataMap, SharedResources

    backend = get_backend("cpu")
    blob = program.delegates[index]
    own = [(k, v) for k, v in blob.compile_specs if not k.startswith("opforge.")]
    specs = decode_specs("cpu", backend.compile_spec_defs, own)
    context = BackendContext(max_memory=1 << 32, named_data=NamedDataMap(program),
                             shared=SharedResources())
    return backend, backend.init(program.segments[blob.segment].data, specs, context)


def _named(program) -> dict[str, bytes]:
    return {n.key: bytes(program.segments[n.segment].data) for n in program.named_data}


def _call_arrays(plan, seed: int):
    """Inputs for a delegate (floats normal, integers small: valid rows and positions for
    the zoo's gathers), and zeroed outputs, from its plan; state inputs are their outputs."""
    rng = np.random.default_rng(seed)
    tensors = plan["tensors"]
    inputs = []
    for tid in plan["inputs"]:
        dims, dtype = tensors[tid]["dims"], NUMPY[tensors[tid]["dtype"]]
        if np.issubdtype(dtype, np.floating):
            inputs.append(rng.standard_normal(dims).astype(dtype))
        else:
            inputs.append(rng.integers(0, 2, dims).astype(dtype))
    state = {out: pos for pos, out in plan.get("state", [])}
    own = iter(plan["outputs"])
    outputs = []
    for position in range(len(plan["outputs"]) + len(state)):
        if position in state:
            outputs.append(inputs[state[position]])
        else:
            t = tensors[next(own)]
            outputs.append(np.zeros(t["dims"], NUMPY[t["dtype"]]))
    return inputs, outputs


def _compare_delegates(probe, program, seed=0):
    """Every delegate of ``program``: native and Python outputs equal bit for bit, twice
    (the second call over the first call's memory). Returns the number compared."""
    from opforge.backends.cpu import blob as B

    compared = 0
    for index, d in enumerate(program.delegates):
        data = program.segments[d.segment].data
        plan, _ = B.parse(data)
        native = NativeDelegate(probe, bytes(data), d.compile_specs, _named(program))
        assert native.status == 0, native.error
        backend, handle = _python_delegate(program, index)
        try:
            for call in range(2):
                ins, outs = _call_arrays(plan, seed + call)
                ins_py = [a.copy() for a in ins]
                state = {out: pos for pos, out in plan.get("state", [])}
                outs_py = [ins_py[state[p]] if p in state else np.zeros_like(a)
                           for p, a in enumerate(outs)]
                backend.execute(handle, ins_py, outs_py)
                rc, message = native(ins, outs)
                assert rc == 0, message
                for k, (got, want) in enumerate(zip(outs, outs_py)):
                    assert got.tobytes() == want.tobytes(), (index, k, call)
                for k, (got, want) in enumerate(zip(ins, ins_py)):  # state written alike
                    assert got.tobytes() == want.tobytes(), (index, "input", k, call)
            compared += 1
        finally:
            backend.destroy(handle)
            native.close()
    return compared


# --- parity ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["mlp", "cnn", "depthwise_separable", "resnet_block",
                                  "transformer_layer", "gpt_decoder"])
def test_zoo_delegates_match_the_python_backend_bit_for_bit(probe, name):
    import torch

    from opforge.examples.zoo import ZOO

    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    program = _export(model.eval(), inputs)
    assert _compare_delegates(probe, program) >= 1


def test_a_whole_delegated_program_gives_the_python_runtimes_outputs(probe):
    """The zoo mlp is one DelegateCall on the method's inputs: the native delegate on the
    method's inputs gives what opforge.runtime.load gives, bit for bit."""
    import torch

    from opforge.examples.zoo import ZOO
    from opforge.program import DelegateCall
    from opforge.runtime import load

    torch.manual_seed(0)
    model, inputs = ZOO["mlp"]()
    program = _export(model.eval(), inputs)
    method = program.method("forward")
    calls = [i for i in method.instructions if type(i) is DelegateCall]
    assert len(calls) == 1 and list(calls[0].args[:len(method.inputs)]) == list(method.inputs)
    arrays = [t.numpy() for t in inputs]
    want = load(program).method("forward")(*arrays)
    d = program.delegates[0]
    native = NativeDelegate(probe, bytes(program.segments[d.segment].data), d.compile_specs,
                            _named(program))
    assert native.status == 0, native.error
    outs = [np.zeros_like(w) for w in want]
    rc, message = native([np.ascontiguousarray(a) for a in arrays], outs)
    native.close()
    assert rc == 0, message
    for got, w in zip(outs, want):
        assert got.tobytes() == np.ascontiguousarray(w).tobytes()


def test_named_weights_and_state_written_in_place(probe):
    """A decoder with a KV cache in program state (index_put into the state input) and
    weights in the program's named data (blob version 2)."""
    import torch

    from opforge.examples.decoder import TinyDecoder

    model = TinyDecoder(vocab=50, dim=24, heads=4, kv_heads=2, hidden=40, layers=2, max_len=40,
                        seed=7).eval()
    program = _export(model, (torch.tensor([0]), torch.tensor([0])))
    from opforge.backends.cpu import blob as B

    plans = [B.parse(program.segments[d.segment].data)[0] for d in program.delegates]
    assert any(p.get("state") for p in plans), "the decode delegate writes its KV cache"
    assert _compare_delegates(probe, program) == len(program.delegates)


def test_custom_ops_in_the_delegate_call_the_kernel_librarys_native_kernels(probe, tmp_path):
    """A delegate with "kernel" ops (custom ops run through the kernel ABI from inside the
    engine): the kernel comes from the library given to the runtime, the outputs are the
    Python backend's bit for bit, and without the library the program is refused."""
    from opforge.examples.custom_model import custom_op_model
    from opforge.examples.my_ops import manifest_path
    from opforge.export import export
    from opforge.native import build_library
    from opforge.runtime import load

    library = build_library(manifest_path(), sorted((manifest_path().parent / "kernels").glob("*.cpp")),
                            tmp_path / "libmy_ops.so", cache_root=tmp_path / "cache")
    model, inputs = custom_op_model(0)
    custom = ["my_ops::mul3", "my_ops::mul4", "my_ops::minmax", "my_ops::scaled_sum"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = export(model, inputs, kernels=["portable", set(library.ops)],
                         backends=[("cpu", {"custom_ops": custom})])
    d = program.delegates[0]
    blob = bytes(program.segments[d.segment].data)
    assert probe.probe_set_kernels(b"/nonexistent.so") == 1
    missing = NativeDelegate(probe, blob, d.compile_specs, _named(program))
    assert missing.status == 4 and "custom op my_ops::" in missing.error, missing.error
    assert probe.probe_set_kernels(str(library.path).encode()) == 0
    native = NativeDelegate(probe, blob, d.compile_specs, _named(program))
    assert native.status == 0, native.error
    arrays = [t.numpy() for t in inputs]
    want = load(program, kernels=[library.path]).method("forward")(*arrays)
    outs = [np.zeros_like(w) for w in want]
    rc, message = native([np.ascontiguousarray(a) for a in arrays], outs)
    native.close()
    probe.probe_set_kernels(b"/nonexistent.so")
    assert rc == 0, message
    for got, w in zip(outs, want):
        assert got.tobytes() == np.ascontiguousarray(w).tobytes()


# --- through the executor: opforge.runtime.load(..., executor="native") ------------------------

@pytest.fixture
def native_engine(monkeypatch):
    """The native runtime told where the cpu engine is (OPFORGE_CPU_ENGINE); the Python
    backend's engine.library() has loaded oneDNN into this process."""
    monkeypatch.setenv("OPFORGE_CPU_ENGINE", str(_engine_path()))


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer_layer", "gpt_decoder"])
def test_programs_with_cpu_delegates_run_in_the_native_executor(native_engine, name):
    """The whole program in the native runtime (loader, executor, DelegateCalls through the
    cpu backend) gives the Python runtime's outputs bit for bit: the same engine runs each
    delegate, and any instruction beside it is a copy or a portable kernel both share."""
    import torch

    from opforge.examples.zoo import ZOO
    from opforge.runtime import load

    torch.manual_seed(0)
    model, inputs = ZOO[name]()
    program = _export(model.eval(), inputs)
    arrays = [t.numpy() for t in inputs]
    want = load(program).method("forward")(*arrays)
    forward = load(program, executor="native").method("forward")
    for _ in range(2):  # the second call over the first call's memory
        got = forward(*arrays)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            assert np.ascontiguousarray(g).tobytes() == np.ascontiguousarray(w).tobytes()


def test_a_decoder_writes_its_kv_cache_in_place_in_the_native_executor(native_engine):
    """Greedy decoding with a KV cache in program state written by the delegate: the
    native executor's logits equal the Python runtime's bit for bit at every step, and the
    caches too."""
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.runtime import load

    model = TinyDecoder(vocab=50, dim=24, heads=4, kv_heads=2, hidden=40, layers=2, max_len=12,
                        seed=7).eval()
    program = _export(model, (torch.tensor([0]), torch.tensor([0])))
    python, native = load(program), load(program, executor="native")
    step_py, step_native = python.method("forward"), native.method("forward")
    token = 1
    for pos in range(12):
        args = (np.array([token]), np.array([pos]))
        (want,), (got,) = step_py(*args), step_native(*args)
        assert got.tobytes() == want.tobytes(), pos
        token = int(np.argmax(want.reshape(-1)))
    for name in ("blocks.0.attn.k_cache", "blocks.1.attn.v_cache"):
        assert native.read_state(name).tobytes() == python.read_state(name).tobytes()
    assert np.any(native.read_state("blocks.0.attn.k_cache") != 0)


def test_a_dynamic_delegate_runs_an_engine_per_shape(native_engine):
    """A delegate with symbolic sizes (dynamic.py's case, natively): each call's batch
    binds the symbol, the shape's engine is built on first use and cached; outputs equal
    the Python runtime's bit for bit at every size, and a size outside the bounds is
    refused before anything runs."""
    import torch

    from opforge.errors import OpforgeError
    from opforge.examples.zoo import ZOO
    from opforge.runtime import load

    torch.manual_seed(0)
    model, inputs = ZOO["mlp"]()
    batch = torch.export.Dim("batch", min=1, max=12)
    program = _export(model.eval(), inputs, dynamic_shapes=({0: batch},))
    from opforge.backends.cpu import blob as B

    assert "symbols" in B.parse(program.segments[program.delegates[0].segment].data)[0]
    python = load(program).method("forward")
    native = load(program, executor="native").method("forward")
    rng = np.random.default_rng(0)
    features = inputs[0].shape[1:]
    for rows in (3, 1, 12, 3, 7, 2, 5, 9, 11, 4, 3):  # more shapes than the cache holds
        x = rng.standard_normal((rows, *features)).astype(np.float32)
        (want,), (got,) = python(x), native(x)
        assert got.shape == want.shape and got.tobytes() == want.tobytes(), rows
    with pytest.raises(OpforgeError, match=r"size 13.*\[1, 12\]"):  # the method's bounds first
        native(rng.standard_normal((13, *features)).astype(np.float32))


def test_a_decoder_with_a_dynamic_prefill_generates_the_python_runtimes_tokens(native_engine):
    """prefill (symbolic sequence length) and decode, both cpu delegates writing the KV
    cache in place: greedy tokens and every logit equal to the Python runtime's."""
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.export import export
    from opforge.program import from_bytes, to_bytes
    from opforge.runtime import load

    model = TinyDecoder(vocab=50, dim=24, heads=4, kv_heads=2, hidden=40, layers=2, max_len=24,
                        seed=7).eval()
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = from_bytes(to_bytes(export(None, methods={
            "prefill": (model, (torch.tensor([1, 2, 3]), torch.arange(3)), ({0: seq}, {0: seq})),
            "decode": (model, (torch.tensor([0]), torch.tensor([0])))},
            kernels="portable", backends=["cpu"])))
    runs = []
    for executor in ("lean", "native"):
        loaded = load(program, executor=executor)
        prefill, decode = loaded.method("prefill"), loaded.method("decode")
        prompt = np.array([3, 1, 4, 1, 5], np.int64)
        (logits,) = prefill(prompt, np.arange(len(prompt)))
        seen, tokens = [np.ascontiguousarray(logits).tobytes()], []
        token = int(np.argmax(logits.reshape(len(prompt), -1)[-1]))
        for pos in range(len(prompt), model.max_len):
            tokens.append(token)
            (logits,) = decode(np.array([token]), np.array([pos]))
            seen.append(np.ascontiguousarray(logits).tobytes())
            token = int(np.argmax(logits.reshape(-1)))
        runs.append((tokens, seen))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]


def test_a_program_with_a_cpu_delegate_and_no_engine_is_refused_at_load(tmp_path, native_runtime):
    """From C (opforge-run: a fresh process, nothing set with opf_backend_set_library) and
    no OPFORGE_CPU_ENGINE: the load is refused naming the delegate and both fixes. (The
    Python binding points the runtime at opforge's own engine instead.)"""
    import os
    import subprocess

    from opforge.program import save

    save(_mlp(), tmp_path / "mlp.opf")
    env = {k: v for k, v in os.environ.items() if k != "OPFORGE_CPU_ENGINE"}
    done = subprocess.run([str(native_runtime.tool("opforge-run")), str(tmp_path / "mlp.opf")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert re.search(r"delegates\[0\] \('cpu'\).*OPFORGE_CPU_ENGINE", done.stdout + done.stderr)


# --- refusals --------------------------------------------------------------------------------

_MLP = {}


def _mlp():
    """The zoo mlp's program (one delegate, weights in named data), exported once."""
    if not _MLP:
        import torch

        from opforge.examples.zoo import ZOO

        torch.manual_seed(0)
        model, inputs = ZOO["mlp"]()
        _MLP["program"] = _export(model.eval(), inputs)
    return _MLP["program"]


def _mlp_blob():
    program = _mlp()
    d = program.delegates[0]
    return bytes(program.segments[d.segment].data), d.compile_specs


def _reseal(blob: bytes, edit) -> bytes:
    """``blob`` with its plan edited, header and CRC-32 written again (a valid envelope)."""
    from fuzz.cpu_blob_write import write_blob
    from opforge.backends.cpu import blob as B

    plan, data = B.parse(blob)
    plan = json.loads(json.dumps(plan))
    edit(plan)
    return write_blob(plan, bytes(data))


def _deeply_nested(blob: bytes, depth: int = 10000) -> bytes:
    """A plan whose "impls" nests lists ``depth`` deep (Python's json gives up with a
    RecursionError; a recursive reader without a bound would overflow its stack)."""
    from opforge.backends.cpu import blob as B

    plan, data = B.parse(blob)
    text = json.dumps({**plan, "impls": "DEEP"}, separators=(",", ":")).encode()
    text = text.replace(b'"DEEP"', b"[" * depth + b"]" * depth)
    pad = bytes(B._align(B.HEADER.size + len(text)) - B.HEADER.size - len(text))
    return B.HEADER.pack(B.MAGIC, 1, len(text), data.nbytes, zlib.crc32(text + bytes(data)), 0) + \
        text + pad + bytes(data)


def _first(plan, test):
    return next(t for t in plan["tensors"] if test(t))


def _named_instead(plan):
    t = _first(plan, lambda t: "data" in t)
    t["named"] = ["sha256:00", t.pop("data")[1]]


def _short_constant(plan):
    t = _first(plan, lambda t: "data" in t and t["data"][1] > 4)
    t["data"] = [t["data"][0], 4]


def _python_refuses(blob: bytes, specs) -> str:
    """The Python backend's message for ``blob`` with the mlp program's named data ("" when
    it takes the blob)."""
    from opforge.backends import decode_specs
    from opforge.backends.base import BackendContext
    from opforge.backends.named_data import NamedDataMap, SharedResources
    from opforge.errors import BackendError

    backend = get_backend("cpu")
    own = [(k, v) for k, v in specs if not k.startswith("opforge.")]
    context = BackendContext(max_memory=1 << 32, named_data=NamedDataMap(_mlp()),
                             shared=SharedResources())
    try:
        handle = backend.init(memoryview(blob), decode_specs("cpu", backend.compile_spec_defs, own),
                              context)
    except BackendError as e:
        return str(e)
    backend.destroy(handle)
    return ""


def _set(path, value):
    def edit(plan):
        target = plan
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


HOSTILE = {
    "truncated": lambda b: b[:len(b) // 2],
    "header only": lambda b: b[:20],
    "bad magic": lambda b: b"XFCPUBLB" + b[8:],
    "bad crc": lambda b: b[:24] + bytes([b[24] ^ 1]) + b[25:],
    "flipped plan byte": lambda b: b[:40] + bytes([b[40] ^ 0x20]) + b[41:],
    "version 3": lambda b: b[:8] + (3).to_bytes(4, "little") + b[12:],
    "bad tensor id": lambda b: _reseal(b, lambda p: p["ops"][0].__setitem__("in", [10 ** 6])),
    "alias of a later tensor": lambda b: _reseal(b, lambda p: p["tensors"][0].update(
        role="alias", base=len(p["tensors"]) - 1, offset=0)),
    "float dims": lambda b: _reseal(b, lambda p: p["tensors"][0].__setitem__("dims", [2.0])),
    "rank 9": lambda b: _reseal(b, lambda p: p["tensors"][0].update(dims=[1] * 9, strides=[1] * 9)),
    "data outside": lambda b: _reseal(b, lambda p: next(
        t for t in p["tensors"] if "data" in t).__setitem__("data", [0, 1 << 30])),
    "unknown op kind": lambda b: _reseal(b, _set(["ops", 0, "kind"], "fft")),
    "bad dtype": lambda b: _reseal(b, _set(["tensors", 0, "dtype"], 5)),
    "input not row-major": lambda b: _reseal(b, lambda p: p["tensors"][p["inputs"][0]].update(
        strides=[s + 1 for s in p["tensors"][p["inputs"][0]]["strides"]])),
    "deep nesting": _deeply_nested,
    "missing named constant": lambda b: _reseal(b, _named_instead),
    "constant of the wrong size": lambda b: _reseal(b, _short_constant),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_blobs_are_refused_with_a_message_as_the_python_backend_refuses_them(probe, case):
    blob, specs = _mlp_blob()
    bad = HOSTILE[case](blob)
    python = _python_refuses(bad, specs)
    native = NativeDelegate(probe, bad, specs, _named(_mlp()))
    try:
        assert python, f"the Python backend took the {case} blob"
        assert native.status != 0, f"the native backend took the {case} blob (Python: {python})"
        assert "cpu backend" in native.error and "delegates[0]" in native.error, native.error
    finally:
        native.close()


def test_the_unedited_blob_is_taken_by_both(probe):
    """The control of the hostile cases: each is refused for its edit, not for a missing
    piece of the harness."""
    blob, specs = _mlp_blob()
    assert _python_refuses(blob, specs) == ""
    native = NativeDelegate(probe, blob, specs, _named(_mlp()))
    assert native.status == 0, native.error
    native.close()
    resealed = _reseal(blob, lambda plan: None)
    native = NativeDelegate(probe, resealed, specs, _named(_mlp()))
    assert native.status == 0, native.error
    native.close()


def test_the_same_checks_refuse_on_the_same_message(probe):
    """Where both readers reject in the header or the plan checks, the reason is blob.py's."""
    blob, specs = _mlp_blob()
    bad = blob[:24] + bytes([blob[24] ^ 1]) + blob[25:]
    native = NativeDelegate(probe, bad, specs, _named(_mlp()))
    assert "a CRC-32 that does not match its contents" in native.error
    assert "a CRC-32 that does not match its contents" in _python_refuses(bad, specs)


def test_wrong_call_arguments_are_refused_not_run(probe):
    blob, specs = _mlp_blob()
    native = NativeDelegate(probe, blob, specs, _named(_mlp()))
    assert native.status == 0, native.error
    from opforge.backends.cpu import blob as B

    plan, _ = B.parse(blob)
    ins, outs = _call_arrays(plan, 0)
    rc, message = native([ins[0].astype(np.float64), *ins[1:]], outs)
    assert rc != 0 and "input 0" in message and "compiled for float32" in message, message
    rc, message = native([np.zeros([s + 1 for s in ins[0].shape], ins[0].dtype), *ins[1:]], outs)
    assert rc != 0 and "input 0" in message, message
    rc, message = native(ins, outs)
    assert rc == 0, message
    native.close()


def test_an_unknown_backend_is_refused_clearly(probe):
    blob, specs = _mlp_blob()
    other = NativeDelegate(probe, blob, specs, {}, backend="xnnpack")
    assert other.status == 10 and "'xnnpack'" in other.error and "'cpu'" in other.error


def test_a_missing_engine_names_the_delegate_and_the_fix(probe, tmp_path):
    blob, specs = _mlp_blob()
    assert probe.opf_backend_set_library(b"cpu", str(tmp_path / "nope.so").encode()) == 0
    try:
        native = NativeDelegate(probe, blob, specs, _named(_mlp()))
        assert native.status == 10, native.error
        assert "delegates[0]" in native.error and "nope.so" in native.error
        assert "OPFORGE_CPU_ENGINE" in native.error and "LD_LIBRARY_PATH" in native.error
    finally:
        assert probe.opf_backend_set_library(b"cpu", str(_engine_path()).encode()) == 0


# --- the blob fuzzer's mutations: refused by both readers, or run by both alike ------------

def _seeds():
    import torch

    from opforge.examples.decoder import TinyDecoder
    from opforge.examples.zoo import ZOO
    from opforge.program import to_bytes

    sys.path.insert(0, str(ROOT / "fuzz"))
    from cpu_blob_write import ParsedSeed

    seeds = [ParsedSeed.of("mlp", to_bytes(_mlp()))]
    for name in ("cnn", "transformer_layer"):
        torch.manual_seed(0)
        model, inputs = ZOO[name]()
        seeds.append(ParsedSeed.of(name, to_bytes(_export(model.eval(), inputs))))
    decoder = TinyDecoder(vocab=50, dim=24, heads=4, kv_heads=2, hidden=40, layers=1, max_len=16,
                          seed=7).eval()
    seeds.append(ParsedSeed.of("decoder", to_bytes(_export(decoder, (torch.tensor([0]),
                                                                     torch.tensor([0]))))))
    torch.manual_seed(0)
    model, inputs = ZOO["mlp"]()
    batch = torch.export.Dim("batch", min=1, max=12)
    seeds.append(ParsedSeed.of("mlp dynamic", to_bytes(_export(model.eval(), inputs,
                                                              dynamic_shapes=({0: batch},)))))
    return seeds


FUZZ_CASES, FUZZ_SEED = 300, 4401  # a longer run: set these on the module and call the test


def _python_run(program, index, inputs, outputs) -> tuple[str, str]:
    """("refused", message) at init, ("failed", message) in the call, or ("ran", "")."""
    from opforge.backends import decode_specs
    from opforge.backends.base import BackendContext
    from opforge.backends.named_data import NamedDataMap, SharedResources
    from opforge.errors import BackendError

    backend = get_backend("cpu")
    blob = program.delegates[index]
    try:
        own = [(k, v) for k, v in blob.compile_specs if not k.startswith("opforge.")]
        specs = decode_specs("cpu", backend.compile_spec_defs, own)
        context = BackendContext(max_memory=1 << 30, named_data=NamedDataMap(program),
                                 shared=SharedResources())
        handle = backend.init(program.segments[blob.segment].data, specs, context)
    except BackendError as e:
        return "refused", str(e)
    try:
        backend.execute(handle, inputs, outputs)
        return "ran", ""
    except BackendError as e:
        return "failed", str(e)
    finally:
        backend.destroy(handle)


def test_fuzzed_blobs_get_the_same_verdict_from_both_backends(probe):
    """300 cases of fuzz/cpu_blob_mutate.py (ids, dims, strides, aliases, dtypes, roles,
    constants, named data, attributes, post-ops, io and state lists, header, specs, size
    expressions and symbols) on five seeds, one of them dynamic: each is refused at init by both backends, or fails in the call in both, or runs
    in both with the same outputs bit for bit."""
    import random

    from opforge.backends.cpu import blob as B
    from opforge.program import from_bytes

    seeds = _seeds()  # (puts fuzz/ on the path)
    from cpu_blob_mutate import mutate
    rng = random.Random(FUZZ_SEED)
    verdicts = {}
    for case in range(FUZZ_CASES):
        seed = seeds[case % len(seeds)]
        data, mutations = mutate(rng, seed)
        program = from_bytes(data)
        index = next(i for i, d in enumerate(program.delegates) if d.id == "cpu"
                     and any(i == j for j, _, _ in seed.plans))
        blob = bytes(program.segments[program.delegates[index].segment].data)
        try:
            plan, data_view = B.parse(blob)
            if "symbols" in plan:  # called at the symbols' minima
                from opforge.backends.cpu.dynamic import check_symbolic, concrete_plan

                exprs = check_symbolic(plan, data_view)
                plan = concrete_plan(plan, exprs, {n: lo for n, lo, _ in plan["symbols"]})
            ins, outs = _call_arrays(plan, case)
        except Exception:  # noqa: BLE001 - a plan the arrays cannot be made for: init only
            plan, ins, outs = None, [], []
        ins_py = [a.copy() for a in ins]
        state = {out: pos for pos, out in (plan or {}).get("state", [])} if plan else {}
        outs_py = [ins_py[state[p]] if p in state else a.copy() for p, a in enumerate(outs)]
        python, python_message = _python_run(program, index, ins_py, outs_py) if plan else \
            _python_run(program, index, [], [])
        native = NativeDelegate(probe, blob, program.delegates[index].compile_specs,
                                _named(program), max_memory=1 << 30)
        try:
            if native.status != 0:
                verdict = "refused"
                assert native.error, "a refusal without a message"
            elif python == "refused":
                verdict = "ran"  # not called: the Python backend took nothing to compare with
            else:
                rc, message = native(ins, outs)
                verdict = "ran" if rc == 0 else "failed"
            what = f"case {case} ({seed.name}: {[str(m) for m in mutations]})"
            assert verdict == python, f"{what}: native {verdict} ({native.error}), Python " \
                                      f"{python} ({python_message})"
            if verdict == "ran":
                for got, want in zip([*ins, *outs], [*ins_py, *outs_py]):
                    assert got.tobytes() == want.tobytes(), what
        finally:
            native.close()
        verdicts[verdict] = verdicts.get(verdict, 0) + 1
    assert verdicts.get("refused", 0) > 30 and verdicts.get("ran", 0) > 30, verdicts
