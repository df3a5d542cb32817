"""The layout says who uses whom: data_prep (the data and the shared prompt renderer) and train use
neither agents nor eval; agents (the simulators and their shared layer) never use eval; eval and the
suite above them use both. Checked on every import statement, at any depth, of every module."""

import ast

import pytest

from data_prep.paths import REPO_ROOT

NEVER = {"data_prep": {"agents", "eval"}, "train": {"agents", "eval"}, "agents": {"eval"}}


def imported_packages(path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(NEVER))
def test_no_arrow_points_back_up(package):
    wrong = {
        str(path.relative_to(REPO_ROOT)): sorted(imported_packages(path) & NEVER[package])
        for path in (REPO_ROOT / package).rglob("*.py")
    }
    assert {k: v for k, v in wrong.items() if v} == {}


def test_the_check_sees_an_import_inside_a_function(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from eval.backends import packaged_minilm\n")
    assert imported_packages(module) == {"eval"}


def module_imports(path) -> set[str]:
    """The project modules a file imports, by dotted name (``from a.b import c`` gives a.b.c when c is a
    module of the tree, else a.b)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                inner = f"{node.module}.{alias.name}"
                names.add(inner if (REPO_ROOT / f"{inner.replace('.', '/')}.py").exists() else node.module)
    return {n for n in names if n.split(".")[0] in {"data_prep", "train", "agents", "eval"}}


def test_no_module_imports_itself_back_round_a_circle():
    """A library never imports its command line (a one-release forward runs it by name instead)."""
    graph = {}
    for package in ("data_prep", "train", "agents", "eval"):
        for path in (REPO_ROOT / package).rglob("*.py"):
            if path.name == "__init__.py":
                continue  # a package's own re-exports are not an arrow between modules
            name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            graph[name] = {m for m in module_imports(path) if m != name}
    circles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(trail[trail.index(nxt) :] + [nxt])
            elif nxt in graph and nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def test_the_circle_check_sees_a_library_that_imports_its_command_line(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("if __name__ == '__main__':\n    from agents.sandbox.cli import main\n")
    assert "agents.sandbox.cli" in module_imports(module)
