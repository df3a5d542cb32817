import sys

from data_prep.provenance import provenance, redact


def test_secret_flag_values_never_reach_the_recorded_command(monkeypatch):
    argv = ["--hf-token", "hf_abc", "--api_key=sk-1", "--SECRET", "s", "--db-password", "pw", "--model", "m"]
    hidden = ["--hf-token", "***", "--api_key=***", "--SECRET", "***", "--db-password", "***"]
    assert redact(argv) == [*hidden, "--model", "m"]
    counts = ["--max-tokens", "256", "--tokenizer", "t", "--max_new_tokens=9", "--prompt_tokens", "5"]
    assert redact(counts) == counts  # token counts and tokenizer names are not secrets
    for flag in ("--hftoken", "--api-keys", "--tokens", "--token2", "--tokenPath", "--keyfile", "--passwd"):
        assert redact([flag, "s3cret"]) == [flag, "***"]
    monkeypatch.setattr(sys, "argv", ["prog", *argv])
    command = provenance()["command"]
    assert not any(secret in command for secret in ("hf_abc", "sk-1", "pw")) and "--model m" in command
