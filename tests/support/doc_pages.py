"""The repository's Markdown pages as a test reads them: where they are, their headings' anchors."""

from __future__ import annotations

import re

from tests.support.paths import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "k8s" / "README.md"]


def heading_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to '-'."""
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-"))
    return anchors

