"""The repository's docs stand alone: nothing points outside the checkout (issue 16, item 9),
and the README points at the architecture page."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_doc_points_outside_the_repository():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        assert "../shared" not in text and "DESIGN.md" not in text, path.name


def test_readme_points_at_the_architecture_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/architecture.md" in readme
    assert (ROOT / "docs" / "architecture.md").is_file()


def test_relative_links_between_docs_resolve():
    for path in sorted((ROOT / "docs").glob("*.md")):
        for target in re.findall(r"\]\(([^)#:]+\.md)\)", path.read_text(encoding="utf-8")):
            assert (path.parent / target).is_file(), f"{path.name} -> {target}"
