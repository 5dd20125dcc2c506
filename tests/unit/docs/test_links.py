"""The README and every page of docs/ link only to files and headings that exist (the guide is read by following its
links: a moved section must not leave one dangling)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers.launch import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(REPO).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page: Path):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(target)
        elif anchor and destination.suffix == ".md":
            headings = {slug(h) for h in re.findall(r"^#+ (.*)$", destination.read_text(), re.M)}
            if anchor not in headings:
                broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_readme_is_a_guide_and_docs_have_one_index():
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    index = (REPO / "docs/index.md").read_text()
    unlisted = [p.name for p in PAGES[1:] if p.name != "index.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs pages missing from docs/index.md: {unlisted}"
