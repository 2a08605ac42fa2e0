"""What a program, a compile spec or an OpDef file may name is checked against what is
loaded: the library is opened once and loaded from that open file (a symlink flipped after
the trust check changes nothing), a trusted library in a folder anyone can write is
refused, and malformed interfaces and names are opforge errors, not ctypes or OS errors.
Needs a C++ compiler (the packages are built from C++ text)."""

import os
import shutil

import pytest
from click.testing import CliRunner

import opforge.backends.oppackage.runtime as runtime
from opforge.backends.oppackage import PackageNode, TensorSpec, parse_opdef_xml
from opforge.backends.oppackage.model import C_NAME_MAX
from opforge.backends.oppackage.runtime import TRUST_ENV, load_package, prepare
from opforge.backends.oppackage.yaml_reader import parse_manifest_packages
from opforge.cli import cli
from opforge.errors import BackendError, ManifestError

from oppackage_support import needs_compiler

pytestmark = needs_compiler

_IFACE = """
#include <cstdio>
static int32_t create(const opforge_pkg_param*, int32_t, const opforge_pkg_tensor*, const int32_t*,
                      int32_t, const opforge_pkg_tensor*, int32_t, void** impl, char*, int32_t) {
  static int x; *impl = &x; return 0; }
static int32_t execute(void*, const opforge_pkg_tensor*, int32_t, opforge_pkg_tensor*, int32_t,
                       char*, int32_t) { return 0; }
static void destroy(void*) {}
static const opforge_pkg_op kOps[] = { {"Op", create, execute, destroy} };
static const opforge_pkg_interface kI = { OPFORGE_OPPACKAGE_ABI_VERSION, "Flip", "1", "cpu",
    OPFORGE_PKG_PLATFORM, N_OPS, OPS, "" };
extern "C" __attribute__((visibility("default"))) int32_t FlipInterfaceProvider(
    uint32_t, const opforge_pkg_interface** out) { *out = &kI; return 0; }
"""


def _package(raw_package, name, marker=None, n_ops="1", ops="kOps"):
    body = _IFACE.replace("N_OPS", n_ops).replace(", OPS,", f", {ops},")
    if marker is not None:  # a constructor: runs inside dlopen, before any check can
        body += (f'__attribute__((constructor)) static void planted() {{ '
                 f'if (FILE* f = std::fopen("{marker}", "w")) std::fclose(f); }}\n')
    return raw_package(name, body)


def _node(path):
    return PackageNode("Flip", "Op", "a.b.default", "FlipInterfaceProvider", "cpu",
                       runtime.host_platform(), str(path), (), (0,), (TensorSpec("float32", (2,)),),
                       (TensorSpec("float32", (2,)),))


def test_a_symlink_flipped_after_the_trust_check_does_not_change_what_is_loaded(
        raw_package, tmp_path, monkeypatch):
    trusted, elsewhere = tmp_path / "trusted", tmp_path / "elsewhere"
    trusted.mkdir()
    elsewhere.mkdir()
    marker = tmp_path / "planted-constructor-ran"
    good = trusted / "libFlipGood.so"
    shutil.copy(_package(raw_package, "FlipGood"), good)
    evil = elsewhere / "libFlipEvil.so"
    shutil.copy(_package(raw_package, "FlipEvil", marker=marker), evil)
    link = trusted / "libFlip.so"
    link.symlink_to(good)
    monkeypatch.setenv(TRUST_ENV, str(trusted))
    checked = []
    real_check = runtime.is_trusted

    def check_then_flip(path):  # the attacker wins the race: right after the check
        checked.append(os.path.realpath(path))
        allowed = real_check(path)
        link.unlink()
        link.symlink_to(evil)
        return allowed

    monkeypatch.setattr(runtime, "is_trusted", check_then_flip)
    _, _, op = prepare(_node(link))
    op.close()
    assert checked == [str(good)]
    assert not marker.exists(), "the library the symlink pointed to after the check was loaded"
    assert op.package.path == str(good)
    assert op.package.file.load_path.startswith("/proc/self/fd/")
    monkeypatch.setattr(runtime, "is_trusted", real_check)
    with pytest.raises(BackendError, match="only when you allow it"):  # now it names evil
        prepare(_node(link))
    assert not marker.exists()


def test_a_trusted_folder_anyone_can_write_is_refused(raw_package, tmp_path, monkeypatch):
    folder = tmp_path / "shared"
    folder.mkdir()
    lib = folder / "libFlip.so"
    shutil.copy(_package(raw_package, "FlipShared"), lib)
    monkeypatch.setenv(TRUST_ENV, str(folder))
    for mode in (0o777, 0o1777):  # the sticky bit does not help: anyone can add a library
        folder.chmod(mode)
        with pytest.raises(BackendError, match=r"is trusted, but .*shared is world-writable .* "
                                               r"— fix: chmod o-w"):
            prepare(_node(lib))
    folder.chmod(0o755)
    lib.chmod(0o777)
    with pytest.raises(BackendError, match=r"libFlip.so is world-writable"):
        prepare(_node(lib))
    lib.chmod(0o755)
    _, _, op = prepare(_node(lib))
    op.close()


def test_an_interface_with_a_null_op_table_is_a_backend_error(raw_package):
    lib = _package(raw_package, "FlipNull", n_ops="3", ops="nullptr")
    with pytest.raises(BackendError, match="reports 3 ops and a NULL op table — valid: an ops "
                                           "pointer to n_ops opforge_pkg_op entries — fix: rebuild"):
        load_package(lib, package_name="Flip")


def test_a_directory_or_fifo_as_the_library_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo.so")
    for path in (tmp_path, tmp_path / "fifo.so"):
        with pytest.raises(BackendError, match="cannot be opened|not a regular file"):
            load_package(path, package_name="Flip")


_XML = """<OpDefCollection PackageName="{package}" Domain="d" Version="1.0"><OpDefList><OpDef>
<Name>{op}</Name>
<Input><Name>x</Name><Mandatory>true</Mandatory><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Input>
<Output><Name>y</Name><Mandatory>true</Mandatory><Datatype>QNN_DATATYPE_FLOAT_32</Datatype></Output>
</OpDef></OpDefList></OpDefCollection>"""


@pytest.mark.parametrize("package, op", [("P", "A" * (10 << 20)), ("P" * (10 << 20), "Op"),
                                         ("P", "A" * (C_NAME_MAX + 1))])
def test_names_too_long_for_a_file_are_refused_where_they_are_read(tmp_path, package, op):
    with pytest.raises(ManifestError, match=f"is not a C identifier of at most {C_NAME_MAX} "
                                            "characters") as e:
        parse_opdef_xml(_XML.format(package=package, op=op), "big.xml")
    assert len(str(e.value)) < 2000  # the name is quoted cut, not whole
    (tmp_path / "big.xml").write_text(_XML.format(package=package, op=op))
    result = CliRunner().invoke(cli, ["oppackage", "new", str(tmp_path / "big.xml"), "-o",
                                      str(tmp_path / "out")])
    assert isinstance(result.exception, ManifestError), result.exception
    yaml = (f"- op_package: {package}\n  ops:\n    - name: {op}\n      inputs: [{{name: x, "
            "datatypes: [QNN_DATATYPE_FLOAT_32]}]\n      outputs: [{name: y, datatypes: "
            "[QNN_DATATYPE_FLOAT_32]}]\n")
    with pytest.raises(ManifestError, match=f"at most {C_NAME_MAX} characters"):
        parse_manifest_packages(yaml, "m.yaml")
    assert C_NAME_MAX == 128  # the documented limit


def test_a_dependency_beside_the_package_through_origin_is_explained(tmp_path):
    cxx = shutil.which("c++") or shutil.which("g++")
    (tmp_path / "dep.cpp").write_text('extern "C" int dep() { return 7; }\n')
    (tmp_path / "pkg.cpp").write_text('extern "C" int dep(); extern "C" int use() { return dep(); }\n')
    import subprocess

    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(tmp_path / "libdep.so"),
                    str(tmp_path / "dep.cpp")], check=True)
    subprocess.run([cxx, "-shared", "-fPIC", "-o", str(tmp_path / "libPkg.so"),
                    str(tmp_path / "pkg.cpp"), f"-L{tmp_path}", "-ldep", "-Wl,-rpath,$ORIGIN"],
                   check=True)
    with pytest.raises(BackendError, match=r"a library it depends on was not found \(libdep.so: "
                                           r".* an rpath of \$ORIGIN does not point beside"):
        load_package(tmp_path / "libPkg.so", package_name="Pkg")
