"""The native runtime's persistent CMake trees: one per variant and source folder. CMake
refuses to configure a tree that another source folder configured ("does not match the
source ... used to generate cache"), which broke a clone's first cross build on a machine
whose build cache a checkout elsewhere had filled."""

from __future__ import annotations

from pathlib import Path

from opforge.native_runtime.build import source_dir, work_area_name


def test_each_checkout_and_variant_gets_its_own_tree(tmp_path):
    here = work_area_name("release")
    assert here == work_area_name("release", source_dir())  # stable for one checkout
    assert here.startswith("native-runtime-release-")
    clone = tmp_path / "clone" / "opforge" / "native_runtime"
    clone.mkdir(parents=True)
    assert work_area_name("release", clone) != here
    names = {work_area_name(v, s) for v in ("release", "asan", "aarch64-linux-gnu")
             for s in (source_dir(), clone)}
    assert len(names) == 6
    # a link to the same folder is the same checkout
    link = tmp_path / "link"
    link.symlink_to(clone)
    assert work_area_name("asan", Path(link)) == work_area_name("asan", clone)
