"""Run fingerprints: what a long run was started from, so that a resume never mixes old work with new.

A run (the review runner, train.sft) writes ``fingerprint.json`` into its folder when it starts: the
inputs that decide its results (its config, the adapter's files, the task folder's files, the store's
build identity, the training pairs' files) as hashes or values, and the code version. A later run into
the same folder compares: when an input differs it stops with a message naming what changed, unless
it was told to ``--overwrite`` (then the caller discards the earlier work); a different code version
only warns, because fixes to code that does not change results are common.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

from data_prep.io import write_atomic
from data_prep.provenance import git_commit

FILE = "fingerprint.json"


def digest_files(paths: list[Path], root: Path | None = None) -> str:
    """sha256 over the files' names (relative to root) and contents, in sorted order."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(str(path.relative_to(root) if root else path.name).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        h.update(b"\0")
    return h.hexdigest()


def task_folder_digest(task_dir: str | Path) -> str:
    """The tasks an agent reads: task files, targets.jsonl and blocked_pairs.json (not the ground truth,
    not the manifest, whose provenance has a timestamp)."""
    root = Path(task_dir)
    files = [*root.glob("tasks/task_*.json"), *root.glob("targets.jsonl"), *root.glob("blocked_pairs.json")]
    if not files:
        raise FileNotFoundError(f"no task files in {root}")
    return digest_files(files, root)


def adapter_digest(adapter: str | Path | None) -> str | None:
    """The adapter's weights and config (what generation depends on); None without an adapter."""
    if not adapter:
        return None
    root = Path(adapter)
    files = [p for p in (root / "adapter_model.safetensors", root / "adapter_config.json") if p.exists()]
    if not files:
        raise FileNotFoundError(f"{root} holds no adapter_model.safetensors / adapter_config.json")
    return digest_files(files, root)


def differences(old, new, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two JSON-like values."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new), key=str):
            out += differences(old.get(key), new.get(key), f"{prefix}.{key}" if prefix else str(key))
        return out
    return [] if old == new else [prefix or "(everything)"]


def normalise(value):
    """JSON round trip, so tuples and lists (and other JSON-equal values) compare equal."""
    return json.loads(json.dumps(value, default=str))


def recorded(folder: Path) -> dict | None:
    """The inputs a run in ``folder`` recorded (None: no fingerprint there)."""
    path = Path(folder) / FILE
    return json.loads(path.read_text())["inputs"] if path.exists() else None


def verdict(folder: Path, inputs: dict, *, overwrite: bool, has_work: bool) -> bool:
    """Compare ``inputs`` with the fingerprint a run in ``folder`` started from (reads only).

    Returns True when the earlier work may be kept (same inputs, or no earlier work) and False when it
    must be discarded (``overwrite`` with different inputs, or earlier work without a fingerprint).
    Raises SystemExit, naming what changed, when the inputs differ and ``overwrite`` is not set."""
    path = folder / FILE
    if not has_work:
        return True
    if not path.exists():
        if not overwrite:
            raise SystemExit(
                f"error: {folder} holds earlier work without a {FILE}, so its inputs are unknown. "
                "Use another output folder, or --overwrite to discard it"
            )
        return False
    old = json.loads(path.read_text())
    changed = differences(old["inputs"], normalise(inputs))
    if changed:
        if not overwrite:
            raise SystemExit(
                f"error: {folder} holds a run started from other inputs; changed: {', '.join(changed)}. "
                "Use another output folder, or --overwrite to discard the earlier work"
            )
        return False
    code = git_commit()
    if old.get("code") != code:
        print(
            f"warning: {folder} was started with code {old.get('code')}, this is {code}; continuing",
            file=sys.stderr,
        )
    return True


def record(folder: Path, inputs: dict) -> None:
    """Write the fingerprint (atomically: a reader never sees half a file)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / FILE, json.dumps({"inputs": normalise(inputs), "code": git_commit()}, indent=2))


def digest(inputs: dict) -> str:
    """A short hash of a run's inputs (a W&B run id that changes when the run is started afresh)."""
    return hashlib.sha256(json.dumps(normalise(inputs), sort_keys=True).encode()).hexdigest()[:12]
