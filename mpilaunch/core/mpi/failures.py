"""What mpirun's own output says about a failure: the first rank it saw fail, a daemon's error.

Every registered flavour's rules are asked, not only the detected one's: the
mpirun that printed the lines may be another than the one found here (an
in-cluster launcher runs the image's).
"""

from __future__ import annotations

import re

from .registry import FLAVOURS

_HELP_RULE = re.compile(r"^-{20,}$")
_ERRORISH = re.compile(r"\berror\b|not found|No such file|Segmentation fault|denied|cannot|unable to|failed", re.I)


def first_failed_rank(lines: list[str]) -> tuple[int, int] | None:
    """(rank, exit code) of the first rank mpirun itself says failed, or None.

    mpirun learns of every exit from its daemons in the order they happened;
    the ranks' own status lines travel as output and can come later than a
    rank mpirun ended in the teardown, or not at all when a daemon is ended
    before it forwards them.
    """
    for flavour in FLAVOURS.values():
        named = flavour.first_failed_rank(lines)
        if named is not None:
            return named
    return None


def _help_blocks(lines: list[str]) -> list[list[str]]:
    """The help texts between rules of dashes (Open MPI's show_help)."""
    blocks, current = [], None
    for line in lines:
        if _HELP_RULE.match(line.strip()):
            if current is not None:
                blocks.append(current)
                current = None
            else:
                current = []
        elif current is not None:
            current.append(line)
    return blocks


def _first_paragraphs(block: list[str]) -> str:
    """The block's first paragraph and, if the next one is an indented
    detail (``  plm_rsh_agent: /path``), that too: one line of text."""
    paras, cur = [], []
    for line in block:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            paras.append(cur)
            cur = []
    if cur:
        paras.append(cur)
    if not paras:
        return ""
    text = " ".join(paras[0])
    if len(paras) > 1 and block and any(line.startswith((" ", "\t")) and line.strip() == paras[1][0] for line in block):
        text = text.rstrip(":") + ": " + " ".join(paras[1])
    return " ".join(text.split())


def _daemon_host(line: str) -> str | None:
    return next((host for host in (f.daemon_host(line) for f in FLAVOURS.values()) if host), None)


def _proxy_error(line: str) -> tuple[str, str] | None:
    return next((found for found in (f.proxy_error(line) for f in FLAVOURS.values()) if found), None)


def launch_hint(lines: list[str]) -> str | None:
    """A flavour's hint for a launch that failed before any rank did (its mpirun's ``lines``), or None."""
    return next((hint for hint in (f.launch_hint(lines) for f in FLAVOURS.values()) if hint), None)


def daemon_error(lines: list[str]) -> str | None:
    """The first error the MPI runtime's daemons printed, as one line
    (``on HOST: <the daemon's message>``), or None.

    Used for the summary of a launch that failed before any rank did, so
    the cause (a daemon's own message) is on the line users read first
    rather than Open MPI's generic advice 30 lines later. Priority: a
    specific help text, else a stray error line (``sh: orted: not found``),
    else the generic help text.
    """
    generic = tuple(advice for f in FLAVOURS.values() for advice in f.generic_daemon_advice)
    blocks = _help_blocks(lines)
    texts = [t for t in map(_first_paragraphs, blocks) if t]
    specific = [t for t in texts if not t.startswith(generic)]
    in_block = set()
    for b in blocks:
        in_block.update(b)
    stray = [
        line.strip()
        for line in lines
        if line not in in_block
        and not _HELP_RULE.match(line.strip())
        and not _daemon_host(line)
        and _ERRORISH.search(line)
    ]
    proxy = [found for found in map(_proxy_error, stray) if found]
    if not specific and proxy:  # a proxy's own words before mpiexec's about it
        return f"on {proxy[0][0]}: {proxy[0][1]}"
    text = (specific or stray or texts or [None])[0]
    if text is None:
        return None
    host = next((h for h in map(_daemon_host, lines) if h), None)
    return f"on {host}: {text}" if host else text
