"""The docs a user's clone has: they point at nothing outside the repository, their links
land on files and headings that exist, and the architecture page's code map names every
module there is."""

from __future__ import annotations

import re

from tests.support.doc_pages import DOCS, REPO, heading_anchors


def test_docs_point_only_inside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text, f"{doc.name} points outside the repository"
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):  # markdown links
            if "://" in target:
                continue
            path = doc.parent / target if target else doc
            assert path.exists(), f"{doc.name} links to missing {target}"
            if anchor and path.suffix == ".md":
                assert anchor in heading_anchors(path.read_text()), f"{doc.name} links to missing {target}#{anchor}"


def test_heading_anchors_are_githubs():
    assert heading_anchors("## `make up` on a 2-core machine\n### Soak: 1,000 faults, every one\n") == {
        "make-up-on-a-2-core-machine", "soak-1000-faults-every-one"}


def test_the_architecture_page_has_the_sections_code_comments_cite():
    text = (REPO / "docs" / "architecture.md").read_text()
    cited = set()
    for path in [*REPO.glob("noloco_rt/**/*.py"), *REPO.glob("workers/**/*.py"), *REPO.glob("coordinator/**/*.py")]:
        cited |= {int(n) for n in re.findall(r"docs/architecture\.md §(\d)", path.read_text())}
    assert cited, "no code cites docs/architecture.md"
    for number in sorted(cited):
        assert re.search(rf"^## {number}\. ", text, re.MULTILINE), f"§{number} is cited but missing"


def test_the_code_map_names_every_module():
    page = (REPO / "docs" / "architecture.md").read_text()
    table = page[page.index("## 7. Code map"):page.index("## 8. ")]
    missing = [str(path.relative_to(REPO)) for package in ("noloco_rt", "workers", "coordinator")
               for path in sorted((REPO / package).rglob("*.py"))
               if path.name != "__init__.py" and path.name not in table and f"`{path.stem}`" not in table]
    assert not missing, f"docs/architecture.md §7 (Code map) does not mention {missing}"
