"""The verbs of a simulator's command line: ``python -m agents.<simulator> VERB ...``.

Each simulator (review, sandbox, converse) answers the same verbs where they apply: ``run`` runs it,
``evaluate`` evaluates a run, ``export`` writes a run for other tools. A verb either calls a function
of its simulator or hands over to a module by name, as ``python -m MODULE`` would run it. The
evaluations live on the floor above the simulators (eval/ imports agents/, never the reverse), so a
verb that evaluates names its module and never imports it.
"""

from __future__ import annotations

import runpy
import sys
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Verb:
    """One verb: what it does (help), and either a function given the remaining arguments or the
    module run as ``python -m module`` with them."""

    help: str
    call: Callable[[list[str]], object] | None = None
    module: str | None = None


def hand_over(module: str, argv: list[str]) -> None:
    """Run ``python -m module ARGV`` in this process (runpy sets sys.argv[0] to the module's file)."""
    sys.argv = [module, *argv]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def usage(prog: str, description: str, verbs: dict[str, Verb]) -> str:
    width = max(map(len, verbs))
    lines = [f"usage: {prog} {{{','.join(verbs)}}} ...", "", description, "", "verbs:"]
    for name, verb in verbs.items():
        where = f" (python -m {verb.module})" if verb.module else ""
        lines.append(f"  {name:<{width}}  {verb.help}{where}")
    lines.append(f"\n{prog} VERB --help shows a verb's own options.")
    return "\n".join(lines)


def dispatch(prog: str, description: str, verbs: dict[str, Verb], argv: list[str] | None = None) -> object:
    """Run the verb named first in ``argv`` with the rest; help or a clear error otherwise."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(prog, description, verbs))
        raise SystemExit(0 if argv else 2)
    name, rest = argv[0], argv[1:]
    if name not in verbs:
        sys.exit(f"error: {prog}: unknown verb {name!r} (one of: {', '.join(verbs)})")
    verb = verbs[name]
    if verb.call is not None:
        sys.argv = [prog, name, *rest]  # provenance records the command with its verb
        return verb.call(rest)
    return hand_over(verb.module, rest)
