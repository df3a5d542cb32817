"""The command line of the conversational evaluations (python -m eval.converse)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from eval.converse import __doc__ as PACKAGE_DOC
from eval.converse.agreement import agreement, agreement_table
from eval.converse.ladders import ladders, ladders_table
from eval.converse.replay import consistency, replay_check
from eval.converse.run import evaluate


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m eval.converse", description=PACKAGE_DOC.split("\n\n")[0])
    parser.add_argument("--run", type=Path, help="a run folder of agents.converse")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/raw/recllmsim"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--replay", choices=["llm", "human"], help="replay recorded conversations instead")
    parser.add_argument(
        "--config", default="configs/converse/recllmsim.yaml", help="replay: the simulator's config"
    )
    parser.add_argument("--limit", type=int, help="replay: at most this many conversations")
    parser.add_argument("--set", nargs="*", action="extend", default=[], help="replay: config overrides")
    parser.add_argument(
        "--questionnaire-only",
        action="store_true",
        help="replay human: only the people's questionnaire, not the per-turn ratings as well",
    )
    parser.add_argument("--consistency", type=Path, nargs=2, help="two replay JSONs of different backbones")
    parser.add_argument(
        "--agreement",
        type=Path,
        nargs="+",
        help="questionnaire-only replay folders: per item agreement, and each against the first, paired",
    )
    parser.add_argument(
        "--ladders",
        type=Path,
        nargs=2,
        help="two ladder runs of different backbones: which tells the ends apart",
    )
    parser.add_argument("--low", default="random", help="ladders: the known-bad rung (oracle-ignores: words)")
    parser.add_argument("--high", default="oracle", help="ladders: the known-good rung (oracle-explains)")
    args = parser.parse_args(argv)
    if args.ladders:
        result = ladders(*args.ladders, low=args.low, high=args.high)
        print(ladders_table(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "ladders.json").write_text(json.dumps(result, indent=1))
            (args.out / "ladders.md").write_text(ladders_table(result) + "\n")
        return
    if not (args.run or args.replay or args.consistency or args.agreement):
        parser.error(
            "give --run RUN_DIR, --replay llm|human, --consistency A.json B.json or --agreement DIR..."
        )
    if args.agreement:
        result = agreement(args.agreement, args.data)
        print(agreement_table(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "agreement.json").write_text(json.dumps(result, indent=1))
            (args.out / "agreement.md").write_text(agreement_table(result) + "\n")
    elif args.consistency:
        result = consistency(*args.consistency)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "consistency.json").write_text(json.dumps(result, indent=1))
    elif args.replay:
        from agents.converse.config import load_config

        out = args.out or Path("runs/converse/replay")
        config = load_config(args.config, args.set)
        replay_check(
            args.data, config, out, args.replay, args.limit, turn_ratings=not args.questionnaire_only
        )
    else:
        evaluate(args.run, args.data, args.out or args.run / "eval")
