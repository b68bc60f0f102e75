"""The base of every webctx task: one task policy, read from Settings.

- Ack late, rejected back to the queue when the worker dies, one message prefetched,
  hard and soft time limits below the broker's visibility timeout: the Celery settings
  (`webctx.workers.celeryconfig`) set these for every task.
- Retries: a step meeting a TransientError calls the task's `retry_transient`, which
  raises Celery's Retry while retries remain (WEBCTX_TASK_MAX_RETRIES, applied to every
  task by `task_annotations`) and returns once they are spent, so the step records the
  failure and the job goes on. The countdown is the provider's `retry_after` when it gave
  one, else WEBCTX_TASK_RETRY_BACKOFF_S doubling per retry; capped by
  WEBCTX_TASK_RETRY_BACKOFF_MAX_S; plus up to half again of jitter, so workers that met
  the same 429 do not come back in step. A provider's failure comes back no later than
  its shared breaker's verdict (`ProviderUnavailable.verdict_in_s`, webctx/net/breaker.py):
  by then the provider answers, or it is down and the job fails (ProviderDown is final).
- Failure recording stays with the steps (`webctx.jobs.steps.record_failure`): the task
  only decides whether to run again.
"""

from __future__ import annotations

import random

from celery import Task

from webctx.errors import ProviderUnavailable, RateLimited, TransientError


def retry_countdown(
    exc: TransientError, retries: int, *, backoff_s: float, backoff_max_s: float
) -> float:
    """Seconds before retry number `retries` + 1, jitter included."""
    if isinstance(exc, RateLimited) and exc.retry_after:
        base = exc.retry_after
    else:
        base = backoff_s * 2**retries
    countdown = min(base, backoff_max_s)
    countdown += random.uniform(0, 0.5 * countdown)
    verdict = exc.verdict_in_s if isinstance(exc, ProviderUnavailable) else None
    return countdown if verdict is None else min(countdown, verdict)


class StageTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A webctx task: retries a transient failure by the policy above."""

    def retry_transient(self, exc: TransientError) -> None:
        """Run again later while retries remain (raises Celery's Retry); return once they
        are spent."""
        retries = int(self.request.retries)
        if self.max_retries is not None and retries >= self.max_retries:
            return
        countdown = retry_countdown(exc, retries, backoff_s=float(self.default_retry_delay),
                                    backoff_max_s=float(self.retry_backoff_max))  # fmt: skip
        raise self.retry(exc=exc, countdown=countdown)
