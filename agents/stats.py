"""Statistics every evaluation shares (the review suite, the sandbox's branch comparison, the
conversational simulator's tables, the quality tables): one place for Holm's correction.

    adjusted = holm([0.01, 0.04, 0.03])          # Holm's step-down adjusted p-values, in the given order
    holm_rows(rows, lambda r: r.get("p"), "p_holm")   # written into each row that has a p-value
"""

from __future__ import annotations


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (statsmodels' multipletests), in the order given: one family of
    tests, so that a table of many claims at 95% each does not find some by chance."""
    if not pvalues:
        return []
    from statsmodels.stats.multitest import multipletests

    return [float(p) for p in multipletests(list(pvalues), method="holm")[1]]


def holm_rows(rows, p_of, key: str) -> None:
    """Holm's correction over the rows whose ``p_of(row)`` is not None, written into each as ``key``."""
    tested = [row for row in rows if p_of(row) is not None]
    for row, p in zip(tested, holm([p_of(row) for row in tested]), strict=True):
        row[key] = p
