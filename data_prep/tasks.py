"""Evaluation tasks in the official AgentSociety layout.

TASK_DIR/tasks/task_{i}.json              {"type": "user_behavior_simulation", "user_id", "item_id"}
TASK_DIR/groundtruth/groundtruth_{i}.json {"stars", "review"}
TASK_DIR/manifest.json                    how they were made (ours, not part of the official layout)
TASK_DIR/blocked_pairs.json               a validation folder's: the [user_id, item_id] pairs of the
                                          tasks it was drawn for, hidden as its own are (ReviewStore.open)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from data_prep.io import read_jsonl

TASK_TYPE = "user_behavior_simulation"
_INDEX = re.compile(r"task_(\d+)\.json$")


def task_files(task_dir: str | Path) -> list[tuple[int, Path]]:
    """(index, path) of every task file, in index order. Accepts TASK_DIR or TASK_DIR/tasks."""
    root = Path(task_dir)
    folder = root / "tasks" if (root / "tasks").is_dir() else root
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _INDEX.search(p.name))]
    if not found:
        raise FileNotFoundError(f"no task_{{i}}.json files in {folder}")
    return sorted(found)


def read_tasks(task_dir: str | Path) -> list[dict]:
    """Every task with its index as ``task_id``; an invalid task file is an error naming the file."""
    tasks = []
    for index, path in task_files(task_dir):
        try:
            task = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        missing = [k for k in ("user_id", "item_id") if not task.get(k)]
        if missing:
            raise ValueError(f"{path}: missing {', '.join(missing)}")
        tasks.append({**task, "task_id": index})
    return tasks


def read_groundtruth(task_dir: str | Path, index: int) -> dict:
    return json.loads((Path(task_dir) / "groundtruth" / f"groundtruth_{index}.json").read_text())


def write_tasks(task_dir: Path, targets: list[dict]) -> None:
    """targets: dicts with user_id, item_id, stars, text (the real held-out review)."""
    (task_dir / "tasks").mkdir(parents=True, exist_ok=True)
    (task_dir / "groundtruth").mkdir(parents=True, exist_ok=True)
    for i, target in enumerate(targets):
        task = {"type": TASK_TYPE, "user_id": target["user_id"], "item_id": target["item_id"]}
        truth = {"stars": target["stars"], "review": target["text"]}
        (task_dir / "tasks" / f"task_{i}.json").write_text(json.dumps(task, indent=2))
        (task_dir / "groundtruth" / f"groundtruth_{i}.json").write_text(
            json.dumps(truth, indent=2, ensure_ascii=False)
        )


def read_targets(task_dir: str | Path) -> dict[int, dict]:
    """task_id -> {review_id, ts, date, source, ...} from targets.jsonl (written by data_prep.split);
    empty for task folders made elsewhere."""
    path = Path(task_dir) / "targets.jsonl"
    return {row["task_id"]: row for row in read_jsonl(path, whole=True)} if path.exists() else {}


def blocked_pairs(task_dir: str | Path) -> list[tuple[str, str]]:
    """Every (user, item) pair a task folder hides: its tasks' and those in blocked_pairs.json."""
    pairs = [(t["user_id"], t["item_id"]) for t in read_tasks(task_dir)]
    extra = Path(task_dir) / "blocked_pairs.json"
    if extra.exists():
        rows = json.loads(extra.read_text())
        if not all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) for r in rows):
            raise ValueError(f"{extra}: not a list of [user_id, item_id] pairs")
        pairs += [tuple(r) for r in rows]
    return pairs
