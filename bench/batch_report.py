"""The batch benchmark's report: what a run measured and the tables of
docs/benchmarks.md's batch section (bench/batch_scaling.py)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass


@dataclass
class Run:
    """What one batch run measured."""

    label: str
    n: int
    elapsed_s: float
    latencies: list[float]
    stats: dict[str, object]
    downloads: int
    done: int
    failed: int
    cpu_s: dict[str, float] | None = None

    @property
    def per_min(self) -> float:
        """Questions finished per minute."""
        return (self.done + self.failed) / self.elapsed_s * 60 if self.elapsed_s else 0.0


def _pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def throughput_table(runs: list[Run]) -> str:
    rows = [
        "| mode | questions | done | failed | wall s | questions/min | p50 item s | "
        "p95 item s | pages downloaded | tokens embedded | CPU s / question "
        "(search+fetch+embed, store+rank, web) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        cpu = (
            " / ".join(f"{r.cpu_s[k] / r.n:.2f}" for k in ("io", "vec", "web"))
            if r.cpu_s
            else "n/a"
        )
        rows.append(
            f"| {r.label} | {r.n} | {r.done} | {r.failed} | {r.elapsed_s:.1f} | "
            f"{r.per_min:.1f} | {_pct(r.latencies, 0.5):.1f} | "
            f"{_pct(r.latencies, 0.95):.1f} | {r.downloads} | "
            f"{r.stats['tokens_embedded']} | {cpu} |"
        )
    return "\n".join(rows)


def _cost_table(runs: list[Run]) -> str:
    rows = [
        "| questions | pages downloaded / q | pages reused / q | tokens embedded / q | "
        "search cache hit rate | embed cache hit rate | cost USD / q |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        s = {k: str(v) for k, v in r.stats.items()}
        rows.append(
            f"| {r.n} | {r.downloads / r.n:.2f} | {int(s['pages_reused']) / r.n:.2f} | "
            f"{int(s['tokens_embedded']) / r.n:.0f} | {s['search_cache_hit_rate']} | "
            f"{s['embed_cache_hit_rate']} | {float(s['cost_usd']) / r.n:.6f} |"
        )
    return "\n".join(rows)


def _cpu_ceiling(most: Run, one: Run) -> str:
    """What the CPU per question says about the most a machine this size can do."""
    if not most.cpu_s:
        return ""
    per_q = sum(most.cpu_s.values()) / most.n
    cores = os.cpu_count() or 1
    need = 3 * one.per_min / 60 * per_q
    return (
        f"At {per_q:.2f} CPU s per question ({most.label}), {cores} cores cap the whole "
        f"pipeline at about {cores / per_q * 60:.0f} questions/min; 3× the 1-worker rate "
        f"would take {need:.1f} cores."
    )


def _rss_line(probe: dict[str, float], n: int) -> str:
    def growth(a: float, b: float) -> str:
        return f"{100 * (b / a - 1):+.0f} %" if a else "n/a"

    rows = [
        f"| batch | process | MB at item 10 | at item {n // 2} | at item {n} | growth 10→{n} | "
        f"growth {n // 2}→{n} |",
        "|---|---|---|---|---|---|---|",
    ]
    roles = (("io", "largest search/fetch/embed process, RSS"), ("vec", "store/rank process, RSS"),
             ("vec_pss", "store/rank process, PSS"),
             ("vec_anon", "store/rank process, anonymous memory"),
             ("vec_engine", "store/rank process, engine's mapped files"),
             ("vec_wal", "of which the engine's write-ahead log"))  # fmt: skip
    for prefix, batch in (("", "cold (index built)"), ("warm_", "warm (web indexed)")):
        for role, name in roles:
            early = probe.get(f"{prefix}rss10_{role}_mb", 0.0)
            mid = probe.get(f"{prefix}rss_mid_{role}_mb", 0.0)
            late = probe.get(f"{prefix}rss_end_{role}_mb", 0.0)
            rows.append(
                f"| {batch} | {name} | {early:.0f} | {mid:.0f} | {late:.0f} | "
                f"{growth(early, late)} | {growth(mid, late)} |"
            )
    return (
        f"Worker memory (target: growth ≤ +10 %). Cold: the {n}-question batch on cold caches, "
        f"while the web's pages are indexed; warm: the next {n} questions on the same "
        "workers.\n\n" + "\n".join(rows)
    )


def report(
    runs: list[Run],
    by_size: dict[int, Run],
    probe: dict[str, float],
    *,
    counts: list[int],
    n: int,
    total_s: float,
    seed: int,
    threads: int,
) -> str:
    """The benchmark's section of docs/benchmarks.md: the runs by worker count (then the
    embedded default), the broker runs by batch size, the interactive and memory probes."""
    base = by_size[min(by_size)]
    top = by_size[max(by_size)]
    base_tok = int(base.stats["tokens_embedded"]) / base.n  # type: ignore[call-overload]
    top_tok = int(top.stats["tokens_embedded"]) / top.n  # type: ignore[call-overload]
    rate = {r.label: r.per_min for r in runs}
    idle, loaded = probe.get("idle_s", 0.0), probe.get("loaded_s", 0.0)
    one, most = runs[0], runs[len(counts) - 1]
    text = "\n".join(
        [
            f"QA web of `../shared/data/qa` (pages delayed 0.2–1 s, embeddings 0.2 s per request, "
            f"lexical vectors), questions from queries.jsonl in a seeded order (seed {seed}), each "
            f"batch a prefix of it; cold caches per run (Redis flushed). "
            f"N workers = N search/fetch/embed processes + 1 store/rank process, {threads} "
            f"thread{'s' if threads > 1 else ''} each; a batch keeps {threads} "
            f"item{'s' if threads > 1 else ''} per search/fetch/embed process in flight "
            f"(the embedded default: its default threads and batch concurrency). "
            f"Whole run: "
            f"{total_s / 60:.1f} min."
            + (f" Scaled down: {n} questions instead of 200." if n != 200 else "")
            + " Load average at the end: "
            + ", ".join(f"{x:.1f}" for x in os.getloadavg())
            + f" ({os.cpu_count()} cores).",
            "",
            "### Throughput",
            "",
            throughput_table(runs),
            "",
            f"{most.label} / {one.label}: {most.per_min / one.per_min:.2f}× the rate "
            f"(target ≥ 3×). {_cpu_ceiling(most, one)}",
            "",
            "### Cost as the batch grows",
            "",
            _cost_table([by_size[s] for s in sorted(by_size)]),
            "",
            f"Tokens embedded per question at {top.n}: {top_tok:.0f}, "
            f"{100 * top_tok / base_tok:.0f} % of the {base.n}-question figure (target ≤ 25 %); "
            f"page downloads per question at {top.n}: {top.downloads / top.n:.2f} (target ≤ 1).",
            "",
            "### Fairness and memory",
            "",
            f"Interactive research job (submission to bundle): idle {idle:.1f} s, while the "
            f"{n}-question batch runs on {max(counts)} workers {loaded:.1f} s "
            f"({loaded / max(idle, 0.01):.2f}×, target ≤ 1.5×).",
            "",
            _rss_line(probe, n),
            "",
            f"Rates: {json.dumps({k: round(v, 1) for k, v in rate.items()})}",
        ]
    )
    return text
