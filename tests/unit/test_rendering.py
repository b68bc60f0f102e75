"""A job's page filled by script: sent to the render queue, and its fetch completed only
when the render ends (fakeredis, fakes of our Fetcher and Renderer Protocols)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.fetch_site import ARTICLE
from webctx.devweb.site import script_shell_pages
from webctx.errors import FetchError, FetchTimeout
from webctx.jobs import pages
from webctx.jobs.engine import Engine
from webctx.models import Download, JobRequest
from webctx.settings import RenderSettings, Settings
from webctx.workers.deps import build_deps

URL = "https://app.example.org/spa/care"
SHELL = script_shell_pages("/spa/care", "Battery care", ["x"])["/spa/care"].body_bytes()
RENDERED = ARTICLE.encode()


def _download(url: str, body: bytes) -> Download:
    return Download(url=url, final_url=url, status=200, content_type="text/html", body=body)


class ShellFetcher:
    """Serves the shell of a single-page app for every URL."""

    def __init__(self, body: bytes = SHELL) -> None:
        self.body = body

    def fetch(
        self, url: str, *, etag: str | None = None, last_modified: str | None = None
    ) -> Download:
        return _download(url, self.body)


class FakeRenderer:
    """Gives the rendered article, or raises `error`; counts its renders."""

    def __init__(self, error: FetchError | None = None) -> None:
        self.error = error
        self.rendered: list[str] = []

    def render(self, url: str) -> Download:
        self.rendered.append(url)
        if self.error is not None:
            raise self.error
        return _download(url, RENDERED)


class Started:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[str | int, ...]]] = []

    def __call__(self, stage: str, arguments: Sequence[tuple[str | int, ...]]) -> None:
        self.calls += [(stage, args) for args in arguments]

    def stages(self) -> list[str]:
        return [stage for stage, _ in self.calls]


def _engine(
    tmp_path: Path,
    started: Started,
    *,
    renderer: FakeRenderer | None,
    fetcher: ShellFetcher | None = None,
    **render: object,
) -> Engine:
    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        render=RenderSettings(browser="no-such-browser", **render))  # type: ignore[arg-type]  # fmt: skip
    engine = build_deps(settings, start=started).engine
    return dataclasses.replace(engine, fetcher=fetcher or ShellFetcher(), renderer=renderer)


def _job(engine: Engine) -> tuple[str, str]:
    job_id = engine.jobs.create(JobRequest(question="how do batteries age?"))
    (url_id,) = engine.jobs.set_urls(job_id, [URL])
    return job_id, url_id


def test_a_shell_goes_to_render_and_its_fetch_completes_only_when_the_render_ends(
    tmp_path: Path,
) -> None:
    started, renderer = Started(), FakeRenderer()
    engine = _engine(tmp_path, started, renderer=renderer)
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    assert started.calls == [("render", (job_id, url_id))]
    assert not engine.jobs.is_done(job_id, "fetch", url_id)  # rank must not start yet
    assert engine.jobs.page_for(job_id, url_id) is None and not engine.jobs.failures(job_id)

    pages.render_one(engine, job_id, url_id)
    assert renderer.rendered == [URL]
    assert engine.jobs.is_done(job_id, "fetch", url_id)
    page = engine.jobs.page_for(job_id, url_id)
    assert page is not None and "Lithium plating" in page.text
    assert started.stages() == ["render", "embed"]
    assert engine.jobs.counters(job_id).get("pages_rendered") == 1
    assert [r.retrieved for r in engine.jobs.retrievals(job_id).values()] == ["live"]

    pages.render_one(engine, job_id, url_id)  # redelivered: no second render
    assert renderer.rendered == [URL]


def test_a_failed_render_completes_the_fetch_and_settles_the_page(tmp_path: Path) -> None:
    started = Started()
    renderer = FakeRenderer(FetchTimeout(URL, "the page did not render within 20s"))
    engine = _engine(tmp_path, started, renderer=renderer)
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    pages.render_one(engine, job_id, url_id)
    assert engine.jobs.is_done(job_id, "fetch", url_id)
    assert started.stages() == ["render", "rank"]  # the only page settled: rank starts
    (failure,) = engine.jobs.failures(job_id)
    assert (failure.stage, failure.reason) == ("render", "timeout")


@pytest.mark.parametrize(
    ("render", "renderer", "says"),
    [
        ({}, None, "apt-get install chromium"),  # no browser in this process
        ({"enabled": False}, FakeRenderer(), "WEBCTX_RENDER__ENABLED"),
        ({"never_domains": ["example.org"]}, FakeRenderer(), "NEVER_DOMAINS"),
    ],
)
def test_a_shell_that_cannot_be_rendered_fails_needs_render_saying_why(
    tmp_path: Path, render: dict[str, object], renderer: FakeRenderer | None, says: str
) -> None:
    started = Started()
    engine = _engine(tmp_path, started, renderer=renderer, **render)
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    assert started.stages() == ["rank"]  # settled at once
    (failure,) = engine.jobs.failures(job_id)
    assert failure.reason == "needs_render" and says in failure.error
    assert "rendered by script" in failure.error


def test_a_worker_without_a_browser_still_diverts_when_render_is_remote(tmp_path: Path) -> None:
    started = Started()
    engine = _engine(tmp_path, started, renderer=None, remote=True)
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    assert started.stages() == ["render"]
    pages.render_one(engine, job_id, url_id)  # ...and a render worker without one says so
    (failure,) = engine.jobs.failures(job_id)
    assert (failure.stage, failure.reason) == ("render", "needs_render")
    assert "apt-get install chromium" in failure.error


def test_always_rendered_domain_goes_to_render_even_when_static_text_was_found(
    tmp_path: Path,
) -> None:
    started = Started()
    engine = _engine(tmp_path, started, renderer=FakeRenderer(), fetcher=ShellFetcher(RENDERED),
                     always_domains=["app.example.org"])  # fmt: skip
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    assert started.stages() == ["render"]


def test_an_article_is_never_sent_to_render(tmp_path: Path) -> None:
    started = Started()
    renderer = FakeRenderer()
    engine = _engine(tmp_path, started, renderer=renderer, fetcher=ShellFetcher(RENDERED))
    job_id, url_id = _job(engine)
    pages.fetch_one(engine, job_id, url_id)
    assert started.stages() == ["embed"] and renderer.rendered == []


def test_domain_lists_read_from_the_environment_as_comma_separated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WEBCTX_RENDER__ALWAYS_DOMAINS", "App.example.org, spa.test")
    monkeypatch.setenv("WEBCTX_RENDER__NEVER_DOMAINS", '["slow.test"]')
    render = Settings().render
    assert render.always_domains == ["app.example.org", "spa.test"]
    assert render.never_domains == ["slow.test"]


class _Queues:
    def __init__(self) -> None:
        self.deselected: list[str] = []

    def deselect(self, names: list[str]) -> None:
        self.deselected += names


def test_a_worker_without_a_browser_leaves_the_render_queue_saying_so_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from types import SimpleNamespace

    from webctx.workers.app import leave_render_queue, set_deps

    settings = Settings(embedding_provider="hash", qdrant_path=tmp_path / "q",
                        render=RenderSettings(browser="no-such-browser"))  # fmt: skip
    set_deps(build_deps(settings, start=Started()))
    queues = _Queues()
    instance = SimpleNamespace(app=SimpleNamespace(amqp=SimpleNamespace(queues=queues)))
    try:
        with caplog.at_level("WARNING", logger="webctx.worker"):
            left = leave_render_queue(instance, {"fetch", "render", "embed"})
        assert left == {"fetch", "embed"} and queues.deselected == ["render"]
        (line,) = [r.getMessage() for r in caplog.records]
        assert "not consuming render" in line and "apt-get install chromium" in line
        with pytest.raises(SystemExit):
            leave_render_queue(instance, {"render"})  # nothing left to serve
    finally:
        set_deps(None)
