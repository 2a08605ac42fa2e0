"""The documented surface of opforge.backends.oppackage, and the run-time half without torch."""

import opforge.backends.oppackage as oppackage

from oppackage_support import needs_compiler


def test_public_api():
    assert sorted(oppackage.__all__) == sorted([
        "OpPackage", "OpDefinition", "TensorDef", "parse_opdef_xml", "load_opdef_xml",
        "skeleton_ops", "generate_skeleton", "include_dir", "build_package", "check_target",
        "host_platform", "OpPackageInfo", "parse_op_package_infos", "load_op_package_infos",
        "normalize_op_name", "PackageNode", "PackageParam", "TensorSpec", "ABI_VERSION"])
    for name in oppackage.__all__:
        assert getattr(oppackage, name) is not None


def test_abi_numbers_match_the_header():
    from opforge.backends.oppackage.runtime import ABI_VERSION

    header = (oppackage.include_dir() / "opforge" / "oppackage.h").read_text()
    assert f"#define OPFORGE_OPPACKAGE_ABI_VERSION {ABI_VERSION}" in header
    assert oppackage.ABI_VERSION == ABI_VERSION
    # the package's tensor struct has the cpu engine's opforge_ext_tensor layout
    import re
    from pathlib import Path

    cpu = Path(oppackage.__file__).parents[1] / "cpu" / "include" / "opforge" / "cpu_external.h"
    if cpu.is_file():
        fields = lambda text, name: re.search(r"typedef struct %s \{(.*?)\}" % name, text, re.S).group(1)
        strip = lambda body: [line.split("/*")[0].strip() for line in body.splitlines() if line.split("/*")[0].strip()]
        assert strip(fields(header, "opforge_pkg_tensor")) == strip(fields(cpu.read_text(), "opforge_ext_tensor"))


@needs_compiler
def test_prepare_runs_without_torch(example_library, python_without_torch):
    result = python_without_torch(f"""
        import numpy as np
        from opforge.backends.oppackage.node import PackageNode, TensorSpec
        from opforge.backends.oppackage.runtime import prepare, host_platform, trust_packages
        trust_packages([{str(example_library)!r}])
        node = PackageNode("ExampleOpPackage", "ExampleCustomOp", "my_ops.mul3.default",
                           "ExampleOpPackageInterfaceProvider", "cpu", host_platform(),
                           {str(example_library)!r}, (), (0,), (TensorSpec("float32", (3,)),),
                           (TensorSpec("float32", (3,)),))
        fn, state, keep = prepare(node.to_bytes())
        out = np.zeros(3, np.float32)
        keep([np.array([1, 2, 3], np.float32)], [out])
        import sys
        assert not {{"torch", "jinja2", "defusedxml"}} & set(sys.modules)
        print(out.tolist())
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[3.0, 6.0, 9.0]"
