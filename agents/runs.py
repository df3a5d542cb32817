"""What every agent run shares: one writer per run folder, and atomic JSON writes (a kill never leaves
half a file). Fingerprints (refusing a resume from other inputs) are data_prep.fingerprint's."""

from __future__ import annotations

import json
from pathlib import Path

from data_prep.io import append_to, drop_cut_line, numbered_lines, read_jsonl, valid_lines, write_atomic  # noqa: F401 (the runners read them here)


def write_json(path: Path, value) -> None:
    """Atomically and durably (data_prep.io.write_atomic): a kill never leaves half a checkpoint."""
    write_atomic(path, json.dumps(value))


def json_lines(path: Path) -> list[tuple[int, object]]:
    """(line number, value) for each non-blank line of a JSON-lines input that must be whole (a small
    catalogue or review sample; data_prep.io.numbered_lines); a line that is not JSON stops the run
    with an error naming the file and the line."""
    try:
        return [(number, value) for number, _, value in numbered_lines(path, whole=True)]
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


class Lock:
    """One writer per run folder: an exclusive flock on RUN_DIR/.lock, held while the process lives
    (the kernel releases it when the process dies, so a killed or requeued run is never locked out)."""

    def __init__(self, out: Path):
        self.path = out / ".lock"

    def __enter__(self):
        import fcntl

        self.handle = open(self.path, "a+")  # noqa: SIM115 (held open for the lock's lifetime)
        try:
            fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.handle.close()
            raise SystemExit(f"error: {self.path.parent} is held by another process") from None
        return self

    def __exit__(self, *exc):
        self.handle.close()  # releases the lock
