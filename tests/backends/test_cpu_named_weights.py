"""One copy of the weights for all of a program's cpu delegates: constants of at least
``blob.NAMED_MIN_BYTES`` are stored once in the program (named data, format version 6) and
the blobs refer to them by key; at run time every delegate reads a key at one address and
the program's weight cache reorders each weight once for all of them.

Checked: what the file holds (each weight once, every key a blob names present), that the
delegates share the reordered weights (the cache holds no more after a second method runs
than after the first alone, where both multiply at the same sizes), results against eager
(the decoder's greedy tokens exactly), a program built in memory (unaligned segments), and
hostile programs: a missing key, a key whose bytes have another size, a named tensor that
is not a constant, duplicate keys."""

from __future__ import annotations

import json
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch

from fuzz.cpu_blob_write import write_blob
from opforge.backends import get_backend
from opforge.backends.cpu import blob
from opforge.errors import BackendError, ProgramError
from opforge.export import export
from opforge.program import NamedData, Program, from_bytes, to_bytes, verify
from opforge.runtime import load

pytestmark = pytest.mark.skipif(get_backend("cpu").unavailable() is not None,
                                reason="the cpu backend cannot run here")


def _quiet_export(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return export(*args, kernels="portable", backends=["cpu"], **kwargs)


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a = torch.nn.Parameter(torch.randn(64, 48, generator=g) / 8)
        self.b = torch.nn.Parameter(torch.randn(32, 64, generator=g) / 8)
        self.bias = torch.nn.Parameter(torch.randn(32, generator=g))  # 128 bytes: in the blob

    def forward(self, x):
        return torch.nn.functional.linear(torch.relu(x @ self.a.T), self.b, self.bias)

    def doubled(self, x):
        return 2 * self.forward(x) + 1


def _two_methods(model):
    class Doubled(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner.doubled(x)

    x = torch.randn(5, 48, generator=torch.Generator().manual_seed(1))
    return _quiet_export(None, methods={"forward": (model, (x,)), "doubled": (Doubled(), (x,))}), x


def _blob_plans(program):
    return [blob.parse(program.segments[d.segment].data)[0] for d in program.delegates]


def _named_refs(plan):
    return {t["named"][0]: t["named"][1] for t in plan["tensors"] if "named" in t}


def test_each_weight_is_stored_once_and_every_blob_names_it():
    model = _Mlp().eval()
    program, _ = _two_methods(model)
    assert len(program.delegates) == 2
    plans = _blob_plans(program)
    refs = [_named_refs(p) for p in plans]
    # the two large weights once each (in the layout the lowering stores: its elements, in
    # some order); the 128-byte bias stays in the blobs
    weights = sorted(tuple(np.sort(p.detach().numpy().ravel())) for p in (model.a, model.b))
    stored = sorted(tuple(np.sort(np.frombuffer(program.segments[n.segment].data, np.float32)))
                    for n in program.named_data)
    assert stored == weights
    assert refs[0] == refs[1] and set(refs[0]) == {n.key for n in program.named_data}
    for d in program.delegates:  # no blob carries a copy of a named weight
        _, data = blob.parse(program.segments[d.segment].data)
        assert data.nbytes < 32 * 64 * 4
    assert from_bytes(to_bytes(program)) == program


def test_the_delegates_share_one_reordered_copy_of_each_weight():
    """Both methods multiply by the same weights at the same sizes, so oneDNN wants the
    same layouts: the second method's engine finds each weight in the program's cache."""
    from opforge.backends.cpu.engine import library, shared_weight_cache

    model = _Mlp().eval()
    program, x = _two_methods(model)
    program = from_bytes(to_bytes(program))  # as from a file
    lib = library()

    def cache_bytes(loaded):
        return lib.ofc_weight_cache_bytes(shared_weight_cache(
            type("C", (), {"shared": loaded.delegates.shared})))

    single = Program(methods=(program.method("forward"),), segments=program.segments,
                     delegates=program.delegates, named_data=program.named_data)
    one = cache_bytes(load(single))
    loaded = load(program)
    both = cache_bytes(loaded)
    weights = sum(p.numel() * 4 for p in (model.a, model.b))  # 20 KiB
    assert one >= weights  # both weights reordered
    # the second delegate reorders none of the named weights again: at most its own copy of
    # the 128-byte bias, which each blob holds (cached when the blob's bytes lie 64-byte
    # aligned in memory, as a file's do and bytes objects may); a weight again is 8 KiB+
    assert both - one < blob.NAMED_MIN_BYTES, (one, both)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
        want2 = 2 * want + 1
    # float32 sums of 48 and 64 terms against float64: |error| < 1e-5 at these magnitudes
    np.testing.assert_allclose(loaded.method("forward")(x.numpy())[0], want, rtol=0, atol=2e-5)
    np.testing.assert_allclose(loaded.method("doubled")(x.numpy())[0], want2, rtol=0, atol=4e-5)


def test_a_decoder_prefill_and_decode_share_its_weights_and_decode_eager_s_tokens():
    from opforge.examples.decoder import TinyDecoder, greedy_decode

    model = TinyDecoder(vocab=50, dim=48, heads=4, kv_heads=2, hidden=64, layers=2,
                        max_len=40, seed=3).eval()
    seq = torch.export.Dim("seq", min=1, max=model.max_len)
    program = _quiet_export(None, methods={
        "prefill": (model, (torch.tensor([1, 2, 3]), torch.arange(3)), ({0: seq}, {0: seq})),
        "decode": (model, (torch.tensor([0]), torch.tensor([0])))})
    program = from_bytes(to_bytes(program))
    refs = [_named_refs(p) for p in _blob_plans(program)]
    assert len(refs) == 2 and refs[0] and set(refs[0]) == set(refs[1])
    large = [p for p in model.parameters() if p.numel() * 4 >= blob.NAMED_MIN_BYTES]
    assert len(program.named_data) == len({p.detach().numpy().tobytes() for p in large})
    loaded = load(program)
    prefill, decode = loaded.method("prefill"), loaded.method("decode")
    got = greedy_decode(lambda t, p: (decode if len(t) == 1 else prefill)(
        t.numpy(), p.numpy())[0], [4, 8, 15, 16, 23], 12)
    with torch.no_grad():
        want = greedy_decode(lambda t, p: model(t, p), [4, 8, 15, 16, 23], 12)
    assert got == want


def test_a_program_built_in_memory_reads_its_named_weights_from_aligned_copies():
    model = _Mlp().eval()
    program, x = _two_methods(model)  # segments are bytes objects, wherever Python put them
    loaded = load(program)
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    np.testing.assert_allclose(loaded.method("forward")(x.numpy())[0], want, rtol=0, atol=2e-5)
    for named in program.named_data:  # what the engines borrow: aligned, the stored bytes
        view = loaded.delegates.named_data.get(named.key)
        assert np.frombuffer(view, np.uint8).ctypes.data % 64 == 0
        assert bytes(view) == bytes(program.segments[named.segment].data)
    assert loaded.delegates.named_data.get("sha256:missing") is None


# --- hostile programs --------------------------------------------------------------------------

def _reseal(data: bytes, edit) -> bytes:
    """The blob with its plan edited and its CRC made valid again."""
    _, version, plan_len, data_len, _, reserved = blob.HEADER.unpack_from(data, 0)
    plan = json.loads(data[blob.HEADER.size:blob.HEADER.size + plan_len])
    edit(plan)
    return write_blob(plan, data[-data_len:] if data_len else b"", version=version,
                      reserved=reserved)


def _with_blob(program, index, data):
    import dataclasses

    from opforge.program import Segment

    segments = list(program.segments)
    segments[program.delegates[index].segment] = Segment(data)
    return dataclasses.replace(program, segments=tuple(segments))


def _first_named(plan):
    return next(t for t in plan["tensors"] if "named" in t)


@pytest.mark.parametrize("edit, message", [
    (lambda p: _first_named(p)["named"].__setitem__(0, "sha256:" + "0" * 64),
     r"names constant 'sha256:0+' of \d+ bytes, which is missing from the program"),
    (lambda p: _first_named(p)["named"].__setitem__(1, _first_named(p)["named"][1] - 4),
     r"which holds \d+ bytes"),
])
def test_a_blob_naming_bytes_the_program_does_not_hold_is_refused_at_load(edit, message):
    program, _ = _two_methods(_Mlp().eval())
    data = bytes(program.segments[program.delegates[0].segment].data)
    hostile = _with_blob(program, 0, _reseal(data, edit))
    with pytest.raises(BackendError, match=message):
        load(hostile)


@pytest.mark.parametrize("edit, message", [
    (lambda p: _first_named(p).__setitem__("named", ["k"]), r"named is not \[key, nbytes\]"),
    (lambda p: _first_named(p).__setitem__("named", [7, 64]), r"named is not \[key, nbytes\]"),
    (lambda p: _first_named(p).__setitem__("named", ["k" * 300, 64]), r"named is not"),
    (lambda p: _first_named(p)["named"].__setitem__(1, -1), r"named nbytes"),
    (lambda p: _first_named(p).__setitem__("data", [0, 0]), r"also has data"),
    (lambda p: _first_named(p).__setitem__("role", "temp"), r"is named but is not a constant"),
])
def test_malformed_named_fields_are_refused_by_parse(edit, message):
    program, _ = _two_methods(_Mlp().eval())
    data = bytes(program.segments[program.delegates[0].segment].data)
    with pytest.raises(BackendError, match=message):
        blob.parse(memoryview(_reseal(data, edit)))


def test_the_verifier_refuses_duplicate_keys_and_dangling_segments():
    import dataclasses

    program, _ = _two_methods(_Mlp().eval())
    first = program.named_data[0]
    twice = dataclasses.replace(program, named_data=program.named_data + (first,))
    with pytest.raises(ProgramError, match="already the key of named_data"):
        verify(twice)
    dangling = dataclasses.replace(
        program, named_data=(NamedData(first.key, len(program.segments)),))
    with pytest.raises(ProgramError, match=r"named_data\[0\].*segment index"):
        verify(dangling)
    with pytest.raises(ProgramError, match="printable string"):
        NamedData("", 0)


def test_a_version_6_table_in_a_version_5_file_is_not_read():
    """A file whose header says version 5 has no named-data table: the bytes after the user
    metadata are trailing garbage to a reader, refused."""
    from opforge.program import _format as F

    program, _ = _two_methods(_Mlp().eval())
    data = bytearray(to_bytes(program))
    assert struct.unpack_from("<I", data, 8)[0] == 6
    struct.pack_into("<I", data, 8, 5)
    head = F.HEADER.unpack_from(data, 0)
    metadata = bytes(data[head[4]:head[4] + head[5]])
    struct.pack_into("<I", data, 40, zlib.crc32(metadata))  # a consistent header otherwise
    with pytest.raises(ProgramError):
        from_bytes(bytes(data))


# --- one layout per key (issue 43 item 6) -------------------------------------------------------

class _SameBytes(torch.nn.Module):
    """Two weights of equal bytes (4 KiB of ones each) read with different shapes."""

    def __init__(self) -> None:
        super().__init__()
        self.square = torch.nn.Parameter(torch.ones(32, 32), requires_grad=False)
        self.wide = torch.nn.Parameter(torch.ones(16, 64), requires_grad=False)

    def forward(self, x):
        return x @ self.square, x.reshape(8, 16) @ self.wide


def test_equal_bytes_read_as_two_shapes_get_two_keys_and_run():
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(2))
    model = _SameBytes().eval()
    program = from_bytes(to_bytes(_quiet_export(model, (x,))))
    refs = [t["named"] for p in _blob_plans(program) for t in p["tensors"] if "named" in t]
    assert len(refs) == 2 and refs[0][0] != refs[1][0]  # one key per layout
    assert len(program.named_data) == 2
    got = load(program).method("forward")(x.numpy())
    with torch.no_grad():
        for g, w in zip(got, model(x)):
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-5, atol=1e-5)


def _retype(plan, key, dtype=None, dims=None):
    t = next(t for t in plan["tensors"] if "named" in t and t["named"][0] == key)
    if dtype is not None:
        t["dtype"] = dtype
    if dims is not None:
        t["dims"], t["strides"] = dims, [int(np.prod(dims[k + 1:])) for k in range(len(dims))]


@pytest.mark.parametrize("change, found", [
    (dict(dtype=3), r"int32\[\d+,\d+\]"),  # the bytes of a float32 weight read as int32
    (dict(dims=None), r"float32\[\d+,\d+\]"),  # the same bytes as another shape
])
def test_a_key_read_with_another_dtype_or_shape_than_its_first_reader_is_refused(change, found):
    """Delegate 1's blob altered to read a weight delegate 0 also reads as another dtype or
    shape of the same byte size: refused at load, naming both readers (only the byte size
    was compared before)."""
    program, _ = _two_methods(_Mlp().eval())
    plans = _blob_plans(program)
    key, _ = _first_named(plans[1])["named"]
    first = next(t for t in plans[0]["tensors"] if "named" in t and t["named"][0] == key)
    if "dims" in change:
        change = dict(dims=list(reversed(first["dims"])))
    data = bytes(program.segments[program.delegates[1].segment].data)
    hostile = _with_blob(program, 1, _reseal(data, lambda p: _retype(p, key, **change)))
    with pytest.raises(BackendError, match=(
            rf"delegates\[1\] .*named data '{key[:20]}.* delegates\[1\] \('cpu'\) \(cpu blob "
            rf"tensors\[\d+\]\) reads it as {found}, delegates\[0\] \('cpu'\) \(cpu blob "
            rf"tensors\[\d+\]\) as float32\[.*one dtype and shape per key.*re-export")):
        load(hostile)


def test_named_data_stores_a_key_per_layout_and_export_refuses_two_layouts_for_one_key():
    from opforge.backends.named_data import NamedDataStore, check_layouts, layout
    from opforge.errors import ExportError

    store = NamedDataStore()
    data = bytes(range(256)) * 16
    a, b = store.add(data, layout("float32", (32, 32))), store.add(data, layout("int32", (1024,)))
    assert a != b and store.add(data, "float32[32,32]") == a and len(store.entries) == 2
    assert store.add(data) not in (a, b)  # no layout: the bytes' own hash, as before
    check_layouts([("delegate 0", {a: "float32[32,32]"}), ("delegate 1", {a: "float32[32,32]"})])
    with pytest.raises(ExportError, match=r"named data 'sha256:.* delegate 1 stores it as "
                       r"int32\[1024\], delegate 0 as float32\[32,32\]"):
        check_layouts([("delegate 0", {a: "float32[32,32]"}), ("delegate 1", {a: "int32[1024]"})])
