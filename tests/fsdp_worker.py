"""One rank of the two-process FSDP2 check in tests/test_fsdp.py (run by torch.distributed.run, gloo).

accelerate turns FSDP on only for accelerators (on a CPU it silently falls back to DDP), so this
drives torch's own FSDP2 (``fully_shard``) directly, the way transformers' Trainer and accelerate 1.15
use it for a PEFT model: each decoder layer and the root sharded, ``generate`` registered as a
forward method of the root (Trainer._prepare_for_training), the full state dict gathered by every
rank with ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` (Accelerator.get_state_dict
for FSDP2) and written by rank 0 through PEFT's ``save_pretrained(state_dict=...)`` (Trainer._save).
On top of that it runs train.sft's own pieces: the sample-generation callback and the saved-adapter
check. It writes OUT/rank_N.json with what it saw.

    python -m torch.distributed.run --nproc_per_node 2 tests/fsdp_worker.py MODEL_DIR OUT_DIR
"""

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState

from train.sft import SampleGenerations, check_saved_adapter, make_callback


def main(model_dir: str, out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()

    def reached(phase: str) -> None:  # on stderr, so that a failure in CI says where each rank was
        print(f"[rank {rank}] {phase}", file=sys.stderr, flush=True)

    out = Path(out_dir)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    for layer in model.base_model.model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    register_fsdp_forward_method(model, "generate")
    seen = {"sharded": type(next(p for n, p in model.named_parameters() if "lora_A" in n)).__name__}

    # one optimizer step, so that lora_B is no longer zero and a saved adapter says something
    batch = tokenizer(["stars: 4\nreview: Lovely place."], return_tensors="pt")
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    model(**batch, labels=batch["input_ids"]).loss.backward()
    optimizer.step()
    reached("trained one step")

    # train.sft's evaluation callback, as the Trainer calls it on every rank (it used to generate on
    # rank 0 only, which waits forever for the other rank's shards)
    examples = [{"prompt": "stars: 4\nreview:", "completion": "stars: 5\nreview: Great."}]
    sampler = SampleGenerations(tokenizer, examples, str(out), max_new_tokens=6)
    state = TrainerState(is_world_process_zero=rank == 0, global_step=1)
    make_callback(sampler).on_evaluate(None, state, TrainerControl(), model=model)
    reached("generated")

    # a naive save from rank 0 alone: PEFT cannot write the local shards; the check must catch it
    naive = out / "naive"
    if rank == 0:
        try:
            model.save_pretrained(naive)
        except RuntimeError as error:
            seen["naive_save_error"] = str(error)[:200]
        try:
            check_saved_adapter(naive, model)
        except RuntimeError as error:
            seen["naive_check_error"] = str(error)[:200]

    # the full state dict: gathered by every rank, written by rank 0, checked and reloaded
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    reached("gathered the full state dict")
    if rank == 0:
        model.save_pretrained(out / "adapter", state_dict=full)
        seen["checked_tensors"] = check_saved_adapter(out / "adapter", model)
        lora = {k: v for k, v in full.items() if "lora_" in k}
        seen["lora_b_norm"] = float(sum(v.norm() for k, v in lora.items() if "lora_B" in k))
        from peft import PeftModel

        reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), out / "adapter")
        mine = {k: v for k, v in reloaded.state_dict().items() if "lora_" in k}
        seen["reloaded_equal"] = sorted(mine) == sorted(lora) and all(
            torch.equal(mine[k], lora[k]) for k in lora
        )
    reached("at the final barrier (rank 0 has saved and reloaded)")
    dist.barrier()
    (out / f"rank_{rank}.json").write_text(json.dumps(seen))
    dist.destroy_process_group()
    reached("destroyed the process group")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
