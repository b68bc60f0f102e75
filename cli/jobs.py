"""`webctx research`, `webctx status`, `webctx bundle`: one research job from the shell."""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import typer

from webctx.cli.collector import settle
from webctx.cli.common import OutputFormat, fail, print_bundle
from webctx.cli.interrupt import Interrupted, watch
from webctx.errors import WebctxError
from webctx.knobs import default as _default
from webctx.knobs import help_text as _help

if TYPE_CHECKING:
    from webctx.jobs.store import JobProgress, JobStore
    from webctx.models import JobRequest

# What a command needs only once its job is submitted (the job store, redis-py, the
# settings) is imported where it is used: `research` hands its request to a running local
# service before loading them (webctx/api/inbox.py).


def _request(options: dict[str, Any]) -> JobRequest:
    from pydantic import ValidationError

    from webctx.api.inbox import validation_problems
    from webctx.models import JobRequest

    try:
        return JobRequest.model_validate(options)
    except ValidationError as exc:
        raise fail(f"invalid request: {validation_problems(exc)}") from exc


def research(
    question: Annotated[str, typer.Argument(help="The research question.")],
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.json,
    # The knobs' defaults and help: the one table (webctx/knobs.py), read without pydantic.
    max_sources: Annotated[int, typer.Option(help=_help("max_sources"))] = _default("max_sources"),
    top_k: Annotated[int, typer.Option(help=_help("top_k"))] = _default("top_k"),
    token_budget: Annotated[
        int, typer.Option(help=_help("token_budget"))
    ] = _default("token_budget"),
    max_queries: Annotated[int, typer.Option(help=_help("max_queries"))] = _default("max_queries"),
    include_domains: Annotated[
        list[str] | None,
        typer.Option("--include-domain", help="Only sources from this domain (repeatable)."),
    ] = None,
    exclude_domains: Annotated[
        list[str] | None,
        typer.Option("--exclude-domain", help="No sources from this domain (repeatable)."),
    ] = None,
    recency_days: Annotated[int | None, typer.Option(help=_help("recency_days"))] = None,
    max_age: Annotated[
        int | None,
        typer.Option(
            help="Seconds: reuse a page copy confirmed current this recently (default: "
            "WEBCTX_PAGE_CACHE_TTL_S without a broker, none with one); 0: download every page "
            "now; -1: stored copies "
            "only, no download."
        ),
    ] = None,
    stale_if_error: Annotated[
        bool,
        typer.Option(
            "--stale-if-error", help="Serve an older copy (marked stale) when a download fails."
        ),
    ] = False,
    depth: Annotated[str, typer.Option(help=_help("depth"))] = _default("depth"),
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Print the job id and exit.")] = False,
    timeout: Annotated[float | None, typer.Option(help="Seconds to wait for the job.")] = None,
    idempotency_key: Annotated[
        str | None,
        typer.Option(help="The same key (and request) gives the same job, as the API's header."),
    ] = None,
) -> None:
    """Research a question and print its cited context bundle."""
    options = _options(question=question, max_sources=max_sources, top_k=top_k,
                       token_budget=token_budget, max_queries=max_queries,
                       include_domains=include_domains, exclude_domains=exclude_domains,
                       recency_days=recency_days, max_age=max_age,
                       stale_if_error=stale_if_error, depth=depth)  # fmt: skip
    job_id = _handed.pop() if _handed else None
    if job_id is None:
        job_id = _hand_to_service(options, idempotency_key, wait=not no_wait)
    if job_id is None:
        job_id = _submit(_request(options), idempotency_key)
    watch(None if no_wait else job_id)  # Ctrl-C cancels a job waited for (cli/interrupt.py)
    settle()  # what the submission loaded stays; the wait collects as usual
    if no_wait:
        typer.echo(job_id)
        return
    _wait(job_id, format, timeout)


def _options(
    *,
    question: str,
    max_sources: int,
    top_k: int,
    token_budget: int,
    max_queries: int,
    include_domains: Sequence[str] | None,
    exclude_domains: Sequence[str] | None,
    recency_days: int | None,
    max_age: int | None,
    stale_if_error: bool,
    depth: str = "fast",
) -> dict[str, Any]:
    """The job request of `webctx research`'s options, as JSON."""
    return {"question": question, "max_sources": max_sources, "top_k": top_k,
            "token_budget": token_budget, "max_queries": max_queries,
            "include_domains": list(include_domains or []),
            "exclude_domains": list(exclude_domains or []), "recency_days": recency_days,
            "max_age": max_age, "stale_if_error": stale_if_error, "depth": depth}  # fmt: skip


_handed: list[str] = []
"""The job the running service submitted from this command's words (webctx/cli/handover.py)."""


def request_of_argv(argv: Any, definition: Any) -> tuple[dict[str, Any], str | None] | None:
    """The request and idempotency key of `webctx research` with the words `argv`, parsed
    by this command's definition (in the local service, for a command that handed its
    words over: webctx/cli/handover.py); None unless they parse here, with the client's
    own definition of the command, into a request (help and usage errors included)."""
    from webctx.cli.handover import HELP
    from webctx.cli.handover import definition as this_definition

    words = argv if isinstance(argv, list) and all(isinstance(w, str) for w in argv) else None
    if words is None or HELP & set(words) or definition != this_definition():
        return None
    try:
        params = _research_command().make_context("research", list(words)).params
    except Exception:  # noqa: BLE001 - any refusal: the command parses and says why
        return None
    names = inspect.signature(_options).parameters
    return _options(**{n: params[n] for n in names}), params["idempotency_key"]


def warm_research_parser() -> bool:
    """Parse a command line once, unless one of this worker's tasks is running (True once
    done): the first parse builds a validator per option (~80 ms of the interpreter, which
    a job's tasks share)."""
    from celery.worker import state

    from webctx.cli.handover import definition

    if state.active_requests:
        return False
    with contextlib.suppress(OSError):
        request_of_argv(["warm"], definition())
    return True


@functools.cache
def _research_command() -> Any:
    return typer.main.get_command(research_cli()).get_command(None, "research")  # type: ignore[attr-defined]


def _hand_to_service(
    options: dict[str, Any], idempotency_key: str | None, *, wait: bool
) -> str | None:
    """The job id when the running local service took the request, else None (a broker is
    set, no service runs yet, or it runs with other settings): the command submits."""
    from webctx.workers.service_client import local_data_dir

    data_dir = local_data_dir(dict(os.environ))
    if data_dir is None:
        return None
    from webctx.api.inbox import hand_over

    answer = hand_over(data_dir, options, idempotency_key=idempotency_key)
    if answer is None:
        return None
    if "job_id" not in answer:
        raise fail(str(answer.get("error")), code=int(answer.get("code") or 1))
    if answer.get("interrupted") and wait:  # Ctrl-C while the service submitted it
        raise Interrupted(str(answer["job_id"]))
    return str(answer["job_id"])


def _submit(request: JobRequest, idempotency_key: str | None) -> str:
    """Submit from this process, as the API does: the local tenant, the request limits,
    the tenant's quota and the idempotency key; with no broker, the local service runs
    the job."""
    import redis
    from kombu.exceptions import OperationalError

    from webctx.api.runtime import Caller, open_runtime, submit
    from webctx.settings import get_settings

    settings = get_settings()
    try:
        with open_runtime(settings) as runtime:
            caller = Caller(tenant=settings.local_tenant)
            return submit(runtime, caller, request, idempotency_key=idempotency_key)[0]
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    except (redis.RedisError, OperationalError) as exc:
        raise fail(f"broker or job state store unreachable: {exc}", code=1) from exc


def _wait(job_id: str, fmt: OutputFormat, timeout: float | None) -> None:
    """Wait for the job (the local service restarted if it stops meanwhile), print it."""
    import redis

    from webctx.api.runtime import Runtime
    from webctx.cli.common import state_stores
    from webctx.settings import get_settings

    settings = get_settings()
    wait_s = timeout if timeout is not None else settings.job_timeout_s + 30
    runtime = Runtime(settings, state_stores(settings))
    try:
        _wait_and_print(runtime.jobs, job_id, fmt, wait_s, keep=runtime.keep_service)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    except redis.RedisError as exc:
        raise fail(f"job state store unreachable: {exc}", code=1) from exc
    finally:
        runtime.stores.close()


def _poller(
    jobs: JobStore, job_id: str, keep: Callable[[], None] = lambda: None
) -> Callable[[], JobProgress]:
    """Poll the job's progress (after `keep`: the local service restarted if it stopped);
    ride out a Redis outage (the wait's timeout bounds it), and say so clearly when Redis
    came back without the job's state."""
    import redis

    from webctx.errors import JobNotFound
    from webctx.jobs.store import JobProgress
    from webctx.models import JobStatus

    last = [JobProgress(job_id=job_id, status=JobStatus.QUEUED)]

    def poll() -> JobProgress:
        try:
            keep()
            last[0] = jobs.progress(job_id)
        except JobNotFound as exc:
            raise WebctxError(
                f"job {job_id}: job state lost (Redis restarted without persistence?); resubmit"
            ) from exc
        except redis.RedisError:
            pass  # Redis restarting: keep the last progress until the deadline
        return last[0]

    return poll


def _until_finished(jobs: JobStore, job_id: str) -> Callable[[float], None]:
    """A pause between polls that ends when the job finishes (a Redis outage: a plain sleep,
    the poller rides it out)."""

    import redis

    def pause(seconds: float) -> None:
        try:
            jobs.wait_finished(job_id, seconds)
        except redis.RedisError:
            time.sleep(seconds)

    return pause


def _wait_and_print(
    jobs: JobStore,
    job_id: str,
    fmt: OutputFormat,
    wait_s: float,
    *,
    keep: Callable[[], None] = lambda: None,
) -> None:
    from webctx.cli.progress import wait_for_job
    from webctx.models import JobStatus

    progress = wait_for_job(_poller(jobs, job_id, keep), timeout_s=wait_s,
                            pause=_until_finished(jobs, job_id))  # fmt: skip
    bundle = jobs.bundle(job_id)
    if bundle is not None:
        print_bundle(bundle, fmt)
    if progress.status is not JobStatus.SUCCEEDED:
        raise fail(f"job {job_id} {progress.status.value}: {progress.error or ''}", code=1)


JobRef = Annotated[
    str, typer.Argument(help="The job's id, or a unique prefix of it (4 characters at least).")
]


def job_id_of(jobs: JobStore, ref: str) -> str:
    """The job `ref` names: its full id, or a unique prefix of one of the local tenant's
    (WEBCTX_LOCAL_TENANT) jobs' ids (webctx/jobs/refs.py). Exit 2 for a prefix too short
    or shared by several jobs, 1 when no job has it."""
    from webctx.errors import InvalidRequest, JobNotFound
    from webctx.jobs.refs import pick
    from webctx.settings import get_settings

    tenant = get_settings().local_tenant
    try:
        return pick("job", ref, exists=jobs.exists,
                    with_prefix=lambda p: jobs.stored.jobs_with_prefix(tenant, p))  # fmt: skip
    except InvalidRequest as exc:
        raise fail(str(exc)) from exc
    except JobNotFound as exc:
        raise fail(str(exc), code=1) from exc


def _echo_progress(progress: JobProgress) -> None:
    typer.echo(json.dumps({**progress.__dict__, "status": progress.status.value}))


def status(job_id: JobRef) -> None:
    """Print a job's progress as JSON."""
    from webctx.settings import get_settings
    from webctx.workers.deps import state_stores

    try:
        jobs = state_stores(get_settings()).jobs
        progress = jobs.progress(job_id_of(jobs, job_id))
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    _echo_progress(progress)


def bundle(
    job_id: JobRef,
    format: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.json,
) -> None:
    """Print a finished job's bundle."""
    from webctx.settings import get_settings
    from webctx.workers.deps import state_stores

    jobs = state_stores(get_settings()).jobs
    full = job_id_of(jobs, job_id)
    found = jobs.bundle(full)
    if found is None:
        why = "expired" if not jobs.exists(full) else f"{jobs.status(full).value}"
        raise fail(f"job {full} has no bundle ({why})", code=1)
    print_bundle(found, format)


def cancel(job_id: JobRef) -> None:
    """Cancel a queued or running job: its tasks stop, it makes no bundle; print its progress."""
    import redis

    from webctx.api.runtime import cancel as cancel_job
    from webctx.api.runtime import open_runtime
    from webctx.models import JobStatus
    from webctx.settings import get_settings

    try:
        with open_runtime(get_settings()) as runtime:
            full = job_id_of(runtime.jobs, job_id)
            before = runtime.jobs.status(full)
            progress = cancel_job(runtime, full)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    except redis.RedisError as exc:
        raise fail(f"job state store unreachable: {exc}", code=1) from exc
    if before is JobStatus.CANCELLED:
        typer.echo(f"job {full} was cancelled already", err=True)
    elif progress.status is JobStatus.CANCELLED:
        typer.echo(f"cancelled job {full}", err=True)
    else:
        typer.echo(f"job {full} had {progress.status.value} already: left as it is", err=True)
    _echo_progress(progress)


def research_cli(*, handed: str | None = None) -> typer.Typer:
    """The command line with `research` alone: `webctx research` loads no other command's
    modules before its job is submitted (webctx.cli.main). `handed`: the job the local
    service submitted from the command's words already (webctx/cli/handover.py)."""
    if handed is not None:
        _handed.append(handed)
    app = typer.Typer(add_completion=False)

    @app.callback()
    def _group() -> None:
        """webctx: a research question -> a cited context bundle."""

    app.command()(research)
    return app
