"""What every output file records about how it was made."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from data_prep.paths import REPO_ROOT


def git_commit() -> str | None:
    """The commit of this checkout, with '-dirty' when files differ from it; None outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return commit + ("-dirty" if dirty else "")


def package_versions(names: list[str]) -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


# any flag naming a token, key, secret or password is secret (--hf-token, --api-keys, --tokenPath), except
# token counts and tokenizer names, which provenance needs (--max-tokens, --max_new_tokens, --tokenizer)
_SECRET_FLAG = re.compile(r"^--?[\w-]*(token|key|secret|passw)[\w-]*$", re.IGNORECASE)
_NOT_SECRET = re.compile(
    r"^--?([\w-]*(max|min|num|new|prompt)[-_]tokens?|tokenizer[\w-]*|keywords?)$", re.IGNORECASE
)


def _is_secret_flag(flag: str) -> bool:
    return bool(_SECRET_FLAG.match(flag)) and not _NOT_SECRET.match(flag)


def redact(argv: list[str]) -> list[str]:
    """The command line with the values of flags named like secrets (token, key, secret, password)
    replaced by ``***``: ``--hf-token X`` and ``--api_key=X`` alike."""
    out, hide_next = [], False
    for arg in argv:
        flag, equals, _ = arg.partition("=")
        if hide_next:
            out.append("***")
            hide_next = False
        elif _is_secret_flag(flag):
            out.append(f"{flag}=***" if equals else arg)
            hide_next = not equals
        else:
            out.append(arg)
    return out


def provenance(packages: list[str] = ()) -> dict:
    return {
        "command": shlex.join([Path(sys.executable).name, "-m", _module_name(), *redact(sys.argv[1:])]),
        "git_commit": git_commit(),
        "created_utc": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": sys.version.split()[0],
        "packages": package_versions(list(packages)),
    }


def _module_name() -> str:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return spec.name.removesuffix(".__main__") if spec else Path(sys.argv[0]).stem  # python -m PACKAGE
