"""robots.txt decisions: how many cases of `bench/robots_cases/cases.json` (written from
RFC 9309 and from protego's tests, see its NOTICE) each parser decides as the RFC does.

- urllib: the standard library's `urllib.robotparser` (what webctx used before).
- protego: Scrapy's parser (PyPI, BSD), `Protego.parse(text).can_fetch(url, agent)`.
- webctx: `webctx.net.robots`, `parse_robots(text).decide(path, agent)`.

Every parser gets the same text and the crawler's product token; URLs are absolute
(`http://example.com` + the case's path) for the two that take URLs. A parser that
raises on a case gets it wrong. Prints a table and the cases each parser misses.

    .venv/bin/python bench/robots.py [--misses] [--write]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.robotparser
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._report import write_section  # noqa: E402
from webctx.net.robots import parse_robots  # noqa: E402

CASES = Path(__file__).resolve().parent / "robots_cases" / "cases.json"
ORIGIN = "http://example.com"
Decide = Callable[[str, str, str], bool]  # (robots text, agent, path) -> allowed


def decide_urllib(text: str, agent: str, path: str) -> bool:
    parser = urllib.robotparser.RobotFileParser()
    parser.parse(text.splitlines())
    return parser.can_fetch(agent, ORIGIN + path)


def decide_protego(text: str, agent: str, path: str) -> bool:
    from protego import Protego

    return bool(Protego.parse(text).can_fetch(ORIGIN + path, agent))


def decide_webctx(text: str, agent: str, path: str) -> bool:
    return parse_robots(text.encode()).decide(path, agent).allowed


PARSERS: dict[str, Decide] = {"urllib": decide_urllib, "protego": decide_protego,
                              "webctx": decide_webctx}  # fmt: skip


def score(decide: Decide, groups: list[dict[str, object]]) -> tuple[int, list[str]]:
    """Cases decided right, and a line for each one missed."""
    right, misses = 0, []
    for group in groups:
        text = str(group["robots"])
        for agent, path, allowed in group["checks"]:  # type: ignore[attr-defined]
            try:
                got = decide(text, agent, path)
            except Exception as exc:  # noqa: BLE001 - a crash is a wrong answer
                got = None
                misses.append(f"{group['source']}: {agent} {path} raised {exc!r}")
                continue
            if got == allowed:
                right += 1
            else:
                misses.append(f"{group['source']}: {agent} {path} -> {got}, RFC: {allowed}")
    return right, misses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--misses", action="store_true", help="list every case missed")
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    groups = json.loads(CASES.read_text())
    total = sum(len(g["checks"]) for g in groups)
    rows, missed = [], {}
    for name, decide in PARSERS.items():
        started = time.perf_counter()
        right, misses = score(decide, groups)
        ms = (time.perf_counter() - started) * 1000
        rows.append(f"| {name} | {right} / {total} | {len(misses)} | {ms:.0f} |")
        missed[name] = misses
    text = (
        f"{total} cases in {len(groups)} robots.txt files (`bench/robots_cases/cases.json`:"
        " RFC 9309's examples and rules, and cases from protego's tests), each a robots.txt,"
        " a crawler's product token, a path and the RFC's verdict.\n\n"
        "| parser | decided right | missed | ms (parse + decide, all cases) |\n"
        "|---|---|---|---|\n" + "\n".join(rows) + "\n\n"
        "The file was written together with `webctx.net.robots`, so webctx's score says it"
        " does what the file encodes (our reading of the RFC), not that an outside judge"
        " agrees; protego's cases whose verdicts follow its own conventions are left out"
        " (listed in `bench/robots_cases/NOTICE`). Times are one pass on a shared machine,"
        " for scale only.\n"
    )
    for name, misses in missed.items():
        if misses and (args.misses or name != "urllib"):
            text += f"\n{name} misses:\n\n" + "\n".join(f"- {m}" for m in misses) + "\n"
    print(text)
    if args.write:
        write_section("robots", text)


if __name__ == "__main__":
    main()
