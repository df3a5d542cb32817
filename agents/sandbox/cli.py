"""The sandbox's command line: ``python -m agents.sandbox run|edit|broadcast|interview|fork|compare|export|evaluate``.

    python -m agents.sandbox evaluate discrimination|generation|alignment ...   # eval/sandbox/, by name

The commands and what a run folder holds: agents/sandbox/run.py (the run-folder library this calls),
branches.py (fork, compare) and export.py (export). Kept apart from the library, so the library's
modules never import the command line and the command line imports them all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from agents.sandbox.branches import compare, fork
from agents.sandbox.export import export
from agents.sandbox.run import __doc__ as RUN_DOC
from agents.sandbox.run import intervene, run
from agents.verbs import Verb, dispatch

ANALYSES = {
    "discrimination": Verb("pick the films a user watched next among distractors", module="eval.sandbox.discrimination"),
    "generation": Verb("the films an agent reaches by browsing, with memory ablations", module="eval.sandbox.generation"),
    "alignment": Verb("the agent's ratings of the films its user rated next", module="eval.sandbox.alignment"),
}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["evaluate"]:  # the tests of eval/sandbox/, run through the simulator, named not imported
        dispatch(
            "python -m agents.sandbox evaluate",
            "The sandbox's tests, run through the simulator.",
            ANALYSES,
            argv[1:],
        )
        return
    parser = argparse.ArgumentParser(prog="python -m agents.sandbox", description=RUN_DOC.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    go = sub.add_parser("run", help="run (or resume) a simulation")
    go.add_argument("--config", required=True)
    go.add_argument("--out", required=True)
    go.add_argument("--rounds", type=int)
    go.add_argument("--agents", type=int)
    go.add_argument("--set", nargs="*", action="extend", help="section.field=value overrides of the config")
    go.add_argument("--human", help="play this agent at the terminal")
    go.add_argument("--overwrite", action="store_true")
    go.add_argument(
        "--fetch-missing",
        action="store_true",
        help="download ml-latest-small when the data folder is missing",
    )
    edit = sub.add_parser("edit", help="change an agent's profile in a paused run")
    edit.add_argument("run")
    edit.add_argument("--agent", required=True)
    edit.add_argument("--field", required=True)
    edit.add_argument("--value", required=True)
    cast = sub.add_parser("broadcast", help="a message every agent hears at the next round")
    cast.add_argument("run")
    cast.add_argument("--message", required=True)
    ask = sub.add_parser("interview", help="ask an agent of a paused run a question")
    ask.add_argument("run")
    ask.add_argument("--agent", required=True)
    ask.add_argument("--question", required=True)
    branch = sub.add_parser("fork", help="a new run continuing from a run's state after round K")
    branch.add_argument("run")
    branch.add_argument("--round", type=int, required=True)
    branch.add_argument("--out", required=True)
    branch.add_argument("--set", nargs="*", action="extend", default=[], help="the branch's config changes")
    pair = sub.add_parser("compare", help="two runs' per-round statistics after their shared past, paired")
    pair.add_argument("runs", nargs=2)
    pair.add_argument("--out", help="write compare.json and compare.md here")
    pair.add_argument("--after", type=int, help="compare the rounds after this one (default: the fork round)")
    leave = sub.add_parser("export", help="the run's interactions as RecBole atomic files or CSV")
    leave.add_argument("run")
    leave.add_argument("--format", choices=["recbole", "csv"], required=True)
    leave.add_argument("--out", help="folder (default RUN/export/FORMAT)")
    leave.add_argument(
        "--with-impressions", action="store_true", help="also every item a page or search showed"
    )
    sub.add_parser("evaluate", help="the sandbox's tests: evaluate discrimination|generation|alignment ...")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args)
    elif args.command == "fork":
        fork(Path(args.run), args.round, Path(args.out), args.set)
    elif args.command == "compare":
        compare(*map(Path, args.runs), Path(args.out) if args.out else None, args.after)
    elif args.command == "export":
        export(Path(args.run), args.format, Path(args.out) if args.out else None, args.with_impressions)
    else:
        intervene(args)
