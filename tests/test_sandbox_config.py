"""The sandbox config: nested typed sections, overrides, and errors that name the file and the field."""

import pytest

from agents.sandbox.config import ConfigError, load_config


def test_defaults_overrides_and_nested_sections(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "rounds: 4\nmemory:\n  enhance_times: 2\nrecommender:\n  kind: popularity\nllm:\n  backend: hf\n"
    )
    config = load_config(path, ["memory.retrieve_top=7", "graph.homophily=0.5"])
    assert (config.rounds, config.memory.enhance_times, config.memory.retrieve_top) == (4, 2, 7)
    assert config.recommender.kind == "popularity" and config.graph.homophily == 0.5
    assert config.llm.backend == "hf" and config.memory.forget_beta == 2.0  # untouched defaults


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("memory:\n  forget_beta: 0.5\n", "memory.forget_beta: Input should be greater than 1"),
        ("memory:\n  nope: 1\n", "memory.nope: Unexpected keyword argument"),
        ("nope: 1\n", "nope: Unexpected keyword argument"),
        ("llm:\n  nope: 1\n", "llm.nope: unknown setting"),
        (
            "recommender:\n  kind: magic\n",
            "recommender.kind: Value error, .magic. is not random, popularity, mf or package.module:Class",
        ),
        ("rounds: many\n", "rounds: Input should be a valid integer"),
        ("- a list\n", "expected a mapping"),
    ],
)
def test_bad_settings_name_the_file_and_the_field(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as error:
        load_config(path)
    assert str(path) in str(error.value)


def test_parsing_a_sandbox_config_does_not_import_trl():
    import subprocess
    import sys

    code = "import sys; from agents.sandbox.config import load_config; load_config(None); print('trl' in sys.modules)"
    from data_prep.paths import REPO_ROOT

    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


def test_every_shipped_sandbox_config_loads():
    from data_prep.paths import REPO_ROOT

    configs = sorted((REPO_ROOT / "configs" / "sandbox").glob("*.yaml"))
    assert configs
    for path in configs:
        config = load_config(path)
        assert config.agents >= 1 and config.llm.model


def test_the_shipped_config_is_the_validated_agent_and_the_run_says_which_it_uses():
    from agents.sandbox.run import decisions

    shipped = load_config("configs/sandbox/movielens.yaml", [])
    assert (shipped.decision.mode, shipped.decision.normalisation, shipped.decision.choice_weight) == (
        "score",
        "mean",
        8,
    )  # what the discrimination test chose on validation users for the base model (bench/README.md)
    said = decisions(shipped)
    assert (
        "base model, no adapter" in said and "plus 8 x the choice model" in said and "alone (no LLM" in said
    )
    tuned = load_config(
        "configs/sandbox/movielens.yaml", ["llm.adapter=runs/sandbox/sft/choice", "decision.choice_weight=2"]
    )
    assert "with the adapter runs/sandbox/sft/choice" in decisions(tuned) and "plus 2 x" in decisions(tuned)
    alone = load_config("configs/sandbox/movielens.yaml", ["decision.choice_weight=0"])
    assert "the LLM alone" in decisions(alone)
