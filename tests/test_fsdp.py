"""FSDP2 on two CPU processes (gloo): the sample generations do not hang and the saved adapter is
whole and reloads. What tests/fsdp_worker.py drives is torch's FSDP2 and PEFT as the Trainer and
accelerate use them, plus train.sft's callback and check; it does not cover accelerate's FSDP plugin
(GPU-only), NCCL, mixed precision or DeepSpeed ZeRO-3 (bench/gpu_check.sh runs the plugin on a GPU)."""

import json
import os
import signal
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from data_prep.paths import REPO_ROOT

# gloo's C++ side once aborted one rank with this message in CI, while rank 0 reloaded the adapter; 11
# runs in a row passed here. The ranks print the phases they reach, so a failure says where each rank was.
GLOO_ABORT = "terminate called without an active exception"


def launch(model_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """tests/fsdp_worker.py on two processes; a hung rank fails the test and its process group is killed."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    with socket.socket() as probe:  # a free port (torchrun's static rendezvous does not take port 0)
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", port]
    job = subprocess.Popen(
        [*command, str(REPO_ROOT / "tests" / "fsdp_worker.py"), str(model_dir), str(out)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, stderr = job.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.communicate()
        pytest.fail("the two FSDP2 processes did not finish in 240 s (a rank hung)")
    return subprocess.CompletedProcess(job.args, job.returncode, "", stderr)


@pytest.mark.slow
def test_fsdp2_generates_on_every_rank_and_saves_a_full_adapter(tmp_path, tiny_model):
    out = tmp_path / "try_1"
    result = launch(tiny_model, out)
    if result.returncode != 0 and GLOO_ABORT in result.stderr:  # that abort alone earns one more try
        warnings.warn(f"FSDP2 check: a rank aborted ({GLOO_ABORT!r}); trying once more", stacklevel=1)
        out = tmp_path / "try_2"
        result = launch(tiny_model, out)
    phases = "\n".join(line for line in result.stderr.splitlines() if line.startswith("[rank "))
    assert result.returncode == 0, f"phases reached:\n{phases}\n...\n{result.stderr[-2500:]}"
    ranks = [json.loads((out / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["sharded"] == "DTensor"
    samples = (out / "samples" / "step_1.jsonl").read_text().splitlines()  # rank 0 wrote, once
    assert len(samples) == 1 and json.loads(samples[0])["generated"]
    assert "was not written" in ranks[0]["naive_check_error"]  # a rank-0 save of the shards is caught
    assert ranks[0]["checked_tensors"] == 2 * 2 * 2  # 2 layers x (q, v) x (A, B), at full shapes
    assert ranks[0]["lora_b_norm"] > 0 and ranks[0]["reloaded_equal"]
