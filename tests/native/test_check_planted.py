"""`opforge check` catches planted wrong kernels (issue 16, items 1 and 7).

The planted kernels are tests/native/planted/planted.cpp (an op each: a crash on k=5, an
abort on k=3, an inverted comparison, float32 elements written into float64 and bool
outputs, a bug only the manifest's `samples:` reach), plus variants of the example
kernels: a mul3 that multiplies by 5 (with and without a `python:` reference) and a minmax
with its comparisons inverted. Each must make `check` exit non-zero with a message naming
the sample; the correct example library must pass.

Needs a C++ compiler and torch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from opforge.native import build_library
from opforge.examples.my_ops import manifest_path

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

PLANTED = Path(__file__).with_name("planted")
EXAMPLE_KERNELS = manifest_path().parent / "kernels"

ET_YAML = textwrap.dedent("""\
    # ExecuTorch's custom_ops.yaml form: no `python:` reference
    - func: et_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
      kernels:
        - arg_meta: null
          kernel_name: custom::mul3_out_impl
""")
ET_KERNEL = textwrap.dedent("""\
    #include "opforge/kernel.h"
    namespace custom { namespace native {
    opforge::Tensor& mul3_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                                   opforge::Tensor& output) {
      if (input.scalar_type() != opforge::ScalarType::Float) {
        ctx.fail("et_ops::mul3.out: unsupported dtype %s", opforge::to_string(input.scalar_type()));
        return output;
      }
      const float* src = input.const_data_ptr<float>();
      float* dst = output.mutable_data_ptr<float>();
      opforge::for_each_index(input.sizes(), [&](const int64_t* i) {
        dst[opforge::offset_of(output, i)] = FACTOR * src[opforge::offset_of(input, i)];
      });
      return output;
    }
    }}
""")


def check(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OPFORGE_CACHE_DIR": str(cache)}
    return subprocess.run([sys.executable, "-m", "opforge", "check", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def check_json(cwd: Path, cache: Path, *args: str) -> tuple[int, dict]:
    proc = check(cwd, cache, *args, "--json")
    try:
        data = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON:\n{proc.stdout}\n{proc.stderr}") from None
    return proc.returncode, {op["op"]: op for op in data["ops"]}


@pytest.fixture(scope="module")
def planted(cache, tmp_path_factory):
    """A project directory holding planted.yaml, its references and the built library."""
    project = tmp_path_factory.mktemp("planted")
    for name in ("planted.yaml", "planted_ref.py", "planted.cpp"):
        shutil.copy(PLANTED / name, project / name)
    build_library(project / "planted.yaml", [project / "planted.cpp"],
                  project / "libplanted.so", cache_root=cache)
    return project


def _example_variant(cache, project: Path, name: str, changes: dict) -> Path:
    """The example library with some sources changed: {file: (old, new)}."""
    sources = []
    for path in sorted(EXAMPLE_KERNELS.glob("*.cpp")):
        if path.name in changes:
            old, new = changes[path.name]
            text = path.read_text()
            assert old in text, f"{path.name} changed: update the planted replacement"
            (project / path.name).write_text(text.replace(old, new))
            path = project / path.name
        sources.append(path)
    return build_library(manifest_path(), sources, project / name, cache_root=cache).path


def test_crash_on_one_int_value_is_reported_and_check_goes_on(planted, cache):
    code, ops = check_json(planted, cache, "planted.yaml", "--kernels", "libplanted.so",
                           "--op", "planted::add_k", "--op", "planted::sub_k")
    assert code == 1
    add_k, sub_k = ops["planted::add_k.out"], ops["planted::sub_k.out"]
    assert add_k["crashed"] > 0 and add_k["passed"] > 0 and "crash" in add_k["checks_failed"]
    first = add_k["messages"][0]
    assert "kernel planted::native::add_k_out (libplanted.so) crashed on sample" in first
    assert "(SIGSEGV)" in first and "k=5" in first
    # the abort on k=3 is the next op's: check went on after the first op's crashes
    assert sub_k["crashed"] > 0 and "(SIGABRT)" in sub_k["messages"][0]
    assert "k=3" in sub_k["messages"][0]


def test_inverted_comparison_gives_the_whole_mismatch(planted, cache):
    proc = check(planted, cache, "planted.yaml", "--kernels", "libplanted.so",
                 "--op", "planted::above")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "FAIL native" in out and "kernel vs reference, output 0:" in out
    line = next(t for t in out.splitlines() if "kernel vs reference" in t and "[5]" not in t)
    assert "element(s) differ; max abs error" in line and "first at index" in line
    assert "expected" in line and "got" in line and len(line) > 120  # not cut
    assert "sample 6 (generated, contiguous): x=float32[5] [" in out  # values to reproduce


def test_wrong_element_size_written(planted, cache):
    code, ops = check_json(planted, cache, "planted.yaml", "--kernels", "libplanted.so",
                           "--op", "planted::halve", "--op", "planted::positive")
    assert code == 1
    halve, positive = ops["planted::halve.out"], ops["planted::positive.out"]
    # float32 elements into a float64 output: half of it unwritten, wrong values
    assert {"memory", "native"} <= set(halve["checks_failed"])
    assert any("differ between two runs" in m and "float64" in m for m in halve["messages"])
    # int32 elements into a bool output: past its end
    assert "memory" in positive["checks_failed"]
    assert any("the kernel wrote after the end of the output bool[5]" in m
               for m in positive["messages"])


def test_a_bug_only_the_manifest_samples_reach(planted, cache):
    from dataclasses import replace

    import torch

    from opforge.check import check_op
    from opforge.manifest import load_manifest
    from opforge.runtime.native import NativeLibrary

    code, ops = check_json(planted, cache, "planted.yaml", "--kernels", "libplanted.so",
                           "--op", "planted::mul_k")
    assert code == 1
    mul_k = ops["planted::mul_k.out"]
    assert mul_k["failed"] == 2 and "native" in mul_k["checks_failed"]
    assert all("(samples: planted_ref:mul_k_samples, user)" in m and "k=7" in m
               for m in mul_k["messages"])
    # without the samples: key the generated samples alone pass this kernel
    sys.path.insert(0, str(planted))
    try:
        opdef = next(d for d in load_manifest(planted / "planted.yaml") if d.name == "planted::mul_k")
        kernel = NativeLibrary(planted / "libplanted.so").kernel("planted::mul_k.out")
        report = check_op(replace(opdef, samples=None), kernel, eager=False)
        assert report.ok and report.failed == 0, report.messages
        hooked = check_op(replace(opdef, samples=None), kernel, eager=False,
                          samples=lambda: [((torch.ones(3), 7), {})])
        assert hooked.failed == 1 and not hooked.ok
    finally:
        sys.path.remove(str(planted))


def test_wrong_constant_and_inverted_minmax_against_python_references(cache, tmp_path):
    lib = _example_variant(cache, tmp_path, "libwrong.so", {
        "mul.cpp": ('scale(&ctx, "my_ops::mul3.out", input, output, 3)',
                    'scale(&ctx, "my_ops::mul3.out", input, output, 5)'),
        "minmax.cpp": ("v < mn) mn", "v > mn) mn")})
    code, ops = check_json(tmp_path, cache, str(manifest_path()), "--kernels", str(lib),
                           "--op", "my_ops::mul3", "--op", "my_ops::mul4", "--op",
                           "my_ops::minmax")
    assert code == 1
    assert "native" in ops["my_ops::mul3.out"]["checks_failed"]
    # 5x instead of 3x: every non-zero element is off by 2/3 of the expected value
    assert "max rel error 0.666667" in ops["my_ops::mul3.out"]["messages"][0]
    assert "native" in ops["my_ops::minmax.out"]["checks_failed"]
    assert ops["my_ops::mul4.out"]["ok"]  # the other op of the library still passes


def test_without_a_reference_check_says_so_and_exits_3(cache, tmp_path):
    (tmp_path / "et_ops.yaml").write_text(ET_YAML)
    (tmp_path / "mul5.cpp").write_text(ET_KERNEL.replace("FACTOR", "5"))
    build_library(tmp_path / "et_ops.yaml", [tmp_path / "mul5.cpp"], tmp_path / "libet.so",
                  cache_root=cache)
    proc = check(tmp_path, cache, "et_ops.yaml", "--kernels", "libet.so")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "no reference: only consistency checked (kernel vs fake shapes, eager vs lean" in text
    assert "pass (no reference)" in proc.stdout and "values were not checked" in proc.stderr
    code, ops = check_json(tmp_path, cache, "et_ops.yaml", "--kernels", "libet.so",
                           "--allow-no-reference")
    assert code == 0 and ops["et_ops::mul3.out"]["verified"] is False
    assert ops["et_ops::mul3.out"]["warnings"][0].startswith("no reference: only consistency")
    # a reference named on the command line catches the wrong constant
    wrong = check(tmp_path, cache, "et_ops.yaml", "--kernels", "libet.so", "--reference",
                  "et_ops::mul3=opforge.examples.my_ops:mul3_reference")
    assert wrong.returncode == 1 and "kernel vs reference" in wrong.stdout


def test_the_example_library_passes_with_json(full, tmp_path, cache):
    code, ops = check_json(tmp_path, cache, str(manifest_path()), "--kernels", str(full.path))
    assert code == 0, ops
    assert set(ops) == {"my_ops::mul3.out", "my_ops::mul4.out", "my_ops::minmax.out",
                        "my_ops::scaled_sum.out"}
    for op in ops.values():
        assert op["ok"] and op["verified"] and op["failed"] == op["crashed"] == 0
        assert op["samples"] == op["passed"] > 20
        assert op["reference"].startswith("python: opforge.examples.my_ops:")
    # combinations the fake refuses (dims out of range) are skipped, not failed
    assert ops["my_ops::minmax.out"]["skipped"] > 0
    assert ops["my_ops::scaled_sum.out"]["dtypes"] == ["float32", "float64"]
