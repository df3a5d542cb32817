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
