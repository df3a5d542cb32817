"""The cluster paths without a cluster: batch arithmetic, slurm/train.sbatch (dry run, and the real
script with fake srun/scontrol on PATH), and the launcher configs."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from data_prep.paths import REPO_ROOT
from train.batch import gradient_accumulation, recipe_batch

GPU_RECIPES = sorted(p for p in (REPO_ROOT / "configs" / "sft").glob("*.yaml") if "cpu" not in p.name)


def sbatch(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "slurm/train.sbatch", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("SLURM")}, **(env or {})},
        timeout=60,
    )


def test_gradient_accumulation_and_the_advice_when_it_does_not_divide():
    assert gradient_accumulation(128, 4, 16) == 2
    assert gradient_accumulation(32, 4, 2) == 4
    with pytest.raises(ValueError) as error:
        gradient_accumulation(64, 8, 16)  # the README's old QLoRA command on 2 nodes
    message = str(error.value)
    assert "8 x 16 processes = 128" in message
    assert "global_batch_size to a multiple of 128" in message
    assert "per_device_train_batch_size to one of [1, 2, 4]" in message  # 64 / 16 = 4
    assert "processes (nodes x GPUs per node) to one of [1, 2, 4, 8]" in message  # 64 / 8 = 8
    with pytest.raises(ValueError, match="not a multiple"):
        gradient_accumulation(10, 4, 1)


def test_flags_override_the_recipe_in_either_spelling(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("global_batch_size: 64\nper_device_train_batch_size: 8\n")
    assert recipe_batch(recipe, []) == (64, 8)
    assert recipe_batch(recipe, ["--global-batch-size=256", "--per_device_train_batch_size", "2"]) == (256, 2)
    (tmp_path / "empty.yaml").write_text("pairs: x\n")
    assert recipe_batch(tmp_path / "empty.yaml", []) == (16, 8)  # train.sft's defaults


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_gpu_recipe_fits_one_to_four_nodes(recipe):
    """The node counts the README and the scripts show: 1 GPU, 1 node, 2 nodes, 4 nodes of 8 GPUs."""
    global_batch, per_device = recipe_batch(recipe, [])
    for processes in (1, 8, 16, 32):
        assert gradient_accumulation(global_batch, per_device, processes) >= 1


def test_dry_run_prints_the_commands_for_the_nodes_it_is_given():
    result = sbatch(
        "--dry-run", "--nodes", "4", "--gpus-per-node", "8", "configs/sft/qwen2.5-7b_qlora.yaml",
        "--learning_rate", "5e-5",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "128 examples per optimizer step = 4 per device x 32 processes x 1 accumulation steps" in out
    assert "--num_machines 4 --num_processes 32" in out and "--main_process_ip gpu01" in out
    assert "--main_process_port 32345" in out  # 20000 + job id 12345 % 20000
    assert "-m train.sft --config configs/sft/qwen2.5-7b_qlora.yaml --learning_rate 5e-5" in out
    assert "srun --nodes 4 --ntasks-per-node 1 --cpus-per-task 32" in out
    no_flags = sbatch("--dry-run", "configs/sft/qwen2.5-7b_qlora.yaml")
    node_command = next(line for line in no_flags.stdout.splitlines() if "accelerate launch" in line)
    assert node_command.endswith("-m train.sft --config configs/sft/qwen2.5-7b_qlora.yaml")  # no stray ''
    assert "--num_machines 2 --num_processes 16" in node_command


def test_bad_batch_arithmetic_stops_before_anything_is_launched():
    result = sbatch(
        "--dry-run", "--nodes", "4", "configs/sft/qwen2.5-7b_qlora.yaml", "--per_device_train_batch_size", "8"
    )
    assert result.returncode == 2
    assert "8 x 32 processes = 256" in result.stderr and "--global_batch_size" in result.stderr
    assert "accelerate launch" not in result.stdout
    refused = sbatch("configs/sft/qwen2.5-7b_qlora.yaml")
    assert refused.returncode == 2 and "SLURM_JOB_ID is not set" in refused.stderr
    sized = sbatch("--nodes", "4", "configs/sft/qwen2.5-7b_qlora.yaml")  # a real job's size is sbatch's
    assert sized.returncode == 2 and "are for --dry-run" in sized.stderr


FAKE_SCONTROL = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/scontrol"
if [[ "$1 $2" == "show hostnames" ]]; then printf 'node07\\nnode08\\n'; fi
if [[ "$1" == requeue ]]; then kill "$(cat "$FAKE_LOG/srun.pid")"; fi  # Slurm stops the job's steps
"""
FAKE_SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_LOG/srun.args"
echo "WANDB_RUN_ID=${WANDB_RUN_ID:-unset}" > "$FAKE_LOG/srun.env"
echo $$ > "$FAKE_LOG/srun.pid"
exec sleep 60
"""


def fake_cluster(tmp_path: Path, job_id: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_LOG": str(tmp_path),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "node[07-08]",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_CPUS_PER_TASK": "16",
    }


def test_usr1_requeues_the_job_and_srun_gets_cpus_port_and_no_wandb_id(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "WANDB_RUN_ID"))}
    env.update(fake_cluster(tmp_path, "40777"))
    job = subprocess.Popen(
        ["bash", "slurm/train.sbatch", "configs/sft/qwen2.5-7b_lora.yaml"],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "srun.pid").exists():
            assert job.poll() is None, job.communicate()
            assert time.monotonic() < deadline, "srun was never started"
            time.sleep(0.1)
        job.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 does ten minutes before the limit
        out, err = job.communicate(timeout=30)
    finally:
        job.kill()
    assert job.returncode == 0, err
    assert "requeueing" in out
    assert (tmp_path / "scontrol").read_text().splitlines() == ["show hostnames node[07-08]", "requeue 40777"]
    args = (tmp_path / "srun.args").read_text().splitlines()
    assert args[args.index("--cpus-per-task") + 1] == "16"
    node_command = args[-1]
    assert "--main_process_ip node07 --main_process_port 20777" in node_command
    # train.sft derives the W&B id from the output folder and inputs; the script must not override it
    assert (tmp_path / "srun.env").read_text().strip() == "WANDB_RUN_ID=unset"


def test_a_failing_step_fails_the_job_and_is_not_requeued(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(fake_cluster(tmp_path, "5"))
    (tmp_path / "bin" / "srun").write_text("#!/usr/bin/env bash\nexit 3\n")
    result = subprocess.run(
        ["bash", "slurm/train.sbatch", "configs/sft/qwen2.5-7b_lora.yaml"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3
    assert "requeue" not in (tmp_path / "scontrol").read_text()


def test_the_sbatch_header_asks_for_what_a_requeue_needs():
    header = [
        line
        for line in (REPO_ROOT / "slurm" / "train.sbatch").read_text().splitlines()
        if line.startswith("#SBATCH")
    ]
    assert {"#SBATCH --requeue", "#SBATCH --signal=B:USR1@600", "#SBATCH --open-mode=append"} <= set(header)
    for line in header:
        if line.startswith(("#SBATCH --output", "#SBATCH --error")):
            assert (REPO_ROOT / Path(line.split("=", 1)[1]).parent).is_dir()  # Slurm opens it before the job


def test_deepspeed_config_launches_nodes_with_the_standard_launcher():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO_ROOT / "configs" / "accelerate" / "deepspeed_zero3.yaml"))
    assert config.deepspeed_config["deepspeed_multinode_launcher"] == "standard"  # not pdsh, under srun


def test_fsdp_config_asks_for_a_full_state_dict():
    fsdp = yaml.safe_load((REPO_ROOT / "configs" / "accelerate" / "fsdp.yaml").read_text())["fsdp_config"]
    assert fsdp["fsdp_state_dict_type"] == "FULL_STATE_DICT"


# -- slurm/sandbox.sbatch: USR1 stops the run at a round boundary, then the job is requeued -----------------

FAKE_VLLM = """#!/usr/bin/env python3
# stands in for `vllm serve MODEL --host H --port P`: answers every GET with 200 (the script's health probe)
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

port = int(sys.argv[sys.argv.index("--port") + 1])
HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sandbox_job_stops_at_a_round_boundary_on_usr1_and_requeues(tmp_path, raw, tiny_model):
    bin_dir, vllm = tmp_path / "bin", tmp_path / "vllm" / "bin"
    bin_dir.mkdir()
    vllm.mkdir(parents=True)
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\necho "$*" >> "$FAKE_LOG/scontrol"\n')
    (vllm / "vllm").write_text(FAKE_VLLM)
    for path in (bin_dir / "scontrol", vllm / "vllm"):
        path.chmod(0o755)
    job = "918273"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path), SLURM_JOB_ID=job,
        VLLM_VENV=str(tmp_path / "vllm"), MODEL=str(tiny_model), PORT=str(free_port()),
    )  # fmt: skip
    out = tmp_path / "run"
    # the job's own settings, then the test's: the tiny model in process instead of the server, 3 agents
    command = ["bash", "slurm/sandbox.sbatch", "configs/sandbox/movielens.yaml", str(out), "--rounds", "40",
               "--set", "llm.backend=hf", f"data={raw / 'movielens_latest_small'}", "agents=3",
               "activity.pareto_xmin=1", "recommender.kind=popularity"]  # fmt: skip
    log = tmp_path / "job.log"
    with open(log, "w") as sink:
        job_process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while not ((out / "stats.jsonl").exists() and (out / "stats.jsonl").read_text().count("\n") >= 1):
                assert job_process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no round finished"
                time.sleep(0.5)
            job_process.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 does before the limit
            job_process.wait(timeout=240)
        finally:
            job_process.kill()
            (REPO_ROOT / "slurm" / "logs" / f"vllm-{job}.log").unlink(missing_ok=True)
    text = log.read_text()
    assert job_process.returncode == 0, text[-3000:]
    assert (tmp_path / "scontrol").read_text().splitlines() == [f"requeue {job}"]
    assert "SIGUSR1: stopping after this round" in text and "requeueing" in text
    rounds = [json.loads(line)["round"] for line in (out / "stats.jsonl").read_text().splitlines()]
    checkpoint = json.loads((out / "checkpoint.json").read_text())
    assert (
        rounds == list(range(1, checkpoint["round"] + 1)) and checkpoint["round"] < 40
    )  # stopped between rounds
    assert not (out / "summary.json").exists()  # paused, not finished
