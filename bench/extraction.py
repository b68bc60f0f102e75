"""Main-text extraction quality and speed: webctx's fetch+extract path vs bare trafilatura.

Data: the Zyte/Scrapinghub article-extraction benchmark in `../shared/data/extraction/`
(181 pages, human-annotated article bodies; see its SOURCE.md), or `$WEBCTX_BENCH_DATA/extraction`.
Scored exactly as that benchmark's `evaluate.py`: word 4-gram shingles, per-page TP/FP/FN
normalised so every page weighs the same, corpus precision and recall as means of per-page
values, F1 of those two means.

- webctx: `webctx.stages.fetch.extract_page` on a `Download` built from the page bytes
  (what the pipeline runs after the HTTP fetch: decoding, trafilatura, interstitial and
  empty-page checks). A page it refuses counts as an empty prediction.
- webctx, hidden-text pass off: the same without `webctx.stages.visibility` (hidden
  elements removed before extraction, invisible word splitters after), as before it.
- trafilatura: `trafilatura.extract(html)` with default settings (the str, already decoded).

Timed on one core (the process is pinned to one CPU) in process CPU time, systems
interleaved page by page over `--repeat` passes.

    .venv/bin/python bench/extraction.py [--repeat 3] [--variants] [--write]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import trafilatura  # noqa: E402

from bench._report import write_section  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.errors import WebctxError  # noqa: E402
from webctx.models import Download, Page  # noqa: E402
from webctx.stages import fetch as fetch_stage  # noqa: E402
from webctx.stages.chunk import chunk_page  # noqa: E402
from webctx.stages.fetch import extract_page  # noqa: E402

_WORD = re.compile(r"\w+", re.UNICODE)
Extractor = Callable[["Sample"], str]


def data_dir() -> Path:
    """The shared benchmark data: $WEBCTX_BENCH_DATA, else ../shared/data beside the repo."""
    env = os.environ.get("WEBCTX_BENCH_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@dataclass(frozen=True)
class Sample:
    """One page of the benchmark: its bytes, decoded HTML, URL and the annotated body."""

    id: str
    raw: bytes
    html: str
    url: str
    truth: str


def load_samples(root: Path) -> list[Sample]:
    """Every page with ground truth, in id order."""
    truth = json.loads((root / "ground-truth.json").read_text(encoding="utf-8"))
    samples = []
    for page_id in sorted(truth):
        raw = gzip.decompress((root / "html" / f"{page_id}.html.gz").read_bytes())
        item = truth[page_id]
        samples.append(
            Sample(
                page_id, raw, raw.decode("utf-8"), item.get("url") or "", item["articleBody"] or ""
            )
        )
    return samples


# --- scoring: article-extraction-benchmark's evaluate.py, re-implemented ---------------


def tokenize(text: str) -> list[str]:
    """Word tokens, case kept, punctuation dropped."""
    return _WORD.findall(text)


def shingles(tokens: list[str], n: int = 4) -> Counter[tuple[str, ...]]:
    """Multiset of word n-grams; 1..n-1 tokens give one shorter shingle, none give none."""
    return Counter(tuple(tokens[i : i + n]) for i in range(max(1, len(tokens) - n + 1)) if tokens)


def page_counts(truth: str, pred: str, n: int = 4) -> tuple[float, float, float]:
    """(tp, fp, fn) of one page, normalised to sum to 1 (all 0 when both are empty)."""
    t, p = shingles(tokenize(truth), n), shingles(tokenize(pred), n)
    tp = fp = fn = 0
    for key in t.keys() | p.keys():
        tp += min(t[key], p[key])
        fp += max(0, p[key] - t[key])
        fn += max(0, t[key] - p[key])
    total = tp + fp + fn
    return (tp / total, fp / total, fn / total) if total else (0.0, 0.0, 0.0)


def _precision_recall(tp: float, fp: float, fn: float) -> tuple[float, float]:
    if fp == 0 and fn == 0:
        return 1.0, 1.0
    precision = tp / (tp + fp) if tp + fp > 0 else 0.0
    recall = tp / (tp + fn) if tp + fn > 0 else 0.0
    return precision, recall


@dataclass(frozen=True)
class Score:
    """Corpus precision, recall, F1 and exact-token accuracy."""

    precision: float
    recall: float
    f1: float
    accuracy: float


def score(truths: list[str], preds: list[str]) -> Score:
    """Corpus metrics as the benchmark computes them."""
    precisions, recalls, exact = [], [], 0
    for truth, pred in zip(truths, preds, strict=True):
        tp, fp, fn = page_counts(truth, pred)
        p, r = _precision_recall(tp, fp, fn)
        if tp + fp > 0:
            precisions.append(p)
        if tp + fn > 0:
            recalls.append(r)
        exact += tokenize(truth) == tokenize(pred)
    precision = sum(precisions) / len(precisions) if precisions else 0.0
    recall = sum(recalls) / len(recalls) if recalls else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return Score(precision, recall, f1, exact / len(truths) if truths else 0.0)


def check_metric() -> None:
    """The benchmark's own test vectors (tests.py, with 3-grams)."""
    vectors = [
        (("a b c", "a b c"), (1, 0, 0)),
        (("a b c d", "a b c"), (0.5, 0, 0.5)),
        (("a b c", "a b c d"), (0.5, 0.5, 0)),
        (("", ""), (0, 0, 0)),
        (("a", ""), (0, 0, 1)),
        (("", "a"), (0, 1, 0)),
        (("a b c a b c", "a b c"), (0.25, 0, 0.75)),
    ]
    for (truth, pred), want in vectors:
        got = page_counts(truth, pred, n=3)
        assert all(abs(g - w) < 1e-9 for g, w in zip(got, want, strict=True)), (truth, pred, got)
    assert tokenize("a b,cd:e(foo,bar) ") == ["a", "b", "cd", "e", "foo", "bar"]


# --- systems ---------------------------------------------------------------------------


def webctx_extract(sample: Sample) -> str:
    """What the pipeline keeps of a fetched page (empty when it refuses the page)."""
    download = Download(
        url=sample.url or f"https://example.org/{sample.id}",
        final_url=sample.url or f"https://example.org/{sample.id}",
        status=200,
        content_type="text/html",
        body=sample.raw,
    )
    try:
        return extract_page(download).text
    except WebctxError:
        return ""


def webctx_without_visibility(sample: Sample) -> str:
    """`extract_page` with the hidden-text pass off (what webctx kept before it)."""
    saved = fetch_stage.remove_hidden, fetch_stage.strip_invisible
    fetch_stage.remove_hidden, fetch_stage.strip_invisible = lambda _tree: 0, lambda text: text
    try:
        return webctx_extract(sample)
    finally:
        fetch_stage.remove_hidden, fetch_stage.strip_invisible = saved


def _page_path(extract: Extractor) -> Extractor:
    """`extract`, then what the embed task does with the page: chunk it, embed the chunks."""
    embedder = HashEmbedder()

    def run(sample: Sample) -> str:
        text = extract(sample)
        if text:
            page = Page(url="https://example.org/", final_url="https://example.org/",
                        fetched_at=datetime.now(UTC), content_sha256="0", text=text)  # fmt: skip
            embedder.embed([c.text for c in chunk_page(page, max_tokens=64, overlap_tokens=0)])
        return text

    return run


def trafilatura_default(sample: Sample) -> str:
    """Bare `trafilatura.extract(html)`, default settings."""
    return trafilatura.extract(sample.html) or ""


def _bare(**options: object) -> Extractor:
    """`bare_extraction` text with `options`, as webctx calls it (variants of its settings)."""

    def run(sample: Sample) -> str:
        doc = trafilatura.bare_extraction(sample.html, url=sample.url or None, **options)  # type: ignore[arg-type]
        return "" if doc is None or isinstance(doc, dict) else (doc.text or "").strip()

    return run


_WEBCTX_OLD = {"with_metadata": True, "favor_precision": True, "include_comments": False,
               "include_tables": True, "include_links": False, "include_images": False}  # fmt: skip
VARIANTS: dict[str, Extractor] = {
    "bare_extraction, favor_precision, no comments, metadata (webctx before #11)": _bare(
        **_WEBCTX_OLD
    ),
    "bare_extraction, defaults + no comments, metadata": _bare(
        with_metadata=True, include_comments=False
    ),
    "bare_extraction, defaults + no comments, no metadata": _bare(include_comments=False),
    "bare_extraction, favor_recall, no comments, metadata": _bare(
        with_metadata=True, favor_recall=True, include_comments=False
    ),
    "bare_extraction, defaults (comments kept), metadata": _bare(with_metadata=True),
}


def measure(
    systems: dict[str, Extractor], samples: list[Sample], repeat: int
) -> dict[str, tuple[Score, float]]:
    """Score and pages per CPU-second of every system.

    Calls are interleaved page by page (the order of systems rotating), each timed in
    process CPU time (extraction threads included): other load on the machine then slows
    no system more than another.
    """
    names = list(systems)
    cpu = dict.fromkeys(names, 0.0)
    preds: dict[str, list[str]] = {name: [] for name in names}
    for sample in samples[:10]:  # warm-up: imports, lxml, caches
        for extract in systems.values():
            extract(sample)
    for rep in range(repeat):
        for i, sample in enumerate(samples):
            shift = (i + rep) % len(names)
            for name in names[shift:] + names[:shift]:
                started = time.process_time()
                pred = systems[name](sample)
                cpu[name] += time.process_time() - started
                if rep == 0:
                    preds[name].append(pred)
    truths = [s.truth for s in samples]
    pages = len(samples) * repeat
    return {name: (score(truths, preds[name]), pages / cpu[name]) for name in names}


def _table(results: dict[str, tuple[Score, float]], ref: str) -> str:
    ref_rate = results[ref][1]
    lines = [
        "| system | F1 | precision | recall | accuracy | pages/s | speed vs trafilatura |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, (s, rate) in results.items():
        lines.append(
            f"| {name} | {s.f1:.3f} | {s.precision:.3f} | {s.recall:.3f} | {s.accuracy:.3f} "
            f"| {rate:.1f} | {rate / ref_rate:.0%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", action="store_true", help="also score settings variants")
    parser.add_argument(
        "--page-path", action="store_true", help="also time extract + chunk + embed per page"
    )
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    check_metric()
    root = data_dir() / "extraction"
    if not (root / "ground-truth.json").exists():
        print(f"no extraction data at {root}: nothing to measure")  # noqa: T201
        return
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    samples = load_samples(root)
    systems: dict[str, Extractor] = {
        "webctx `extract_page`": webctx_extract,
        "webctx `extract_page`, hidden-text pass off": webctx_without_visibility,
        "trafilatura `extract(html)`": trafilatura_default,
    }
    results = measure(systems, samples, args.repeat)
    text = (
        f"{len(samples)} pages of the Zyte/Scrapinghub article-extraction benchmark "
        f"(shared/data/extraction), trafilatura {trafilatura.__version__}; one core, pages per "
        f"CPU-second over {args.repeat} passes interleaved page by page. Metric: the "
        "benchmark's word-4-gram "
        "precision/recall (means over pages), F1 of the means. A page webctx refuses "
        "(too short, interstitial) scores as empty.\n\n"
        + _table(results, "trafilatura `extract(html)`")
    )
    if args.variants:
        variants = measure({"trafilatura `extract(html)`": trafilatura_default, **VARIANTS},
                           samples, args.repeat)  # fmt: skip
        text += (
            "\n\nSettings variants of the extraction call (trafilatura only, no webctx checks):"
            "\n\n" + _table(variants, "trafilatura `extract(html)`")
        )
    if args.page_path:
        path = measure({"page path (extract, chunk, hash-embed)": _page_path(webctx_extract),
                        "page path, hidden-text pass off": _page_path(webctx_without_visibility)},
                       samples, args.repeat)  # fmt: skip
        ref = "page path, hidden-text pass off"
        text += (
            "\n\nA fetched page's CPU path in the pipeline: extraction, then chunking (64 "
            "tokens) and embedding with the local hash embedder (the provider's time left out):"
            "\n\n" + _table(path, ref).replace("speed vs trafilatura", "speed vs pass off")
        )
    print(text)  # noqa: T201
    if args.write:
        write_section("extraction", text)


if __name__ == "__main__":
    main()
