"""Pictures people would rather look at than read: star confusion, error histograms, comparisons."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def star_confusion(true_stars: np.ndarray, pred_stars: np.ndarray, path: Path) -> None:
    """Rows: true stars 1-5; columns: predicted stars (clipped) rounded to 0-5."""
    matrix = np.zeros((5, 6), int)
    for t, p in zip(np.rint(true_stars).astype(int), np.rint(pred_stars).astype(int), strict=True):
        matrix[t - 1, p] += 1
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    ax.imshow(matrix, cmap="Blues")
    for (i, j), v in np.ndenumerate(matrix):
        ax.text(j, i, str(v), ha="center", va="center", color="white" if v > matrix.max() / 2 else "black")
    ax.set_xticks(range(6), labels=[str(s) for s in range(6)])
    ax.set_yticks(range(5), labels=[str(s) for s in range(1, 6)])
    ax.set_xlabel("predicted stars (rounded)")
    ax.set_ylabel("true stars")
    ax.set_title(f"Star confusion (n={len(true_stars)})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def error_histograms(terms: dict[str, np.ndarray], path: Path) -> None:
    names = ("sentiment_error", "emotion_error", "topic_error")
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.5))
    for ax, name in zip(axes, names, strict=True):
        values = terms[name]
        ax.hist(values, bins=30, color="#4C72B0")
        ax.axvline(values.mean(), color="crimson", linestyle="--", label=f"mean {values.mean():.3f}")
        ax.set_title(name.replace("_", " "))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compare_bars(names: list[str], results: list[dict], path: Path) -> None:
    metrics = ("preference_estimation", "review_generation", "overall")
    x = np.arange(len(metrics))
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names) + 4), 4))
    for i, (name, result) in enumerate(zip(names, results, strict=True)):
        values = [result[m] for m in metrics]
        bars = ax.bar(x + i * width - 0.4 + width / 2, values, width, label=name)
        ax.bar_label(bars, fmt="%.3f", fontsize=7)
    ax.set_xticks(x, labels=["PE", "RG", "overall"])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Review simulation quality (higher is better)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def fidelity(true_stars, pred_stars, true_texts: list[str], pred_texts: list[str], path: Path) -> None:
    """The real and simulated populations side by side: star histograms and review lengths in words."""
    from eval.review.fidelity import words

    fig, (stars_ax, length_ax) = plt.subplots(1, 2, figsize=(11, 3.8))
    bins = np.arange(-0.25, 5.5, 0.5)
    stars_ax.hist(
        [true_stars, pred_stars], bins=bins, label=["real", "simulated"], color=["#999999", "#4C72B0"]
    )
    stars_ax.set_xlabel("stars")
    stars_ax.set_title("Star distribution")
    stars_ax.legend()
    true_len = [len(words(t)) for t in true_texts]
    pred_len = [len(words(t)) for t in pred_texts]
    top = max(np.percentile(true_len + pred_len, 99), 1)
    length_bins = np.linspace(0, top, 30)
    length_ax.hist(true_len, bins=length_bins, alpha=0.6, label="real", color="#999999")
    length_ax.hist(pred_len, bins=length_bins, alpha=0.6, label="simulated", color="#4C72B0")
    length_ax.set_xlabel("review length (words; the longest 1% not shown)")
    length_ax.set_title("Review length")
    length_ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
