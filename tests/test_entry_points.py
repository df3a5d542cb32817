"""Every documented entry point starts and prints its help (a help text with a stray % once made
python -m agents.simulate --help crash)."""

import subprocess
import sys

import pytest

from data_prep.paths import REPO_ROOT

ENTRY_POINTS = [
    "data_prep.build", "data_prep.split", "data_prep.pairs", "data_prep.fetch_sample",
    "train.sft", "train.batch", "agents.simulate", "agents.suite", "eval.suite", "eval.review", "eval.baselines",
    "bench.gpu_check", "bench.sandbox_bench", "eval.discrimination", "agents.sandbox",
]  # fmt: skip


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_point_prints_its_help(module):
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage:" in result.stdout
