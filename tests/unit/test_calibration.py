"""The measures behind the coverage benchmark: AUROC, reliability bins and ECE, the
logistic fit, and the fit half's figures under the shipped constants."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench.calibration import auroc, fit_logistic, reliability
from bench.sufficiency_fit import Record, fit_half_text
from webctx.stages import coverage as cov


def test_auroc_counts_pairs_ordered_and_ties_half() -> None:
    assert auroc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auroc([0.1], [0.9]) == 0.0
    assert auroc([0.5], [0.5]) == 0.5


def test_a_calibrated_confidence_has_no_calibration_error_and_an_overconfident_one_has() -> None:
    labels = [True] * 8 + [False] * 2 + [True] * 2 + [False] * 8
    calibrated = [0.8] * 10 + [0.2] * 10
    ece, rows = reliability(calibrated, labels)
    assert ece == pytest.approx(0.0)
    assert [(round(m, 2), round(a, 2), n) for _, m, a, n in rows] == [(0.2, 0.2, 10),
                                                                      (0.8, 0.8, 10)]  # fmt: skip
    over, _ = reliability([0.99] * 10 + [0.01] * 10, labels)
    assert over == pytest.approx(0.19)


def test_the_logistic_fit_recovers_the_model_that_drew_the_labels() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20000, 2))
    y = (rng.random(20000) < 1 / (1 + np.exp(-(2.0 * x[:, 0] - 1.0 * x[:, 1] + 0.5)))).astype(float)
    coef, intercept = fit_logistic(x, y)
    assert coef == pytest.approx([2.0, -1.0], abs=0.1)
    assert intercept == pytest.approx(0.5, abs=0.1)


def _record(scenario: str, budget: int, signals: list[float], label: bool) -> Record:
    return Record(scenario, budget, 0.0, True, label, scenario == "full", 1, 1, [signals],
                  [label], "fit")  # fmt: skip


def test_the_fit_half_figures_use_the_shipped_constants(tmp_path: Path) -> None:
    answer = [0.8, 0.3, 1.0, 0.0, 0.0, 0.7]  # far above MISSING
    nothing = [0.1, 0.0, 0.0, 0.0, 0.0, 0.0]  # far below
    assert cov.confidence_of(cov.FacetSignals(*nothing)) < cov.MISSING
    assert cov.confidence_of(cov.FacetSignals(*answer)) > cov.MISSING
    records = [_record(s, b, sig, s == "full") for b in (250, 500, 1000, 3000)
               for s, sig in (("full", answer), ("removed", nothing))]  # fmt: skip
    path = tmp_path / "fit.json"
    path.write_text(json.dumps({"records": [dataclasses.asdict(r) for r in records]}))
    text = fit_half_text(path)
    assert "at 1000 tokens AUROC (answer pages removed) 1.000" in text
    assert "unanswerable flagged 100.0%, answered flagged 0.0%" in text
    assert fit_half_text(tmp_path / "absent.json") == ""
