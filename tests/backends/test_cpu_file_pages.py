"""A delegate's weights are resident once, not twice: the engine copies each constant out of
the program file's read-only mapping at init and gives the mapping's pages back
(``file_pages.FilePages``). Measured on the file's own mapping in ``/proc/self/smaps`` (the
pages of this process that map it), so nothing else in the process moves the number; and
the values stay eager's, including after the pages are read again.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from torch import nn

from opforge.backends.cpu import engine as cpu_engine
from opforge.export import export
from opforge.program import from_bytes, save
from opforge.runtime import load

pytestmark = pytest.mark.skipif(cpu_engine.missing() is not None or not sys.platform.startswith("linux"),
                                reason="cpu backend missing, or no /proc/self/smaps")

# child code: the Rss of every mapping of the program file at `path`, in KiB
_MAPPED_KIB = """
def mapped_kib():
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            inside = line.rstrip().endswith(path)
        elif inside and first == "Rss:":
            total += int(line.split()[1])
    return total
"""

_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from opforge.runtime import load
    path, x = sys.argv[1], np.load(sys.argv[2])
""") + _MAPPED_KIB + textwrap.dedent("""
    # the C++ runtime maps the file itself and gives the pages back in its cpu backend
    program = load(path) if sys.argv[4] == "python" else load(path, executor="native")
    forward = program.method("forward")
    y = forward(x)[0]
    print("mapped", mapped_kib())
    np.save(sys.argv[3], y)
""")


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.Tanh(),
                          nn.Linear(1024, 512)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.7).add_(0.01)  # away from the default initialisation
    return model, (torch.randn(4, 512, generator=torch.Generator().manual_seed(1)),)


@pytest.mark.parametrize("executor", ["python", "native"])
def test_the_file_s_pages_of_a_delegate_s_weights_are_given_back(tmp_path, executor):
    model, inputs = _model()
    program = export(model, inputs, backends=["cpu"])
    path = tmp_path / "mlp.opf"
    save(program, path)
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    weights_kib = sum(p.numel() for p in model.parameters()) * 4 // 1024  # 6.3 MiB
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy"), executor], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    mapped = int(proc.stdout.split("mapped")[1].split()[0])
    # the header, the plan and a page at each constant's ends stay; the weights do not
    assert mapped < weights_kib / 8, (mapped, weights_kib)
    with torch.no_grad():
        want = model.double()(inputs[0].double()).numpy()
    # float32 sums of 512-1024 products: rtol 2e-5 is ~ 200 ulp, far below a wrong weight
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=2e-5, atol=2e-5)


def test_pages_read_again_and_programs_in_memory_are_unchanged(tmp_path):
    model, inputs = _model()
    program = export(model, inputs, backends=["cpu"])
    path = tmp_path / "mlp.opf"
    save(program, path)
    with torch.no_grad():
        want = model(*inputs).numpy()
    mapped = load(path)  # its pages given back: a second delegate reads them again
    again = load(path)
    in_memory = load(from_bytes(path.read_bytes()))  # bytes, not a mapping: left alone
    for loaded in (mapped, again, in_memory):
        got = loaded.method("forward")(inputs[0].numpy())[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    blob = mapped.program.segments[mapped.program.delegates[0].segment].data
    assert bytes(blob) == bytes(program.segments[program.delegates[0].segment].data)


_TABLE_CHILD = textwrap.dedent("""
    import resource, sys, numpy as np
    from opforge.runtime import load

    def faults(call, x):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        call(x)
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    forward = load(sys.argv[1]).method("forward")
    start, end = np.arange(5, dtype=np.int64), np.arange(8185, 8192, dtype=np.int64)
    forward(start)                     # the table's first rows read: their pages mapped
    forward(end)                       # another length: an engine built now
    print("faults", faults(forward, start), *(faults(forward, start) for _ in range(3)))
""")


def test_a_table_read_in_place_keeps_its_pages_when_another_engine_is_built(tmp_path):
    """An embedding table is read on every call, never copied: giving its pages back when a
    later engine is built (a dynamic delegate's new shape) made the next calls fault its rows
    in again (0.56 ms per token of a decoder). A call reading rows an earlier call read
    faults no more than the same call repeated."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(8192, 256), nn.Linear(256, 64)).eval()  # 8 MiB table
    rows = torch.export.Dim("rows", min=1, max=16)
    program = export(model, (torch.arange(3),), dynamic_shapes=({0: rows},), backends=["cpu"])
    path = tmp_path / "table.opf"
    save(program, path)
    proc = subprocess.run([sys.executable, "-c", _TABLE_CHILD, str(path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    after_build, *repeated = map(int, proc.stdout.split("faults")[1].split()[:4])
    assert after_build <= max(repeated), (after_build, repeated)


_GATHER_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from opforge.runtime import load
    path = sys.argv[1]
    forward = load(path).method("forward")
    forward(np.arange(16, dtype=np.int64) * 2039 % 32768)  # 16 rows spread over the table
    mapping, flags = None, {}
    for line in open("/proc/self/smaps"):  # each mapping of the file: its size and flags
        first = line.split()[0]
        if "-" in first and not first.endswith(":"):
            lo, hi = (int(v, 16) for v in first.split("-"))
            mapping = hi - lo if line.rstrip().endswith(path) else None
        elif mapping is not None and first == "VmFlags:":
            flags[mapping] = line.split()[1:]
    size, largest = max(flags.items())
    print("largest", size, " ".join(largest))
""")


def test_a_gathered_table_is_marked_read_at_random(tmp_path):
    """A few rows of an embedding table are read in place per call: the kernel maps a
    file's pages in large chunks around each fault (160 token rows made all of a 98 MB
    table resident), less with read-around and huge pages off on the table's range
    ("rr" and "nh" in its VmFlags; how much less is the kernel's: about two thirds of the
    98 MB table on the machine these were written on)."""
    torch.manual_seed(0)
    model = nn.Embedding(32768, 256).eval()  # 32 MiB: the file's largest mapping
    program = export(model, (torch.arange(16),), backends=["cpu"])
    path = tmp_path / "table.opf"
    save(program, path)
    proc = subprocess.run([sys.executable, "-c", _GATHER_CHILD, str(path)], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    size, *flags = proc.stdout.split("largest")[1].split()
    assert int(size) >= 31 << 20 and "rr" in flags and "nh" in flags, proc.stdout


_FILE_READ_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from opforge.runtime import load
    path, out = sys.argv[1], sys.argv[2]
""") + _MAPPED_KIB + textwrap.dedent("""
    forward = load(path).method("forward")
    rows = np.arange(64, dtype=np.int64) * 509 % 32768  # 64 rows spread over the table
    got = np.stack([forward(rows[i:i + 16])[0] for i in range(0, 64, 16)])
    print("mapped", mapped_kib())
    np.save(out, got)
""")


def test_an_embedding_table_is_read_from_the_file_not_through_the_mapping(tmp_path):
    """An embedding table in a program file is read with one pread per row: however the
    kernel maps the file's pages (large folios make a few rows' faults map most of a table),
    none of the table becomes this process's resident memory, and the rows are exact."""
    torch.manual_seed(0)
    model = nn.Embedding(32768, 256).eval()  # 32 MiB
    with torch.no_grad():
        model.weight.mul_(3.0).add_(0.5)
    program = export(model, (torch.arange(16),), backends=["cpu"])
    path = tmp_path / "table.opf"
    save(program, path)
    path.read_bytes()  # the whole file in the page cache, as right after an export
    proc = subprocess.run([sys.executable, "-c", _FILE_READ_CHILD, str(path),
                           str(tmp_path / "rows.npy")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    mapped = int(proc.stdout.split("mapped")[1].split()[0])
    assert mapped < 2048, proc.stdout  # KiB: the header, the plan, never the 32 MiB table
    rows = torch.arange(64) * 509 % 32768
    with torch.no_grad():
        want = model(rows).numpy().reshape(4, 16, 256)
    np.testing.assert_array_equal(np.load(tmp_path / "rows.npy"), want)  # copies: exact


def test_a_table_also_read_in_place_keeps_the_mapping(tmp_path):
    """A table some other op reads on every call (here a binary op adds it to itself) stays
    read through the mapping; the gather still gives eager's rows."""

    class TwoUses(nn.Module):
        def __init__(self):
            super().__init__()
            self.table = nn.Embedding(64, 8)

        def forward(self, ids):
            return self.table(ids), self.table.weight * 2.0

    torch.manual_seed(0)
    model = TwoUses().eval()
    ids = torch.tensor([3, 63, 0, 3])
    program = export(model, (ids,), backends=["cpu"])
    path = tmp_path / "two.opf"
    save(program, path)
    got = load(path).method("forward")(ids.numpy())
    with torch.no_grad():
        want = model(ids)
    np.testing.assert_array_equal(got[0], want[0].numpy())
    np.testing.assert_array_equal(got[1], want[1].numpy())


def test_a_file_source_is_checked_against_its_file(tmp_path):
    """``ofc_tensor_file`` (the engine's only way to read a program file) takes a borrowed
    constant's range of an open regular file, nothing else: each refusal names why."""
    import ctypes

    lib = cpu_engine.library()
    raw = np.zeros(4096 + 64, np.uint8)
    start = -raw.ctypes.data % 64
    table = raw[start:start + 4096].view(np.float32).reshape(64, 16)  # 64-byte aligned
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(8192))
    err = ctypes.create_string_buffer(1024)
    ptr = lib.ofc_new(1, 0, err, 1024)
    try:
        dims, strides = (ctypes.c_int64 * 2)(64, 16), (ctypes.c_int64 * 2)(16, 1)
        f32 = 6  # the engine's dtype code (engine.h)
        data = table.ctypes.data_as(ctypes.c_void_p)
        borrowed = lib.ofc_add_tensor(ptr, f32, 2, dims, strides, data, table.nbytes, -1, 0, 3,
                                      err, 1024)
        intermediate = lib.ofc_add_tensor(ptr, f32, 2, dims, strides, None, 0, -1, 0, 1, err, 1024)
        assert (borrowed, intermediate) == (0, 1), err.value
        with open(path, "rb") as f, open(os.devnull, "rb") as device:
            fd = f.fileno()
            cases = [
                (intermediate, fd, 0, b"not a borrowed constant"),
                (borrowed, -1, 0, b"not an open regular file"),
                (borrowed, device.fileno(), 0, b"not an open regular file"),
                (borrowed, fd, 4097, b"outside its file"),    # 4097 + 4096 > 8192
                (borrowed, fd, -8, b"outside its file"),
                (borrowed, fd, 1 << 62, b"outside its file"),  # no overflow: checked add
                (7, fd, 0, b"file source"),                    # no such tensor
            ]
            for tid, descriptor, offset, message in cases:
                assert lib.ofc_tensor_file(ptr, tid, descriptor, offset, 0, err, 1024) == 1
                assert message in err.value, (tid, descriptor, offset, err.value)
            assert lib.ofc_tensor_file(ptr, borrowed, fd, 0, 2, err, 1024) == 1
            assert b"flags" in err.value
            assert lib.ofc_tensor_file(ptr, borrowed, fd, 4096, 1, err, 1024) == 0, err.value
    finally:
        lib.ofc_destroy(ptr)


_PEAK_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from opforge.runtime import load

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key + ":"):
                return int(line.split()[1])

    small, big, x = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
    load(small).method("forward")  # the engine's libraries, resident from here on
    before = status("VmRSS")
    program = load(big)
    forward = program.method("forward")
    print("peak", status("VmHWM") - before)
    np.save(sys.argv[4], forward(x)[0])
""")


def test_a_large_weight_is_reordered_in_chunks_exactly_and_without_its_pages(tmp_path):
    """A weight of 16 MiB or more from a program file is reordered a chunk at a time, each
    chunk's file pages dropped after it: the init's peak holds the reordered copy and one
    chunk, not the copy and the whole weight; and the copy is the one-shot reorder's, bit
    for bit (the program in memory, not a file mapping, is reordered at once)."""
    torch.manual_seed(0)
    # weights of 32 and 31 MiB
    model = nn.Sequential(nn.Linear(1024, 8192), nn.ReLU(), nn.Linear(8192, 1000)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.3).add_(0.01)
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(1))
    program = export(model, (x,), backends=["cpu"])
    small = export(nn.Linear(4, 4).eval(), (torch.randn(1, 4),), backends=["cpu"])
    save(program, tmp_path / "big.opf")
    save(small, tmp_path / "small.opf")
    np.save(tmp_path / "x.npy", x.numpy())
    proc = subprocess.run([sys.executable, "-c", _PEAK_CHILD, str(tmp_path / "small.opf"),
                           str(tmp_path / "big.opf"), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    peak_kib = int(proc.stdout.split("peak")[1].split()[0])
    weights_kib = sum(p.numel() for p in model.parameters()) * 4 // 1024
    # the copies (63 MiB) and at most a chunk or two of pages; at once it was the copies
    # and the largest weight beside them (+32 MiB)
    assert peak_kib < weights_kib + 20 * 1024, (peak_kib, weights_kib)
    at_once = load(from_bytes((tmp_path / "big.opf").read_bytes())).method("forward")
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), at_once(x.numpy())[0])
    with torch.no_grad():
        want = model.double()(x.double()).numpy()
    # float32 sums of 1024-8192 products: rtol 1e-4 is far below a misplaced block's error
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), want, rtol=1e-4, atol=1e-4)


def test_a_small_table_is_read_through_the_mapping_and_a_large_one_from_the_file():
    """An embedding table up to 1 MiB (file_pages.FILE_READ_FROM) is read in place: a pread
    per row cost more than all of its pages (a decoder's 32 token rows of a 64 KB table took
    13.5 µs that way); a larger one is read from the file and its pages given back."""
    from opforge.backends.cpu import file_pages

    class Mapping:  # a file mapping's FilePages as PagePlan uses it: an open file beside it
        fd, start = 7, 0x10000

        def gathered(self, address, nbytes):
            pass

    plan = {"ops": [{"kind": "embedding", "in": [0, 1], "out": [2], "post": []}]}
    limit = file_pages.FILE_READ_FROM
    for nbytes, from_file in [(64 << 10, False), (limit, False), (limit + 4096, True)]:
        pages = file_pages.PagePlan(plan, [0, 1, 2], {0: (0x10000, nbytes, Mapping())}, {0: True})
        assert (0 in pages.file_read) == from_file, nbytes
        assert (0 in pages.in_place) != from_file, nbytes  # read in place: its pages stay
        assert [s[0] for s in pages.file_sources] == ([0] if from_file else [])


def test_a_small_table_from_a_file_gives_eagers_rows(tmp_path):
    torch.manual_seed(0)
    model = nn.Embedding(256, 64).eval()  # 64 KiB: read through the mapping
    program = export(model, (torch.arange(32),), backends=["cpu"])
    path = tmp_path / "small.opf"
    save(program, path)
    ids = np.array([255, 0, 17, 17, 128] * 6 + [1, 2], np.int64)
    got = load(path).method("forward")(ids)[0]
    with torch.no_grad():
        np.testing.assert_array_equal(got, model(torch.from_numpy(ids)).numpy())
