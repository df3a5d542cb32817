"""Optional W&B logging of evaluations (off by default): ``--wandb offline`` writes a local run under
the output folder (sync it later with ``wandb sync``), ``--wandb online`` needs ``WANDB_API_KEY`` in the
environment. An evaluation of a tuned agent's predictions goes into the W&B project and group of its
adapter's training run (recorded by train.sft in the adapter's training_card.json), so a user sees the
training and the evaluation of one model side by side; ``--wandb-project`` / ``--wandb-group`` override.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

from eval.review.predictions import summary_path

DEFAULT_PROJECT = "usersim"
MODES = ("off", "offline", "online")


def adapter_of(predictions: Path) -> Path | None:
    """The LoRA adapter the predictions' run used, from the run's summary (None: no adapter known)."""
    path = summary_path(predictions)
    if not path.exists():
        return None
    adapter = (json.loads(path.read_text()).get("llm") or {}).get("adapter")
    return Path(adapter) if adapter else None


def target(adapter: Path | None, project: str | None = None, group: str | None = None) -> dict:
    """{project, group}: given ones first, then the adapter's training card, then the defaults."""
    card = adapter / "training_card.json" if adapter else None
    recorded = (json.loads(card.read_text()).get("wandb") or {}) if card and card.exists() else {}
    return {
        "project": project or recorded.get("project") or DEFAULT_PROJECT,
        "group": group or recorded.get("group"),
    }


def log_run(
    mode: str,
    where: dict,
    name: str,
    out: Path,
    summary: dict,
    config: dict,
    images: dict[str, Path] = {},  # noqa: B006 (read only)
    tables: dict[str, list[dict]] = {},  # noqa: B006 (read only)
) -> str | None:
    """One W&B run with ``summary`` as its summary metrics, the images and the tables (rows of dicts);
    returns the run's local folder. ``mode`` off: nothing, None."""
    if mode == "off":
        return None
    if mode not in MODES:
        raise ValueError(f"unknown W&B mode {mode!r}: one of {MODES}")
    import wandb

    out.mkdir(parents=True, exist_ok=True)
    # a training run in the same process (train.sft) leaves its run id, group and resume mode in the
    # environment: an evaluation is a new run of its own, never a resumption of that one
    names = ("WANDB_RUN_ID", "WANDB_RUN_GROUP", "WANDB_RESUME")
    inherited = {k: os.environ.pop(k) for k in names if k in os.environ}
    try:
        run = wandb.init(
            mode=mode,
            project=where["project"],
            group=where["group"],
            name=name,
            id=uuid.uuid4().hex[:16],
            job_type="evaluation",
            dir=str(out),
            config=config,
            reinit="create_new",
        )
    finally:
        os.environ.update(inherited)
    logged = {key: wandb.Image(str(path)) for key, path in images.items() if Path(path).exists()}
    for key, rows in tables.items():
        if rows:
            columns = list(rows[0])
            logged[key] = wandb.Table(columns=columns, data=[[row.get(c) for c in columns] for row in rows])
    run.log(logged)
    run.summary.update(summary)
    folder = run.dir
    run.finish()
    # wandb keeps process-wide settings, read from the environment at its first use: drop them, so a
    # later run in this process (a training's, with its own WANDB_* variables) reads them afresh
    wandb.teardown()
    return str(Path(folder).parent)


def flat(results: dict) -> dict:
    """The scalar figures of an eval.review results.json, fidelity ones prefixed ``fidelity/``."""
    keys = ("n", "preference_estimation", "review_generation", "overall")
    keys += ("sentiment_error", "emotion_error", "topic_error")
    out = {k: results[k] for k in keys if k in results}
    for key, value in (results.get("fidelity") or {}).items():
        if isinstance(value, int | float) and value is not None:
            out[f"fidelity/{key}"] = value
    return out
