"""The docs a user's clone has: they point at nothing outside the repository, and the
README's module table names every module there is."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "k8s" / "README.md"]


def test_docs_point_only_inside_the_repository():
    for doc in DOCS:
        text = doc.read_text()
        assert "../shared" not in text, f"{doc.name} points outside the repository"
        for target in re.findall(r"\]\(([^)#]+)\)", text):  # markdown links
            if "://" not in target:
                assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


def test_the_architecture_page_has_the_sections_code_comments_cite():
    text = (REPO / "docs" / "architecture.md").read_text()
    cited = set()
    for path in [*REPO.glob("noloco_rt/**/*.py"), *REPO.glob("workers/**/*.py"), *REPO.glob("coordinator/**/*.py")]:
        cited |= {int(n) for n in re.findall(r"docs/architecture\.md §(\d)", path.read_text())}
    assert cited, "no code cites docs/architecture.md"
    for number in sorted(cited):
        assert re.search(rf"^## {number}\. ", text, re.MULTILINE), f"§{number} is cited but missing"


def test_what_is_inside_names_every_module():
    readme = (REPO / "README.md").read_text()
    table = readme[readme.index("## What is inside"):readme.index("## Tests")]
    missing = [str(path.relative_to(REPO)) for package in ("noloco_rt", "workers", "coordinator")
               for path in sorted((REPO / package).rglob("*.py"))
               if path.name != "__init__.py" and path.name not in table and f"`{path.stem}`" not in table]
    assert not missing, f"README 'What is inside' does not mention {missing}"
