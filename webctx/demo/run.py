"""`webctx demo`: run one research job through a local service against the demo web,
print the bundle, and check every citation against the page as served."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import httpx

from webctx.adapters.pdf_sandbox import PdfLimits, SandboxedPdfReader
from webctx.demo.web import DemoWeb
from webctx.models import Bundle, Download
from webctx.stages.bundle import render_markdown
from webctx.stages.fetch import extract_page


def verify_bundle(bundle: Bundle) -> list[str]:
    """Problems found: a source not reachable, or a chunk not at its offsets."""
    problems: list[str] = []
    reader = SandboxedPdfReader(PdfLimits())
    with httpx.Client(timeout=10) as client:
        for source in bundle.sources:
            resp = client.get(source.final_url)
            if resp.status_code != 200:
                problems.append(f"[{source.id}] {source.final_url}: HTTP {resp.status_code}")
                continue
            page = extract_page(
                Download(
                    url=source.url,
                    final_url=source.final_url,
                    status=200,
                    content_type=resp.headers.get("content-type", "text/html"),
                    body=resp.content,
                ),
                pdf=reader,
            )
            for chunk in (c for c in bundle.chunks if c.source == source.id):
                if page.text[chunk.start : chunk.end] != chunk.text:
                    problems.append(f"[{source.id}] chunk {chunk.start}:{chunk.end} not at offsets")
    return problems


def run_demo(question: str, *, fmt: str = "markdown") -> int:
    """Serve the demo web, run `webctx research` in a subprocess, verify; the exit code."""
    with DemoWeb() as web, tempfile.TemporaryDirectory(prefix="webctx-demo-") as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
        env.update(web.env())
        # Its own state (vector store, state server), gone with the demo: the demo web's
        # pages must not land in the user's caches.
        env["WEBCTX_DATA_DIR"] = tmp
        env["WEBCTX_QDRANT_PATH"] = os.path.join(tmp, "qdrant")
        # Nor the user's config file (a Redis, an embedder of theirs): the demo's settings.
        env["WEBCTX_CONFIG_FILE"] = os.path.join(tmp, "no-config.toml")
        cmd = [
            sys.executable,
            "-m",
            "webctx.cli",
            "research",
            question,
            "--format",
            "json",
            "--max-sources",
            "8",
            "--top-k",
            "8",
            "--token-budget",
            "1500",
        ]
        try:
            done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True, check=False)
        finally:
            # The research ran through the demo directory's local service, started with the
            # demo web's settings: stop it with the web (its files go with the directory).
            stop = [sys.executable, "-m", "webctx.cli", "service", "stop"]
            subprocess.run(stop, env=env, capture_output=True, check=False)
        if done.returncode != 0 or not done.stdout.strip():
            sys.stderr.write(f"demo: research exited {done.returncode}\n")
            return done.returncode or 1
        bundle = Bundle.model_validate_json(done.stdout)
        problems = verify_bundle(bundle)
    body = render_markdown(bundle) if fmt == "markdown" else bundle.model_dump_json(indent=2)
    sys.stdout.write(body + "\n")
    for problem in problems:
        sys.stderr.write(f"demo: {problem}\n")
    verdict = "all citations verified" if not problems else f"{len(problems)} problems"
    sys.stderr.write(
        f"demo: {len(bundle.chunks)} chunks from {len(bundle.sources)} sources; {verdict} "
        "(every source reachable, every chunk == source_text[start:end])\n"
    )
    return 0 if not problems and bundle.chunks else 1
