"""`@opforge.op` modules through `opforge build` and `opforge check`, found from the current
directory with no PYTHONPATH, and `build --json` (issue 16, items 3, 6 and 7).

Runs the installed console script in a temp directory holding the user's module and
kernel: the console script's bin directory is sys.path[0], so before the one lookup rule
`check` could not import the module its MANIFEST (or a `python:` reference) named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

OPS = textwrap.dedent('''
    import opforge
    from opforge.manifest import KernelBinding

    @opforge.op("pyops_cli::twice(Tensor x) -> Tensor",
                kernels=[KernelBinding("custom::twice_out")])
    def twice(x):
        return x * 2
''')

KERNEL = textwrap.dedent('''
    #include "opforge/kernel.h"

    namespace custom {
    namespace native {

    opforge::Tensor& twice_out(opforge::KernelContext& ctx, const opforge::Tensor& x,
                               opforge::Tensor& out) {
      if (x.scalar_type() != opforge::ScalarType::Float || !x.is_contiguous() ||
          !out.is_contiguous()) {
        ctx.fail("pyops_cli::twice.out: unsupported dtype or layout");
        return out;
      }
      const float* src = x.const_data_ptr<float>();
      float* dst = out.mutable_data_ptr<float>();
      for (int64_t i = 0; i < x.numel(); ++i) dst[i] = src[i] * FACTOR;
      return out;
    }

    }  // namespace native
    }  // namespace custom
''')


def run_cli(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "opforge"
    if not script.exists():
        pytest.skip("the opforge console script is not installed")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OPFORGE_CACHE_DIR"] = str(cache)
    return subprocess.run([str(script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "pyops_cli.py").write_text(OPS)
    (tmp_path / "twice.cpp").write_text(KERNEL.replace("FACTOR", "2"))
    (tmp_path / "wrong.cpp").write_text(KERNEL.replace("FACTOR", "5"))
    return tmp_path


def test_build_json_from_a_local_module_then_a_cache_hit(project, cache):
    first = run_cli(project, cache, "build", "pyops_cli", "-s", "twice.cpp", "-o", "libtwice.so",
                    "--json")
    assert first.returncode == 0, first.stderr
    data = json.loads(first.stdout)  # the whole of stdout is one JSON object
    assert data["library"] == str(project / "libtwice.so")
    assert data["ops"] == ["pyops_cli::twice.out"]
    assert data["kernels"] == [{"op": "pyops_cli::twice.out", "dtype_key": "default",
                                "cpp": "custom::native::twice_out"}]
    assert len(data["key"]) >= 16 and data["size"] == (project / "libtwice.so").stat().st_size
    again = run_cli(project, cache, "build", "pyops_cli.py", "-s", "twice.cpp", "-o",
                    "libtwice.so", "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["cached"] is True
    assert json.loads(again.stdout)["key"] == data["key"]
    assert json.loads(again.stdout)["compiled"] == []  # a cache hit compiles nothing
    if not data["cached"]:
        assert any(path.endswith("twice.cpp") for path in data["compiled"]), data["compiled"]


def test_check_a_local_module_against_its_python_reference(project, cache):
    assert run_cli(project, cache, "build", "pyops_cli", "-s", "twice.cpp", "-o",
                   "libtwice.so").returncode == 0
    assert run_cli(project, cache, "build", "pyops_cli", "-s", "wrong.cpp", "-o",
                   "libwrong.so").returncode == 0
    good = run_cli(project, cache, "check", "pyops_cli", "--kernels", "libtwice.so")
    assert good.returncode == 0, good.stdout + good.stderr
    wrong = run_cli(project, cache, "check", "pyops_cli", "--kernels", "libwrong.so")
    assert wrong.returncode != 0, wrong.stdout  # x*5 against the @opforge.op's x*2


def test_build_errors_are_named_for_build(project, cache):
    (project / "bad.yaml").write_text("- func: my_ops::f(Tensor x) -> Tensor\n  colour: red\n")
    proc = run_cli(project, cache, "build", "bad.yaml", "-s", "twice.cpp", "-o", "libbad.so")
    assert proc.returncode == 1
    assert "`opforge build`: " in proc.stderr and "`opforge manifest`" not in proc.stderr


def test_check_with_another_manifests_library_gives_cli_advice(project, cache):
    from opforge.examples.my_ops import manifest_path

    assert run_cli(project, cache, "build", "pyops_cli", "-s", "twice.cpp", "-o",
                   "libtwice.so").returncode == 0
    proc = run_cli(project, cache, "check", str(manifest_path()), "--kernels", "libtwice.so")
    assert proc.returncode == 1
    assert "`opforge check`: pyops_cli::twice — the library" in proc.stderr
    assert "pass that one as MANIFEST" in proc.stderr
    assert "register_manifest" not in proc.stderr and "manifest=" not in proc.stderr
