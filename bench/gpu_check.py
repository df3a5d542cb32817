"""The pieces of bench/gpu_check.sh that are Python: the tiny model it trains, the check of each run,
the hf-backend reload, and gpu_check.json. Run through the script, not by hand:

    bash bench/gpu_check.sh --prepare   # here: wheels, tiny model, pairs
    bash bench/gpu_check.sh             # on the GPU machine
    bash bench/gpu_check.sh --cpu       # the smoke run here, CUDA-only steps skipped
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path


def make_model(out: Path, hidden: int = 32) -> None:
    """A randomly initialised 2-layer Llama with SmolLM2's tokenizer and chat template, in bf16: 3 MB of
    weights and 1.6 MB of tokenizer, so that everything carried fits 64 MiB. It exercises the code
    paths of the real recipes; its speed and memory say nothing about a 7B model's. bitsandbytes' CPU
    4-bit kernel (used in eval mode) needs in_features a multiple of 64, so the --cpu smoke run's QLoRA
    checks use hidden=64, built there and not carried; CUDA has no such limit."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from data_prep.offline_models import smollm2_offline

    tokenizer = AutoTokenizer.from_pretrained(smollm2_offline())
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=1,  # every quantised output a multiple of 32, as bitsandbytes' CPU kernel needs
        num_key_value_heads=1,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(out)
    tokenizer.save_pretrained(out)
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"), pretty=False)  # 1.6 MB instead of 3.5


def slim_wheel(wheel: Path, keep: str) -> dict:
    """bitsandbytes ships one native library per CUDA and ROCm version (43 MB); the GPU machine needs the
    one of its CUDA (``keep``, e.g. cuda130) and the CPU one. Rewrites the wheel without the others, and
    its RECORD without their lines (every kept file keeps its hash). Returns the sizes."""
    import re
    import zipfile

    native = re.compile(r"^bitsandbytes/libbitsandbytes_(cuda|rocm)\d+\.so$")
    kept_library = f"bitsandbytes/libbitsandbytes_{keep}.so"
    before = wheel.stat().st_size
    tmp = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as target:
        names = source.namelist()
        if kept_library not in names:
            raise SystemExit(f"error: {wheel.name} has no {kept_library}")
        dropped = {n for n in names if native.match(n) and n != kept_library}
        for name in names:
            if name in dropped:
                continue
            data = source.read(name)
            if name.endswith(".dist-info/RECORD"):
                lines = [line for line in data.decode().splitlines() if line.split(",")[0] not in dropped]
                data = ("\n".join(lines) + "\n").encode()
            target.writestr(source.getinfo(name), data)
    tmp.replace(wheel)
    return {
        "wheel": wheel.name,
        "kept": kept_library,
        "dropped": len(dropped),
        "bytes": [before, wheel.stat().st_size],
    }


def check_run(name: str, out: Path, rc: int, steps: int, resumed_from: str | None, log: Path) -> dict:
    """One training run: it exited 0, reached its steps, evaluated and checkpointed every 10 steps,
    its losses are finite, its adapter reloads (train.sft checked its shapes), and the figures."""
    problems = []
    if rc != 0:
        problems.append(f"exit status {rc} (see {log})")
    card_path = out / "training_card.json"
    card = json.loads(card_path.read_text()) if card_path.exists() else {}
    if not card:
        problems.append("no training_card.json")
    if card and card.get("steps") != steps:
        problems.append(f"{card.get('steps')} steps, expected {steps}")
    losses = card.get("train_losses", [])
    if card and (not losses or not all(math.isfinite(x) for x in losses)):
        problems.append(f"training losses not all finite: {losses[:5]}")
    if card and card.get("final_eval_loss") is None:
        problems.append("no evaluation loss")
    checkpoints = sorted(p.name for p in out.glob("checkpoint-*"))
    if card and not checkpoints:
        problems.append("no checkpoint")
    if resumed_from and f"resuming from {resumed_from}" not in (log.read_text() if log.exists() else ""):
        problems.append(f"did not resume from {resumed_from}")
    if card:
        from peft.utils import load_peft_weights

        weights = load_peft_weights(str(out), device="cpu")
        if not weights or not all(v.numel() and v.float().isfinite().all() for v in weights.values()):
            problems.append("the saved adapter is empty or not finite")
    if card and not (out / "samples").is_dir():
        problems.append("no sample generations written at evaluation")
    throughput = card.get("throughput", {})
    return {
        "check": name,
        "pass": not problems,
        "problems": problems,
        "steps": card.get("steps"),
        "checkpoints": checkpoints,
        "final_train_loss": card.get("final_train_loss"),
        "final_eval_loss": card.get("final_eval_loss"),
        # a resumed run's card counts all tokens over the resumed part's time: no rate
        "tokens_per_second": None if resumed_from else throughput.get("tokens_per_second"),
        "peak_gpu_memory_gib": throughput.get("peak_gpu_memory_gib"),
    }


def check_backend(model: Path, adapter: Path, device: str) -> dict:
    """The adapter reloaded through the hf agent backend, one batched generation of 4 prompts, and one
    constrained one (llguidance, the agents' answer format): every answer in the format."""
    import re

    from agents.llm import Constraint, HFBackend, LLMConfig, Sampling

    problems = []
    start = time.perf_counter()
    try:
        backend = HFBackend(
            LLMConfig(model=str(model), adapter=str(adapter), generation_batch_size=4, device=device)
        )
        prompts = [[{"role": "user", "content": f"Review item {i}."}] for i in range(4)]
        outputs = [a.text for a in backend.generate(prompts, Sampling(max_new_tokens=16))]
        if len(outputs) != 4:
            problems.append(f"{len(outputs)} answers for 4 prompts")
        formatted = [
            a.text
            for a in backend.generate(prompts, Sampling(max_new_tokens=48), constraint=Constraint.answer(16))
        ]
        wrong = [a for a in formatted if not re.fullmatch(r"stars: [1-5]\nreview: [^\n]{1,16}", a)]
        if wrong:
            problems.append(f"constrained answers out of the format: {wrong[:2]}")
        outputs += formatted
        if device == "cuda" and backend.model.device.type != "cuda":
            problems.append(f"the model is on {backend.model.device}")
    except Exception as error:  # reported as this check's failure, with the reason
        problems.append(f"{type(error).__name__}: {error}")
        outputs = []
    return {
        "check": "hf backend: adapter reload + batched generation + constrained (llguidance)",
        "pass": not problems,
        "problems": problems,
        "seconds": round(time.perf_counter() - start, 2),
        "answers": outputs,
    }


def report(results: Path, out: Path, mode: str) -> int:
    import torch

    rows = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    record = {
        "mode": mode,
        "device": torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else platform.processor() or "cpu",
        "python": platform.python_version(),
        "versions": {
            name: _version(name)
            for name in ("torch", "transformers", "trl", "peft", "accelerate", "bitsandbytes", "datasets")
        },
        "checks": rows,
        "passed": sum(r["pass"] for r in rows),
        "failed": sum(not r["pass"] for r in rows),
    }
    out.write_text(json.dumps(record, indent=2))
    for row in rows:
        figures = ", ".join(
            f"{k} {row[k]}"
            for k in ("steps", "tokens_per_second", "peak_gpu_memory_gib", "final_eval_loss", "seconds")
            if row.get(k) is not None
        )
        print(f"{'PASS' if row['pass'] else 'FAIL'}  {row['check']}: {figures}")
        for problem in row["problems"]:
            print(f"      {problem}")
    print(f"{record['passed']} passed, {record['failed']} failed -> {out}")
    return 1 if record["failed"] or not rows else 0


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    model = sub.add_parser("model")
    model.add_argument("out", type=Path)
    model.add_argument("--hidden", type=int, default=32)
    run = sub.add_parser("check")
    run.add_argument("name")
    run.add_argument("out", type=Path)
    run.add_argument("--rc", type=int, required=True)
    run.add_argument("--steps", type=int, required=True)
    run.add_argument("--resumed-from")
    run.add_argument("--log", type=Path, required=True)
    backend = sub.add_parser("backend")
    backend.add_argument("model", type=Path)
    backend.add_argument("adapter", type=Path)
    backend.add_argument("--device", default="cuda")
    slim = sub.add_parser("slim")
    slim.add_argument("wheel", type=Path)
    slim.add_argument("--keep", required=True, help="the native library to keep, e.g. cuda130")
    tests = sub.add_parser("pytest")
    tests.add_argument("rc", type=int)
    tests.add_argument("log", type=Path)
    done = sub.add_parser("report")
    done.add_argument("results", type=Path)
    done.add_argument("out", type=Path)
    done.add_argument("--mode", required=True)
    args = parser.parse_args(argv)
    if args.command == "model":
        make_model(args.out, args.hidden)
    elif args.command == "check":
        print(json.dumps(check_run(args.name, args.out, args.rc, args.steps, args.resumed_from, args.log)))
    elif args.command == "backend":
        print(json.dumps(check_backend(args.model, args.adapter, args.device)))
    elif args.command == "slim":
        print(json.dumps(slim_wheel(args.wheel, args.keep)))
    elif args.command == "pytest":
        tail = args.log.read_text().strip().splitlines()[-1:] if args.log.exists() else []
        row = {"check": "pytest -m gpu tests/test_gpu.py", "pass": args.rc == 0, "summary": tail}
        row["problems"] = [] if args.rc == 0 else [f"exit status {args.rc} (see {args.log})"]
        print(json.dumps(row))
    else:
        return report(args.results, args.out, args.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main())
