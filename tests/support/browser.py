"""Debian's Chromium, headless, as the timeline page's tests open a page (``scripts/test`` installs it).

``browse`` loads a file with ``--dump-dom`` and reads the console from
``--enable-logging=stderr``: every ``CONSOLE`` line, whatever its level (that
logging names none), so a page without script must have none at all.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/test installs Debian's)")
CONSOLE = re.compile(r":CONSOLE[:(]\d*\)?\] (.*)")


class Rects(HTMLParser):
    """The rects of a DOM, by class."""

    def __init__(self, dom: str = ""):
        super().__init__()
        self.rects: list[dict] = []
        self.feed(dom)

    def handle_starttag(self, tag, attrs):
        if tag == "rect":
            self.rects.append(dict(attrs))

    def with_class(self, cls: str) -> list[dict]:
        return [r for r in self.rects if cls in (r.get("class") or "").split()]


def browse(page, profile) -> tuple[str, list[str]]:
    """(the DOM Chromium built, its console lines) of a page opened from a file; ``profile``: a fresh
    directory for Chromium's user data."""
    proc = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",  # root in CI; the page is our own file
            "--disable-gpu",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout, [m.group(1) for m in map(CONSOLE.search, proc.stderr.splitlines()) if m]
