"""Serve a trained LoRA adapter with ``vllm serve``, and say how the agents reach it.

    USERSIM_VLLM_KEY=$(openssl rand -hex 16) python -m agents.vllm_serve --adapter runs/demo/sft/smollm2_lora
    python -m agents.vllm_serve --adapter ADAPTER --dry-run      # print the command and the agent's flags

The adapter's ``adapter_config.json`` gives the base model (``base_model_name_or_path``, or ``--model``)
and its rank. The server gets what a LoRA needs and vLLM does not default to: ``--enable-lora``,
``--max-lora-rank`` (the smallest value vLLM accepts that holds the adapter's rank; its default, 16, refuses
a larger one) and ``--lora-modules NAME=ADAPTER``. It listens on 127.0.0.1 only and asks for a token: the
key is read from the environment variable ``--key-env`` names (``USERSIM_VLLM_KEY``) and handed to vLLM as
``VLLM_API_KEY`` in its environment, never on its command line (where ``ps`` would show it).

The agents then use the openai backend with ``decoding_fields: vllm``: every decoding setting is sent
explicitly, and the answer format goes as vLLM's own constraint (a regular expression for the two-line
answer the adapter was trained on), not as a JSON schema. The printed flags say so.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from agents.llm import vllm_lora_rank


def serve_command(
    adapter: Path, name: str, port: int, model: str | None = None, extra: list[str] = ()
) -> tuple[list[str], dict]:
    """(the ``vllm serve`` command, what the adapter's config said): a clear error for an adapter folder
    without its config."""
    path = Path(adapter) / "adapter_config.json"
    if not path.exists():
        raise SystemExit(f"error: {adapter} is not a PEFT adapter folder (no adapter_config.json)")
    config = json.loads(path.read_text())
    base = model or config.get("base_model_name_or_path")
    if not base:
        raise SystemExit(f"error: {path} names no base model: give --model")
    rank = int(config.get("r", 16))
    command = [
        "vllm", "serve", base,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--enable-lora",
        "--max-lora-rank", str(vllm_lora_rank(rank)),
        "--lora-modules", f"{name}={Path(adapter).resolve()}",
        *extra,
    ]  # fmt: skip
    return command, {"base_model": base, "rank": rank}


def agent_flags(name: str, port: int, key_env: str) -> list[str]:
    """What agents.review run (or an agent config) needs to reach the served adapter."""
    return [
        "--backend", "openai",
        "--base_url", f"http://127.0.0.1:{port}/v1",
        "--model", name,
        "--api_key_env", key_env,
        "--decoding_fields", "vllm",
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m agents.vllm_serve", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--adapter", type=Path, required=True, help="a train.sft output folder (PEFT adapter)"
    )
    parser.add_argument("--name", default="adapter", help="the model name the server gives the adapter")
    parser.add_argument("--model", help="the base model (default: the adapter config's)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--key-env", default="USERSIM_VLLM_KEY", help="the variable holding the server's token"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the command and the agent's flags")
    parser.add_argument("extra", nargs="*", help="more vllm serve arguments, after --")
    args = parser.parse_args(argv)
    command, found = serve_command(args.adapter, args.name, args.port, args.model, args.extra)
    flags = agent_flags(args.name, args.port, args.key_env)
    print(f"adapter {args.adapter}: base {found['base_model']}, LoRA rank {found['rank']}")
    print("serve:  " + shlex.join(command))
    print("agents: python -m agents.review run --config configs/review/tuned.yaml ... " + shlex.join(flags))
    if args.dry_run:
        return
    key = os.environ.get(args.key_env)
    if not key:
        raise SystemExit(
            f"error: set the server's token in {args.key_env} (the agents send it from there too)"
        )
    sys.stdout.flush()
    os.execvpe(command[0], command, {**os.environ, "VLLM_API_KEY": key})


if __name__ == "__main__":
    main()
