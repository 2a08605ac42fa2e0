"""`opforge signature`: the declarations to implement, a stub that builds as generated, and
a kernel with the wrong return type refused at compile time. Needs a C++ compiler."""

import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from opforge.native import build_library
from opforge.cli import cli
from opforge.errors import BuildError, KernelError
from opforge.examples.my_ops import manifest_path
from opforge.manifest import parse_manifest
from opforge.runtime.native import NativeLibrary

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                reason="needs a C++ compiler")

MUL3 = """
- func: sig_ops::mul3.out(Tensor input, *, Tensor(a!) output) -> Tensor(a!)
  kernels:
    - arg_meta: null
      kernel_name: custom::mul3_out_impl
"""


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.getbasetemp() / "opforge-cache"


def test_signature_prints_every_kernel_declaration():
    result = CliRunner().invoke(cli, ["signature", str(manifest_path())])
    assert result.exit_code == 0, result.output
    assert ("opforge::Tensor& custom::native::mul3_out_impl(opforge::KernelContext& ctx, "
            "const opforge::Tensor& input, opforge::Tensor& output);") in result.output
    assert ("std::tuple<opforge::Tensor&, opforge::Tensor&> custom::native::minmax_out_impl("
            in result.output)
    assert "// my_ops::scaled_sum.out [default]" in result.output


def test_signature_filters_by_op_and_names_the_valid_ones():
    runner = CliRunner()
    only = runner.invoke(cli, ["signature", str(manifest_path()), "--op", "minmax"])
    assert only.exit_code == 0 and "minmax_out_impl" in only.output
    assert "mul3_out_impl" not in only.output
    bad = runner.invoke(cli, ["signature", str(manifest_path()), "--op", "nope"])
    assert bad.exit_code != 0
    assert "valid ops: my_ops::minmax, my_ops::mul3" in str(bad.exception)


def test_the_stub_builds_as_generated_and_each_kernel_says_not_implemented(tmp_path, cache):
    stub = tmp_path / "stub.cpp"
    result = CliRunner().invoke(cli, ["signature", str(manifest_path()), "--stub", str(stub)])
    assert result.exit_code == 0, result.output
    built = build_library(manifest_path(), [stub], tmp_path / "libstub.so", cache_root=cache)
    library = NativeLibrary(built.path)
    x = np.ones((2, 3), np.float32)
    with pytest.raises(KernelError, match="mul3_out_impl is not implemented yet"):
        library.kernel("my_ops::mul3.out")(x, np.empty_like(x))
    with pytest.raises(KernelError, match="minmax_out_impl is not implemented yet"):
        library.kernel("my_ops::minmax.out")(x, 1, np.empty(2, np.float32),
                                             np.empty(2, np.float32))


@pytest.mark.parametrize("returns, body", [("void", ""), ("int", "return 0;"),
                                           ("opforge::Tensor", "return output;")])
def test_a_kernel_with_another_return_type_does_not_build(tmp_path, cache, returns, body):
    (tmp_path / "k.cpp").write_text(f"""
#include "opforge/kernel.h"
namespace custom {{ namespace native {{
{returns} mul3_out_impl(opforge::KernelContext& ctx, const opforge::Tensor& input,
                        opforge::Tensor& output) {{ {body} }}
}}}}
""")
    with pytest.raises(BuildError) as info:
        build_library(parse_manifest(MUL3, "sig_ops.yaml"), [tmp_path / "k.cpp"],
                      tmp_path / "libsig.so", cache_root=cache)
    message = str(info.value)
    assert "k.cpp:4" in message
    assert "another return type" in message and "opforge signature" in message
