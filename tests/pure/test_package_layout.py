"""No source package is named like a build-output folder: tools that skip such folders
(code browsers, coverage and lint configurations, search indexes) would skip the code in
it, as they skipped the native-kernel stage while it lived in ``opforge/build/``."""

from pathlib import Path

import opforge

OUTPUT_LIKE = {"build", "builds", "dist", "out", "output", "target", "bin", "obj", "tmp",
               "cache", ".cache", "_build"}


def test_no_package_is_named_like_build_output():
    root = Path(opforge.__file__).parent
    packages = [p.parent for p in root.rglob("__init__.py")]
    assert len(packages) > 5  # the walk found the packages
    offending = [str(p.relative_to(root.parent)) for p in packages
                 if any(part.lower() in OUTPUT_LIKE for part in p.relative_to(root.parent).parts)]
    assert offending == []


def test_the_native_kernel_stage_is_opforge_native():
    import opforge.native as native

    assert Path(native.__file__).parent.name == "native"
    assert (Path(native.__file__).parent / "include" / "opforge" / "kernel_abi.h").is_file()
