"""The batch arithmetic of a training recipe: global batch = per-device batch x processes x accumulation.

``train.sft`` computes the gradient accumulation from ``global_batch_size`` at start-up; this module lets
a launcher check the same arithmetic for a given number of processes before it starts anything, with a
message that says which numbers to change (slurm/train.sbatch runs it at job start and in --dry-run).
With ``--accelerate-config`` it also refuses a combination that would fail late: QLoRA under DeepSpeed
ZeRO-3, naming what trains a quantized base instead.

    python -m train.batch --processes 16 --accelerate-config configs/accelerate/fsdp.yaml \
        configs/sft/qwen2.5-7b_qlora.yaml [train.sft flags ...]

It needs only PyYAML, so it runs on a login node without the training stack.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

# train.sft's defaults (RecipeArguments.global_batch_size, TrainingArguments.per_device_train_batch_size)
DEFAULTS = {"global_batch_size": 16, "per_device_train_batch_size": 8}


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def gradient_accumulation(global_batch: int, per_device: int, processes: int) -> int:
    """Accumulation steps so that per_device x processes x steps == global_batch; otherwise a ValueError
    that names the numbers to change."""
    per_step = per_device * processes
    if per_step and global_batch % per_step == 0:
        return global_batch // per_step
    fixes = [f"global_batch_size to a multiple of {per_step} (e.g. {per_step} or {2 * per_step})"]
    if global_batch % processes == 0:
        fits = divisors(global_batch // processes)
        fixes.append(f"per_device_train_batch_size to one of {fits}")
    fits = [p for p in divisors(global_batch // per_device) if global_batch % per_device == 0]
    if fits:
        fixes.append(f"the number of processes (nodes x GPUs per node) to one of {fits}")
    raise ValueError(
        f"global_batch_size {global_batch} is not a multiple of per_device_train_batch_size {per_device} "
        f"x {processes} processes = {per_step}; set " + ", or ".join(fixes)
    )


def flag_value(flags: list[str], name: str) -> str | None:
    """The last value a flag gives (``--name V``, ``--name=V``, either spelling of dashes)."""
    value = None
    for i, flag in enumerate(flags):
        key, _, inline = flag.partition("=")
        if key.lstrip("-").replace("-", "_") == name and key.startswith("--"):
            value = inline if inline else (flags[i + 1] if i + 1 < len(flags) else None)
    return value


def recipe_batch(recipe: str | Path, flags: list[str]) -> tuple[int, int]:
    """(global_batch_size, per_device_train_batch_size) as train.sft will see them: flags over the
    recipe over the defaults."""
    config = yaml.safe_load(Path(recipe).read_text()) or {}
    values = []
    for name in ("global_batch_size", "per_device_train_batch_size"):
        value = flag_value(flags, name)
        values.append(int(value if value is not None else config.get(name, DEFAULTS[name])))
    return values[0], values[1]


QUANTIZED_WITH_ZERO3 = (
    "QLoRA (a 4- or 8-bit base: load_in_4bit / load_in_8bit) does not train under DeepSpeed ZeRO-3 here "
    "(transformers refuses the quantized model's device_map under ZeRO-3, after the data is built). "
    "Train QLoRA with configs/accelerate/multi_gpu_ddp.yaml (each GPU holds the 4-bit base) or "
    "configs/accelerate/fsdp.yaml (the 4-bit base sharded), or ZeRO-3 with LoRA on the unquantized base "
    "(load_in_4bit: false, e.g. configs/sft/qwen2.5-7b_lora.yaml)"
)


def recipe_flag(recipe: str | Path | None, flags: list[str], name: str) -> bool:
    """A boolean setting as train.sft will see it: a flag over the recipe (false when neither says). A
    bare ``--name`` (no value, or another flag next) is true, as the training parser reads it."""
    for i, flag in enumerate(flags):
        bare = flag.startswith("--") and "=" not in flag and flag.lstrip("-").replace("-", "_") == name
        if bare and (i + 1 == len(flags) or flags[i + 1].startswith("--")):
            return True
    value = flag_value(flags, name)
    if value is None and recipe is not None:
        value = (yaml.safe_load(Path(recipe).read_text()) or {}).get(name, False)
    return str(value).lower() in ("true", "1", "yes")


def quantized(recipe: str | Path | None, flags: list[str]) -> bool:
    return recipe_flag(recipe, flags, "load_in_4bit") or recipe_flag(recipe, flags, "load_in_8bit")


def zero_stage(accelerate_config: str | Path) -> int | None:
    """The DeepSpeed ZeRO stage an accelerate config asks for (inline, or in the DeepSpeed JSON file it
    names); None when it is not DeepSpeed."""
    import json

    config = yaml.safe_load(Path(accelerate_config).read_text()) or {}
    if config.get("distributed_type") != "DEEPSPEED":
        return None
    deepspeed = config.get("deepspeed_config") or {}
    if deepspeed.get("deepspeed_config_file"):
        path = Path(deepspeed["deepspeed_config_file"])
        return int(json.loads(path.read_text()).get("zero_optimization", {}).get("stage", 0))
    return int(deepspeed.get("zero_stage", 0))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, required=True, help="all processes: nodes x GPUs")
    parser.add_argument("--accelerate-config", help="the accelerate config the job launches with")
    parser.add_argument("recipe")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="train.sft flags that override the recipe")
    args = parser.parse_args(argv)
    if (
        args.accelerate_config
        and zero_stage(args.accelerate_config) == 3
        and quantized(args.recipe, args.flags)
    ):
        print(f"error: {args.recipe} with {args.accelerate_config}: {QUANTIZED_WITH_ZERO3}", file=sys.stderr)
        return 2
    global_batch, per_device = recipe_batch(args.recipe, args.flags)
    try:
        steps = gradient_accumulation(global_batch, per_device, args.processes)
    except ValueError as error:
        print(
            f"error: {args.recipe} on {args.processes} processes: {error} (in the recipe, or as a flag "
            "such as --global_batch_size N after the recipe)",
            file=sys.stderr,
        )
        return 2
    print(
        f"batch: {global_batch} examples per optimizer step = {per_device} per device x "
        f"{args.processes} processes x {steps} accumulation steps"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
