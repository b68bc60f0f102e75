"""The one exception tree of webctx.

WebctxError
+-- ConfigError                  # settings that cannot work together
|   +-- SettingsMismatch(names)  # the busy local service runs other settings than a client's
+-- InvalidRequest               # a malformed request (CLI, API): 422
|   +-- InvalidTenant            # a tenant name outside [A-Za-z0-9._-]{1,64}
|   +-- InvalidBatch             # a batch file with bad lines (each named)
+-- JobNotFound(job_id)          # no such job, or another tenant's: 404
|   +-- BatchNotFound(batch_id)
+-- Unauthorized                 # no API key, or an unknown or revoked one: 401
+-- TooManyRequests(retry_after_s)  # the key spent its request budget: 429
|   +-- TooManyJobs(unfinished)  # the tenant's unfinished jobs fill its admission caps
+-- QuotaExceeded(stored_bytes, limit_bytes)  # the tenant's jobs hold its byte quota: 403
+-- Conflict                     # not in a state that allows this: 409
|   +-- BatchConflict            # the batch name holds a different file
+-- TransientError               # the only thing Celery retries
|   +-- RateLimited(retry_after, rate_limits)  # 429 from a provider
|   +-- FetchTimeout(url)        # also a FetchError
|   +-- ProviderUnavailable(kind)  # 5xx / connection errors from search, embeddings, store
+-- FetchError(url)
|   +-- BlockedURL               # SSRF guard, scheme, robots.txt
|   |   +-- OptedOut(rule)       # the publisher reserved the page (noai, TDM reservation)
|   |   +-- Interstitial         # the site answered a block or challenge page instead
|   +-- InvalidRedirect          # a redirect's Location is no URL httpx can parse
|   +-- ContentTooLarge
|   +-- UnsupportedContent       # not HTML / XHTML / plain text
|   +-- HTTPStatusError(status)
|   +-- ExtractionError          # no main text could be extracted
|       +-- UnreadablePdf(reason)  # encrypted, malformed, too_many_pages, no_text_layer,
|                                  # timeout, too_large (the sandbox's limits)
|   +-- NeedsRender              # a script-rendered shell and no browser to render it
+-- ProviderError(provider)      # search / embeddings / vector store refused the request
    +-- ProviderDown(provider, url)  # failing for a while: the shared breaker is open

The HTTP API maps the tree to status codes in one table (`webctx.api.http`); the MCP tools
raise ToolError with the message.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class WebctxError(Exception):
    """Base of every error webctx raises on purpose."""


class ConfigError(WebctxError):
    """Settings that cannot work (missing URL, conflicting options)."""


class SettingsMismatch(ConfigError):
    """The local service runs with other settings than the client's and is busy, so it
    cannot be restarted with them: the client's work is refused, never run under others."""

    def __init__(self, names: Sequence[str], *, pid: int, restarted: bool = False) -> None:
        self.names = list(names)
        differ = f"{', '.join(self.names)} {'differs' if len(self.names) == 1 else 'differ'}"
        if restarted:
            message = (f"the local service (pid {pid}), restarted for this client, still runs "
                       f"other settings ({differ}): did the config file change meanwhile? "
                       "run the command again")  # fmt: skip
        else:
            message = (f"refused: the local service (pid {pid}) is busy with other settings "
                       f"than this client's ({differ}); retry once it is idle (it then restarts "
                       "with yours), give both the same settings (`webctx config set NAME "
                       "VALUE`), or use another WEBCTX_DATA_DIR")  # fmt: skip
        super().__init__(message)


class InvalidRequest(WebctxError):
    """A job request that fails validation."""


class InvalidTenant(InvalidRequest):
    """A tenant name that is empty, too long, or has characters outside [A-Za-z0-9._-]."""


class InvalidBatch(InvalidRequest):
    """A batch file with bad lines; the message names each."""


class JobNotFound(WebctxError):
    """No job with this id exists (or it has expired)."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"job {job_id!r} not found")
        self.job_id = job_id


class BatchNotFound(JobNotFound):
    """No batch with this id (or another tenant's)."""

    def __init__(self, batch_id: str) -> None:
        super().__init__(batch_id)
        self.args = (f"batch {batch_id!r} not found",)


class Unauthorized(WebctxError):
    """No API key, or an unknown or revoked one."""


class TooManyRequests(WebctxError):
    """The key spent its request budget for this window."""

    def __init__(self, message: str, *, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class TooManyJobs(TooManyRequests):
    """The tenant's unfinished jobs fill its admission caps (webctx.jobs.admission): a 429,
    since one of them finishing frees a slot within seconds."""

    def __init__(self, message: str, *, retry_after_s: int, unfinished: int) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.unfinished = unfinished


class QuotaExceeded(WebctxError):
    """The tenant's live jobs already hold its stored-bytes quota; this job would pass it.

    403, not 413 (the request itself may be small), 429 (no request window resets it: jobs
    expire days later) or 507 (a 5xx: clients retry it and alerts blame the server)."""

    def __init__(self, message: str, *, stored_bytes: int, limit_bytes: int) -> None:
        super().__init__(message)
        self.stored_bytes = stored_bytes
        self.limit_bytes = limit_bytes


class Conflict(WebctxError):
    """The job (or batch) is not in a state that allows this."""


class BatchConflict(Conflict):
    """The batch name is taken by a different file."""


class TransientError(WebctxError):
    """A failure that may go away when retried."""


class RateLimited(TransientError):
    """The provider answered 429; retry after `retry_after` seconds. `rate_limits`: the
    answer's `x-ratelimit-*` headers, lower-cased (empty when it sent none)."""

    def __init__(
        self,
        message: str = "rate limited",
        *,
        retry_after: float | None = None,
        rate_limits: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.rate_limits: Mapping[str, str] = dict(rate_limits or {})


class ProviderUnavailable(TransientError):
    """A provider answered 5xx, timed out, or could not be reached: `kind` says which
    ("status", "timeout", "unreachable"; "error" when the adapter cannot tell), `detail`
    how in a few words ("HTTP 500", "connection refused"). `verdict_in_s`: when the shared
    breaker (webctx/net/breaker.py) decides whether the provider is down, so a retry comes
    by then rather than after a longer backoff."""

    def __init__(
        self,
        *args: object,
        kind: str = "error",
        detail: str = "",
        verdict_in_s: float | None = None,
    ) -> None:
        super().__init__(*args)
        self.kind, self.detail = kind, detail or str(self)
        self.verdict_in_s = verdict_in_s


class FetchError(WebctxError):
    """A page could not be fetched or extracted."""

    reason = "fetch_error"

    def __init__(self, url: str, message: str) -> None:
        super().__init__(message)
        self.url = url


class FetchTimeout(FetchError, TransientError):
    """The page did not arrive within its deadline."""

    reason = "timeout"


class BlockedURL(FetchError):
    """The URL is refused by policy (scheme, address, robots.txt)."""

    reason = "blocked"


class OptedOut(BlockedURL):
    """The publisher reserved the page from text and data mining (`X-Robots-Tag: noai`, a
    TDM reservation); `rule` names what said so."""

    reason = "opted_out"

    def __init__(self, url: str, rule: str) -> None:
        super().__init__(url, rule)
        self.rule = rule


class Interstitial(BlockedURL):
    """The site answered with a block, CAPTCHA or "enable JavaScript" page instead of the
    page: the site blocked the download, not our policy."""


class InvalidRedirect(FetchError):
    """A redirect points to something that is no parsable URL (`data:…`, garbage)."""

    reason = "invalid_redirect"


class ContentTooLarge(FetchError):
    """The decoded body exceeded the size cap."""

    reason = "too_large"


class UnsupportedContent(FetchError):
    """The response is not HTML, XHTML or plain text."""

    reason = "unsupported_content"


class HTTPStatusError(FetchError):
    """The server answered with a non-2xx status."""

    reason = "http_status"

    def __init__(self, url: str, message: str, *, status: int) -> None:
        super().__init__(url, message)
        self.status = status


class ExtractionError(FetchError):
    """No main text could be extracted from the page."""

    reason = "extraction"


class NeedsRender(FetchError):
    """The page is an empty shell its scripts fill, and it cannot be rendered here."""

    reason = "needs_render"
    INSTALL_HINT = ("rendering needs Chromium and Playwright: `apt-get install chromium` and "
                    "`pip install 'webctx[render]'` (or set WEBCTX_RENDER__BROWSER)")  # fmt: skip


class UnreadablePdf(ExtractionError):
    """A PDF refused or not read within its sandbox's limits; `reason` says which.

    Not a TransientError, timeouts included: the same file would hit the same limit again.
    """

    reasons = ("encrypted", "malformed", "too_many_pages", "no_text_layer", "timeout", "too_large")

    def __init__(self, url: str, message: str, *, reason: str) -> None:
        super().__init__(url, message)
        self.reason = reason if reason in self.reasons else "malformed"


class ProviderError(WebctxError):
    """A search, embeddings or vector-store provider refused the request."""

    def __init__(self, provider: str, message: str) -> None:
        super().__init__(f"{provider}: {message}")
        self.provider = provider


class ProviderDown(ProviderError):
    """A provider failed every request for a while (refused, timed out, 5xx, or 429 past
    the budget) and the shared breaker holds it open: a job that needs it fails at once,
    its error this one line naming the provider, its URL and the fix."""

    reason = "provider_down"

    def __init__(self, provider: str, message: str, *, url: str = "") -> None:
        super().__init__(provider, message)
        self.args = (message,)
        self.url = url
