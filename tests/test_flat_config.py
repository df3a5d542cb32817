"""The review runner's flat configs go through the same loader as the other simulators' (agents/config.py):
a file, ``--set KEY=VALUE`` items and one flag per field, each value checked for its field's type."""

import pytest

from agents.config import ConfigError, load_flat, parse_flat
from agents.review.simulate import CONFIG_CLASSES
from data_prep.paths import REPO_ROOT

STATS = str(REPO_ROOT / "configs" / "review" / "stats.yaml")
TUNED = str(REPO_ROOT / "configs" / "review" / "tuned.yaml")


def parse(*argv):
    return parse_flat(list(argv), CONFIG_CLASSES, prog="python -m agents.review run")


def refused(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        parse(*argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_file_then_set_then_flags_each_read_for_its_field():
    agent, llm, run = parse("--config", TUNED, "--set", "k_user=4", "prompt_tokens=512", "--limit", "3",
                            "--out", "x", "--temperature", "0.5", "--utility_weights", "{sentiment: 4}")  # fmt: skip
    assert (agent.kind, agent.k_user, agent.prompt_tokens, agent.k_item) == (
        "tuned",
        4,
        512,
        1,
    )  # k_item: file
    assert agent.temperature == 0.5 and agent.utility_weights == {"sentiment": 4}
    assert llm.adapter == "runs/demo/sft/smollm2_lora" and (run.limit, run.out) == (3, "x")
    # a text field keeps the text; null is None where the field allows it
    _, llm, run = parse("--config", TUNED, "--out", "2024", "--set", "model=123", "adapter=null")
    assert (llm.model, llm.adapter, run.out) == ("123", None, "2024")


def test_flags_without_a_value_and_with_several():
    *_, run = parse("--out", "x", "--overwrite", "--merge", "a", "b")
    assert run.overwrite is True and run.merge == ["a", "b"]
    *_, run = parse("--out", "x", "--overwrite", "false")
    assert run.overwrite is False


def test_the_last_value_given_on_the_command_line_wins():
    agent, *_ = parse("--out", "x", "--set", "k_user=2", "--k_user", "3")
    assert agent.k_user == 3
    agent, *_ = parse("--out", "x", "--k_user", "3", "--set", "k_user=2", "--set", "k_item=1")
    assert (agent.k_user, agent.k_item) == (2, 1)


def test_bad_values_are_refused_with_the_setting_and_its_source_named(capsys, tmp_path):
    assert "--k_user: Input should be a valid integer" in refused(capsys, "--config", STATS, "--out", "x",
                                                                   "--set", "k_user=many")  # fmt: skip
    assert "--k_user: Input should be a valid integer" in refused(capsys, "--out", "x", "--k_user", "2.0")
    assert "--set 'k_user': expected KEY=VALUE" in refused(capsys, "--out", "x", "--set", "k_user")
    assert "nope: unknown setting" in refused(capsys, "--out", "x", "--set", "nope=1")
    assert "--out is required" in refused(capsys, "--config", STATS)
    assert "unrecognized arguments: --nope" in refused(capsys, "--out", "x", "--nope", "1")
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: stats\nk_usr: 2\n")
    assert f"{bad}: k_usr: unknown setting" in refused(capsys, "--config", str(bad), "--out", "x")
    bad.write_text("kind: stats\nk_user: true\n")  # a flag is no count
    assert f"{bad}: k_user: Input should be a valid integer" in refused(
        capsys, "--config", str(bad), "--out", "x"
    )
    assert "No such file" in refused(capsys, "--config", str(tmp_path / "missing.yaml"), "--out", "x")
    with pytest.raises(ConfigError, match="expected a mapping"):
        bad.write_text("- kind\n")
        load_flat(bad, CONFIG_CLASSES, {"out": "x"})


def test_a_number_in_a_file_is_text_where_the_setting_is_text(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("device: 0\nmodel: 123\ntemperature: 0\nutility_weights: {sentiment: 4}\n")
    agent, llm, _ = load_flat(config, CONFIG_CLASSES, {"out": "x"})
    assert (llm.device, llm.model) == ("0", "123")
    assert (
        repr(agent.temperature) == "0.0" and repr(agent.utility_weights) == "{'sentiment': 4.0}"
    )  # floats: one fingerprint


def test_help_lists_every_field_with_its_help_and_default(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "--k_user K_USER (default: 5)" in text
    assert "--out OUT run folder (required)" in text
    assert (
        "--adapter" in text and "--set KEY=VALUE" in text and "embedding or bm25 (default: embedding)" in text
    )
