"""The coverage model's fit (bench/sufficiency.py `--fit`, `--refit`) and the fit half's own
figures under the shipped constants, printed beside the report half's."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.calibration import auroc, fit_logistic, reliability
from webctx.stages import coverage as cov

COVERAGE_BUDGET = 3000  # the default token_budget: abstention and calibration figures


@dataclass
class Record:
    """One bundle measured: its scenario, facets' signals and labels, and recall."""

    scenario: str
    budget: int
    confidence: float
    sufficient: bool
    holds: bool  # the bundle holds (every) answer
    answerable: bool  # a fetched page holds (every) answer
    facets: int
    facets_found: int
    signals: list[list[float]]
    labels: list[bool]
    split: str


def fit_model(records: Sequence[Record]) -> str:
    """Fit the coverage model on the fit half's single-question facets (every budget); the
    shipped threshold flags 4 % of the bundles holding their answer at the default budget
    there. Its constants, as text."""
    rows = [(s, lab, r) for r in records for s, lab in zip(r.signals, r.labels, strict=True)]
    x = np.asarray([s for s, _, _ in rows], dtype=float)
    y = np.asarray([lab for _, lab, _ in rows], dtype=float)
    coef, intercept = fit_logistic(x, y)
    conf = 1.0 / (1.0 + np.exp(-(x @ coef + intercept)))
    ece, _ = reliability(conf.tolist(), y.astype(bool).tolist())
    shipped = np.asarray([r.budget == COVERAGE_BUDGET and r.scenario == "full" for _, _, r in rows])
    threshold = float(np.quantile(conf[shipped & (y == 1)], 0.04))
    flagged = float((conf[y == 0] < threshold).mean())
    return (
        f"FEATURES = {cov.FEATURES}\nCOEFFICIENTS = {tuple(round(float(c), 4) for c in coef)}\n"
        f"INTERCEPT = {round(intercept, 4)}\nMISSING = {round(threshold, 3)}\n"
        f"# fit half: {len(y)} facet-bundles, {int(y.sum())} holding their answer; ECE {ece:.3f}; "
        f"{flagged:.1%} of those without flagged missing"
    )


def fit_half_text(path: Path) -> str:
    """The fit half's figures with the shipped constants (in sample: the model was fitted
    on these bundles), from the last `--fit` run's records; empty without them."""
    if not path.exists():
        return ""
    records = [Record(**r) for r in json.loads(path.read_text())["records"]]
    single = [r for r in records if r.facets == 1]
    conf = {id(r): cov.confidence_of(cov.FacetSignals(*r.signals[0])) for r in single}
    text = f"\nThe fit half under the same constants (in sample), {len(single) // 4} jobs:"
    for budget in (1000, COVERAGE_BUDGET):
        at = [r for r in single if r.budget == budget]
        answered = [conf[id(r)] for r in at if r.scenario == "full" and r.labels[0]]
        removed = [conf[id(r)] for r in at if r.scenario == "removed" and not r.answerable]
        ece, _ = reliability([conf[id(r)] for r in at], [r.labels[0] for r in at])
        flag = sum(p < cov.MISSING for p in removed) / max(1, len(removed))
        wrong = sum(p < cov.MISSING for p in answered) / max(1, len(answered))
        text += (f" at {budget} tokens AUROC (answer pages removed) "
                 f"{auroc(answered, removed):.3f}, unanswerable flagged {flag:.1%}, answered "
                 f"flagged {wrong:.1%}, ECE {ece:.3f};")  # fmt: skip
    return text.rstrip(";") + ".\n"
