"""False positives of the script-shell detector (`webctx.stages.shell.script_shell`).

Data: the 181 pages of the extraction benchmark (`bench/extraction.py`): real article pages,
all readable without a browser. Each page goes through static extraction
(`webctx.stages.fetch.extract_page`) and through the detector on its own; a page the
detector calls a shell while static extraction succeeds is a false positive (in the
pipeline the detector is asked only after extraction failed, so such a page would still be
read statically, but a detector that fires on content pages would send every page whose
extraction fails for another reason to the browser).

    .venv/bin/python bench/shell_detector.py [--write]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._report import write_section  # noqa: E402
from bench.extraction import data_dir, load_samples  # noqa: E402
from webctx.errors import WebctxError  # noqa: E402
from webctx.models import Download  # noqa: E402
from webctx.stages.fetch import extract_page  # noqa: E402
from webctx.stages.shell import script_shell  # noqa: E402


def main() -> None:
    """Count pages by (static extraction outcome, detector verdict)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    args = parser.parse_args()
    samples = load_samples(data_dir() / "extraction")
    counts: Counter[tuple[str, str]] = Counter()
    flagged: list[str] = []
    for sample in samples:
        download = Download(url=sample.url, final_url=sample.url, status=200,
                            content_type="text/html", body=sample.raw)  # fmt: skip
        try:
            extract_page(download)
            outcome = "extracted"
        except WebctxError as exc:
            outcome = getattr(exc, "reason", "error")
        verdict = script_shell(sample.html) or "not a shell"
        counts[(outcome, "shell" if verdict != "not a shell" else verdict)] += 1
        if verdict != "not a shell":
            flagged.append(f"{sample.id[:12]} ({outcome}: {verdict})")
    false_positives = counts[("extracted", "shell")]
    rows = "\n".join(f"| {o} | {v} | {n} |" for (o, v), n in sorted(counts.items()))
    body = (
        f"{len(samples)} pages. False positives (extracted statically, yet called a shell): "
        f"**{false_positives}**.\n\n| static extraction | detector | pages |\n|---|---|---|\n"
        f"{rows}\n"
    )
    if flagged:
        body += "\nCalled a shell: " + ", ".join(flagged) + "\n"
    print(body)  # noqa: T201
    if args.write:
        write_section("shell_detector", body)


if __name__ == "__main__":
    main()
