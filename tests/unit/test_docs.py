"""The documentation site builds: `mkdocs build --strict` over docs/ (mkdocs.yml).

A broken link between pages, a link to an anchor that no longer exists, a page
missing from the nav or a nav entry without its page is a warning, and --strict
turns it into a failed build, so the docs cannot drift apart silently.
"""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def mkdocs_build(tmp_path: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(tmp_path / "site"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_docs_build_strictly(tmp_path):
    result = mkdocs_build(tmp_path, ROOT / "mkdocs.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert (tmp_path / "site" / "kubernetes" / "index.html").is_file()


def test_a_broken_link_fails_the_build(tmp_path):
    """The check above can fail: the same config over a copy of docs/ with one bad link."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)  # pages and their images (docs/img)
    with open(docs / "ssh.md", "a") as f:
        f.write("\nSee [the lost section](failures.md#no-such-section).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text((ROOT / "mkdocs.yml").read_text().replace("docs_dir: docs", f"docs_dir: {docs}"))
    result = mkdocs_build(tmp_path, config)
    assert result.returncode != 0
    assert "no-such-section" in result.stdout + result.stderr
