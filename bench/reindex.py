"""Benchmark re-indexing: 1,000 pages of which 5 % changed, incremental vs full, one run.

A loopback site (its own process, a minimal asyncio HTTP/1.1 server with keep-alive, so
that its CPU on these shared cores stays small) serves N article pages (ETag /
If-None-Match) and a sitemap; embeddings go to a loopback OpenAI-compatible server
(feature hashing, so what is measured is webctx's work, not a model's). Tenant `inc`
indexes the site, then CHANGED pages are rewritten; then `inc` is re-indexed (conditional
GETs) and tenant `full` indexes the changed site from nothing (every page fetched,
extracted, chunked, embedded). Same fetcher, store (embedded engine), Redis
($BENCH_REDIS, default db 15, flushed) and concurrency for both.

    .venv/bin/python bench/reindex.py [--pages 1000] [--changed 0.05] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402

from webctx.adapters.edge_store import EdgeVectorStore  # noqa: E402
from webctx.adapters.hash_embedder import HashEmbedder  # noqa: E402
from webctx.adapters.httpx_fetcher import HttpxFetcher  # noqa: E402
from webctx.adapters.openai_embedder import OpenAIEmbedder  # noqa: E402
from webctx.devweb.embeddings import make_embeddings_app  # noqa: E402
from webctx.devweb.server import LoopbackServer  # noqa: E402
from webctx.index.page_records import PageRecords  # noqa: E402
from webctx.index.refresh import IndexContext, RefreshReport, refresh_source  # noqa: E402
from webctx.index.sources import SourceRegistry  # noqa: E402
from webctx.jobs.caches import StoredPages  # noqa: E402
from webctx.net.addresses import AddressPolicy  # noqa: E402
from webctx.settings import ChunkSettings, EmbedSettings, FetchSettings, IndexSettings  # noqa: E402

MODEL = "hash-embedding"
WORDS = ("harbour tide ledger copper lantern orchard basalt meridian quarry falcon "
         "thistle cobalt vellum juniper saffron glacier").split()  # fmt: skip


def article(i: int, version: int) -> str:
    words = [WORDS[(i * 7 + k * 3 + version) % len(WORDS)] for k in range(60)]
    paras = "".join(
        f"<p>Page {i} revision {version}, part {p}: {' '.join(words[p * 10 : p * 10 + 10])}. "
        f"The {words[p]} report explains how the {words[p + 1]} was measured.</p>"
        for p in range(6)
    )
    head = f"<html><head><title>Page {i}</title></head>"
    return f"{head}<body><article>{paras}</article></body></html>"


class SiteProtocol(asyncio.Protocol):
    """A minimal HTTP/1.1 site (keep-alive, ETag / If-None-Match): articles, a sitemap, and
    two bench endpoints. Hand-written on asyncio so that the site's own CPU, which shares
    this machine's cores with the bench, stays small, as a real site's would elsewhere."""

    def __init__(self, versions: dict[int, int], base: str, hits: dict[int, int]) -> None:
        self.versions, self.base, self.hits = versions, base, hits
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer and self.transport is not None:
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            headers = {k.strip().lower(): v.strip()
                       for k, _, v in (line.partition(":") for line in lines[1:])}  # fmt: skip
            status, extra, body = self.answer(path, headers.get("if-none-match"))
            reason = {200: "OK", 304: "Not Modified"}[status]
            length = f"Content-Length: {len(body)}\r\n" if status != 304 else ""
            self.transport.write(f"HTTP/1.1 {status} {reason}\r\n{extra}{length}\r\n".encode()
                                 + body)  # fmt: skip
            if headers.get("connection", "").lower() == "close":
                self.transport.close()

    def answer(self, path: str, if_none_match: str | None) -> tuple[int, str, bytes]:
        if path.startswith("/_bump/"):  # the bench changes a page
            self.versions[int(path.rsplit("/", 1)[-1])] += 1
            return 200, "Content-Type: text/plain\r\n", b"ok"
        if path == "/_hits":
            n = self.hits.pop(200, 0)
            return 200, "Content-Type: text/plain\r\n", str(n).encode()
        if path == "/sitemap.xml":
            locs = "".join(f"<url><loc>{self.base}/p/{i}</loc></url>" for i in self.versions)
            ns = "http://www.sitemaps.org/schemas/sitemap/0.9"
            body = f'<urlset xmlns="{ns}">{locs}</urlset>'.encode()
            return 200, "Content-Type: application/xml\r\n", body
        i = int(path.rsplit("/", 1)[-1])
        etag = f'"{self.versions[i]}"'
        if if_none_match == etag:
            return 304, f"ETag: {etag}\r\n", b""
        self.hits[200] = self.hits.get(200, 0) + 1
        return 200, f"ETag: {etag}\r\nContent-Type: text/html; charset=utf-8\r\n", \
            article(i, self.versions[i]).encode()


def serve_site(port: int, pages: int) -> None:
    """The site's process: serve until terminated."""
    versions, hits = dict.fromkeys(range(pages), 1), dict[int, int]()
    base = f"http://127.0.0.1:{port}"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: SiteProtocol(versions, base, hits),
                                          "127.0.0.1", port)  # fmt: skip
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_up(url: str) -> None:
    for _ in range(200):
        try:
            httpx.get(url + "/_hits", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError("site did not start")


def run(tenant: str, ctx: IndexContext, registry: SourceRegistry, url: str) -> RefreshReport:
    source = registry.add(tenant, url, every_s=3600)
    return refresh_source(source, ctx)


def row(name: str, rep: RefreshReport, hits: int) -> str:
    return (f"| {name} | {rep.discovered} | {hits} | {rep.outcomes.get('not_modified', 0)} "
            f"| {rep.chunks_embedded} | {rep.embed_requests} | {rep.seconds:.2f} |")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pages", type=int, default=1000)
    parser.add_argument("--changed", type=float, default=0.05)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--write", action="store_true", help="update docs/benchmarks.md")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # the site's process
    args = parser.parse_args()
    if args.serve:
        serve_site(args.serve, args.pages)
        return
    r = redis.Redis.from_url(os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/15"),
                             decode_responses=True)  # fmt: skip
    r.flushdb()
    # The site runs in its own process, as a real site would: its CPU is not ours.
    port = free_port()
    site = subprocess.Popen([sys.executable, __file__, "--pages", str(args.pages),
                             "--serve", str(port)])  # fmt: skip
    site_url = f"http://127.0.0.1:{port}"
    wait_up(site_url)
    hasher = HashEmbedder(model=MODEL)
    emb = LoopbackServer(make_embeddings_app(hasher.vectors, model=MODEL, rpm=None, tpm=None))
    emb.start()
    tmp = Path(tempfile.mkdtemp(prefix="bench-reindex-"))
    store = EdgeVectorStore(tmp / "q")
    fetch = FetchSettings(per_host_delay_s=0, per_host_concurrency=args.concurrency,
                          concurrency=args.concurrency, respect_robots=False)  # fmt: skip
    ctx = IndexContext(
        records=PageRecords(r),
        stored_pages=StoredPages(r, ttl_s=3600, scope=[str(tmp / "q")]),
        fetcher=HttpxFetcher(fetch, policy=AddressPolicy(allowed_networks=["127.0.0.1/32"])),
        embedder=OpenAIEmbedder(base_url=emb.url + "/v1", api_key="bench", model=MODEL),
        store=store,
        chunking=ChunkSettings(),
        embedding=EmbedSettings(),
        settings=IndexSettings(concurrency=args.concurrency, grace_s=0, max_pages=100_000),
    )
    registry = SourceRegistry(r)
    sitemap = site_url + "/sitemap.xml"
    try:
        initial = run("inc", ctx, registry, sitemap)
        n_changed = int(args.pages * args.changed)
        for i in range(0, args.pages, max(1, args.pages // max(1, n_changed)))[:n_changed]:
            httpx.get(f"{site_url}/_bump/{i}")
        httpx.get(site_url + "/_hits")
        incremental = run("inc", ctx, registry, sitemap)
        inc_hits = int(httpx.get(site_url + "/_hits").text)
        full = run("full", ctx, registry, sitemap)
        full_hits = int(httpx.get(site_url + "/_hits").text)
    finally:
        store.close()
        site.terminate()
        site.wait()
        emb.stop()
        r.flushdb()
    ratio = incremental.seconds / full.seconds if full.seconds else 0.0
    table = "\n".join([
        "| run | pages listed | 200 responses | 304 responses | chunks embedded "
        "| embed requests | wall s |",
        "|---|---|---|---|---|---|---|",
        row(f"re-index, {n_changed} changed", incremental, inc_hits),
        row("full index of the same site", full, full_hits),
    ])  # fmt: skip
    load = os.getloadavg()
    body = (
        f"{args.pages} loopback pages, {n_changed} ({args.changed:.0%}) changed between runs; "
        f"{args.concurrency} pages in parallel; embedded engine; feature-hashing embeddings "
        f"over a loopback OpenAI-compatible server; the site a minimal asyncio HTTP/1.1 "
        f"server in its own process. Initial index: {initial.seconds:.2f} s. Load average "
        f"{load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} at the end (2 cores, shared).\n\n"
        f"{table}\n\nRe-index wall time: {ratio:.1%} of the full run (target ≤ 10 %); "
        f"chunks embedded: {incremental.chunks_embedded} vs {full.chunks_embedded}.\n"
    )
    print(body)  # noqa: T201
    if args.write:
        from bench._report import write_section

        write_section("reindex", body)


if __name__ == "__main__":
    main()
