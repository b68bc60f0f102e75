"""The task policy: a transient failure is retried by the settings, after the provider's
retry-after when it gave one, and no more once the retries are spent."""

from __future__ import annotations

import pytest
from celery.exceptions import Retry

from webctx.errors import ProviderUnavailable, RateLimited
from webctx.workers.app import app
from webctx.workers.policy import StageTask, retry_countdown


def test_the_countdown_honours_retry_after_else_doubles_and_is_capped() -> None:
    for retries in range(5):
        waited = retry_countdown(RateLimited(retry_after=7.0), retries, backoff_s=2.0,
                                 backoff_max_s=60.0)  # fmt: skip
        assert 7.0 <= waited <= 10.5  # the provider's word, plus up to half of jitter
    doubling = [retry_countdown(ProviderUnavailable("5xx"), n, backoff_s=2.0, backoff_max_s=60.0)
                for n in range(4)]  # fmt: skip
    for n, waited in enumerate(doubling):
        assert 2.0 * 2**n <= waited <= 1.5 * 2.0 * 2**n
    capped = retry_countdown(RateLimited(retry_after=600.0), 0, backoff_s=2.0, backoff_max_s=60.0)
    assert 60.0 <= capped <= 90.0


@app.task(name="webctx.test.policy", bind=True)
def _probe(self: StageTask) -> None:
    """A task to read the policy of (never sent)."""


def test_every_task_takes_its_retries_from_the_settings() -> None:
    assert isinstance(_probe, StageTask)
    assert _probe.max_retries == 5 and _probe.default_retry_delay == 2.0
    assert _probe.retry_backoff_max == 60.0
    tasks = [t for name, t in app.tasks.items() if name.startswith("webctx.")]
    assert tasks and all(isinstance(t, StageTask) for t in tasks)


def test_a_transient_failure_is_retried_until_the_retries_are_spent() -> None:
    # As if run by `apply()`: Celery raises the Retry without sending the new message, so
    # no broker is needed (the default one is the local service's, not started here).
    _probe.push_request(retries=0, called_directly=False, is_eager=True)
    try:
        with pytest.raises(Retry):
            _probe.retry_transient(ProviderUnavailable("5xx"))
    finally:
        _probe.pop_request()
    _probe.push_request(retries=5, called_directly=False, is_eager=False)
    try:
        assert _probe.retry_transient(ProviderUnavailable("5xx")) is None  # spent: record it
    finally:
        _probe.pop_request()


def test_a_providers_failure_is_retried_by_its_breakers_verdict_whatever_the_backoff() -> None:
    # The breaker decides in 1.5 s whether the provider is down: the retry comes by then,
    # even where the backoff (8 s and more at the fourth retry) would wait longer.
    exc = ProviderUnavailable("searxng: HTTP 502", kind="status", verdict_in_s=1.5)
    for retries in range(6):
        waited = retry_countdown(exc, retries, backoff_s=2.0, backoff_max_s=60.0)
        assert waited <= 1.5
    early = retry_countdown(ProviderUnavailable("x", verdict_in_s=30.0), 0, backoff_s=2.0,
                            backoff_max_s=60.0)  # fmt: skip
    assert 2.0 <= early <= 3.0  # a verdict far off: the backoff as before
