"""The cluster paths without a cluster: batch arithmetic, slurm/train.sbatch (dry run, and the real
script with fake srun/scontrol on PATH), and the launcher configs."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
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
"""
FAKE_SRUN = """#!/usr/bin/env bash
printf '%s\\n' "$@" > "$FAKE_LOG/srun.args"
echo "WANDB_RUN_ID=${WANDB_RUN_ID:-unset}" > "$FAKE_LOG/srun.env"
echo $$ > "$FAKE_LOG/srun.pid"
for _ in $(seq 600); do  # as train.sft does: once the stop file appears, save, say so, and end
    if [[ -f "$USERSIM_STOP_FILE" ]]; then echo checkpoint-7 > "$USERSIM_STOP_FILE.saved"; exit 0; fi
    sleep 0.1
done
exit 1
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


@pytest.mark.slow
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
        job_process = subprocess.Popen(
            command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )  # its own process group: a failed test leaves no run or server behind
        try:
            deadline = time.monotonic() + 240
            while not ((out / "stats.jsonl").exists() and (out / "stats.jsonl").read_text().count("\n") >= 1):
                assert job_process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no round finished"
                time.sleep(0.5)
            job_process.send_signal(signal.SIGUSR1)  # what --signal=B:USR1@600 does before the limit
            job_process.wait(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job_process.pid, signal.SIGKILL)
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


# -- the rendezvous: two jobs on one node meet at two endpoints -------------------------------------------


def rendezvous(accelerate_argv: list[str]) -> tuple[str, str]:
    """(backend, host:port) of the rendezvous that `accelerate launch ARGV` gives torchrun: accelerate's
    own parsing and environment, then torch's, as torch.distributed.run.run does it (a standalone launch
    becomes c10d at a fresh port; c10d with no endpoint means localhost at c10d's default port)."""
    import warnings

    import torch.distributed.run as distrib_run
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import _filter_args, prepare_multi_gpu_env
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import DEFAULT_PORT

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args, _, _ = _validate_launch_command(launch_command_parser().parse_args(accelerate_argv))
        prepare_multi_gpu_env(args)
    script = ["--training_script", args.training_script, "--training_script_args", args.training_script_args]
    args = _filter_args(args, distrib_run.get_args_parser(), script)
    if args.standalone:
        return "c10d", "standalone (a fresh port)"
    config, _, _ = distrib_run.config_from_args(args)
    if config.rdzv_backend == "c10d" and not config.rdzv_endpoint:
        return "c10d", f"localhost:{DEFAULT_PORT}"
    return config.rdzv_backend, config.rdzv_endpoint


def node_command(job: str, nodes: str) -> list[str]:
    """The accelerate launch arguments slurm/train.sbatch gives node 0 of this job."""
    import shlex

    result = sbatch("--dry-run", "--nodes", nodes, "--gpus-per-node", "8", "configs/sft/qwen2.5-7b_lora.yaml",
                    env={"SLURM_JOB_ID": job})  # fmt: skip
    line = next(line for line in result.stdout.splitlines() if "accelerate launch" in line)
    words = shlex.split(re.sub(r"<node rank 0\.\.\d+>", "0", line))
    return words[words.index("launch") + 1 : words.index("--config")]


@pytest.mark.parametrize("nodes", ["1", "2"])
def test_two_jobs_on_one_node_meet_at_two_rendezvous_endpoints(nodes):
    first, second = (rendezvous(node_command(job, nodes)) for job in ("41001", "41002"))
    assert first[0] == ("static" if nodes == "1" else "c10d")
    assert first[1] != second[1], (first, second)


def test_two_plain_launches_with_a_shipped_config_meet_at_two_endpoints():
    for config in ("multi_gpu_ddp", "fsdp"):
        argv = ["--config_file", f"configs/accelerate/{config}.yaml", "-m", "train.sft"]
        assert rendezvous(argv)[1] != rendezvous(argv)[1], config


# -- the driver and the torch build ------------------------------------------------------------------------


def test_the_driver_check_names_the_mismatch_and_the_cuda12_build():
    from train.cuda_env import verdict

    fits, message = verdict("535.104.05", "13.0", "2.13.0")
    assert not fits
    assert "needs NVIDIA driver 580.65.06 or newer; this node has 535.104.05" in message
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" in message
    assert verdict("580.82.07", "13.0", "2.13.0")[0] and verdict("535.104.05", "12.8", "2.13.0+cu128")[0]
    assert verdict(None, "13.0", "2.13.0") == (
        True,
        "no NVIDIA driver here (nvidia-smi not found): nothing to check",
    )
    assert "CPU build" in verdict("580.82.07", None, "2.13.0+cpu")[1]


def fake_nvidia_smi(tmp_path: Path, driver: str) -> Path:
    bin_dir = tmp_path / "smi"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text(f"#!/usr/bin/env bash\necho {driver}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_a_train_job_on_a_node_whose_torch_cannot_use_the_driver_stops_before_launching(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM")}
    env.update(fake_cluster(tmp_path, "52"))
    env["PATH"] = f"{fake_nvidia_smi(tmp_path, '535.104.05')}:{env['PATH']}"
    result = subprocess.run(["bash", "slurm/train.sbatch", "configs/sft/qwen2.5-7b_lora.yaml"], cwd=REPO_ROOT,
                            env=env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 2
    assert (
        "NVIDIA driver 535.104.05" in result.stderr
        and "--index-url https://download.pytorch.org/whl/" in result.stderr
    )
    assert not (tmp_path / "srun.args").exists()  # nothing was launched
    clean = subprocess.run(
        [sys.executable, "-m", "train.cuda_env"], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert clean.returncode == 0 and "nothing to check" in clean.stdout  # no driver here: a CPU node


def test_the_gpu_checks_bitsandbytes_wheel_keeps_only_the_machines_cuda_library(tmp_path):
    """bench/gpu_check.sh --prepare cuts bitsandbytes to the GPU machine's CUDA library (carry <= 48 MiB)."""
    import zipfile

    from bench.gpu_check import slim_wheel

    wheel = tmp_path / "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"
    files = {
        "bitsandbytes/__init__.py": b"x = 1\n",
        "bitsandbytes/libbitsandbytes_cpu.so": b"c" * 100,
        "bitsandbytes/libbitsandbytes_cuda128.so": b"8" * 5000,
        "bitsandbytes/libbitsandbytes_cuda130.so": b"3" * 1000,
        "bitsandbytes/libbitsandbytes_rocm72.so": b"r" * 3000,
    }
    record = "".join(f"{name},sha256=x,{len(data)}\n" for name, data in files.items())
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(
            "bitsandbytes-0.50.2.dist-info/RECORD", record + "bitsandbytes-0.50.2.dist-info/RECORD,,\n"
        )
    result = slim_wheel(wheel, "cuda130")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        kept_record = archive.read("bitsandbytes-0.50.2.dist-info/RECORD").decode()
    assert result["dropped"] == 2
    assert names == {
        "bitsandbytes/__init__.py", "bitsandbytes/libbitsandbytes_cpu.so", "bitsandbytes/libbitsandbytes_cuda130.so",
        "bitsandbytes-0.50.2.dist-info/RECORD",
    }  # fmt: skip
    assert (
        "cuda128" not in kept_record
        and "rocm72" not in kept_record
        and "cuda130.so,sha256=x,1000" in kept_record
    )
    with pytest.raises(SystemExit, match="no bitsandbytes/libbitsandbytes_cuda999.so"):
        slim_wheel(wheel, "cuda999")


@pytest.mark.slow
def test_the_gpu_check_refuses_without_its_prepared_folders_and_runs_every_gpu_test(tmp_path):
    """bench/gpu_check.sh stops with what to do when --prepare has not run, and a wrong option is a usage
    error; the GPU tests it runs (pytest -m gpu tests/test_gpu.py) are every test of that file."""
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "gpu_check.sh").write_text((REPO_ROOT / "bench" / "gpu_check.sh").read_text())
    bare = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--cpu"], cwd=tmp_path, capture_output=True, text=True
    )
    assert bare.returncode == 2 and "run bash bench/gpu_check.sh --prepare first" in bare.stderr
    wrong = subprocess.run(
        ["bash", "bench/gpu_check.sh", "--gpu"], cwd=tmp_path, capture_output=True, text=True
    )
    assert wrong.returncode == 2 and "usage:" in wrong.stderr

    def collected(*marker: str) -> int:
        listing = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *marker, "tests/test_gpu.py"],
            cwd=REPO_ROOT, capture_output=True, text=True,
        ).stdout  # fmt: skip
        return sum(1 for line in listing.splitlines() if "::" in line)

    assert collected("-m", "gpu") == collected() >= 2


def test_qlora_under_zero3_is_refused_before_launch_naming_what_trains_it():
    from train import batch

    qlora, lora = "configs/sft/qwen2.5-7b_qlora.yaml", "configs/sft/qwen2.5-7b_lora.yaml"
    zero3, fsdp = "configs/accelerate/deepspeed_zero3.yaml", "configs/accelerate/fsdp.yaml"
    common = ["--processes", "16", "--accelerate-config"]
    assert batch.main([*common, zero3, qlora]) == 2
    assert batch.main([*common, fsdp, qlora]) == 0 and batch.main([*common, zero3, lora]) == 0
    assert batch.main([*common, zero3, qlora, "--load_in_4bit", "false"]) == 0  # the flag wins
    assert batch.main([*common, zero3, lora, "--load-in-8bit=true"]) == 2
    result = sbatch("--dry-run", "--nodes", "2", qlora, env={"ACCELERATE_CONFIG": zero3})
    assert result.returncode == 2 and "configs/accelerate/fsdp.yaml" in result.stderr
    assert "would run on every node" not in result.stdout  # nothing launched


def test_the_qlora_check_reads_a_bare_flag_and_a_deepspeed_json(tmp_path):
    from train import batch

    lora = "configs/sft/qwen2.5-7b_lora.yaml"
    zero3 = "configs/accelerate/deepspeed_zero3.yaml"
    assert (
        batch.main(["--processes", "16", "--accelerate-config", zero3, lora, "--load_in_4bit"]) == 2
    )  # bare: true
    assert (
        batch.main(["--processes", "16", "--accelerate-config", zero3, lora, "--load_in_4bit", "--seed", "1"])
        == 2
    )
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 3}}))
    launcher = tmp_path / "accelerate.yaml"
    launcher.write_text(
        yaml.safe_dump(
            {"distributed_type": "DEEPSPEED", "deepspeed_config": {"deepspeed_config_file": str(ds)}}
        )
    )
    assert (
        batch.main(
            ["--processes", "16", "--accelerate-config", str(launcher), "configs/sft/qwen2.5-7b_qlora.yaml"]
        )
        == 2
    )
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert (
        batch.main(
            ["--processes", "16", "--accelerate-config", str(launcher), "configs/sft/qwen2.5-7b_qlora.yaml"]
        )
        == 0
    )
