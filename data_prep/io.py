"""Streaming, gzip-aware line reading with line numbers and byte progress, and file hashing."""

from __future__ import annotations

import gzip
import hashlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


class LineReader:
    """Iterates ``(line_number, raw_bytes)`` over a plain or gzip file, one line in memory at a time.

    ``position`` is the offset in the file on disk (compressed bytes for gzip), for progress bars.
    """

    def __init__(self, path: Path):
        self.path = Path(path)
        self._raw: BinaryIO = open(self.path, "rb")
        stream: BinaryIO = self._raw
        if is_gzip(self.path):
            stream = gzip.GzipFile(fileobj=self._raw)  # type: ignore[assignment]
        self._lines = io.BufferedReader(stream, buffer_size=1 << 20)  # type: ignore[arg-type]

    @property
    def position(self) -> int:
        return self._raw.tell()

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for number, line in enumerate(self._lines, start=1):
            yield number, line.rstrip(b"\r\n")

    def close(self) -> None:
        self._lines.close()
        self._raw.close()

    def __enter__(self) -> LineReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_atomic(path: str | Path, data: str | bytes) -> None:
    """Write a whole file so that a kill or a power cut never leaves half of it: into a temporary file
    beside it, flushed and fsynced, then renamed over the target, and the folder fsynced so the rename
    itself is on disk. A reader sees the old file or the new one."""
    import os

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data.encode("utf-8") if isinstance(data, str) else data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def write_card(out: str | Path, title: str, card: dict) -> None:
    """A pairs folder's card: card.json (written atomically) and README.md, one line per field under
    ``title``. The one writer of the training pairs' cards (reviews, sandbox choices, conversations)."""
    import json

    out = Path(out)
    write_atomic(out / "card.json", json.dumps(card, indent=2, ensure_ascii=False))
    fields = "\n".join(f"- **{k}**: `{json.dumps(v, ensure_ascii=False)}`" for k, v in card.items())
    (out / "README.md").write_text(f"# {title}\n\n{fields}\n", encoding="utf-8")


def numbered_lines(path: str | Path, whole: bool = False) -> list[tuple[int, str, object]]:
    """(line number, line, value) for each non-blank line of a JSON-lines file: the one reader of the
    project's run files and inputs. A line that is not JSON is an error naming the file and the line (a
    file damaged in the middle is not read as if it were shorter), except a run file's last line
    without its newline (cut by a kill, or still being written), which is left out. ``whole``: an input
    that must be whole (a catalogue, a sample, predictions): a missing file and a bad last line are
    errors too. A missing run file has no lines."""
    path = Path(path)
    if not whole and not path.exists():
        return []
    return numbered_text(path.read_text(encoding="utf-8"), path, whole)


def numbered_text(text: str, path: str | Path, whole: bool = False) -> list[tuple[int, str, object]]:
    """numbered_lines over a file's text already read (``path`` names it in errors)."""
    import json

    lines = text.split("\n")
    last_cut = not whole and not text.endswith("\n")
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((number, line, json.loads(line)))
        except json.JSONDecodeError as error:
            if last_cut and number == len(lines):
                continue  # the cut last line
            raise ValueError(f"{path} line {number}: not JSON ({error.msg})") from None
    return out


def valid_lines(path: str | Path) -> list[tuple[str, object]]:
    """A run file's lines and their values (numbered_lines)."""
    return [(line, value) for _, line, value in numbered_lines(path)]


def read_jsonl(path: str | Path, whole: bool = False) -> list:
    """The values of a JSON-lines file's lines (numbered_lines; ``whole``: an input that must be whole)."""
    return [value for _, _, value in numbered_lines(path, whole)]


def drop_cut_line(path: str | Path) -> bytes:
    """A JSON-lines file's bytes without a last line that lacks its newline (cut by a kill mid-write;
    the file is rewritten without it, so lines appended next start clean). b"" for no file."""
    path = Path(path)
    if not path.exists():
        return b""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        data = data[: data.rfind(b"\n") + 1]
        path.write_bytes(data)
    return data


def append_to(path: str | Path):
    """A JSON-lines file opened for appending, a last line cut by a kill dropped first (drop_cut_line),
    so the next line does not run on from half a line and damage the file in its middle."""
    drop_cut_line(path)
    return open(path, "a", encoding="utf-8")  # noqa: SIM115 (the caller's with-block closes it)
