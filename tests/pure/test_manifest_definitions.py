"""load_definitions: a YAML manifest, a .py file or a module name → OpDefs (issue 16, item 3)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from opforge.errors import ManifestError
from opforge.manifest import load_definitions, load_manifest
from opforge.manifest.definitions import is_module_name

OPS = textwrap.dedent('''
    import opforge
    from opforge.manifest import KernelBinding

    @opforge.op("defs_test::twice(Tensor x) -> Tensor",
                kernels=[KernelBinding("custom::twice_out")])
    def twice(x):
        return x * 2

    @opforge.op("defs_test::thrice(Tensor x) -> Tensor")
    def thrice(x):
        return x * 3

    alias = twice          # the same op twice in the module: listed once
''')


@pytest.fixture
def ops_file(tmp_path, monkeypatch):
    path = tmp_path / "defs_test_ops.py"
    path.write_text(OPS)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield path
    sys.modules.pop("defs_test_ops", None)


def test_python_file_gives_its_ops_in_order(ops_file):
    defs = load_definitions(str(ops_file))
    assert [d.out_key for d in defs] == ["defs_test::twice.out", "defs_test::thrice.out"]
    assert defs[0].kernels[0].kernel_name == "custom::twice_out"
    assert callable(defs[0].python_impl)


def test_module_name_gives_the_same_ops(ops_file):
    assert [d.name for d in load_definitions("defs_test_ops")] == \
        ["defs_test::twice", "defs_test::thrice"]


def test_yaml_manifest_is_read_as_before():
    from opforge.examples.my_ops import manifest_path

    assert [d.out_key for d in load_definitions(manifest_path())] == \
        [d.out_key for d in load_manifest(manifest_path())]


def test_module_without_ops_is_a_clear_error(tmp_path):
    empty = tmp_path / "no_ops_here.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ManifestError, match=r"`opforge check`: .*defines no operator.*@opforge.op"):
        load_definitions(str(empty), api="opforge check")
    sys.modules.pop("no_ops_here", None)


def test_unknown_module_names_what_is_valid():
    with pytest.raises(ManifestError, match=r"no module of that name.*valid: a YAML manifest"):
        load_definitions("surely_not_a_module_xyz")


def test_missing_py_file_names_the_path(tmp_path):
    with pytest.raises(ManifestError, match=r"no such Python file"):
        load_definitions(str(tmp_path / "gone.py"))


def test_errors_name_the_calling_command(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- func: my_ops::f(Tensor x) -> Tensor\n  colour: red\n")
    with pytest.raises(ManifestError) as info:
        load_definitions(bad, api="opforge build")
    assert str(info.value).startswith("`opforge build`: ")
    assert "opforge manifest" not in str(info.value)


def test_module_name_or_file():
    assert is_module_name("pkg.ops") and is_module_name("ops")
    assert not is_module_name("ops.yaml") and not is_module_name("dir/ops.py")
    assert not is_module_name("my-ops")
