"""Every entry point in the tree starts and prints its help: each module of data_prep/, train/,
agents/, eval/ and bench/ that runs as ``python -m`` (a ``__main__`` block, or a package's
``__main__.py``), found by walking the tree, so a new one is covered without editing this file. They run
as ``python -m`` runs them (runpy, sys.argv set), in this process. A help text with a stray % once made
``python -m agents.review run --help`` crash."""

import contextlib
import io
import runpy
import sys

import pytest

from data_prep.paths import REPO_ROOT

FOLDERS = ("data_prep", "train", "agents", "eval", "bench")


def entry_points() -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
            if path.name == "__main__.py":
                found.append(module.removesuffix(".__main__"))
            elif 'if __name__ == "__main__":' in path.read_text():
                found.append(module)
    return found


def test_the_walk_finds_the_entry_points_a_newcomer_is_told_about():
    found = set(entry_points())
    for documented in ("data_prep.build", "train.sft", "agents.review", "agents.simulate", "agents.sandbox", "agents.converse",
                       "eval.review.suite", "eval.converse", "agents.vllm_serve", "bench.quality_tables"):  # fmt: skip
        assert documented in found
    assert len(found) >= 40


@pytest.mark.parametrize("module", entry_points())
def test_entry_point_prints_its_help(module, monkeypatch):
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert done.value.code == 0 and "usage:" in out.getvalue()
