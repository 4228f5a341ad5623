"""A backend's helper modules read its public fields only: no ``backend._x`` outside the class.

A helper (``creation.py``, ``startup.py``, ``follow.py``, ``orphan.py``, ``handoff.py`` ...)
that reads the backend's underscore state ties itself to the class's insides: neither can be
changed alone. What a helper needs is a public field or method, or an argument of its own
(``follow.run_launcher`` takes the API, the pod and a callback, not the backend)."""

from __future__ import annotations

import ast

from support.helpers import REPO

BACKENDS = REPO / "mpilaunch" / "backends"


def private_reads(root, base=REPO) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "backend"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                found.append(f"{path.relative_to(base)}:{node.lineno}: backend.{node.attr}")
    return found


def test_no_helper_reads_a_backends_private_state():
    assert private_reads(BACKENDS) == []


def test_the_private_state_check_sees_one(tmp_path):
    (tmp_path / "helper.py").write_text("def f(backend):\n    return backend._secret_put\n")
    (tmp_path / "fine.py").write_text("def g(backend, self):\n    return backend.job, self._x, backend.__class__\n")
    assert private_reads(tmp_path, tmp_path) == ["helper.py:2: backend._secret_put"]
