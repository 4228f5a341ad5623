"""docs/index.md lists every page of the site, so none is found only through the nav.

(mkdocs --strict, tests/unit/test_docs.py, already fails on a page missing from
mkdocs.yml's nav; the front page is written by hand and was missing Hangs.)
"""

from __future__ import annotations

import re

from support.helpers import REPO

LINK_RE = re.compile(r"\]\(([\w-]+\.md)(?:#[\w-]*)?\)")


def linked_pages(text: str) -> set[str]:
    return set(LINK_RE.findall(text))


def test_docs_index_links_every_page():
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    missing = sorted(pages - linked_pages((REPO / "docs" / "index.md").read_text()))
    assert not missing, f"docs/index.md does not link {', '.join(missing)}"


def test_docs_index_link_finder_sees_anchored_links():
    # the check above can fail: a page is found only when its link is written as Markdown
    assert linked_pages("- [Hangs](hangs.md): ... [x](failures.md#when-mpilaunch-dies)") == {"hangs.md", "failures.md"}
    assert linked_pages("hangs.md in prose, not a link") == set()
