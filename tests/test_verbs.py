"""The three simulators' command lines: the same verbs where they apply, the evaluations run by name
(agents/ never imports eval/), and the old entry points forwarding with a note."""

import importlib.util
import subprocess
import sys
import warnings

import pytest

import agents.verbs as verbs
from agents.converse import cli as converse_cli
from agents.review import cli as review_cli
from agents.review.simulate import moved_config
from agents.sandbox import cli as sandbox_cli
from data_prep.paths import REPO_ROOT

ALL_VERBS = {
    "review": review_cli.VERBS,
    "sandbox evaluate": sandbox_cli.ANALYSES,
    "converse": converse_cli.VERBS,
}


@pytest.fixture
def handed(monkeypatch):
    calls = []
    monkeypatch.setattr(verbs, "hand_over", lambda module, argv: calls.append((module, argv)))
    return calls


@pytest.mark.parametrize("simulator", sorted(ALL_VERBS))
def test_every_named_module_exists_and_runs_as_a_command(simulator):
    for name, verb in ALL_VERBS[simulator].items():
        assert (verb.call is None) != (verb.module is None), name
        if verb.module:
            spec = importlib.util.find_spec(verb.module)
            assert spec is not None, verb.module
            path = (
                spec.origin
                if not spec.submodule_search_locations
                else spec.origin.replace("__init__", "__main__")
            )
            assert 'if __name__ == "__main__":' in open(path).read() or path.endswith("__main__.py"), path


def test_review_and_converse_share_run_and_evaluate():
    assert {"run", "evaluate"} <= set(review_cli.VERBS) & set(converse_cli.VERBS)


def test_a_verb_hands_its_arguments_over_by_name(handed):
    review_cli.main(["evaluate", "--tasks", "T", "--predictions", "P.jsonl", "--out", "E"])
    sandbox_cli.main(["evaluate", "alignment", "--config", "C", "--out", "O"])
    converse_cli.main(["evaluate", "--run", "R"])
    assert handed == [
        ("eval.review", ["--tasks", "T", "--predictions", "P.jsonl", "--out", "E"]),
        ("eval.sandbox.alignment", ["--config", "C", "--out", "O"]),
        ("eval.converse", ["--run", "R"]),
    ]


def test_an_unknown_verb_is_a_clear_error_and_help_lists_the_verbs(capsys):
    with pytest.raises(SystemExit, match="unknown verb 'simulate'.*run, evaluate"):
        review_cli.main(["simulate", "--config", "x"])
    with pytest.raises(SystemExit) as stop:
        converse_cli.main(["--help"])
    assert stop.value.code == 0
    assert "run " in capsys.readouterr().out
    with pytest.raises(SystemExit) as stop:
        converse_cli.main([])
    assert stop.value.code == 2


def test_a_hand_over_runs_the_module_as_python_m_would(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the hand-over sets sys.argv, as python -m does
    with pytest.raises(SystemExit) as stop:
        verbs.hand_over("eval.review.baselines", ["--help"])
    assert stop.value.code == 0
    assert "nearest-centroid" in capsys.readouterr().out


def test_the_converse_form_without_a_verb_still_runs_with_a_note(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(converse_cli, "run", seen.append)
    converse_cli.main(["--config", "configs/converse/yelp.yaml", "--out", "R"])
    assert seen == [["--config", "configs/converse/yelp.yaml", "--out", "R"]]
    assert "agents.converse run --config" in capsys.readouterr().err


def test_an_old_review_config_path_is_read_from_configs_review(capsys):
    argv = moved_config(["--config", "configs/agents/stats.yaml", "--limit", "3"])
    assert argv == ["--config", "configs/review/stats.yaml", "--limit", "3"]
    assert (REPO_ROOT / argv[1]).exists()
    assert "configs/review/" in capsys.readouterr().err
    kept = ["--config", str(REPO_ROOT / "configs/review/tuned.yaml")]
    assert moved_config(kept) == kept


def test_the_one_module_eval_review_names_still_resolve_with_a_warning():
    import eval.review
    from eval.review.score import narrow

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert eval.review.narrow is narrow
    assert "eval.review.score.narrow" in str(caught[0].message)
    with pytest.raises(AttributeError):
        _ = eval.review.no_such_name


def test_the_review_evaluations_import_by_name_in_a_fresh_process():
    """A package attribute hook once sent ``from eval.review import baselines`` into endless recursion
    when nothing had imported eval.review.score first (this process has, so it runs apart)."""
    code = "from eval.review import baselines, fidelity, suite; print(fidelity.__name__, suite.__name__)"
    done = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["eval.review.fidelity", "eval.review.suite"]


def test_provenance_records_a_verb_command_that_reruns(monkeypatch):
    """python -m agents.review run ...: the recorded command names the package and the verb."""
    import types

    from data_prep.provenance import provenance

    seen = {}
    main = types.ModuleType("__main__")
    main.__spec__ = importlib.util.find_spec("agents.review.__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    monkeypatch.setattr(sys, "argv", ["x"])
    verbs.dispatch("python -m agents.review", "d", {"run": verbs.Verb("h", call=lambda rest: seen.update(provenance()))},
                   ["run", "--config", "c.yaml"])  # fmt: skip
    assert seen["command"].split()[1:] == ["-m", "agents.review", "run", "--config", "c.yaml"]
