"""A delegate's weights are resident once, not twice: the engine copies each constant out of
the program file's read-only mapping at init and gives the mapping's pages back
(``engine._FilePages``). Measured on the file's own mapping in ``/proc/self/smaps`` (the
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

_CHILD = textwrap.dedent("""
    import sys, numpy as np
    from opforge.runtime import load
    path, x = sys.argv[1], np.load(sys.argv[2])

    def mapped_kib():
        # the Rss of every mapping of the program file, in KiB
        total, inside = 0, False
        for line in open("/proc/self/smaps"):
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(path)
            elif inside and first == "Rss:":
                total += int(line.split()[1])
        return total

    program = load(path)
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


def test_the_file_s_pages_of_a_delegate_s_weights_are_given_back(tmp_path):
    model, inputs = _model()
    program = export(model, inputs, backends=["cpu"])
    path = tmp_path / "mlp.opf"
    save(program, path)
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    weights_kib = sum(p.numel() for p in model.parameters()) * 4 // 1024  # 6.3 MiB
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path), str(tmp_path / "x.npy"),
                           str(tmp_path / "y.npy")], capture_output=True, text=True,
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
