"""No import cycle anywhere, lazy imports (inside functions) included, in the package and the testbeds.

A cycle hidden by an import inside a function still ties two modules
together: neither can be read, moved or tested alone. import-linter's
graph (grimp) sees every import statement, wherever it is.
"""

import grimp

from support.helpers import REPO


def import_cycles(graph, modules) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []
    counter = 0
    for root in sorted(modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))
    # an import under ``if TYPE_CHECKING:`` names a type for an annotation and never runs
    graph = grimp.build_graph(
        "mpilaunch", "testbeds", include_external_packages=False, exclude_type_checking_imports=True
    )
    assert import_cycles(graph, graph.modules) == []


def test_the_cycle_finder_finds_a_lazy_cycle(tmp_path, monkeypatch):
    # two modules that import each other only inside functions: a cycle all the same
    pkg = tmp_path / "cyclic_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n")
    (pkg / "c.py").write_text("from . import a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("cyclic_probe", cache_dir=None)
    assert import_cycles(graph, graph.modules) == [["cyclic_probe.a", "cyclic_probe.b"]]
