"""`opforge msop build`: a vendor package built, installed, found through the search path
(earlier entries win; MindSpore's variable honoured), checked against reg_info, and run."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from mindspore_support import needs_cxx
from opforge.cli import cli
from opforge.errors import BuildError, ManifestError
from opforge.examples.mindspore_add import OP_HOST, OP_KERNEL
from opforge.mindspore import (CustomRegOp, DataType, define, find_op, packages,
                               register_vendor_ops)
from opforge.mindspore.msop import build_vendor_package
from opforge.runtime import KernelRegistry

pytestmark = needs_cxx


@pytest.fixture
def sources(tmp_path):
    shutil.copytree(OP_HOST, tmp_path / "op_host")
    shutil.copytree(OP_KERNEL, tmp_path / "op_kernel")
    return tmp_path / "op_host", tmp_path / "op_kernel"


def test_build_install_and_find_through_the_search_path(sources, cache, search_path, monkeypatch):
    host, kernel = sources
    built = build_vendor_package(host, kernel, vendor_name="acme", install=True,
                                 install_path=search_path / "opp", cache_root=cache)
    assert built.ops == ("AddCustom",)
    assert built.package == host.parent / "build_out" / "vendors" / "acme"
    installed = search_path / "opp" / "vendors" / "acme"
    assert built.installed == installed
    assert sorted(p.name for p in installed.iterdir()) == ["include", "lib", "op_info.json"]
    assert (installed / "lib" / "libacme_ops.so").is_file()
    info = json.loads((installed / "op_info.json").read_text())
    assert info["vendor"] == "acme" and info["ops"][0]["out_shape"] == "cpp"

    assert find_op("AddCustom") is None  # not on the search path yet
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(search_path / "opp"))
    op, folder = find_op("AddCustom")
    assert folder == installed
    reg = (CustomRegOp("AddCustom").input(0, "x").input(1, "y").output(0, "z")
           .dtype_format(DataType.F32_Default, DataType.F32_Default, DataType.F32_Default)
           .target("CPU").get_op_info())
    defined = define("AddCustom", reg_info=reg)
    assert defined.library == str(installed / "lib" / "libacme_ops.so")
    assert defined.dtype_rows == (("float32",) * 3,)
    registry = KernelRegistry.portable()
    assert register_vendor_ops(registry) == ["mindspore::AddCustom.out"]
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    z = np.empty_like(x)
    registry.lookup("mindspore::AddCustom.out").fn(x, x, z)
    np.testing.assert_array_equal(z, 2 * x)


def test_vendor_op_is_checked_against_reg_info(sources, cache, search_path, monkeypatch):
    host, kernel = sources
    build_vendor_package(host, kernel, install=True, install_path=search_path / "opp",
                         cache_root=cache)
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(search_path / "opp"))

    def reg(name="AddCustom", inputs=("x", "y"), row=DataType.F32_Default):
        r = CustomRegOp(name)
        for i, n in enumerate(inputs):
            r.input(i, n)
        return r.output(0, "z").dtype_format(*[row] * (len(inputs) + 1)).get_op_info()

    with pytest.raises(ManifestError, match="reg_info op name 'CustomAdd'.*valid: 'AddCustom'"):
        define("AddCustom", reg_info=reg("CustomAdd"))
    with pytest.raises(ManifestError, match="reg_info inputs .x1, x2.*has 2 inputs: x, y"):
        define("AddCustom", reg_info=reg(inputs=("x1", "x2")))
    with pytest.raises(ManifestError, match="row 0 .float16/DefaultFormat.*not supported"):
        define("AddCustom", reg_info=reg(row=DataType.F16_Default))
    with pytest.raises(ManifestError, match="no vendor package.*has an op 'SubCustom'.*"
                                            "their ops: AddCustom.*OPFORGE_CUSTOM_OPP_PATH"):
        define("SubCustom", reg_info=reg("SubCustom"))


def test_earlier_search_path_entries_win_and_mindspore_variable_counts(sources, cache,
                                                                     search_path, monkeypatch):
    host, kernel = sources
    first = build_vendor_package(host, kernel, vendor_name="first", install=True,
                                 install_path=search_path / "a", cache_root=cache).installed
    second = build_vendor_package(host, kernel, vendor_name="second", install=True,
                                  install_path=search_path / "b", cache_root=cache).installed
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", f"{search_path / 'b'}:{search_path / 'a'}")
    assert find_op("AddCustom")[1] == second
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", f"{first}:{second}")  # package folders too
    assert find_op("AddCustom")[1] == first
    assert packages()[:2] == [first, second]
    registry = KernelRegistry.portable()
    register_vendor_ops(registry)  # the op is in both: the first wins, no duplicate error
    assert str(first) in registry.lookup("mindspore::AddCustom.out").origin
    monkeypatch.delenv("OPFORGE_CUSTOM_OPP_PATH")
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(search_path / "b"))
    assert find_op("AddCustom")[1] == second


def test_cli_build_install_clean(sources, search_path, monkeypatch, tmp_path):
    host, kernel = sources
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["msop", "build", "-o", str(host), "-k", str(kernel),
                                      "--vendor_name", "cli", "-i"])
    assert result.exit_code == 0, result.output
    default = search_path / "xdg" / "opforge" / "opp" / "vendors" / "cli"
    assert (default / "op_info.json").is_file()  # the default install location
    assert (host.parent / "build_out" / "build.log").is_file()
    assert (host.parent / "build_out" / "tmp").is_dir()
    assert find_op("AddCustom")[1] == default  # the default location is on the search path
    result = CliRunner().invoke(cli, ["msop", "build", "--op_host_path", str(host),
                                      "--op_kernel_path", str(kernel), "--vendor_name", "cli",
                                      "-c"])
    assert result.exit_code == 0, result.output
    assert not (host.parent / "build_out" / "build.log").exists()
    assert not (host.parent / "build_out" / "tmp").exists()
    assert (host.parent / "build_out" / "vendors" / "cli" / "op_info.json").is_file()


def test_build_refuses_missing_pieces(sources, cache):
    host, kernel = sources
    with pytest.raises(BuildError, match="--op_host_path/-o .*not a folder"):
        build_vendor_package(host / "nope", kernel, cache_root=cache)
    with pytest.raises(BuildError, match="--vendor_name 'a/b'"):
        build_vendor_package(host, kernel, vendor_name="a/b", cache_root=cache)
    (host / "add_custom_infer.cc").unlink()
    with pytest.raises(BuildError, match="no AddCustomInferShape in op_host or op_kernel"):
        build_vendor_package(host, kernel, cache_root=cache)
    (host / "add_custom.yaml").write_text((host / "add_custom.yaml").read_text()
                                          .replace("op_name: AddCustom", "op_name: AddCustm"))
    with pytest.raises(BuildError, match="exports no function 'AddCustm'.*AddCustom"):
        build_vendor_package(host, kernel, cache_root=cache)
    (host / "add_custom.yaml").write_text("op_name: X\ninputs: [x]\noutputs: [y]\nshape: 1\n")
    with pytest.raises(ManifestError, match="unknown key.*shape"):
        build_vendor_package(host, kernel, cache_root=cache)
    (host / "add_custom.yaml").unlink()
    with pytest.raises(ManifestError, match="holds no prototype"):
        build_vendor_package(host, kernel, cache_root=cache)


@pytest.mark.parametrize("below", ["", "sub"])
def test_an_install_path_that_is_a_file_is_a_build_error(sources, cache, search_path, below):
    host, kernel = sources
    blocker = search_path / "opp-file"
    blocker.write_text("not a folder\n")
    install_path = blocker / below if below else blocker
    with pytest.raises(BuildError, match=r"--install_path .* is a file, not a folder — valid: a "
                                         r"folder \(created if missing\) — fix: pass a folder"):
        build_vendor_package(host, kernel, vendor_name="acme", install=True,
                             install_path=install_path, cache_root=cache)
    result = CliRunner().invoke(cli, ["msop", "build", "-o", str(host), "-k", str(kernel),
                                      "--install_path", str(install_path), "-i"])
    assert isinstance(result.exception, BuildError) and "is a file" in str(result.exception)


def _installed(sources, cache, search_path, monkeypatch):
    host, kernel = sources
    build_vendor_package(host, kernel, vendor_name="acme", install=True,
                         install_path=search_path / "opp", cache_root=cache)
    monkeypatch.setenv("OPFORGE_CUSTOM_OPP_PATH", str(search_path / "opp"))
    return search_path / "opp" / "vendors" / "acme"


def test_a_library_outside_its_vendor_package_is_refused(sources, cache, search_path, monkeypatch):
    package = _installed(sources, cache, search_path, monkeypatch)
    elsewhere = search_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(package / "lib" / "libacme_ops.so", elsewhere / "lib.so")
    info_path = package / "op_info.json"
    info = json.loads(info_path.read_text())
    for library in ("../../../elsewhere/lib.so", str(elsewhere / "lib.so")):
        info["ops"][0]["library"] = library
        info_path.write_text(json.dumps(info))
        with pytest.raises(ManifestError, match=r"names the library .* outside the package — "
                                                r"valid: a library inside .*acme"):
            register_vendor_ops(KernelRegistry.portable())
    # a symlink inside the package that leads out is outside too
    (package / "lib" / "libacme_ops.so").unlink()
    (package / "lib" / "libacme_ops.so").symlink_to(elsewhere / "lib.so")
    info["ops"][0]["library"] = "lib/libacme_ops.so"
    info_path.write_text(json.dumps(info))
    with pytest.raises(ManifestError, match="outside the package"):
        find_op("AddCustom")


@pytest.mark.parametrize("where", ["entry", "vendors", "package", "lib"])
def test_a_vendor_package_others_can_write_is_refused(sources, cache, search_path, monkeypatch,
                                                      where):
    package = _installed(sources, cache, search_path, monkeypatch)
    folder = {"entry": search_path / "opp", "vendors": search_path / "opp" / "vendors",
              "package": package, "lib": package / "lib"}[where]
    folder.chmod(0o1777 if where != "lib" else 0o777)
    try:
        with pytest.raises(ManifestError, match=r"is world-writable .* — fix: chmod o-w it, or "
                                                r"install the package into a folder of your own"):
            register_vendor_ops(KernelRegistry.portable())
    finally:
        folder.chmod(0o755)
    assert register_vendor_ops(KernelRegistry.portable()) == ["mindspore::AddCustom.out"]


def test_the_documented_prototype_attr_form_parses():
    """docs/mindspore.md's `attr` example for an op_host prototype, as a build reads it."""
    import re
    from pathlib import Path

    import yaml

    from opforge.mindspore.attrs import attr_values
    from opforge.mindspore.reg_info import parse_reg_info

    doc = (Path(__file__).parents[2] / "docs" / "mindspore.md").read_text()
    block = re.search(r"```yaml\n(\s*attr:\n.*?)```", doc, re.S).group(1)
    proto = {"op_name": "AddCustom", "inputs": ["x", "y"], "outputs": ["z"],
             "dtype_format": [[["float32", "ND"]] * 3], **yaml.safe_load(block)}
    info = parse_reg_info(proto, "test")
    assert attr_values(info.attrs, "test") == {"scale": ("float", 2.5), "axes": ("listInt", [0, 1])}
