"""How well a confidence separates and is calibrated (AUROC, reliability bins and ECE), and
the logistic fit behind webctx.stages.coverage (bench/sufficiency.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def auroc(positive: Sequence[float], negative: Sequence[float]) -> float:
    """Probability a positive scores above a negative (ties count half)."""
    if not positive or not negative:
        return float("nan")
    pos, neg = np.asarray(positive), np.asarray(negative)
    greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(greater / (len(pos) * len(neg)))


def reliability(conf: Sequence[float], labels: Sequence[bool], bins: int = 10
                ) -> tuple[float, list[tuple[float, float, float, int]]]:  # fmt: skip
    """ECE and (low, mean confidence, accuracy, count) per equal-width bin."""
    c, y = np.asarray(conf, dtype=float), np.asarray(labels, dtype=float)
    rows, ece = [], 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        mask = (c >= lo) & ((c < hi) if b < bins - 1 else (c <= hi))
        if mask.any():
            rows.append((lo, float(c[mask].mean()), float(y[mask].mean()), int(mask.sum())))
            ece += mask.sum() / len(c) * abs(c[mask].mean() - y[mask].mean())
    return float(ece), rows


def fit_logistic(x: np.ndarray, y: np.ndarray, l2: float = 1e-2) -> tuple[np.ndarray, float]:
    """Logistic regression by Newton's method with a small L2 penalty (not on the bias)."""
    a = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(a.shape[1])
    penalty = np.full(a.shape[1], l2)
    penalty[-1] = 0.0
    for _ in range(50):
        p = 1.0 / (1.0 + np.exp(-(a @ w)))
        grad = a.T @ (p - y) + penalty * w
        hess = (a * (p * (1 - p))[:, None]).T @ a + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-8:
            break
    return w[:-1], float(w[-1])
