"""The cpu engine is built when opforge is installed and loaded from the installation: a
deploy machine runs a cpu program with no compiler on PATH and an empty build cache. An
installed engine built from other sources (an editable checkout edited since `pip install
-e .`) is not used silently, and one of another ABI is refused. Needs torch (to export)
and oneDNN; the fallback and setup.py tests need a C++ compiler."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import opforge.backends.cpu.engine as engine
from opforge.backends.cpu import engine_build, fastcall
from opforge.errors import BackendError
from opforge.export import export
from opforge.program import save

pytestmark = pytest.mark.skipif(engine.onednn_prefix() is None, reason="needs oneDNN")
needs_compiler = pytest.mark.skipif(not any(shutil.which(c) for c in ("c++", "g++", "clang++")),
                                    reason="needs a C++ compiler")
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path | None:
    """The folder holding the engine for these sources: the installation's, else one
    built here by engine_build.build (the function setup.py runs), standing in for it."""
    if engine.installed_library() is not None:
        return None  # the real installation: no override
    if not any(shutil.which(c) for c in ("c++", "g++", "clang++")):
        pytest.skip("no installed engine for these sources, and no compiler to build one")
    folder = tmp_path_factory.mktemp("site") / "_engine"
    engine_build.build(folder)
    if fastcall.problem() is None:  # and the call extension beside it, as setup.py does
        fastcall.build(folder, np.get_include(), np.__version__)
    return folder


def _no_compiler_env(tmp_path: Path) -> dict:
    bin_dir = tmp_path / "bin"  # PATH holds nothing but an empty folder
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("CXX", "CC", "CMAKE", "PATH")}
    env.update(PATH=str(bin_dir), OPFORGE_CACHE_DIR=str(tmp_path / "empty-cache"),
               PYTHONPATH=str(REPO))
    return env


RUN = """
import sys
from pathlib import Path
import numpy as np
import opforge.backends.cpu.engine as engine
if {folder!r}:
    engine.INSTALL_DIR = Path({folder!r})
from opforge.runtime import load
x = np.load({x!r})
out = load({program!r}).method("forward")(x)[0]
np.save({out!r}, out)
print(" ".join(m for m in HEAVY if m in sys.modules))
from opforge.backends.cpu import fastcall
print(getattr(fastcall.module(), "__file__", fastcall.problem()))
print(engine.library()._name)
"""
# What a deploy process must not import to load and run a cpu program: OpenSSL (hashlib),
# package metadata (email, zipfile, socket) and the compiler toolchain are resident memory
# (~3.4, ~2 and ~5 MB) spent on nothing but the check of which engine to load.
HEAVY = ("_hashlib", "importlib.metadata", "opforge.native.toolchain", "cmake")


def test_a_cpu_program_runs_with_no_compiler_and_an_empty_cache(installed, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 36, 4)).eval()
    x = torch.randn(2, 3, 6, 6)
    program = export(model, (x,), backends=["cpu"])
    assert program.delegates
    save(program, tmp_path / "m.opf")
    np.save(tmp_path / "x.npy", x.numpy())
    env = _no_compiler_env(tmp_path)
    assert not any(shutil.which(c, path=env["PATH"]) for c in ("gcc", "g++", "cc", "c++", "cmake"))
    code = f"HEAVY = {HEAVY!r}\n" + RUN.format(folder=str(installed or ""), x=str(tmp_path / "x.npy"),
                      program=str(tmp_path / "m.opf"), out=str(tmp_path / "y.npy"))
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    *_, heavy, called, loaded = done.stdout.splitlines()
    assert heavy == "", f"a deploy process imported {heavy}"
    if fastcall.problem() is None:  # the installed call extension, not one compiled now
        assert Path(called).parent == (installed or engine.INSTALL_DIR), called
    assert Path(loaded).name == engine_build.installed_name()
    assert Path(loaded).parent == (installed or engine.INSTALL_DIR)
    cache = tmp_path / "empty-cache"
    assert not cache.exists() or not any(cache.rglob("*.so")), "something was compiled"
    with torch.no_grad():
        np.testing.assert_allclose(np.load(tmp_path / "y.npy"), model(x).numpy(), rtol=1e-4,
                                   atol=1e-5)


@pytest.fixture
def fresh_engine(monkeypatch, tmp_path):
    """library() as in a new process, with its installation in ``tmp_path/_engine``."""
    monkeypatch.setattr(engine, "_lib", None)
    monkeypatch.setattr(engine, "_warned_stale", False)
    folder = tmp_path / "_engine"
    folder.mkdir()
    monkeypatch.setattr(engine, "INSTALL_DIR", folder)
    return folder


@needs_compiler
def test_an_engine_installed_from_other_sources_is_not_used_silently(fresh_engine):
    stale = fresh_engine / f"{engine_build.ENGINE_NAME}.0123456789abcdef.so"
    stale.write_bytes(b"built from yesterday's engine.cpp")
    with pytest.warns(RuntimeWarning, match=r"the installed engine .*0123456789abcdef.so was "
                                            r"built from other sources .* it is not used.* "
                                            r"fix: pip install -e \. again"):
        lib = engine.library()
    assert Path(lib._name).parent != fresh_engine  # the development build, from the cache
    assert lib.ofc_abi_version() == engine.ABI_VERSION


@needs_compiler
def test_an_installed_engine_of_another_abi_is_refused(fresh_engine, tmp_path):
    source = tmp_path / "old.cpp"
    source.write_text('extern "C" int ofc_abi_version() { return 99; }\n')
    target = fresh_engine / engine_build.installed_name()
    subprocess.run([shutil.which("c++") or shutil.which("g++"), "-shared", "-fPIC", "-o",
                    str(target), str(source)], check=True)
    assert engine.missing() is None
    with pytest.raises(BackendError, match=r"engine .*_engine/libopforge_cpu\.[0-9a-f]{16}\.so has "
                                           r"ABI 99, expected \d+ — fix: reinstall opforge"):
        engine.library()


def test_the_installed_name_follows_every_source_and_header(tmp_path):
    cpu = tmp_path / "opforge" / "backends" / "cpu"
    shutil.copytree(Path(engine_build.__file__).parent / "native", cpu / "native")
    shutil.copytree(Path(engine_build.__file__).parent / "include", cpu / "include")
    shutil.copytree(REPO / "opforge" / "native" / "include", tmp_path / "opforge" / "native" / "include")
    before = engine_build.source_hash(cpu)
    assert before == engine_build.source_hash()  # the same files give the same name
    header = next((tmp_path / "opforge" / "native" / "include").rglob("*.h"))
    header.write_text(header.read_text() + "\n// edited\n")
    engine_build._hash_cache.clear()
    assert engine_build.source_hash(cpu) != before


@needs_compiler
def test_setup_py_builds_the_engine_into_the_package(tmp_path):
    """`build_ext` (what pip runs for a wheel, and in place for `pip install -e .`)."""
    done = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--build-lib",
                           str(tmp_path / "lib"), "--build-temp", str(tmp_path / "tmp")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    built = tmp_path / "lib" / "opforge" / "backends" / "cpu" / "_engine" / engine_build.installed_name()
    assert built.is_file(), done.stderr
    readelf = shutil.which("readelf")
    if readelf:  # finds libdnnl.so.3 through the wheel's lib folder of a standard layout
        dynamic = subprocess.run([readelf, "-d", str(built)], capture_output=True, text=True).stdout
        assert "libdnnl.so.3" in dynamic and "$ORIGIN/../../../../../.." in dynamic


def _setup_py_build_ext():
    """setup.py's build_ext command (BuildEngine), without running setup()."""
    import runpy

    import setuptools

    captured: dict = {}
    real = setuptools.setup
    setuptools.setup = lambda **kw: captured.update(kw)
    try:
        runpy.run_path(str(REPO / "setup.py"), run_name="setup_py_under_test")
    finally:
        setuptools.setup = real
    return captured["cmdclass"]["build_ext"](setuptools.Distribution())


def test_setup_py_installs_in_place_atomically(tmp_path, monkeypatch):
    """`pip install -e .` copies the built engine (and the call extension and file guard)
    into the checkout's _engine/, where another engineer's test processes load it at any
    time. setuptools' copy unlinked the installed file and rewrote it in pieces: a copy
    cut short (here the disk full after 64 KiB) left a truncated library under the name
    `library()` loads, and a process loading one that short dies of SIGBUS. The installed
    file must be the old one, whole, until the new one is whole."""
    import builtins

    command = _setup_py_build_ext()
    src, dst = tmp_path / "build" / "libopforge_cpu.x.so", tmp_path / "_engine" / "libopforge_cpu.x.so"
    src.parent.mkdir()
    dst.parent.mkdir()
    old, new = os.urandom(200_000), os.urandom(300_000)
    dst.write_bytes(old)
    src.write_bytes(new)
    src.chmod(0o755)
    real_open = builtins.open

    class DiskFull:  # a file whose writes stop after 64 KiB
        def __init__(self, f):
            self.f, self.left = f, 1 << 16

        def write(self, data):
            if len(data) > self.left:
                self.f.write(data[:self.left])
                self.left = 0
                raise OSError(28, "No space left on device")
            self.left -= len(data)
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def opened(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        writes_dst_folder = "w" in mode and Path(os.fsdecode(file)).parent == dst.parent
        return DiskFull(f) if writes_dst_folder else f

    monkeypatch.setattr(builtins, "open", opened)
    with pytest.raises(Exception):
        command.copy_file(str(src), str(dst))
    monkeypatch.undo()
    assert dst.read_bytes() == old, "a failed in-place install left a partial engine behind"
    assert sorted(p.name for p in dst.parent.iterdir()) == [dst.name]  # no temporary file left
    command.copy_file(str(src), str(dst))
    assert dst.read_bytes() == new and os.access(dst, os.X_OK)


@needs_compiler
def test_a_source_saved_during_the_install_build_is_not_installed_under_the_old_name(tmp_path):
    """engine_build.build names the engine by the hash of its sources, taken before the
    compiler reads them: a source saved mid-compile (another engineer's edit) installed a
    library of the new sources under the old sources' name, which `library()` of a checkout
    with the old sources then loads as theirs. Here the compiler saves the edit itself, on
    its first compile: what is installed is named for the sources it was compiled from."""
    import ctypes
    import stat

    cpu = tmp_path / "opforge" / "backends" / "cpu"
    (cpu / "native").mkdir(parents=True)
    source = cpu / "native" / "value.cpp"
    source.write_text('extern "C" int value() { return 1; }\n')
    first_name = engine_build.installed_name(cpu)
    engine_build._hash_cache.clear()
    compiler = shutil.which("g++") or shutil.which("c++")
    marker = tmp_path / "edited"
    wrapper = tmp_path / "cxx-editing"
    wrapper.write_text(f"""#!/bin/sh
if [ ! -e {marker} ]; then
  touch {marker}
  printf 'extern "C" int value() {{ return 2; }}\\n' > {source}
fi
exec {compiler} "$@"
""")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    built = engine_build.build(tmp_path / "out", cpu_dir=cpu, cxx=str(wrapper))
    engine_build._hash_cache.clear()
    assert built.name == engine_build.installed_name(cpu) != first_name
    assert not (tmp_path / "out" / first_name).exists(), "the edited sources' engine has the old name"
    assert ctypes.CDLL(str(built)).value() == 2
    engine_build._hash_cache.clear()
