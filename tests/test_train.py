"""Fine-tuning on the CPU with a tiny random Llama (built here) and the real SmolLM2 tokenizer."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from data_prep import build, fingerprint, pairs, split
from data_prep.paths import REPO_ROOT
from data_prep.store import to_epoch
from train import sft


@pytest.fixture(scope="module")
def amazon_pairs(raw, tiny_model, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("amazon")
    build.main(
        [
            "--source",
            "amazon2018",
            "--input",
            str(raw / "amazon2018_5core_small"),
            "--out",
            str(root / "data"),
        ]
    )
    split.main(
        [
            "--data",
            str(root / "data"),
            "--out",
            str(root / "tasks"),
            "--min-history",
            "2",
            "--max-tasks",
            "40",
        ]
    )
    pairs.main(
        [
            "--data",
            str(root / "data"),
            "--tasks",
            str(root / "tasks"),
            "--out",
            str(root / "pairs"),
            "--max-examples",
            "48",
            "--max-tokens",
            "256",
            "--k-user",
            "2",
            "--k-item",
            "1",
            "--tokenizer",
            str(tiny_model),
        ]
    )
    return root


def recipe(tmp_path, tiny_model, amazon_pairs, **overrides) -> Path:
    config = {
        "pairs": str(amazon_pairs / "pairs"),
        "global_batch_size": 4,
        "max_eval_examples": 4,
        "sample_generations": 1,
        "model_name_or_path": str(tiny_model),
        "dtype": "float32",
        "use_peft": True,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "lora_target_modules": ["all-linear"],
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "activation_checkpointing": False,
        "per_device_train_batch_size": 2,
        "learning_rate": 3.0e-2,
        "max_steps": 12,
        "logging_steps": 1,
        "eval_strategy": "no",
        "save_strategy": "no",
        "seed": 0,
        "report_to": ["none"],
        "dataloader_num_workers": 0,
    }
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**config, **overrides}))
    return path


@pytest.mark.slow
def test_pairs_never_show_a_target_or_anything_newer(amazon_pairs):
    from data_prep.store import ReviewStore
    from data_prep.tasks import read_targets

    blocked = {row["review_id"] for row in read_targets(amazon_pairs / "tasks").values()}
    store = ReviewStore(amazon_pairs / "data")
    rows = [
        json.loads(line)
        for f in ("train", "validation")
        for line in (amazon_pairs / "pairs" / f"{f}.jsonl").open()
    ]
    assert rows and len({r["user_id"] for r in rows if r}) > 5
    train_users = {json.loads(line)["user_id"] for line in (amazon_pairs / "pairs" / "train.jsonl").open()}
    val_users = {json.loads(line)["user_id"] for line in (amazon_pairs / "pairs" / "validation.jsonl").open()}
    assert not train_users & val_users  # split by user
    target_texts = {store.get_reviews(review_id=b)[0]["text"][:60] for b in blocked}
    for row in rows:
        assert row["review_id"] not in blocked and not set(row["shown_review_ids"]) & blocked
        assert all(date < row["date"] for date in row["shown_dates"])  # strictly older
        prompt = row["prompt"][1]["content"]
        assert not any(text in prompt for text in target_texts if len(text) > 40)


@pytest.mark.slow
def test_a_step_zero_evaluation_in_a_run_without_evaluations_is_refused_by_name(
    tmp_path, tiny_model, amazon_pairs
):
    """eval_on_start with eval_strategy no is refused before the model loads, saying how to fix it, not
    at step 0 by the Trainer's "evaluation requires an eval_dataset" (what bench.sft_bench hit)."""
    path = recipe(tmp_path, tiny_model, amazon_pairs, eval_on_start=True)
    with pytest.raises(
        SystemExit, match="eval_on_start is true but eval_strategy is no.*--eval_on_start false"
    ):
        sft.build_trainer(["--config", str(path)])
    sft.build_trainer(["--config", str(path), "--eval_on_start", "false"])  # the fix it names runs


def test_training_sees_the_renderers_prompt_and_learns_only_completion_plus_eos(
    tmp_path, tiny_model, amazon_pairs
):
    trainer, tokenizer, *_ = sft.build_trainer(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs))])
    assert trainer.args.max_length == 256  # the pairs' budget (card.json), not TRL's default 1024
    source = [json.loads(line) for line in (amazon_pairs / "pairs" / "train.jsonl").open()]
    prepared = trainer.train_dataset
    assert len(prepared) == len(source)
    for row, example in zip(source[:10], prepared, strict=False):
        ids, labels = example["input_ids"], example["labels"]
        start = next(i for i, label in enumerate(labels) if label != -100)
        served = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, return_dict=True)
        assert ids[:start] == list(served["input_ids"])  # the prompt trained on is the prompt served
        supervised = [t for t, label in zip(ids, labels, strict=True) if label != -100]
        assert supervised == ids[start:]  # one contiguous supervised span, to the end
        assert tokenizer.decode(supervised) == row["completion"][0]["content"] + tokenizer.eos_token


def test_max_length_comes_from_the_pairs_and_a_disagreeing_one_is_refused(tmp_path, tiny_model, amazon_pairs):
    with pytest.raises(SystemExit, match="fitted to 256 tokens .* but max_length is 40"):
        sft.build_trainer(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs, max_length=40))])
    for flag in (["--max_length", "1024"], ["--max-length", "1024"], ["--max_length=1024"]):
        with pytest.raises(SystemExit, match="but max_length is 1024"):  # a flag is as explicit as the YAML
            sft.build_trainer(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs)), *flag])


def test_an_example_without_supervised_tokens_is_an_error(tiny_model, amazon_pairs):
    from datasets import load_from_disk
    from transformers import AutoTokenizer

    from data_prep.prompt import render_prompt

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = load_from_disk(str(amazon_pairs / "pairs" / "dataset"))["train"]
    texts = {"prompt": [render_prompt(tokenizer, rows[i]["prompt"]) for i in range(4)]}
    sft.check_supervision(texts, tokenizer, 256)  # the pairs' own budget: fine
    with pytest.raises(ValueError, match="no supervised token"):
        sft.check_supervision(texts, tokenizer, 40)


@pytest.mark.slow
def test_a_resume_from_other_inputs_is_refused_naming_what_changed(tmp_path, tiny_model, amazon_pairs):
    save = {"max_steps": 2, "save_strategy": "steps", "save_steps": 2}
    sft.main(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs, **save))])
    out = tmp_path / "out"
    assert (out / "checkpoint-2").is_dir() and (out / "fingerprint.json").exists()
    other = recipe(tmp_path, tiny_model, amazon_pairs, **save, learning_rate=1e-3, lora_r=4)
    with pytest.raises(SystemExit, match=r"changed: model\.lora_r, training\.learning_rate"):
        sft.main(["--config", str(other)])
    assert (out / "checkpoint-2").is_dir()  # nothing was lost
    trainer = sft.main(["--config", str(other), "--overwrite", "true"])
    assert trainer.state.global_step == 2 and json.loads((out / "adapter_config.json").read_text())["r"] == 4
    assert json.loads((out / "fingerprint.json").read_text())["inputs"]["model"]["lora_r"] == 4


@pytest.mark.slow
def test_sft_smoke_loss_falls_lora_moves_base_stays_adapter_reloads(tmp_path, tiny_model, amazon_pairs):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trainer = sft.main(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs))])
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 12 and all(torch.isfinite(torch.tensor(losses)))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5

    out = tmp_path / "out"
    adapter = load_file(out / "adapter_model.safetensors")
    lora_b = [v for k, v in adapter.items() if "lora_B" in k]
    assert lora_b and all(v.abs().sum() > 0 for v in lora_b)  # lora_B starts at zero: it moved
    base = load_file(tiny_model / "model.safetensors")
    trained = {k.removeprefix("base_model.model."): v for k, v in trainer.model.state_dict().items()}
    for name, weight in base.items():
        key = (
            name.replace(".weight", ".base_layer.weight")
            if name.replace(".weight", ".base_layer.weight") in trained
            else name
        )
        assert torch.equal(trained[key].cpu(), weight), name

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert (
        tokenizer.chat_template
        and json.loads((out / "generation_config.json").read_text())["eos_token_id"] == tokenizer.eos_token_id
    )
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model), out)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, return_tensors="pt"
    )
    prompt = prompt["input_ids"] if not torch.is_tensor(prompt) else prompt
    generated = model.generate(prompt, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > prompt.shape[1]
    card = (out / "README.md").read_text()
    assert str(tiny_model) in card and '"rank": 8' in card and "git_commit" in card
    trained_on = json.loads((out / "training_data.json").read_text())
    rows = [json.loads(line) for line in (amazon_pairs / "pairs" / "train.jsonl").open()]
    assert trained_on["train_review_ids"] == [r["review_id"] for r in rows]
    assert trained_on["latest_target_ts"] == max(to_epoch(r["date"]) for r in rows)
    assert (out / "loss.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_stopped_run_resumes_to_the_same_end_with_the_same_data_order(tmp_path, tiny_model, amazon_pairs):
    from transformers import TrainerCallback

    def losses_of(trainer):
        return {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}

    save = {"max_steps": 6, "save_strategy": "steps", "save_steps": 3, "save_total_limit": 1}
    whole = sft.main(["--config", str(recipe(tmp_path / "a", tiny_model, amazon_pairs, **save))])

    class Killed(Exception):
        pass

    class KillAfterFirstCheckpoint(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            raise Killed  # as if the job were preempted right after checkpoint-3

    cut = recipe(tmp_path / "b", tiny_model, amazon_pairs, **save)
    with pytest.raises(Killed):
        sft.main(["--config", str(cut)], callbacks=[KillAfterFirstCheckpoint()])
    assert (tmp_path / "b" / "out" / "checkpoint-3").is_dir() and not (
        tmp_path / "b" / "out" / "adapter_model.safetensors"
    ).exists()

    class CountSteps(TrainerCallback):
        steps: list[int] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(state.global_step)

    resumed = sft.main(["--config", str(cut)], callbacks=[CountSteps()])  # no flag: it finds checkpoint-3
    assert resumed.state.global_step == whole.state.global_step == 6
    assert CountSteps.steps == [4, 5, 6]  # steps 1-3 were not redone
    # save_total_limit removed the checkpoint it resumed from; the card was still written
    assert not (tmp_path / "b" / "out" / "checkpoint-3").exists()
    after, before = losses_of(resumed), losses_of(whole)
    for step in range(1, 7):
        assert after[step] == pytest.approx(before[step], rel=1e-5)  # same batches, same order
    # the card's speed covers only the steps the resumed process ran (its runtime covers no others)
    speed = json.loads((tmp_path / "b" / "out" / "training_card.json").read_text())["throughput"]
    assert (speed["resumed_from_step"], speed["steps_this_process"]) == (3, 3)
    full = json.loads((tmp_path / "a" / "out" / "training_card.json").read_text())["throughput"]
    assert (full["resumed_from_step"], full["steps_this_process"]) == (0, 6)
    assert 0 < speed["tokens"] < full["tokens"]
    # a rerun of the finished run trains nothing and leaves the adapter as it was (resuming from
    # checkpoint-6 would have taken a step 7)
    adapter = tmp_path / "b" / "out" / "adapter_model.safetensors"
    saved, CountSteps.steps = adapter.read_bytes(), []
    again = sft.main(["--config", str(cut)], callbacks=[CountSteps()])
    assert CountSteps.steps == [] and again.state.global_step == 6 and adapter.read_bytes() == saved
    assert losses_of(again) == after and not (tmp_path / "b" / "out" / "checkpoint-7").exists()


def test_explicit_empty_resume_path_is_refused(tmp_path, tiny_model, amazon_pairs):
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="missing or empty"):
        sft.main(
            [
                "--config",
                str(recipe(tmp_path, tiny_model, amazon_pairs)),
                "--resume_from_checkpoint",
                str(tmp_path / "empty"),
            ]
        )


def test_unknown_recipe_keys_are_rejected(tmp_path, tiny_model, amazon_pairs):
    with pytest.raises(ValueError, match="Unknown arguments"):
        sft.parse(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs, lora_rank=8))])


@pytest.mark.slow
def test_qlora_4bit_path_trains(tmp_path, tiny_model, amazon_pairs):
    trainer = sft.main(
        ["--config", str(recipe(tmp_path, tiny_model, amazon_pairs, load_in_4bit=True, max_steps=2))]
    )
    assert trainer.state.global_step == 2
    assert any("Linear4bit" in type(m).__name__ for m in trainer.model.modules())


@pytest.mark.slow
def test_two_process_data_parallel_run_through_accelerate(tmp_path, tiny_model, amazon_pairs):
    config = recipe(tmp_path, tiny_model, amazon_pairs, max_steps=3)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(REPO_ROOT / "configs/accelerate/cpu_2proc.yaml"),
            "-m",
            "train.sft",
            "--config",
            str(config),
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # a rank stuck at exit (see sft.drop_ddp_wrapper) fails here, not after CI's limit
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "DDP wrapper is still referenced" not in result.stderr
    out = tmp_path / "out"
    assert len(list(out.rglob("adapter_model.safetensors"))) == 1  # one adapter, written once
    card = json.loads((out / "training_card.json").read_text())
    assert (
        card["steps"] == 3 and card["training"]["gradient_accumulation_steps"] == 1
    )  # 4 = 2 per device x 2 procs
    # the W&B project and group the adapter's evaluations log into (eval.tracking reads them)
    assert card["wandb"]["project"] == "usersim" and card["wandb"]["group"].startswith("out-")


def test_every_shipped_recipe_parses_and_keeps_the_settings_that_matter_on_its_hardware():
    """Each recipe parses in full (bf16 ones with the hardware check turned off here); a CPU recipe
    turns bf16 off (on this CPU bf16 runs about 17x slower or raises); no two recipes write the same
    folder; a named task metric resolves to a function; each launcher is the kind its name says."""
    import importlib

    from accelerate.commands.config.config_args import ClusterConfig

    recipes = sorted((REPO_ROOT / "configs" / "sft").glob("*.yaml"))
    outputs = {}
    for path in recipes:
        raw = yaml.safe_load(path.read_text())
        gpu_only = raw.get("bf16") and not torch.cuda.is_available()
        overrides = ["--bf16", "false", "--use_cpu", "true"] if gpu_only else []
        recipe_args, training_args, _ = sft.parse(["--config", str(path), *overrides])
        if "cpu" in path.stem:
            assert training_args.use_cpu and not training_args.bf16, path.name
        else:
            assert raw.get("bf16") is True, path.name  # the GPU recipes train in bf16
        assert training_args.output_dir not in outputs, (path.name, outputs.get(training_args.output_dir))
        outputs[training_args.output_dir] = path.name
        if recipe_args.task_metric:
            module, _, name = recipe_args.task_metric.partition(":")
            assert callable(getattr(importlib.import_module(module), name)), path.name
    kinds = {"cpu_2proc": "MULTI_GPU", "multi_gpu_ddp": "MULTI_GPU", "fsdp": "FSDP", "deepspeed_zero3": "DEEPSPEED",
             "single_gpu": "NO"}  # fmt: skip
    for path in sorted((REPO_ROOT / "configs" / "accelerate").glob("*.yaml")):
        config = ClusterConfig.from_yaml_file(path)
        assert str(config.distributed_type).split(".")[-1] == kinds[path.stem], path.name


@pytest.mark.slow
def test_wandb_offline_run_with_stable_id_and_generation_table(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    for name in (
        "WANDB_RUN_ID",
        "WANDB_PROJECT",
        "WANDB_RUN_GROUP",
        "WANDB_RESUME",
    ):  # set by sft.main; restored after
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "wandb").mkdir()
    config = recipe(
        tmp_path,
        tiny_model,
        amazon_pairs,
        max_steps=2,
        eval_strategy="steps",
        eval_steps=2,
        report_to=["wandb"],
    )
    sft.main(["--config", str(config)])
    inputs = json.loads((tmp_path / "out" / "fingerprint.json").read_text())["inputs"]
    run_id = sft.stable_wandb_run_id(str(tmp_path / "out"), fingerprint.digest(inputs))
    # another folder, or the same folder started afresh from other inputs: another W&B run
    assert run_id != sft.stable_wandb_run_id(str(tmp_path / "other"), fingerprint.digest(inputs))
    assert run_id != sft.stable_wandb_run_id(
        str(tmp_path / "out"), fingerprint.digest({**inputs, "pairs": "x"})
    )
    runs = list((tmp_path / "wandb").rglob(f"offline-run-*-{run_id}"))
    assert len(runs) == 1
    card = json.loads((tmp_path / "out" / "training_card.json").read_text())
    assert card["wandb"] == {"project": "usersim", "group": f"out-{run_id[:8]}"}  # where its evaluations go
    tables = list(runs[0].rglob("sample_generations*.table.json"))
    assert tables and "generated" in tables[0].read_text()
    samples = [json.loads(line) for line in (tmp_path / "out" / "samples" / "step_2.jsonl").open()]
    assert len(samples) == 1 and samples[0]["truth"].startswith("stars: ")


def test_peft_under_zero3_gets_reentrant_checkpointing_in_the_field_transformers_reads(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    """DeepSpeed is not installed here, so the ZeRO-3 plugin is a stand-in on the parsed arguments;
    TRL's own workaround runs on it (and writes the deprecated field only); the Trainer reads
    activation_checkpointing_kwargs when it turns checkpointing on."""
    import types

    parse = sft.parse

    def parse_under_zero3(argv):
        recipe_args, training_args, model_args = parse(argv)
        training_args.deepspeed_plugin = types.SimpleNamespace(zero_stage=3)
        return recipe_args, training_args, model_args

    monkeypatch.setattr(sft, "parse", parse_under_zero3)
    from transformers import Trainer

    make_accelerator = Trainer.create_accelerator_and_postprocess

    def without_the_stand_in(self):  # TRL's check has run; the accelerator needs the real DeepSpeed
        self.args.deepspeed_plugin = None
        return make_accelerator(self)

    monkeypatch.setattr(Trainer, "create_accelerator_and_postprocess", without_the_stand_in)
    config = recipe(tmp_path, tiny_model, amazon_pairs, activation_checkpointing=True)
    trainer, *_ = sft.build_trainer(["--config", str(config)])
    assert trainer.args.activation_checkpointing_kwargs == {"use_reentrant": True}
    trainer, *_ = sft.build_trainer(["--config", str(config), "--use_peft", "false", "--overwrite", "true"])
    assert not trainer.args.activation_checkpointing_kwargs  # full fine-tuning: left to the defaults


def test_qlora_loads_one_whole_copy_per_process_and_stores_4bit_in_the_compute_dtype_when_sharded(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    _, training_args, model_args = sft.parse(
        ["--config", str(recipe(tmp_path, tiny_model, amazon_pairs, load_in_4bit=True))]
    )
    model = sft.load_model(str(tiny_model), model_args, training_args)
    assert model.is_loaded_in_4bit and {p.device.type for p in model.parameters()} == {"cpu"}
    assert model_args.bnb_4bit_quant_storage is None  # one process: bitsandbytes' default storage
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")  # what `accelerate launch` sets for an FSDP config
    model = sft.load_model(str(tiny_model), model_args, training_args)
    assert model_args.bnb_4bit_quant_storage == "float32"  # the recipe's compute dtype
    assert model.config.quantization_config.bnb_4bit_quant_storage == torch.float32


def test_validation_examples_are_spread_over_the_file_not_its_first_users():
    from train.sft import spread

    assert spread(100, 7) == [0, 16, 33, 50, 66, 82, 99]  # round(k * 99 / 6)
    assert spread(3, 8) == [0, 1, 2] and spread(1, 4) == [0] and spread(48, 1) == [0]


def test_several_visible_gpus_in_one_process_are_refused_before_the_model_loads(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.delenv("LOCAL_RANK", raising=False)

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(sft, "load_model", never)
    config = recipe(tmp_path, tiny_model, amazon_pairs, use_cpu=False)
    with pytest.raises(SystemExit) as refused:
        sft.main(["--config", str(config)])
    message = str(refused.value)
    assert "one process sees 4 GPUs" in message
    assert (
        "accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml --num_processes 4" in message
    )
    assert "CUDA_VISIBLE_DEVICES=0 python -m train.sft" in message
    monkeypatch.setenv("LOCAL_RANK", "0")  # one process of a distributed launch: not refused
    sft.check_one_process_sees_one_gpu(argparse.Namespace(use_cpu=False))


FAKE_SRUN_RUNS_THE_NODE_COMMAND = """#!/usr/bin/env bash
echo $$ > "$FAKE_LOG/srun.pid"
SLURM_NODEID=0 exec bash -c "${@: -1}"
"""


@pytest.mark.slow
def test_usr1_makes_training_save_at_a_step_boundary_then_the_job_is_requeued(
    tmp_path, tiny_model, amazon_pairs
):
    """slurm/train.sbatch for real under bash, with stand-in srun (it runs the node command: accelerate
    launch of train.sft, on the CPU) and scontrol; USR1 as Slurm sends it before the time limit."""
    import signal
    import time

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN_RUNS_THE_NODE_COMMAND)
    (bin_dir / "scontrol").write_text('#!/usr/bin/env bash\necho "$*" >> "$FAKE_LOG/scontrol"\n'
                                      'if [[ "$1" == show ]]; then echo node01; fi\n')  # fmt: skip
    for name in ("srun", "scontrol"):
        (bin_dir / name).chmod(0o755)
    config = recipe(tmp_path, tiny_model, amazon_pairs, max_steps=100000, global_batch_size=2,
                    per_device_train_batch_size=2, logging_steps=1)  # fmt: skip
    job = "63001"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "LOCAL_RANK", "USERSIM"))}
    env.update(
        PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_LOG=str(tmp_path), SLURM_JOB_ID=job,
        SLURM_JOB_NUM_NODES="1", SLURM_JOB_NODELIST="node01", SLURM_GPUS_ON_NODE="1", SLURM_CPUS_PER_TASK="2",
        ACCELERATE_CONFIG="configs/accelerate/single_gpu.yaml", VENV=str(Path(sys.executable).parents[1]),
    )  # fmt: skip
    log = tmp_path / "job.log"
    stop = REPO_ROOT / "slurm" / "logs" / f"stop-{job}"
    try:
        with open(log, "w") as sink:
            job_process = subprocess.Popen(["bash", "slurm/train.sbatch", str(config)], cwd=REPO_ROOT, env=env,
                                           stdout=sink, stderr=subprocess.STDOUT)  # fmt: skip
            try:
                deadline = time.monotonic() + 300
                while log.read_text().count("'loss'") < 3:  # training is under way
                    assert job_process.poll() is None, log.read_text()[-3000:]
                    assert time.monotonic() < deadline, "training never started"
                    time.sleep(0.5)
                job_process.send_signal(signal.SIGUSR1)
                job_process.wait(timeout=300)
            finally:
                job_process.kill()
        text = log.read_text()
        assert job_process.returncode == 0, text[-3000:]
        assert (tmp_path / "scontrol").read_text().splitlines() == ["show hostnames node01", f"requeue {job}"]
        out = tmp_path / "out"
        checkpoints = sorted(out.glob("checkpoint-*"))
        assert len(checkpoints) == 1, checkpoints  # save_strategy no: this one came from the stop request
        step = json.loads((checkpoints[0] / "trainer_state.json").read_text())["global_step"]
        assert checkpoints[0].name == f"checkpoint-{step}" and 3 <= step < 100000  # at a step boundary
        assert (checkpoints[0] / "adapter_model.safetensors").exists()
        assert stop.with_name(stop.name + ".saved").read_text().strip() == checkpoints[0].name
        assert not (out / "adapter_model.safetensors").exists()  # paused: no final adapter or card
        assert f"stopped on request after step {step}" in text and "requeueing" in text
    finally:
        for path in (stop, stop.with_name(stop.name + ".saved")):
            path.unlink(missing_ok=True)


@pytest.mark.slow
def test_the_task_metric_runs_at_step_0_and_every_evaluation_and_keeps_the_best_checkpoint(
    tmp_path, tiny_model, amazon_pairs
):
    """The recipe's task metric (eval.training, by import path) scores the greedy answers of validation
    pairs at step 0 and at each evaluation beside the copy baseline; the checkpoint kept is the best by
    it, and the card holds the curve and the paired differences against the base model and the copy."""
    config = recipe(
        tmp_path,
        tiny_model,
        amazon_pairs,
        max_steps=4,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        eval_on_start=True,
        task_metric="eval.training:review_task_metric",
        task_examples=3,
        task_max_new_tokens=8,
        metric_for_best_model="task_overall",
        greater_is_better=True,
        load_best_model_at_end=True,
    )
    trainer = sft.main(["--config", str(config)])
    curve = [h for h in trainer.state.log_history if "eval_task_overall" in h]
    assert [h["step"] for h in curve] == [0, 2, 4]
    assert len({h["eval_copy_overall"] for h in curve}) == 1  # the copy baseline: the same pairs each time
    best = max(curve[1:], key=lambda h: h["eval_task_overall"])  # step 0 has no checkpoint
    assert trainer.state.best_model_checkpoint.endswith(f"checkpoint-{best['step']}")
    card = json.loads((tmp_path / "out" / "training_card.json").read_text())["task_metric"]
    assert card["examples"] == 3 and card["kept_step"] == best["step"]
    assert [p["step"] for p in card["curve"]] == [0, 2, 4]
    for comparison in ("adapter_minus_base", "adapter_minus_copy"):
        d = card[comparison]["overall"]
        assert d["n"] == 3 and d["ci95"][0] <= d["difference"] <= d["ci95"][1]
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "## What it learned (3 validation examples" in readme and f"| {best['step']} (kept) |" in readme
    assert (tmp_path / "out" / "loss.png").stat().st_size > 0
    assert sorted(p.name for p in (tmp_path / "out" / "task_eval").iterdir()) == [
        "step_0.jsonl",
        "step_2.jsonl",
        "step_4.jsonl",
    ]


def test_a_run_that_starts_at_step_0_keeps_no_answers_of_an_earlier_start(tmp_path):
    """A start that died before its first checkpoint leaves answers a later run's task metric would
    restore as its own (eval.task_check.restore): a fresh start removes them, and only them."""
    out = tmp_path / "out"
    for name in ("task_eval/step_0.jsonl", "samples/step_0.jsonl", "fingerprint.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text("{}\n")
    sft.drop_answers_of_an_earlier_start(str(out))
    assert sorted(p.name for p in out.iterdir()) == ["fingerprint.json"]


def test_a_run_ended_at_max_steps_or_out_of_patience_not_when_stopped_on_request(tmp_path):
    """sft.ended reads the checkpoint's trainer_state.json. A requeue's stop (SaveAndStop) also saves
    should_training_stop: that run has not ended, and a rerun must resume it, not save a card."""

    def checkpoint(name, step, counter, stop):
        folder = tmp_path / name
        folder.mkdir()
        early = {
            "args": {"early_stopping_patience": 3},
            "attributes": {"early_stopping_patience_counter": counter},
        }
        control = {"args": {"should_training_stop": stop}, "attributes": {}}
        state = {"global_step": step, "max_steps": 100,
                 "stateful_callbacks": {"EarlyStoppingCallback": early, "TrainerControl": control}}  # fmt: skip
        (folder / "trainer_state.json").write_text(json.dumps(state))
        return str(folder)

    assert sft.ended(checkpoint("at_max_steps", 100, 0, True))
    assert sft.ended(checkpoint("out_of_patience", 40, 3, True))
    assert not sft.ended(checkpoint("stopped_on_request", 40, 1, True))
    assert not sft.ended(checkpoint("mid_run", 40, 2, False))


def test_a_task_metric_that_is_not_module_colon_function_is_refused(tmp_path, tiny_model, amazon_pairs):
    config = recipe(tmp_path, tiny_model, amazon_pairs, task_metric="eval.training.review_task_metric")
    with pytest.raises(SystemExit, match="is not module:function"):
        sft.main(["--config", str(config)])


class FallingMetric:
    """A scripted task metric: its accuracy halves at every evaluation, so step 0 stays the best."""

    def __init__(self, pairs, rows, output_dir, max_new_tokens):
        self.prompts, self.max_new_tokens, self.calls = [r["rendered"] for r in rows], max_new_tokens, 0

    def __call__(self, answers, step, write=True):
        assert len(answers) == len(self.prompts)
        self.calls += 1
        return {"task_accuracy": 1.0 / 2**self.calls, "most_rated_accuracy": 0.5, "chance_accuracy": 0.2}

    def summary(self, kept_step):
        return {"examples": len(self.prompts), "curve": [], "kept_step": kept_step,
                "plot": {"ylabel": "accuracy", "title": "scripted",
                         "series": {"top-1": ["task_accuracy", "most_rated_accuracy"]}}}  # fmt: skip


def falling_metric(pairs, rows, output_dir, max_new_tokens):
    return FallingMetric(pairs, rows, output_dir, max_new_tokens)


@pytest.mark.slow
def test_the_task_metric_stops_a_run_that_does_not_improve_and_a_rerun_keeps_it(
    tmp_path, tiny_model, amazon_pairs
):
    from safetensors.torch import load_file, save_file
    from transformers import TrainerCallback

    config = recipe(
        tmp_path, tiny_model, amazon_pairs, max_steps=12, eval_strategy="steps", eval_steps=2,
        save_strategy="steps", save_steps=2, eval_on_start=True, task_metric="tests.test_train:falling_metric",
        task_examples=2, task_max_new_tokens=2, metric_for_best_model="task_accuracy", greater_is_better=True,
        load_best_model_at_end=True, early_stopping_patience=2,
    )  # fmt: skip
    trainer = sft.main(["--config", str(config)])
    # step 0 has no checkpoint to keep, so step 2 is the first best; steps 4 and 6 are worse: two
    # evaluations without a better one stop the run at 6 of 12, and step 2's checkpoint is kept
    assert trainer.state.global_step == 6 and trainer.state.best_model_checkpoint.endswith("checkpoint-2")
    card = json.loads((tmp_path / "out" / "training_card.json").read_text())
    assert card["stopped_early"] and card["steps"] == 6
    assert [p["step"] for p in card["task_metric"]["curve"]] == [0, 2, 4, 6]  # the whole curve, from the log
    assert [p["task_accuracy"] for p in card["task_metric"]["curve"]] == [0.5, 0.25, 0.125, 0.0625]
    again = sft.main(["--config", str(config)])  # a finished run, stopped early: nothing to do
    assert (
        again.state.global_step == 6
        and json.loads((tmp_path / "out" / "training_card.json").read_text()) == card
    )
    # a run that ended but died before it saved: a rerun saves the kept adapter and the card, no step
    out = tmp_path / "out"
    for name in ("training_card.json", "README.md", "adapter_model.safetensors", "training_data.json"):
        (out / name).unlink()
    steps = []

    class CountSteps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            steps.append(state.global_step)

    kept_file = out / "checkpoint-2" / "adapter_model.safetensors"
    whole = kept_file.read_bytes()
    partial = load_file(kept_file)
    partial.pop(sorted(partial)[0])
    save_file(partial, kept_file)  # an adapter that lacks a LoRA matrix is refused, not loaded in part
    with pytest.raises(SystemExit, match="missing"):
        sft.main(["--config", str(config)])
    kept_file.write_bytes(whole)
    sft.main(["--config", str(config)], callbacks=[CountSteps()])
    assert steps == [] and (out / "training_data.json").exists()
    saved = json.loads((out / "training_card.json").read_text())
    for key in ("steps", "stopped_early", "best_checkpoint", "task_metric", "train_losses"):
        assert saved[key] == card[key], key
    kept, written = (
        load_file(out / "checkpoint-2" / "adapter_model.safetensors"),
        load_file(out / "adapter_model.safetensors"),
    )
    assert kept.keys() == written.keys() and all(torch.equal(kept[k], written[k]) for k in kept)


def test_qlora_under_an_accelerate_zero3_launch_is_refused_before_anything_loads(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    """What `accelerate launch` with a ZeRO-3 config puts in each rank's environment; DeepSpeed itself
    is not installed here, and the refusal comes before the arguments that would need it are parsed."""
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    monkeypatch.setenv("ACCELERATE_DEEPSPEED_ZERO_STAGE", "3")
    config = recipe(tmp_path, tiny_model, amazon_pairs, load_in_4bit=True)
    with pytest.raises(SystemExit, match="Train QLoRA with configs/accelerate/multi_gpu_ddp.yaml"):
        sft.build_trainer(["--config", str(config)])
    with pytest.raises(SystemExit, match="ZeRO-3"):
        sft.build_trainer(
            ["--config", str(recipe(tmp_path, tiny_model, amazon_pairs)), "--load_in_8bit", "true"]
        )


def test_the_first_process_downloads_and_builds_the_caches_before_the_others(
    tmp_path, tiny_model, amazon_pairs, monkeypatch
):
    """The tokenizer, the datasets and the base model's download run inside main_process_first (global:
    shared storage), so the other ranks read what the first one wrote; the model loads on every rank."""
    import contextlib

    from transformers import TrainingArguments

    inside, events = [], []

    @contextlib.contextmanager
    def first(self, local=True, desc="work"):
        inside.append(local)
        yield
        inside.pop()

    monkeypatch.setattr(TrainingArguments, "main_process_first", first)
    for name in ("load_pairs", "fetch_model", "load_model"):
        real = getattr(sft, name)
        monkeypatch.setattr(
            sft, name, lambda *a, _real=real, _name=name: events.append((_name, list(inside))) or _real(*a)
        )
    sft.build_trainer(["--config", str(recipe(tmp_path, tiny_model, amazon_pairs))])
    # the download under the first process; the loading on every process (collective under ZeRO-3)
    assert events == [("load_pairs", [False]), ("fetch_model", [False]), ("load_model", [])]
    fetched = []
    monkeypatch.setattr(
        "huggingface_hub.snapshot_download", lambda *a, **k: fetched.append((a, k)) or "/snap"
    )
    assert sft.fetch_model(str(tiny_model), None) is None and not fetched  # a local folder: nothing to fetch
    assert sft.fetch_model("Qwen/Qwen2.5-7B-Instruct", "main") == "/snap"
    assert (
        fetched[0][0] == ("Qwen/Qwen2.5-7B-Instruct",) and "*.safetensors" in fetched[0][1]["allow_patterns"]
    )


def test_the_task_metrics_greedy_answers_block_repeats_as_the_agents_decode(tiny_model):
    """The review recipes ask the task metric to decode as the review agents do (no 4-token n-gram twice):
    the setting reaches generation, and the answers differ from unblocked ones only by it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from train.sft import greedy_answers

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    seen = []
    generate = model.generate
    model.generate = lambda **kw: seen.append(kw.get("no_repeat_ngram_size")) or generate(**kw)
    prompts = ["stars: 5\nreview: a very", "stars: 1\nreview: this is the"]
    blocked = greedy_answers(model, tokenizer, prompts, 48, 2, no_repeat_ngram_size=2)
    greedy_answers(model, tokenizer, prompts, 48, 2)
    assert seen == [2, 0]
    for text in blocked:  # no token pair twice in an answer
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        pairs = list(zip(ids, ids[1:], strict=False))
        assert len(set(pairs)) >= len(pairs) - 1  # decoding and re-encoding may merge one boundary
    for name in ("smollm2_cpu", "smollm2_cpu_quality"):
        recipe = yaml.safe_load((REPO_ROOT / "configs" / "sft" / f"{name}.yaml").read_text())
        assert recipe["task_no_repeat_ngram_size"] == 4, name


@pytest.mark.slow
def test_the_training_checks_copy_sees_only_what_the_prompts_could(tmp_path):
    """The copy baseline beside the task metric copies another user's older review of the item, from the
    store with its task pairs blocked: never the user's own earlier review of it, never a task's target."""
    from conftest import write_lines

    from eval.review.training_check import ReviewTaskMetric

    day = lambda d: f"2020-01-{d:02d} 12:00:00"  # noqa: E731
    rows = [
        ("own1", "u1", "b0", 1, "my first visit, lovely pancakes"),
        ("oth1", "u2", "b0", 2, "decent pancakes and coffee"),
        ("task", "u3", "b0", 3, "my first visit, lovely pancakes again"),  # a task's target: blocked
        ("own2", "u1", "b1", 3, "my first visit here, lovely waffles"),
        ("own3", "u1", "b0", 4, "back for the pancakes"),
    ]
    reviews = [
        {"review_id": r, "user_id": u, "business_id": b, "stars": 4.0, "text": t, "date": day(d)}
        for r, u, b, d, t in rows
    ]
    path = write_lines(tmp_path / "yelp_academic_dataset_review.json.gz", reviews)
    build.main(["--source", "yelp", "--input", str(path), "--out", str(tmp_path / "data")])
    (tmp_path / "tasks").mkdir()
    (tmp_path / "tasks" / "task_0.json").write_text(json.dumps({"user_id": "u3", "item_id": "b0"}))
    folder = tmp_path / "pairs"
    folder.mkdir()
    card = {"data": [{"dir": str(tmp_path / "data"), "tasks": str(tmp_path / "tasks")}]}
    (folder / "card.json").write_text(json.dumps(card))
    row = {"user_id": "u1", "item_id": "b0", "date": day(4)}
    row["completion"] = [{"role": "assistant", "content": "stars: 4\nreview: back for the pancakes"}]
    metric = ReviewTaskMetric(str(folder), [row], str(tmp_path / "out"))
    assert metric.copies == [(4.0, "decent pancakes and coffee")]
