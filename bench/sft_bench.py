"""Benchmark: the CPU demo recipe with and without padding-free (BFD) packing, and with two memory
allocator settings, side by side in one run.

    python -m bench.sft_bench --steps 8 --out runs/bench/sft_bench.json

Each variant runs `python -m train.sft --config configs/sft/smollm2_cpu.yaml` for the same steps on the
same pairs in its own process; reported: tokens/s (TRL's count of real tokens / train_runtime), wall
time, peak RSS, system CPU seconds and minor page faults. The allocator variants change only the
environment: ``thp`` sets PyTorch's THP_MEM_ALLOC_ENABLE=1 (its CPU allocator aligns buffers of 2 MB
and more to 2 MB and asks the kernel for transparent huge pages, madvise), ``no_mmap`` keeps glibc from
returning large buffers to the kernel after each use (GLIBC_TUNABLES mmap_max=0, a high trim threshold),
so they are not faulted in afresh every step. BFD packing (TRL's padding-free packing: best-fit decreasing into max_length rows,
no padding) flattens sequences into one row with position_ids; the check below
confirms that the model's loss on a flattened batch equals the padded batch's, i.e. the sequences do
not attend to each other (transformers builds a block-diagonal mask from the position_ids).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench.build_bench import measure
from data_prep import build, pairs, split
from data_prep.paths import raw_dir

RECIPE = "configs/sft/smollm2_cpu.yaml"


def ensure_pairs(work: Path) -> Path:
    out = work / "pairs"
    if not (out / "dataset").exists():
        build.main(
            [
                "--source",
                "amazon2018",
                "--input",
                str(raw_dir() / "amazon2018_5core_small"),
                "--out",
                str(work / "data"),
                "--overwrite",
            ]
        )
        split.main(
            [
                "--data",
                str(work / "data"),
                "--out",
                str(work / "tasks"),
                "--min-history",
                "2",
                "--max-tasks",
                "50",
                "--overwrite",
            ]
        )
        pairs.main(
            [
                "--data",
                str(work / "data"),
                "--tasks",
                str(work / "tasks"),
                "--out",
                str(out),
                "--k-user",
                "2",
                "--k-item",
                "1",
                "--max-tokens",
                "256",
            ]
        )
    return out


NO_MMAP = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=17179869184"
# name: (padding-free BFD packing, environment added)
VARIANTS = {
    "padded": (False, {}),
    "padding_free": (True, {}),
    "thp": (False, {"THP_MEM_ALLOC_ENABLE": "1"}),
    "no_mmap": (False, {"GLIBC_TUNABLES": NO_MMAP}),
    "thp_no_mmap": (False, {"THP_MEM_ALLOC_ENABLE": "1", "GLIBC_TUNABLES": NO_MMAP}),
}


def run_variant(name: str, pairs_dir: Path, out: Path, steps: int, padding_free: bool, env: dict) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "train.sft",
        "--config",
        RECIPE,
        "--pairs",
        str(pairs_dir),
        "--output_dir",
        str(out / name),
        "--max_steps",
        str(steps),
        "--eval_strategy",
        "no",
        "--eval_on_start",
        "false",
        "--save_strategy",
        "no",
        "--max_length",
        "256",
        "--packing",
        str(padding_free).lower(),
        "--packing_strategy",
        "bfd",
        "--logging_steps",
        "1",
    ]
    run = measure(cmd, env)
    card = json.loads((out / name / "training_card.json").read_text())
    return {
        "bfd_packing": padding_free,
        "environment": env,
        "wall_seconds": round(run["wall_seconds"], 1),
        "peak_rss_mb": run["peak_rss_mb"],
        "system_cpu_seconds": run["system_cpu_seconds"],
        "minor_page_faults": run["minor_page_faults"],
        **card["throughput"],
        "final_train_loss": card["final_train_loss"],
    }


def padding_free_matches_padded() -> float:
    """Largest |loss difference| between a padded batch and the same batch flattened padding-free."""
    import torch
    from transformers import AutoModelForCausalLM, DataCollatorWithFlattening

    from data_prep.offline_models import smollm2_offline

    model = AutoModelForCausalLM.from_pretrained(smollm2_offline(), dtype=torch.float32).eval()
    torch.manual_seed(0)
    seqs = [torch.randint(100, 1000, (n,)).tolist() for n in (40, 25, 33)]
    losses_padded = []
    for seq in seqs:  # each alone: the reference
        ids = torch.tensor([seq])
        losses_padded.append(model(input_ids=ids, labels=ids).loss.item() * (len(seq) - 1))
    flat = DataCollatorWithFlattening()([{"input_ids": s, "labels": s} for s in seqs])
    with torch.no_grad():
        loss = model(
            input_ids=flat["input_ids"], position_ids=flat["position_ids"], labels=flat["labels"]
        ).loss.item()
    n_predicted = sum(len(s) - 1 for s in seqs)
    return abs(loss - sum(losses_padded) / n_predicted)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("runs/bench/sft_bench.json"))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    work = args.out.parent / "sft_bench"
    pairs_dir = ensure_pairs(work)
    names = ["padded", *(v for v in args.variants if v != "padded")]  # the reference first
    results = {name: run_variant(name, pairs_dir, work, args.steps, *VARIANTS[name]) for name in names}
    base = results["padded"]
    for name in names[1:]:  # each against the padded default, measured in this same run
        results[name]["tokens_per_second_over_padded"] = round(
            results[name]["tokens_per_second"] / base["tokens_per_second"], 2
        )
        results[name]["peak_rss_over_padded"] = round(results[name]["peak_rss_mb"] / base["peak_rss_mb"], 2)
    results["padding_free_loss_difference"] = padding_free_matches_padded()
    args.out.write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
