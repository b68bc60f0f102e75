"""The labels a PromQL expression's series carry, worked out from the metrics webctx defines
(workers/metrics.py): an expression that matches, groups or joins on a label its metrics do
not carry is an error here, because in Prometheus it silently selects nothing and an alert
built on it can never fire."""

from __future__ import annotations

from collections.abc import Mapping

import promql_parser as pq
from celery import Celery
from prometheus_client.metrics import MetricWrapperBase

# Prometheus adds these to every scraped series.
SCRAPE_LABELS = frozenset({"job", "instance"})
Labels = frozenset[str]
Metrics = Mapping[str, Labels]
# Functions of a vector whose result keeps the argument's labels (those webctx's rules and
# dashboard use, and their kin); any other function is refused until taught here.
_KEEPS_LABELS = frozenset({
    "rate", "irate", "increase", "delta", "idelta", "deriv", "abs", "ceil", "floor", "round",
    "clamp", "clamp_min", "clamp_max", "avg_over_time", "max_over_time", "min_over_time",
    "sum_over_time", "count_over_time", "last_over_time", "resets", "changes",
})  # fmt: skip


def defined_metrics() -> dict[str, Labels]:
    """Every series name webctx exports, with its label names: the metric objects of
    workers/metrics.py and what its scrape-time collector yields."""
    from webctx.workers import metrics

    out: dict[str, Labels] = {}
    for value in vars(metrics).values():
        if not isinstance(value, MetricWrapperBase):
            continue
        name, labels = value._name, frozenset(value._labelnames)
        if value._type == "counter":
            out[name + "_total"] = labels
        elif value._type == "histogram":
            out |= {name + "_bucket": labels | {"le"}, name + "_sum": labels,
                    name + "_count": labels}  # fmt: skip
        else:
            out[name] = labels
    app = Celery("labels", broker="memory://")  # an in-process broker answers the collector
    for family in metrics.QueueDepthCollector(app, ["search"]).collect():
        assert family.samples, family.name
        out[family.name] = frozenset(k for s in family.samples for k in s.labels)
    return out


def series_labels(expr: str, metrics: Metrics) -> Labels | None:
    """The label names of `expr`'s result (None: a scalar); AssertionError names the fault."""
    return _labels(pq.parse(expr), metrics)


def _labels(node: object, metrics: Metrics) -> Labels | None:
    if isinstance(node, (pq.NumberLiteral, pq.StringLiteral)):
        return None
    if isinstance(node, (pq.ParenExpr, pq.UnaryExpr, pq.SubqueryExpr)):
        return _labels(node.expr, metrics)
    if isinstance(node, pq.MatrixSelector):
        return _labels(node.vector_selector, metrics)
    if isinstance(node, pq.VectorSelector):
        return _selector(node, metrics)
    if isinstance(node, pq.Call):
        return _call(node, metrics)
    if isinstance(node, pq.AggregateExpr):
        return _aggregate(node, metrics)
    if isinstance(node, pq.BinaryExpr):
        return _binary(node, metrics)
    raise AssertionError(f"no rule for {type(node).__name__}")


def _selector(node: pq.VectorSelector, metrics: Metrics) -> Labels:
    assert node.name in metrics, f"{node.name}: webctx exports no such series"
    carried = metrics[node.name] | SCRAPE_LABELS
    for matcher in node.matchers.matchers:
        assert matcher.name in carried | {"__name__"}, (
            f"{node.name} has no label {matcher.name!r} (it carries {sorted(carried)})"
        )
    return carried


def _call(node: pq.Call, metrics: Metrics) -> Labels | None:
    name = node.func.name
    args = [_labels(arg, metrics) for arg in node.args]
    if name == "histogram_quantile":
        buckets = args[1]
        assert buckets is not None and "le" in buckets, f"histogram_quantile without le: {buckets}"
        return buckets - {"le"}
    if name == "vector":
        return frozenset()
    if name in ("scalar", "time"):
        return None
    assert name in _KEEPS_LABELS, f"{name}(): teach tests/promql_labels.py what it returns"
    return args[0]


def _aggregate(node: pq.AggregateExpr, metrics: Metrics) -> Labels:
    inner = _labels(node.expr, metrics)
    assert inner is not None, f"{node.op} of a scalar"
    if str(node.op) in ("topk", "bottomk"):
        return inner
    modifier = node.modifier
    if modifier is None:
        return frozenset()
    labels = frozenset(modifier.labels)
    if modifier.type == pq.AggModifierType.Without:
        return inner - labels
    assert labels <= inner, f"{node.op} by {sorted(labels - inner)}: not among {sorted(inner)}"
    return labels


def _binary(node: pq.BinaryExpr, metrics: Metrics) -> Labels | None:
    lhs, rhs = _labels(node.lhs, metrics), _labels(node.rhs, metrics)
    if lhs is None or rhs is None:  # against a scalar: the vector side's labels
        return rhs if lhs is None else lhs
    op, modifier = str(node.op), node.modifier
    matching = modifier.matching if modifier is not None else None
    if matching is None:  # matched on every label: the two sides must carry the same names
        assert lhs == rhs, (
            f"`{op}` matches on all labels, but one side carries {sorted(lhs)} and the other "
            f"{sorted(rhs)}: no series pair ever matches (use on(...))"
        )
        return lhs
    labels = frozenset(matching.labels)
    if matching.type == pq.LabelModifierType.Include:  # on(...)
        for side in (lhs, rhs):
            assert labels <= side, f"on({', '.join(sorted(labels))}): {sorted(side)} lacks one"
    else:  # ignoring(...)
        assert lhs - labels == rhs - labels, f"ignoring{sorted(labels)}: {lhs} vs {rhs}"
    if op in ("and", "unless"):
        return lhs
    if op == "or":
        return lhs | rhs
    card = str(modifier.card)
    if card.endswith("OneToOne"):
        return labels if matching.type == pq.LabelModifierType.Include else lhs - labels
    extra = frozenset(modifier.group_labels or ())
    many, one = (lhs, rhs) if card.endswith("ManyToOne") else (rhs, lhs)
    assert extra <= one, f"group_left/right({sorted(extra)}): not on the 'one' side {one}"
    return many | extra
