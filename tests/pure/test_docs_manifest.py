"""docs/manifest.md documents every key the manifest parser accepts, and its YAML examples
parse (issue 16, item 4)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from opforge.manifest import DTYPE_NAMES, parse_manifest
from opforge.manifest import yaml_manifest

DOC = Path(__file__).resolve().parents[2] / "docs" / "manifest.md"
# the keys of one `kernels:` item, checked by the parser's `_kernels`
KERNEL_KEYS = {"arg_meta", "kernel_name"}


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


@pytest.mark.parametrize("key", sorted(yaml_manifest._ALL_KEYS | KERNEL_KEYS))
def test_every_accepted_key_is_documented(key):
    assert f"`{key}`" in doc_text(), f"docs/manifest.md does not mention `{key}`"


def test_the_accepted_key_set_is_what_the_parser_enforces():
    # a key outside _ALL_KEYS is refused: the documented set is the whole set
    with pytest.raises(Exception, match="unknown key 'surely_not_a_key'"):
        parse_manifest("- func: my_ops::f(Tensor x) -> Tensor\n  surely_not_a_key: 1\n")
    for key in sorted(yaml_manifest._PASSIVE_KEYS):
        parse_manifest(f"- func: my_ops::f(Tensor x) -> Tensor\n  {key}: null\n")


@pytest.mark.parametrize("name", sorted(DTYPE_NAMES))
def test_every_dtype_name_is_listed(name):
    assert f"`{name}`" in doc_text()


def test_yaml_examples_parse():
    blocks = re.findall(r"```yaml\n(.*?)```", doc_text(), re.S)
    entries = [b for b in blocks if b.lstrip().startswith("- ")]
    assert len(entries) >= 5
    for block in entries:
        assert parse_manifest(block, "docs/manifest.md"), block
