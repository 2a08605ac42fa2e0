"""`opforge msop build` shaped like MindSpore's custom_compiler (its options, CANN's
install layout: vendors/config.ini load_priority, bin/set_env.bash) and the search path
reading CANN's folders (load_priority order; an Ascend-only package skipped with a
warning)."""

import shutil

import pytest
from click.testing import CliRunner

from mindspore_support import needs_cxx
from opforge.cli import cli
from opforge.examples.mindspore_add import OP_HOST, OP_KERNEL
from opforge.mindspore import find_op, packages

pytestmark = needs_cxx


@pytest.fixture
def sources(tmp_path):
    shutil.copytree(OP_HOST, tmp_path / "op_host")
    shutil.copytree(OP_KERNEL, tmp_path / "op_kernel")
    return tmp_path / "op_host", tmp_path / "op_kernel"


def test_cli_takes_custom_compilers_options_and_installs_cann_layout(sources, search_path,
                                                                      monkeypatch, tmp_path):
    host, kernel = sources
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path / "cache"))
    cann = tmp_path / "Ascend"
    cann.mkdir()
    root = tmp_path / "opp"
    root.mkdir()
    for vendor in ("older", "newer"):  # --install_path alone installs, as the real tool
        result = CliRunner().invoke(cli, [
            "msop", "build", "--op_host_path", str(host), "--op_kernel_path", str(kernel),
            "--soc_version", "ascend910b;ascend310p", "--ascend_cann_package_path", str(cann),
            "--vendor_name", vendor, "--install_path", str(root), "--clear"])
        assert result.exit_code == 0, result.output
    assert "compiles no Ascend C device code" in result.output
    assert (root / "vendors" / "config.ini").read_text() == "load_priority=newer,older\n"
    set_env = (root / "vendors" / "newer" / "bin" / "set_env.bash").read_text()
    assert f"ASCEND_CUSTOM_OPP_PATH={(root / 'vendors' / 'newer').resolve()}:" in set_env
    assert not (host.parent / "build_out" / "tmp").exists()  # --clear
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", str(root))
    assert find_op("AddCustom")[1] == (root / "vendors" / "newer").resolve()  # load_priority
    (root / "vendors" / "config.ini").write_text("load_priority=older,newer\n")
    assert find_op("AddCustom")[1] == (root / "vendors" / "older").resolve()

    bad = CliRunner().invoke(cli, ["msop", "build", "-o", str(host), "-k", str(kernel),
                                   "--soc_version", "ascend999"])
    assert bad.exit_code != 0 and "ascend910b" in str(bad.exception)
    bad = CliRunner().invoke(cli, ["msop", "build", "-o", str(host), "-k", str(kernel),
                                   "--ascend_cann_package_path", str(tmp_path / "none")])
    assert bad.exit_code != 0 and "not a folder" in str(bad.exception)


def test_ascend_only_packages_on_the_search_path_are_skipped_with_a_warning(search_path,
                                                                            monkeypatch):
    from opforge.mindspore.cann import AscendOnlyPackageWarning

    ascend = search_path / "cann" / "vendors" / "ascend_only"
    (ascend / "op_impl" / "ai_core").mkdir(parents=True)
    (search_path / "cann" / "vendors" / "config.ini").write_text("load_priority=ascend_only\n")
    monkeypatch.setenv("ASCEND_CUSTOM_OPP_PATH", f"{search_path / 'cann'}:{ascend}")
    with pytest.warns(AscendOnlyPackageWarning, match="ascend_only.*Ascend devices only"):
        assert packages() == []
