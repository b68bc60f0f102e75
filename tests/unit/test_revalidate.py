"""Revalidation: conditional GETs on the fetcher's lean path, kept-alive connections, and
every cap and guard of the full path.
"""

from __future__ import annotations

import socket
import threading

import pytest
from starlette.types import Receive, Scope, Send

from tests.fetch_site import ARTICLE, LOOPBACK_ONLY, SETTINGS, Site, no_dns
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.devweb.server import LoopbackServer
from webctx.devweb.site import SitePage, make_site_app
from webctx.errors import (
    BlockedURL,
    ContentTooLarge,
    FetchError,
    HTTPStatusError,
    UnsupportedContent,
)
from webctx.models import Download
from webctx.protocols import BatchFetcher, Revalidation


def test_revalidations_reuse_kept_alive_connections_and_report_failures() -> None:
    ports: list[int] = []
    inner = make_site_app({"/p": SitePage(ARTICLE)})

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("client"):
            ports.append(scope["client"][1])  # the client's port: one per TCP connection
        await inner(scope, receive, send)

    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    assert isinstance(fetcher, BatchFetcher)
    try:
        with LoopbackServer(app) as server:
            first = fetcher.fetch(f"{server.url}/p")
            again = Revalidation(f"{server.url}/p", etag=first.etag)
            requests = [again] * 5 + [Revalidation(f"{server.url}/missing", etag='"gone"'),
                                      Revalidation("ftp://127.0.0.1/p")]  # fmt: skip
            results = dict(fetcher.fetch_many(requests, window=1))
            assert fetcher.fetch(f"{server.url}/p", etag=first.etag).status == 304
    finally:
        fetcher.close()
    assert [results[i].status for i in range(5)] == [304] * 5  # type: ignore[union-attr]
    missing, refused = results[5], results[6]
    assert isinstance(missing, HTTPStatusError) and missing.status == 404
    assert isinstance(refused, BlockedURL)
    # The revalidations (5 x 304, then the 404 read to its end) share one kept-alive
    # connection of the lean path; the two plain fetches share one of the httpx pool.
    assert len(ports) == 8, ports
    assert len(set(ports[1:7])) == 1 and ports[0] == ports[7] != ports[1]


def _revalidate(fetcher: HttpxFetcher, url: str, etag: str) -> Download | FetchError:
    [(_, result)] = list(fetcher.fetch_many([Revalidation(url, etag=etag)], window=1))
    return result


def test_revalidation_of_a_changed_page_downloads_it_once(
    site: Site, fetcher: HttpxFetcher
) -> None:
    before = site.hits["/article"]
    result = _revalidate(fetcher, site.url("/article"), '"v0"')
    assert isinstance(result, Download) and result.status == 200
    assert b"Lithium plating" in result.body and result.etag == '"v1"'
    assert result.content_type == "text/html"
    assert site.hits["/article"] - before == 1


@pytest.mark.parametrize(("path", "error"), [("/huge", ContentTooLarge), ("/bomb", ContentTooLarge),
                                             ("/not-a-pdf", UnsupportedContent),
                                             ("/binary-as-html", UnsupportedContent)])  # fmt: skip
def test_revalidation_answered_with_a_body_keeps_every_cap(
    site: Site, fetcher: HttpxFetcher, path: str, error: type[FetchError]
) -> None:
    assert isinstance(_revalidate(fetcher, site.url(path), '"v0"'), error)


def test_revalidation_of_a_redirect_is_followed_by_the_full_path(
    site: Site, fetcher: HttpxFetcher
) -> None:
    result = _revalidate(fetcher, site.url("/hop"), '"v1"')
    assert isinstance(result, Download) and result.final_url == site.url("/article")
    assert isinstance(_revalidate(fetcher, site.url("/loop"), '"v1"'), FetchError)


def test_revalidation_never_connects_to_a_forbidden_address(
    site: Site, fetcher: HttpxFetcher
) -> None:
    named = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY,
                         resolver=lambda host, port: ["127.0.0.2"])  # fmt: skip
    port = site.other.url.rsplit(":", 1)[1]
    try:
        for guarded, url in (
            (fetcher, f"{site.other.url}/"),
            (named, f"http://other.test:{port}/"),
        ):
            assert isinstance(_revalidate(guarded, url, '"v1"'), BlockedURL)
    finally:
        named.close()
    assert site.other_hits.total() == 0


def test_revalidation_reconnects_when_the_server_dropped_the_kept_connection() -> None:
    """A server that closes every connection after its 304 (without saying so)."""
    accepted: list[int] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(4096)
                conn.sendall(b'HTTP/1.1 304 Not Modified\r\nETag: "a"\r\n\r\n')

    threading.Thread(target=serve, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/p"
    fetcher = HttpxFetcher(SETTINGS, policy=LOOPBACK_ONLY, resolver=no_dns)
    try:
        results = [_revalidate(fetcher, url, '"a"') for _ in range(3)]
    finally:
        fetcher.close()
        listener.close()
    assert [getattr(r, "status", r) for r in results] == [304, 304, 304]
    assert len(accepted) == 3


def test_revalidation_of_a_refused_connection_is_one_fetch_error(fetcher: HttpxFetcher) -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens there now: connections are refused
    result = _revalidate(fetcher, f"http://127.0.0.1:{port}/p", '"v1"')
    assert type(result) is FetchError and "cannot connect" in str(result)
    assert result.url == f"http://127.0.0.1:{port}/p"
