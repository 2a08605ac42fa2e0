"""The package build's native steps: the cpu backend's engine, compiled when opforge is
installed (a wheel, ``pip install .``, ``pip install -e .``), so a deploy machine needs no
compiler, the extension that calls it from Python (opforge/backends/cpu/fastcall.py), and
the program-file guard (opforge/program/file_guard.py: a SIGBUS handler, so that a loaded
file truncated on disk is a ProgramError). Everything else is in pyproject.toml; why setuptools' build_ext, and how the
installed engine is found and checked, is in opforge/backends/cpu/engine_build.py.

Without oneDNN's headers or a C++ compiler the step is skipped with a message (the lean
runtime needs neither; the engine is then compiled on first use); set
OPFORGE_BUILD_ENGINE=1 to make that an error instead.
"""

import importlib.util
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
# The Extension that stands for the engine library: opforge/backends/cpu/_engine/
# libopforge_cpu.<source hash>.so (setuptools asks for its file name with the whole dotted
# name and with its last part; both get the hashed name)
ENGINE = "opforge.backends.cpu._engine.libopforge_cpu"
# The Extension that stands for the call extension: _engine/_fastcall.<hash><EXT_SUFFIX>
FASTCALL = "opforge.backends.cpu._engine._fastcall"
# The Extension that stands for the file guard: opforge/program/_guard/opforge_file_guard.<hash>.so
GUARD = "opforge.program._guard.opforge_file_guard"


def _load(name: str):
    """opforge/backends/cpu/<name>.py, loaded by path (opforge's dependencies are not
    installed in the build environment)."""
    path = HERE / "opforge" / "backends" / "cpu" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_opforge_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _engine_build():
    return _load("engine_build")


def _file_guard():
    path = HERE / "opforge" / "program" / "file_guard.py"
    spec = importlib.util.spec_from_file_location("_opforge_file_guard", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fastcall_name() -> str:
    import numpy

    return _load("fastcall").installed_name(numpy.__version__)


class BuildEngine(build_ext):
    """build_ext whose one extension is the engine, compiled by engine_build.build."""

    def get_ext_filename(self, fullname):
        if fullname in (ENGINE, ENGINE.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")[:-1], _engine_build().installed_name())
        if fullname in (FASTCALL, FASTCALL.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")[:-1], _fastcall_name())
        if fullname in (GUARD, GUARD.rpartition(".")[2]):
            return os.path.join(*fullname.split(".")[:-1], _file_guard().installed_name())
        return super().get_ext_filename(fullname)

    def build_extension(self, ext):
        if ext.name == FASTCALL:
            return self._build_fastcall(ext)
        if ext.name == GUARD:
            return self._build_guard(ext)
        if ext.name != ENGINE:
            return super().build_extension(ext)
        eb = _engine_build()
        out = Path(self.get_ext_fullpath(ext.name)).parent
        try:
            built = eb.build(out)
        except eb.EngineBuildError as e:
            if os.environ.get("OPFORGE_BUILD_ENGINE") == "1":
                raise SystemExit(f"opforge: building the cpu backend's engine failed: {e}")
            print(f"opforge: the cpu backend's engine was not built ({e}); it will be compiled "
                  "on first use, which needs a C++ compiler and onednn-devel-cpu-gomp then",
                  file=sys.stderr)
            self._skipped = True
            return
        print(f"opforge: built the cpu backend's engine {built}", file=sys.stderr)

    def _build_fastcall(self, ext):
        """The call extension; without it the runtime calls the engine through ctypes."""
        import numpy

        fc = _load("fastcall")
        out = Path(self.get_ext_fullpath(ext.name)).parent
        try:
            built = fc.build(out, numpy.get_include(), numpy.__version__)
        except fc.FastcallBuildError as e:
            print(f"opforge: the cpu backend's call extension was not built ({e}); it will be "
                  "compiled on first use where a compiler and Python's headers are present, "
                  "else the engine is called through ctypes", file=sys.stderr)
            self._skipped_fastcall = True
            return
        print(f"opforge: built the cpu backend's call extension {built}", file=sys.stderr)

    def _build_guard(self, ext):
        """The program-file guard; without it the runtime compiles it on first use, or
        runs without it (a file truncated under a call then ends the process)."""
        fg = _file_guard()
        out = Path(self.get_ext_fullpath(ext.name)).parent
        try:
            built = fg.build(out)
        except fg.GuardBuildError as e:
            print(f"opforge: the program-file guard was not built ({e}); it will be compiled "
                  "on first use where a compiler is present", file=sys.stderr)
            self._skipped_guard = True
            return
        print(f"opforge: built the program-file guard {built}", file=sys.stderr)

    def copy_file(self, infile, outfile, preserve_mode=1, preserve_times=1, link=None, level=1):
        """The in-place copy (``pip install -e .``) of a library into the checkout, where
        other processes load it at any time: atomic (engine_build.install_file), not the
        unlink-and-rewrite of setuptools' copy, whose half-written engine kills a process
        that loads it (SIGBUS)."""
        if self.dry_run:
            return outfile, 1
        _engine_build().install_file(Path(infile), Path(outfile))
        return outfile, 1

    def copy_extensions_to_source(self):
        """In place (``pip install -e .``): into the checkout's _engine/, replacing engines
        built from older sources."""
        eb = _engine_build()
        folder = HERE / "opforge" / "backends" / "cpu" / eb.INSTALL_FOLDER
        folder.mkdir(exist_ok=True)
        if not getattr(self, "_skipped", False):
            for old in folder.glob(f"{eb.ENGINE_NAME}.*.so"):
                if old.name != eb.installed_name():
                    old.unlink()
        if not getattr(self, "_skipped_fastcall", False):
            for old in folder.glob("_fastcall.*"):
                if old.name != _fastcall_name():
                    old.unlink()
        guards = HERE / "opforge" / "program" / "_guard"
        guards.mkdir(exist_ok=True)
        if not getattr(self, "_skipped_guard", False):
            for old in guards.glob("opforge_file_guard.*.so"):
                if old.name != _file_guard().installed_name():
                    old.unlink()
        super().copy_extensions_to_source()

    def get_outputs(self):
        outputs = super().get_outputs()
        if getattr(self, "_skipped", False):
            outputs = [o for o in outputs if not (Path(o).parent.name == "_engine"
                                                  and Path(o).name.startswith("libopforge_cpu"))]
        if getattr(self, "_skipped_fastcall", False):
            outputs = [o for o in outputs if not (Path(o).parent.name == "_engine"
                                                  and Path(o).name.startswith("_fastcall"))]
        if getattr(self, "_skipped_guard", False):
            outputs = [o for o in outputs if not (Path(o).parent.name == "_guard")]
        return outputs


setup(
    ext_modules=[Extension(ENGINE, optional=True, sources=sorted(
        str(p.relative_to(HERE)) for p in (HERE / "opforge/backends/cpu/native").glob("*.cpp"))),
                 Extension(FASTCALL, optional=True, sources=["opforge/backends/cpu/pycall/fastcall.cpp"]),
                 Extension(GUARD, optional=True, sources=["opforge/program/file_guard.cpp"])],
    cmdclass={"build_ext": BuildEngine},
)
