"""Fine-tune an LLM to write a user's stars and review: TRL SFTTrainer + PEFT LoRA / QLoRA.

    # one CPU or one GPU
    python -m train.sft --config configs/sft/smollm2_cpu.yaml
    python -m train.sft --config configs/sft/smollm2_cpu.yaml --max_steps 20 --output_dir runs/sft/try
    # several processes / GPUs on one node (accelerate configs in configs/accelerate/)
    accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml -m train.sft --config configs/sft/qwen2.5-7b_lora.yaml
    # a Slurm cluster, several nodes
    sbatch --nodes 2 slurm/train.sbatch configs/sft/qwen2.5-7b_qlora.yaml

The recipe is a YAML file of TRL's SFTConfig and ModelConfig fields plus RecipeArguments below;
command-line flags override it; unknown keys are an error. ``max_length`` is not set in recipes: it is
the token budget the pairs were fitted to (their card.json), so the two cannot disagree. The loss is
on the completion (stars and review) plus EOS only. Gradient accumulation is computed from
``global_batch_size``. A run resumes from the last complete checkpoint in output_dir by itself, but
only when output_dir/fingerprint.json shows the same inputs (pairs, model, recipe, the settings that
shape training); otherwise it stops naming what changed, unless ``--overwrite`` (which removes the
earlier run). An explicit ``--resume_from_checkpoint`` that is missing or empty is an error.

output_dir then holds the LoRA adapter, the tokenizer with its chat template, a generation config
whose EOS is the chat template's end-of-turn token, loss.png and a README.md model card (base model
and revision, the training data's card, the recipe, the git commit, the LoRA settings) and
training_data.json (the pairs' review ids and latest target time).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from data_prep import fingerprint
from data_prep.io import read_jsonl
from data_prep.offline_models import resolve_model
from data_prep.prompt import parse_completion, training_prompt
from data_prep.provenance import provenance
from train.batch import gradient_accumulation


@dataclass
class RecipeArguments:
    pairs: str = field(metadata={"help": "a folder written by python -m data_prep.pairs"})
    global_batch_size: int = field(
        default=16, metadata={"help": "examples per optimizer step, all processes"}
    )
    max_train_examples: int | None = field(
        default=None, metadata={"help": "use the first N training examples"}
    )
    max_eval_examples: int | None = field(
        default=None,
        metadata={
            "help": "use N validation examples spread evenly over the file (many users, not the first few)"
        },
    )
    sample_generations: int = field(
        default=4, metadata={"help": "validation examples generated at each evaluation"}
    )
    task_metric: str | None = field(
        default=None,
        metadata={
            "help": "the task's own metric at step 0 and at every evaluation, by import path module:function "
            "(eval.training:review_task_metric for review pairs); the best checkpoint is kept by it when the "
            "recipe says metric_for_best_model"
        },
    )
    task_examples: int = field(default=16, metadata={"help": "validation pairs the task metric answers"})
    task_max_new_tokens: int = field(default=128, metadata={"help": "the task metric's answer length cap"})
    task_no_repeat_ngram_size: int = field(
        default=0,
        metadata={
            "help": "the task metric's greedy answers block every n-gram's repeat, as the agents that use the "
            "adapter decode (0: no block)"
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": "stop after this many evaluations without a better metric_for_best_model (0: never)"
        },
    )
    wandb_project: str = field(default="usersim")
    overwrite: bool = field(
        default=False,
        metadata={"help": "discard checkpoints in output_dir that were made from other inputs"},
    )


def parse(argv: list[str] | None = None):
    from trl import ModelConfig, SFTConfig, TrlParser

    refuse_quantized_under_zero3(argv)
    parser = TrlParser((RecipeArguments, SFTConfig, ModelConfig))
    return parser.parse_args_and_config(args=argv)  # unknown YAML keys raise ValueError


def refuse_quantized_under_zero3(argv: list[str] | None) -> None:
    """Under ``accelerate launch`` with a ZeRO-3 config (its environment says so), a quantized base is
    refused before anything is parsed or loaded, naming what trains it (train.batch has the message;
    slurm/train.sbatch checks the same before it launches)."""
    from accelerate.utils import parse_flag_from_env

    from train.batch import QUANTIZED_WITH_ZERO3, quantized

    if (
        not parse_flag_from_env("ACCELERATE_USE_DEEPSPEED")
        or os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") != "3"
    ):
        return
    argv = list(sys.argv[1:] if argv is None else argv)
    recipe = argv[argv.index("--config") + 1] if "--config" in argv[:-1] else None
    recipe = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), recipe)
    if quantized(recipe, argv):
        raise SystemExit(f"error: {QUANTIZED_WITH_ZERO3}")


def explicit_keys(argv: list[str] | None) -> set[str]:
    """The settings a recipe YAML (``--config PATH``, as TrlParser takes it) or a flag gives explicitly,
    not left at their defaults; flags in either spelling (--max_length, --max-length, --max_length=N)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    keys = {a[2:].split("=")[0].replace("-", "_") for a in argv if a.startswith("--")}
    if "--config" in argv[:-1]:
        keys |= set(yaml.safe_load(Path(argv[argv.index("--config") + 1]).read_text()) or {})
    return keys


def pairs_card(recipe: RecipeArguments) -> dict:
    path = Path(recipe.pairs) / "card.json"
    if not path.exists():
        raise SystemExit(f"error: {path} is missing: make the pairs with python -m data_prep.pairs")
    return json.loads(path.read_text())


def set_max_length(training_args, card: dict, recipe: RecipeArguments, explicit: bool) -> None:
    """max_length comes from one place, the token budget the pairs were fitted to: a recipe or flag
    that says otherwise is an error, not a silent cut."""
    budget = card["options"]["max_tokens"]
    if explicit and training_args.max_length != budget:
        raise SystemExit(
            f"error: the pairs in {recipe.pairs} were fitted to {budget} tokens (prompt + completion + EOS), "
            f"but max_length is {training_args.max_length}. Leave max_length out (it is taken from the "
            "pairs), or rebuild the pairs with python -m data_prep.pairs --max-tokens N"
        )
    training_args.max_length = budget


# Training settings that shape the weights (with the model settings, the pairs and the recipe's
# batch and data limits): a resume whose values differ would continue another run.
TRAJECTORY_FIELDS = (
    "learning_rate",
    "lr_scheduler_type",
    "lr_scheduler_kwargs",
    "warmup_steps",
    "warmup_ratio",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim",
    "max_grad_norm",
    "num_train_epochs",
    "max_steps",
    "seed",
    "data_seed",
    "bf16",
    "fp16",
    "max_length",
    "packing",
    "packing_strategy",
    "padding_free",
    "completion_only_loss",
    "assistant_only_loss",
    "loss_type",
    "neftune_noise_alpha",
    # which checkpoint the run keeps (the best by the task metric) and when it stops
    "eval_steps",
    "load_best_model_at_end",
    "metric_for_best_model",
    "greater_is_better",
)


def run_inputs(recipe: RecipeArguments, training_args, model_args) -> dict:
    """What a training run's result depends on (data_prep.fingerprint)."""
    pairs = Path(recipe.pairs)
    training = training_args.to_dict()
    return {
        "pairs": fingerprint.digest_files([pairs / "train.jsonl", pairs / "validation.jsonl"], pairs),
        "recipe": {
            **{
                k: getattr(recipe, k)
                for k in (
                    "global_batch_size",
                    "max_train_examples",
                    "max_eval_examples",
                    "task_metric",
                    "task_examples",
                    "task_max_new_tokens",
                    "early_stopping_patience",
                )
            },
            "eval_selection": "spread",  # which validation rows max_eval_examples takes (was: the first)
            # recorded only when set, so a folder trained before the setting existed still resumes
            **({"task_no_repeat_ngram_size": n} if (n := recipe.task_no_repeat_ngram_size) else {}),
        },
        "model": asdict(model_args),
        "training": {k: training.get(k) for k in TRAJECTORY_FIELDS},
    }


def check_fingerprint(recipe: RecipeArguments, training_args, model_args) -> str:
    """Refuse to resume from checkpoints made from other inputs (unless --overwrite, which removes
    them). Every process reads the same record and reaches the same verdict (so all stop together);
    then the main process alone removes and records. Returns the digest of the inputs."""
    from accelerate import PartialState

    state = PartialState()
    output_dir = Path(training_args.output_dir)
    has_work = output_dir.is_dir() and (
        any(output_dir.glob("checkpoint-*")) or (output_dir / "adapter_model.safetensors").exists()
    )
    inputs = run_inputs(recipe, training_args, model_args)
    keep = fingerprint.verdict(output_dir, inputs, overwrite=recipe.overwrite, has_work=has_work)
    state.wait_for_everyone()  # everyone has read the old record before it changes
    if state.is_main_process:
        if not keep:
            for path in output_dir.iterdir():
                shutil.rmtree(path) if path.is_dir() else path.unlink()
            print(f"--overwrite: removed the earlier run in {output_dir}")
        fingerprint.record(output_dir, inputs)
    state.wait_for_everyone()
    return fingerprint.digest(inputs)


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest checkpoint-N folder that finished saving (trainer_state.json is written last)."""
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    done = [
        p
        for p in folder.glob("checkpoint-*")
        if (p / "trainer_state.json").exists() and p.name[11:].isdigit()
    ]
    return str(max(done, key=lambda p: int(p.name[11:]))) if done else None


def saved_state(checkpoint: str) -> dict:
    """The trainer state a checkpoint saved (its trainer_state.json, as JSON)."""
    return json.loads((Path(checkpoint) / "trainer_state.json").read_text())


def ended(checkpoint: str) -> bool:
    """Whether training ended at ``checkpoint``: it reached max_steps, or the early stopping it saved
    there had run out of patience (its counter reached early_stopping_patience)."""
    state = saved_state(checkpoint)
    if 0 < state.get("max_steps", 0) <= state["global_step"]:
        return True
    early = state.get("stateful_callbacks", {}).get("EarlyStoppingCallback", [])
    for saved in early if isinstance(early, list) else [early]:  # a list when there were several
        patience = saved.get("args", {}).get("early_stopping_patience")
        if (
            patience is not None
            and saved.get("attributes", {}).get("early_stopping_patience_counter", 0) >= patience
        ):
            return True
    return False


def finished(checkpoint: str, output_dir: str) -> bool:
    """Whether ``checkpoint`` is the last step of a run that ended there and saved its adapter and card
    (the card's steps are the checkpoint's; the run ended, or its card says it stopped early)."""
    state = saved_state(checkpoint)
    card = Path(output_dir) / "training_card.json"
    if not (card.exists() and (Path(output_dir) / "adapter_model.safetensors").exists()):
        return False
    record = json.loads(card.read_text())
    if record.get("steps") != state["global_step"]:
        return False
    return ended(checkpoint) or bool(record.get("stopped_early"))


def load_ended_run(trainer, checkpoint: str) -> None:
    """A run that ended at ``checkpoint`` but whose process died before it saved the adapter and card:
    take its state from there and the weights it would have saved (the best checkpoint's when
    load_best_model_at_end, else this one's), so the save below writes the adapter the run would have.
    The card's throughput covers no steps: their runtime was not saved. One process or DDP only: under
    FSDP or DeepSpeed the model is sharded only by ``train()``, so the kept checkpoint is named instead."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file
    from transformers import TrainerState

    trainer.state = TrainerState.load_from_json(str(Path(checkpoint) / "trainer_state.json"))
    best = trainer.state.best_model_checkpoint
    kept = best if trainer.args.load_best_model_at_end and best else checkpoint
    if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
        raise SystemExit(
            f"error: {checkpoint} ended the run but no adapter and card were saved, and a sharded launch "
            f"cannot save them without training: the kept adapter is {kept} (a PEFT adapter folder)"
        )
    loaded = set_peft_model_state_dict(
        trainer.model, load_file(str(Path(kept) / "adapter_model.safetensors"))
    )
    missing = [k for k in loaded.missing_keys if "lora_" in k]  # the base weights are missing by design
    if loaded.unexpected_keys or missing:
        raise SystemExit(
            f"error: {kept}'s adapter does not fit this model: unexpected {loaded.unexpected_keys[:3]}, "
            f"missing {missing[:3]}"
        )
    trainer.accelerator.print(
        f"{checkpoint} ended the run at step {trainer.state.global_step} but no adapter and card were saved: "
        f"saving them now from {kept}"
    )


def drop_answers_of_an_earlier_start(output_dir: str) -> None:
    """A run that starts at step 0 keeps no evaluation answers of an earlier start that died before its
    first checkpoint (output_dir/task_eval, samples): the task metric scores again those of a resumed
    run, and they must be this run's. The main process removes them; the others wait."""
    from accelerate import PartialState

    state = PartialState()
    if state.is_main_process:
        for name in ("task_eval", "samples"):
            shutil.rmtree(Path(output_dir) / name, ignore_errors=True)
    state.wait_for_everyone()


def resume_point(explicit: str | None, output_dir: str) -> str | None:
    if explicit:
        path = Path(explicit)
        if not path.is_dir() or not any(path.iterdir()):
            raise SystemExit(f"error: --resume_from_checkpoint {explicit} is missing or empty")
        return explicit
    return last_complete_checkpoint(output_dir)


def stable_wandb_run_id(output_dir: str, inputs_digest: str = "") -> str:
    """The same id for every (re)start of one run (a Slurm requeue or a manual restart resumes it); a
    run started afresh from other inputs (--overwrite) gets another."""
    return hashlib.sha256(f"{Path(output_dir).resolve()}:{inputs_digest}".encode()).hexdigest()[:16]


def trl_example(tokenizer, example: dict) -> dict:
    """One pair as TRL's text prompt/completion: the prompt rendered by the shared renderer (one BOS,
    as served), the completion as written (TRL appends EOS), so the loss covers exactly the completion
    plus EOS and the prompt's token ids are those the agents feed the model."""
    return {
        "prompt": training_prompt(tokenizer, example["prompt"]),
        "completion": example["completion"][0]["content"],
    }


def spread(total: int, n: int) -> list[int]:
    """min(n, total) row indices spread evenly over range(total), first and last included."""
    m = min(n, total)
    return sorted({round(k * (total - 1) / max(m - 1, 1)) for k in range(m)})


def load_pairs(recipe: RecipeArguments, tokenizer):
    """The pairs' train.jsonl and validation.jsonl (the files the run's fingerprint hashes), rendered."""
    from datasets import Dataset

    out = {}
    for split, limit in (("train", recipe.max_train_examples), ("validation", recipe.max_eval_examples)):
        data = Dataset.from_json(str(Path(recipe.pairs) / f"{split}.jsonl"))
        if not limit:
            part = data
        elif split == "train":
            part = data.select(range(min(limit, len(data))))
        else:  # the file is grouped by user: the first N rows would be one or two users
            part = data.select(spread(len(data), limit))
        out[split] = part.map(
            lambda example: trl_example(tokenizer, example),
            remove_columns=part.column_names,
            desc=f"rendering {split}",
        )
    return out


def check_supervision(texts, tokenizer, max_length: int | None) -> None:
    """An example whose prompt alone fills max_length has no supervised token left: an error (TRL
    would drop it silently). Tokenized as TRL does, with the tokenizer's special tokens."""
    if not max_length:
        return
    lengths = [len(ids) for ids in tokenizer(list(texts["prompt"]))["input_ids"]]
    full = [i for i, n in enumerate(lengths) if n >= max_length]
    if full:
        raise ValueError(
            f"{len(full)} of {len(lengths)} training examples have no supervised token once cut to max_length="
            f"{max_length} (first: {full[:10]}); rebuild the pairs with a smaller --max-tokens or raise max_length"
        )


class SampleGenerations:
    """At each evaluation: greedy generations for a few validation prompts next to the truth, written
    to output_dir/samples/step_N.jsonl and logged to W&B as a table when W&B is on.

    Every process generates and only the main one writes: with sharded weights (FSDP, ZeRO-3) each
    decoding step gathers the shards from all ranks, so a rank-0-only ``generate`` waits forever for the
    others. ``synced_gpus`` keeps the ranks stepping together until all are done (transformers turns
    it on by itself for ZeRO-3 but not for an FSDP2 model); under DDP the other ranks would wait for
    rank 0 anyway. The Trainer registers ``generate`` as an FSDP2 forward method, so the root's own
    parameters are gathered too."""

    def __init__(self, tokenizer, examples: list[dict], output_dir: str, max_new_tokens: int = 128):
        self.tokenizer, self.examples, self.output_dir, self.max_new_tokens = (
            tokenizer,
            examples,
            output_dir,
            max_new_tokens,
        )

    def __call__(self, model, step: int, write: bool = True) -> list[dict]:
        rows = []
        texts = greedy_answers(
            model, self.tokenizer, [e["prompt"] for e in self.examples], self.max_new_tokens
        )
        for example, text in zip(self.examples, texts, strict=True):
            stars, _ = parse_completion(text)
            true_stars, _ = parse_completion(example["completion"])
            rows.append(
                {
                    "step": step,
                    "generated": text,
                    "truth": example["completion"],
                    "stars": stars,
                    "true_stars": true_stars,
                }
            )
        if not write:
            return rows
        folder = Path(self.output_dir) / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"step_{step}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        try:
            import wandb

            if wandb.run is not None:
                table = wandb.Table(columns=list(rows[0]), data=[list(r.values()) for r in rows])
                wandb.log({"sample_generations": table}, commit=False)
        except ImportError:
            pass
        return rows


def greedy_answers(
    model,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int,
    batch_size: int = 1,
    no_repeat_ngram_size: int = 0,
) -> list[str]:
    """Greedy answers for rendered prompts, tokenized as TRL tokenizes the training prompt (with the
    tokenizer's special tokens), ``batch_size`` at a time, left-padded (``no_repeat_ngram_size``: no
    n-gram twice, 0 for none); the tokenizer's padding side is restored after. Every rank calls it
    (see SampleGenerations: ``synced_gpus`` keeps sharded ranks stepping together)."""
    import torch
    import torch.distributed as dist

    synced = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    was_training, side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    texts = []
    try:
        for start in range(0, len(prompts), batch_size):
            inputs = tokenizer(prompts[start : start + batch_size], return_tensors="pt", padding=True)
            inputs = inputs.to(model.device)
            with torch.no_grad():
                output = model.generate(
                    **inputs,
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    no_repeat_ngram_size=no_repeat_ngram_size,
                    pad_token_id=tokenizer.pad_token_id,
                    synced_gpus=synced,
                )
            new = output[:, inputs["input_ids"].shape[1] :]
            texts += tokenizer.batch_decode(new, skip_special_tokens=True)
    finally:
        model.train(was_training)
        tokenizer.padding_side = side
    return texts


def check_saved_adapter(folder: str | Path, model) -> int:
    """The adapter in ``folder`` reloads and holds every LoRA matrix of ``model`` at its full shape:
    (r, in_features) and (out_features, r), from each LoRA layer's own record, which sharding (FSDP,
    ZeRO-3) does not change. A sharded save that wrote nothing, shards or empty tensors fails here, not
    at inference. Returns the number of LoRA matrices checked."""
    from peft.tuners.lora import LoraLayer
    from peft.utils import load_peft_weights

    path = Path(folder) / "adapter_model.safetensors"
    if not path.exists():
        raise RuntimeError(
            f"{path} was not written (an FSDP run saves an adapter only with fsdp_state_dict_type: "
            "FULL_STATE_DICT, as in configs/accelerate/fsdp.yaml)"
        )
    saved = {k: tuple(v.shape) for k, v in load_peft_weights(str(folder), device="cpu").items()}
    expected = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            for adapter, r in module.r.items():
                if adapter in module.lora_A:
                    expected[f"{name}.lora_A.weight"] = (r, module.in_features)
                    expected[f"{name}.lora_B.weight"] = (module.out_features, r)
    # other saved tensors (a DoRA magnitude, modules_to_save) are allowed; no LoRA matrix may be missing
    missing = sorted(set(expected) - set(saved))
    wrong = sorted(k for k in set(saved) & set(expected) if saved[k] != expected[k])
    empty = sorted(k for k, shape in saved.items() if 0 in shape)
    if not expected or missing or wrong or empty:
        raise RuntimeError(
            f"{path} does not hold the full adapter: {len(expected)} LoRA matrices expected, {len(missing)} "
            f"missing (first {missing[:3]}), wrong shapes {[(k, saved[k], expected[k]) for k in wrong[:3]]}, "
            f"empty {empty[:3]}"
        )
    return len(expected)


STOP_FILE = "USERSIM_STOP_FILE"  # slurm/train.sbatch names the file it creates on USR1


def stop_callback(path: str):
    """A requeue that loses no training: when ``path`` appears (slurm/train.sbatch creates it when Slurm
    warns, ten minutes before the time limit), every rank stops after the step in progress and the
    trainer saves a checkpoint there. Rank 0 looks for the file and tells the others (one small
    broadcast a step), so all stop at the same step. ``requested`` says whether it happened."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list
    from transformers import TrainerCallback

    class SaveAndStop(TrainerCallback):
        requested = False

        def on_step_end(self, args, state, control, **kwargs):
            seen = [Path(path).exists()]
            if PartialState().num_processes > 1:
                broadcast_object_list(seen, from_process=0)
            if seen[0]:
                self.requested = control.should_save = control.should_training_stop = True

    return SaveAndStop()


def check_one_process_sees_one_gpu(training_args) -> None:
    """A plain ``python -m train.sft`` is one process; with several GPUs visible, TRL refuses
    DataParallel only after the model has loaded. Refuse before, saying how to use them."""
    import torch

    if training_args.use_cpu or os.environ.get("LOCAL_RANK") is not None:  # CPU, or launched distributed
        return
    visible = torch.cuda.device_count()
    if visible > 1:
        raise SystemExit(
            f"error: one process sees {visible} GPUs, and training does not split over GPUs within one process. "
            f"Use them all with `accelerate launch --config_file configs/accelerate/multi_gpu_ddp.yaml "
            f"--num_processes {visible} -m train.sft --config ...`, or one with "
            "`CUDA_VISIBLE_DEVICES=0 python -m train.sft --config ...`"
        )


def load_task_metric(recipe: RecipeArguments, tokenizer, output_dir: str):
    """The recipe's task metric (``task_metric: module:function``), built on ``task_examples`` validation
    pairs spread over the file; None when the recipe names none. Loaded by import path: train never
    imports the evaluator. The protocol: the factory takes (pairs folder, rows each with its rendered
    prompt under ``rendered``, output_dir, max_new_tokens) and returns an object with ``prompts`` and
    ``max_new_tokens``; called with the greedy answers to its prompts, a step and ``write``, it returns
    the metrics; ``summary(kept_step)`` gives the card its record."""
    import importlib

    if not recipe.task_metric:
        return None
    module, _, name = recipe.task_metric.partition(":")
    if not name:
        raise SystemExit(f"error: task_metric {recipe.task_metric!r} is not module:function")
    factory = getattr(importlib.import_module(module), name)
    validation = read_jsonl(Path(recipe.pairs) / "validation.jsonl", whole=True)
    rows = [validation[i] for i in spread(len(validation), recipe.task_examples)]
    for row in rows:
        row["rendered"] = training_prompt(tokenizer, row["prompt"])
    return factory(recipe.pairs, rows, output_dir, recipe.task_max_new_tokens)


def make_callback(
    sampler: SampleGenerations, task_metric=None, tokenizer=None, no_repeat_ngram_size: int = 0
):
    from transformers import TrainerCallback

    class Callback(TrainerCallback):
        kept_metric = task_metric  # write_card asks it for the curve and the paired comparisons

        def on_evaluate(self, args, state, control, model=None, metrics=None, **kwargs):
            if model is not None and sampler.examples:  # on every rank (see SampleGenerations)
                sampler(model, state.global_step, write=state.is_world_process_zero)
            if model is not None and task_metric is not None:  # every rank: the same pairs, the same verdict
                answers = greedy_answers(
                    model, tokenizer, task_metric.prompts, task_metric.max_new_tokens, 8, no_repeat_ngram_size
                )
                found = task_metric(answers, state.global_step, write=state.is_world_process_zero)
                record = {f"eval_{k}": v for k, v in found.items()}
                if metrics is not None:  # what the Trainer keeps the best checkpoint by
                    metrics.update(record)
                state.log_history.append({**record, "step": state.global_step})
                try:
                    import wandb

                    if wandb.run is not None:
                        wandb.log(record, commit=False)
                except ImportError:
                    pass

        def on_save(self, args, state, control, model=None, **kwargs):
            if state.is_world_process_zero and model is not None:
                check_saved_adapter(Path(args.output_dir) / f"checkpoint-{state.global_step}", model)

    return Callback()


def throughput(trainer, resumed_from_step: int = 0) -> dict:
    """Speed of this process's training and peak accelerator memory. A resumed run counts only the steps
    it ran itself: its runtime covers them, and TRL's token counter (num_tokens) restarts with it."""
    import torch

    history = trainer.state.log_history
    steps = trainer.state.global_step - resumed_from_step
    mine = [h["num_tokens"] for h in history if h.get("step", 0) > resumed_from_step and "num_tokens" in h]
    tokens = max(mine, default=0)
    runtime = next((h["train_runtime"] for h in reversed(history) if "train_runtime" in h), None)
    out = {
        "resumed_from_step": resumed_from_step,
        "steps_this_process": steps,
        "tokens": tokens,
        "train_runtime_s": runtime,
        "seconds_per_step": round(runtime / steps, 2) if runtime and steps else None,
        "tokens_per_second": round(tokens / runtime, 1) if runtime else None,
    }
    if torch.cuda.is_available():
        out["peak_gpu_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


# what an adapter is for, by its pairs' task (their card.json): the model card's title and summary
TASKS = {
    "review": ("user review simulation", "Predicts the stars and the review a user would write for an item"),
    "converse": (
        "the conversational user simulator",
        "Writes a user's next turn and its intent in a dialogue",
    ),
    "sandbox_choice": (
        "the sandbox's choice of a film",
        "Predicts the number, on a page, of the film a MovieLens user watches next (data_prep.choice_pairs)",
    ),
}


def write_card(
    output_dir: str,
    recipe,
    training_args,
    model_args,
    base: str,
    trainer,
    wandb: dict,
    resumed_from_step: int,
    task_summary: dict | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    history = trainer.state.log_history
    train_points = [(h["step"], h["loss"]) for h in history if "loss" in h]
    eval_points = [(h["step"], h["eval_loss"]) for h in history if "eval_loss" in h]
    plot = (task_summary or {}).get("plot")
    by_step = {h["step"]: h for h in history if any(k.startswith("eval_task_") for k in h)} if plot else {}
    task_points = [by_step[step] for step in sorted(by_step)]
    if task_points:  # the whole curve, evaluations before a resume included (trainer_state.json keeps them)
        keys = {k for pair in plot["series"].values() for k in pair if k} | {"task_unreadable"}
        task_summary["curve"] = [
            {"step": h["step"], **{k: h[f"eval_{k}"] for k in sorted(keys) if f"eval_{k}" in h}}
            for h in task_points
        ]
    fig, axes = plt.subplots(1, 2 if task_points else 1, figsize=(11 if task_points else 6, 3.5))
    ax = axes[0] if task_points else axes
    if train_points:
        ax.plot(*zip(*train_points, strict=True), label="train")
    if eval_points:
        ax.plot(*zip(*eval_points, strict=True), "o-", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (completion tokens)")
    ax.legend()
    if task_points:  # the task's own metric on validation, each series beside its dotted reference
        steps = [h["step"] for h in task_points]
        for k, (label, (key, reference)) in enumerate(plot["series"].items()):
            colour = f"C{k}"
            if key:
                axes[1].plot(steps, [h[f"eval_{key}"] for h in task_points], "o-", color=colour, label=label)
            if reference:  # a series may have no reference (a parse rate)
                axes[1].axhline(
                    task_points[0][f"eval_{reference}"],
                    color=colour,
                    ls=":",
                    lw=1,
                    label=None if key else label,
                )
        if "kept_step" in task_summary:
            axes[1].axvline(task_summary["kept_step"], color="grey", lw=1)
        axes[1].set_xlabel("step (grey: the kept checkpoint)")
        axes[1].set_ylabel(plot["ylabel"])
        axes[1].set_title(plot["title"], fontsize=9)
        axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(output_dir) / "loss.png", dpi=120)
    plt.close(fig)

    data_card_path = Path(recipe.pairs) / "card.json"
    data_card = json.loads(data_card_path.read_text()) if data_card_path.exists() else None
    recipe_dump = {
        "recipe": asdict(recipe),
        "model": asdict(model_args),
        "training": {k: v for k, v in training_args.to_dict().items() if not k.startswith("_")},
    }
    card = {
        "base_model": model_args.model_name_or_path,
        "base_model_loaded_from": base,
        "base_model_revision": model_args.model_revision,
        "lora": {
            "rank": model_args.lora_r,
            "alpha": model_args.lora_alpha,
            "dropout": model_args.lora_dropout,
            "target_modules": model_args.lora_target_modules,
            "4bit": model_args.load_in_4bit,
        },
        "steps": trainer.state.global_step,
        "stopped_early": 0 < trainer.state.global_step < trainer.state.max_steps,
        "throughput": throughput(trainer, resumed_from_step),
        "final_train_loss": train_points[-1][1] if train_points else None,
        "train_losses": [loss for _, loss in train_points],
        "final_eval_loss": eval_points[-1][1] if eval_points else None,
        "best_checkpoint": trainer.state.best_model_checkpoint,
        "task_metric": task_summary,
        "wandb": wandb,
        "provenance": provenance(
            ["torch", "transformers", "trl", "peft", "accelerate", "datasets", "bitsandbytes"]
        ),
    }
    (Path(output_dir) / "training_card.json").write_text(
        json.dumps({**card, **recipe_dump, "data": data_card}, indent=2, default=str)
    )
    task = (data_card or {}).get("task", "review")
    what = TASKS.get(task, TASKS["review"])
    text = [
        f"# LoRA adapter: {what[0]} on {model_args.model_name_or_path}",
        "",
        f"{what[1]}, from the prompt of data_prep/prompt.py.",
        "",
        *learned(task_summary),
        *(f"- **{k}**: `{json.dumps(v, default=str)}`" for k, v in card.items()),
        f"- **training data**: `{recipe.pairs}` — `{json.dumps(data_card, default=str) if data_card else 'no card'}`",
        "",
        "## Recipe",
        "```yaml",
        yaml.safe_dump(json.loads(json.dumps(recipe_dump, default=str)), sort_keys=False).strip(),
        "```",
        "",
        "Loss curve and the task metric beside its references: loss.png. Full record: training_card.json.",
    ]
    (Path(output_dir) / "README.md").write_text("\n".join(text) + "\n")


def learned(task_summary: dict | None) -> list[str]:
    """The card's first section: the task metric at each evaluation beside its references, the step
    kept, and the paired differences at it (the metric's own summary)."""
    if not task_summary or not task_summary.get("curve"):
        return []
    keys = [k for pair in task_summary["plot"]["series"].values() for k in pair if k]
    lines = [
        f"## What it learned ({task_summary['examples']} validation examples, greedy answers)",
        "",
        "| step | " + " | ".join(keys) + " |",
        "|---" * (len(keys) + 1) + "|",
    ]
    for point in task_summary["curve"]:
        kept = " (kept)" if point["step"] == task_summary.get("kept_step") else ""
        lines.append(f"| {point['step']}{kept} | " + " | ".join(str(point.get(k, "–")) for k in keys) + " |")
    lines.append("")
    for name, by_metric in task_summary.items():
        if name.startswith("adapter_minus_"):
            for metric, d in by_metric.items():
                low, high = d["ci95"]
                lines.append(
                    f"- {name.replace('_', ' ')}, {metric}: {d['difference']:+.4f} [{low:+.4f}, {high:+.4f}] "
                    f"(paired, {d['n']} examples)"
                )
    return [*lines, ""]


def write_training_data(output_dir: str, recipe: RecipeArguments) -> None:
    """training_data.json beside the adapter: the pairs it trained on (folder, hash), their review (or
    example) ids
    (so a validation set can be kept disjoint from them) and the latest target time among them (so a
    run can say which tasks the adapter's training data postdates)."""
    from data_prep.schema import parse_iso

    pairs = Path(recipe.pairs)
    rows = read_jsonl(pairs / "train.jsonl", whole=True)
    rows = rows[: recipe.max_train_examples] if recipe.max_train_examples else rows
    record = {
        "pairs": str(pairs),
        "pairs_sha256": fingerprint.digest_files([pairs / "train.jsonl", pairs / "validation.jsonl"], pairs),
        "train_examples": len(rows),
        "latest_target_ts": max((parse_iso(r["date"]) for r in rows if r.get("date")), default=None),
        "train_review_ids": [r["review_id"] for r in rows if "review_id" in r],
        # pairs of other kinds (data_prep.converse_pairs) name their examples example_id
        "train_example_ids": [r["example_id"] for r in rows if "example_id" in r],
    }
    (Path(output_dir) / "training_data.json").write_text(json.dumps(record))


def load_model(base: str, model_args, training_args):
    """The base model, loaded here rather than by TRL so that QLoRA gets one whole copy per process on
    that process's device (TRL passes device_map=None under DDP and DeepSpeed, and "auto" otherwise,
    which under FSDP would spread one copy over all of a node's GPUs). Under sharding (FSDP, ZeRO-3)
    the 4-bit weights are stored in the compute dtype (bnb_4bit_quant_storage) so that they can be
    flattened and sharded with the rest."""
    import torch
    from accelerate.utils import parse_flag_from_env
    from transformers import AutoModelForCausalLM
    from trl import get_quantization_config

    dtype = model_args.dtype or "auto"
    init = {
        "revision": model_args.model_revision,
        "dtype": getattr(torch, dtype) if dtype != "auto" else dtype,
        "trust_remote_code": training_args.trust_remote_code,
    }
    if model_args.attn_implementation:
        init["attn_implementation"] = model_args.attn_implementation
    if model_args.load_in_4bit or model_args.load_in_8bit:
        # accelerate launch says so in the environment (its PartialState reports FSDP as MULTI_GPU)
        sharded = parse_flag_from_env("ACCELERATE_USE_FSDP") or training_args.deepspeed_plugin is not None
        if sharded and model_args.load_in_4bit and not model_args.bnb_4bit_quant_storage:
            model_args.bnb_4bit_quant_storage = dtype if dtype != "auto" else "bfloat16"
        init["quantization_config"] = get_quantization_config(model_args)
        device = training_args.device
        init["device_map"] = {"": device.index if device.type == "cuda" else device.type}
    init.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = None  # used here; TRL ignores it for a loaded model
    return AutoModelForCausalLM.from_pretrained(base, **init)


def fetch_model(base: str, revision: str | None) -> str | None:
    """The base model's files into the local Hugging Face cache (a hub id; a local folder needs nothing):
    the weights, config and tokenizer files, not other formats. Returns the snapshot folder, or None."""
    if Path(base).exists():
        return None
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "tokenizer*"]
    return snapshot_download(base, revision=revision, allow_patterns=patterns)


def reentrant_checkpointing_for_zero3(training_args, model_args) -> bool:
    """PEFT + DeepSpeed ZeRO-3 + activation checkpointing needs reentrant checkpointing (otherwise:
    "Recomputed values ... have different metadata"). TRL 1.16 asks for it in the deprecated
    gradient_checkpointing_kwargs, which transformers 5.23 no longer reads; this sets the current field.
    Returns whether it did."""
    plugin = training_args.deepspeed_plugin
    if not (model_args.use_peft and plugin is not None and plugin.zero_stage == 3):
        return False
    if not training_args.activation_checkpointing:
        return False
    kwargs = dict(training_args.activation_checkpointing_kwargs or {})
    training_args.activation_checkpointing_kwargs = {**kwargs, "use_reentrant": True}
    return True


def check_evaluation(training_args) -> None:
    """A run that evaluates at step 0 must evaluate at all: eval_on_start with eval_strategy no has no
    validation set to read (the Trainer would fail at step 0 saying only that it has no eval_dataset)."""
    if training_args.eval_on_start and training_args.eval_strategy == "no":
        raise SystemExit(
            "error: eval_on_start is true but eval_strategy is no: a run without evaluations has no step-0 "
            "evaluation. Pass --eval_on_start false, or an eval_strategy of steps or epoch"
        )


def build_trainer(argv: list[str] | None = None, callbacks: list | None = None):
    """Everything up to training: configuration, data, model, trainer (checked). Returns
    (trainer, tokenizer, recipe, training_args, model_args, base, resume)."""
    # -- configuration ---------------------------------------------------------------------------------
    recipe, training_args, model_args = parse(argv)
    check_one_process_sees_one_gpu(training_args)
    check_evaluation(training_args)
    card = pairs_card(recipe)
    set_max_length(training_args, card, recipe, "max_length" in explicit_keys(argv))
    if card.get("tokenizer") not in (model_args.model_name_or_path, None):
        print(
            f"warning: the pairs were fitted with the tokenizer of {card['tokenizer']}, this recipe trains "
            f"{model_args.model_name_or_path}: token budgets may not hold",
            file=sys.stderr,
        )
    training_args.gradient_accumulation_steps = gradient_accumulation(
        recipe.global_batch_size, training_args.per_device_train_batch_size, training_args.world_size
    )
    inputs_digest = check_fingerprint(recipe, training_args, model_args)
    resume = resume_point(training_args.resume_from_checkpoint, training_args.output_dir)
    if resume is None:
        drop_answers_of_an_earlier_start(training_args.output_dir)
    run_id = stable_wandb_run_id(training_args.output_dir, inputs_digest)
    # the W&B project and group of this adapter, kept in its training card: the evaluations of the
    # adapter (eval.review --wandb, eval.review.suite --wandb) log into the same group
    wandb_target = {
        "project": os.environ.get("WANDB_PROJECT", recipe.wandb_project),
        "group": os.environ.get("WANDB_RUN_GROUP", f"{Path(training_args.output_dir).name}-{run_id[:8]}"),
    }
    if "wandb" in (training_args.report_to or []):
        os.environ.setdefault("WANDB_PROJECT", wandb_target["project"])
        os.environ.setdefault("WANDB_RUN_GROUP", wandb_target["group"])
        os.environ.setdefault("WANDB_RUN_ID", run_id)
        os.environ.setdefault("WANDB_RESUME", "allow")

    from transformers import AutoTokenizer, set_seed
    from trl import SFTTrainer, get_peft_config

    set_seed(training_args.seed)

    # -- data ------------------------------------------------------------------------------------------
    # the first process of all downloads and builds the caches on shared storage; the others wait, then read
    with training_args.main_process_first(local=False, desc="the tokenizer and the datasets' cache"):
        base = resolve_model(model_args.model_name_or_path)
        tokenizer = AutoTokenizer.from_pretrained(
            base, revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code
        )
        data = load_pairs(recipe, tokenizer)
    check_supervision(data["train"], tokenizer, training_args.max_length)

    # -- model -----------------------------------------------------------------------------------------
    # the first process downloads the weights while the others wait; then every process loads them
    # (under ZeRO-3 loading is itself collective: no process may load while the others wait)
    with training_args.main_process_first(local=False, desc="the base model's files"):
        fetch_model(base, model_args.model_revision)
    model = load_model(base, model_args, training_args)
    reentrant_checkpointing_for_zero3(training_args, model_args)
    sampler = SampleGenerations(
        tokenizer,
        [data["validation"][i] for i in spread(len(data["validation"]), recipe.sample_generations)],
        training_args.output_dir,
    )
    task_metric = load_task_metric(recipe, tokenizer, training_args.output_dir)
    own = [make_callback(sampler, task_metric, tokenizer, recipe.task_no_repeat_ngram_size)]
    if recipe.early_stopping_patience:
        from transformers import EarlyStoppingCallback

        own.append(EarlyStoppingCallback(recipe.early_stopping_patience))
        # a resumed run keeps counting the evaluations without a better one (trainer_state.json)
        training_args.restore_callback_states_from_checkpoint = True
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=data["train"],
        eval_dataset=data["validation"] if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[*own, *(callbacks or [])],
    )
    if os.environ.get(STOP_FILE):
        trainer.add_callback(stop_callback(os.environ[STOP_FILE]))
    if trainer.is_fsdp_enabled:
        state_dict_type = str(trainer.accelerator.state.fsdp_plugin.state_dict_type)
        if "FULL_STATE_DICT" not in state_dict_type:
            raise SystemExit(
                f"error: FSDP with {state_dict_type} saves no adapter (transformers' save_model writes one only "
                "for FULL_STATE_DICT): set fsdp_state_dict_type: FULL_STATE_DICT in the accelerate config"
            )
    return trainer, tokenizer, recipe, training_args, model_args, base, resume, wandb_target


def main(argv: list[str] | None = None, callbacks: list | None = None):
    trainer, tokenizer, recipe, training_args, model_args, base, resume, wandb_target = build_trainer(
        argv, callbacks
    )

    # -- train -----------------------------------------------------------------------------------------
    if resume and finished(resume, training_args.output_dir):
        # a rerun of a finished run: resuming from its last checkpoint would train past max_steps (the
        # Trainer took a step 51 from checkpoint-50 of a 50-step run) and overwrite the adapter
        from transformers import TrainerState

        trainer.state = TrainerState.load_from_json(str(Path(resume) / "trainer_state.json"))
        trainer.accelerator.print(
            f"{training_args.output_dir} is trained from these inputs to step {trainer.state.global_step} of "
            f"{trainer.state.max_steps} ({resume}; adapter and card saved): nothing to do"
        )
        return trainer
    # read before training: save_total_limit may remove the resumed checkpoint
    start = saved_state(resume)["global_step"] if resume else 0
    if resume and ended(resume):
        load_ended_run(trainer, resume)
    else:
        if resume:
            trainer.accelerator.print(f"resuming from {resume}")
            # the resumed step was evaluated before the stop: again would count as "no better" once more
            trainer.args.eval_on_start = False
        trainer.train(resume_from_checkpoint=resume)
    stop = next((c for c in trainer.callback_handler.callbacks if type(c).__name__ == "SaveAndStop"), None)
    if stop is not None and stop.requested:  # a checkpoint at this step, not the end: no adapter or card
        step = trainer.state.global_step
        if trainer.is_world_process_zero():
            Path(os.environ[STOP_FILE] + ".saved").write_text(f"checkpoint-{step}\n")
        trainer.accelerator.print(
            f"stopped on request after step {step}; checkpoint-{step} saved: rerun to resume"
        )
        trainer.accelerator.wait_for_everyone()
        drop_ddp_wrapper(trainer)
        trainer.end()
        return trainer

    # -- save: adapter, tokenizer + chat template, generation config, card -------------------------------
    trainer.save_model(training_args.output_dir)  # on every rank: gathering a sharded model is collective
    if trainer.is_world_process_zero():
        check_saved_adapter(training_args.output_dir, trainer.model)
        tokenizer.save_pretrained(training_args.output_dir)
        generation = trainer.model.generation_config
        generation.eos_token_id = tokenizer.eos_token_id  # the chat template's end of turn
        generation.pad_token_id = tokenizer.pad_token_id
        generation.save_pretrained(training_args.output_dir)
        metric = next(
            (c.kept_metric for c in trainer.callback_handler.callbacks if hasattr(c, "kept_metric")), None
        )
        best = trainer.state.best_model_checkpoint
        best_step = int(Path(best).name.split("-")[-1]) if best else None
        summary = metric.summary(best_step) if metric is not None else None
        write_card(
            training_args.output_dir,
            recipe,
            training_args,
            model_args,
            base,
            trainer,
            wandb_target,
            start,
            summary,
        )
        write_training_data(training_args.output_dir, recipe)
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        if losses and not all(math.isfinite(x) for x in losses):
            print("warning: non-finite training loss; see training_card.json", file=sys.stderr)
    trainer.accelerator.print(f"saved the adapter and its card to {training_args.output_dir}")
    trainer.accelerator.wait_for_everyone()  # rank 0 wrote the card alone; leave together
    if not drop_ddp_wrapper(trainer):
        print(
            "warning: the DDP wrapper is still referenced; the exit may hang (see drop_ddp_wrapper)",
            file=sys.stderr,
        )
    trainer.end()  # finish W&B, destroy the process group
    return trainer


def drop_ddp_wrapper(trainer) -> bool:
    """Free the DistributedDataParallel wrapper (and its gradient reducer) while the process group is
    still registered. The reducer drops its reference to the group while holding the GIL; when that is
    the group's last reference (at exit, after ``trainer.end()``), ``~ProcessGroupGloo`` waits for a
    worker thread that waits for the GIL, and the process hangs (pytorch/pytorch#56297; seen here in
    the two-process CPU test). Returns whether the wrapper is gone."""
    import weakref

    if trainer.model_wrapped is trainer.model:
        return True
    wrapper = weakref.ref(trainer.model_wrapped)
    trainer.model_wrapped = trainer.model
    trainer.accelerator.free_memory()  # its list of prepared models holds the wrapper too; collects
    return wrapper() is None


if __name__ == "__main__":
    main()
