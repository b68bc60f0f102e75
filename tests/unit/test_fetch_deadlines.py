"""Every fetch ends by its deadline: a slow page, a trickling server, a hanging DNS lookup,
a hanging revalidation, a stuck extraction. They assert sub-second timing, so they run
alone (`make test`), not beside other tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import trafilatura

from tests.fetch_site import ARTICLE, LOOPBACK_ONLY, MARGIN_S, SETTINGS, Site, no_dns, timed_failure
from webctx.adapters.httpx_fetcher import HttpxFetcher
from webctx.errors import ExtractionError, FetchTimeout
from webctx.models import Download
from webctx.protocols import Revalidation
from webctx.stages.fetch import extract_page

pytestmark = pytest.mark.serial
DEADLINE = SETTINGS.model_copy(update={"total_timeout_s": 0.8})


@pytest.fixture(scope="module")
def fetcher() -> Iterator[HttpxFetcher]:
    """A loopback fetcher with a 0.8 s deadline."""
    fetcher = HttpxFetcher(DEADLINE, policy=LOOPBACK_ONLY, resolver=no_dns)
    yield fetcher
    fetcher.close()


def test_fetch_gives_up_on_slow_page_at_total_deadline(site: Site) -> None:
    patient_settings = DEADLINE.model_copy(update={"read_timeout_s": 10.0})
    patient = HttpxFetcher(patient_settings, policy=LOOPBACK_ONLY, resolver=no_dns)
    error, elapsed = timed_failure(patient, site.url("/slow"))
    assert isinstance(error, FetchTimeout)
    assert DEADLINE.total_timeout_s - 0.05 <= elapsed < DEADLINE.total_timeout_s + MARGIN_S


def test_fetch_cuts_off_trickling_server_at_total_deadline(
    site: Site, fetcher: HttpxFetcher
) -> None:
    error, elapsed = timed_failure(fetcher, site.url("/trickle"))
    assert isinstance(error, FetchTimeout)  # each 8-byte read is far inside read_timeout_s
    assert elapsed < DEADLINE.total_timeout_s + MARGIN_S
    assert site.sent["/trickle"] < len(ARTICLE)


def test_fetch_gives_up_on_hanging_dns_at_deadline(site: Site) -> None:
    release = threading.Event()

    def hanging(host: str, port: int) -> list[str]:
        release.wait(5.0)
        return ["127.0.0.1"]

    slow_connect = DEADLINE.model_copy(update={"connect_timeout_s": 5.0})
    fetcher = HttpxFetcher(slow_connect, policy=LOOPBACK_ONLY, resolver=hanging)
    try:
        error, elapsed = timed_failure(fetcher, f"http://hang.example.test:{site.main.port}/")
    finally:
        release.set()
        fetcher.close()
    assert isinstance(error, FetchTimeout)
    assert elapsed < DEADLINE.total_timeout_s + MARGIN_S


def test_revalidation_of_a_hanging_page_times_out(site: Site, fetcher: HttpxFetcher) -> None:
    started = time.monotonic()
    [(_, result)] = fetcher.fetch_many([Revalidation(site.url("/slow"), etag='"v1"')], window=1)
    assert isinstance(result, FetchTimeout)
    assert time.monotonic() - started < DEADLINE.total_timeout_s + MARGIN_S


def test_extract_page_gives_up_after_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    def stuck(*args: object, **kwargs: object) -> None:
        time.sleep(1.0)

    monkeypatch.setattr(trafilatura, "bare_extraction", stuck)
    download = Download(
        url="http://127.0.0.1/x",
        final_url="http://127.0.0.1/x",
        status=200,
        content_type="text/html",
        body=ARTICLE.encode(),
    )
    started = time.monotonic()
    with pytest.raises(ExtractionError, match="took over"):
        extract_page(download, timeout_s=0.1)
    assert time.monotonic() - started < 0.5
