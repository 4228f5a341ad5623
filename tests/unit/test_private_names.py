"""No private name (``_x``) is imported from another module of the project: what a module
shares it names without an underscore, so a reader can tell its interface from its insides."""

import ast

from support.helpers import REPO

OURS = ("mpilaunch", "testbeds", "support")


def private_imports(root, base=REPO) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            ours = node.level > 0 or (node.module or "").split(".")[0] in OURS
            for alias in node.names if ours else ():
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(
                        f"{path.relative_to(base)}:{node.lineno} imports {alias.name} from "
                        f"{'.' * node.level}{node.module or ''}"
                    )
    return found


def test_no_private_name_crosses_a_module_boundary():
    assert [hit for folder in ("mpilaunch", "testbeds", "tests") for hit in private_imports(REPO / folder)] == []


def test_the_check_sees_a_lazy_relative_import_of_a_private_name(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("def f():\n    from .b import _helper\n")
    assert private_imports(tmp_path / "pkg", base=tmp_path) == ["pkg/a.py:2 imports _helper from .b"]
