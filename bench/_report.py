"""Replace one benchmark's section of docs/benchmarks.md, between its markers."""

from __future__ import annotations

import platform
from datetime import date
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nNumbers behind webctx's defaults. Each section is written by the script "
    "it names (`--write`); rerun it to refresh the section.\n"
)


def replace_block(begin: str, end: str, block: str) -> None:
    """Replace the text from `begin` to `end` (markers included) with `block`, which
    carries the markers itself; append it when the markers are not there yet."""
    text = DOC.read_text() if DOC.exists() else HEADER
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text)


def write_section(name: str, body: str) -> None:
    """Put `body` under a heading between `<!-- bench:NAME -->` markers."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    stamp = f"`bench/{name}.py --write` on {date.today()}, {platform.python_version()}.\n\n"
    replace_block(begin, end, f"{begin}\n## {name}\n\n{stamp}{body.strip()}\n{end}")
