"""The settings of per-tenant admission (WEBCTX_ADMISSION__<NAME>), a group of the one
Settings (`webctx.settings.Settings.admission`); the admission is webctx/jobs/admission.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdmissionSettings(BaseModel):
    """How many unfinished jobs one tenant may have (WEBCTX_ADMISSION__<NAME>): its first
    `running` go to the workers, `queued` more are held back (none of their tasks queued)
    until one of its running jobs ends, and a job past both is refused with 429 and
    `Retry-After`, so one tenant's burst neither delays another tenant's job by more than
    `running` jobs' work nor grows the queues without bound.
    Counted for jobs submitted over HTTP, MCP and `webctx research`; batch items have their
    own caps (`WEBCTX_BATCH__*`)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    running: int = Field(default=2, ge=1)
    """A tenant's unfinished jobs whose tasks are in the queues or running (priority 0), beside
    every other tenant's: another tenant's job shares the workers with at most this many of
    them (docs/benchmarks.md, `load`)."""
    queued: int = Field(default=30, ge=0)
    """More unfinished jobs a tenant may have, held (`hold`) until one of its running jobs
    ends, oldest first; a job past `running` + `queued` is refused with 429."""
    hold: bool = True
    """Held jobs' tasks wait outside the queues until the tenant has a free slot (true), or are
    published at once at `queued_priority`, behind every tenant's front jobs (false)."""
    queued_priority: int = Field(default=3, ge=1, le=9)
    """Broker priority of a waiting job's tasks with `hold` false (0 is served first; batch
    items: 9)."""
    tick_s: float = Field(default=5.0, gt=0)
    """How often Celery beat's reconciler publishes held jobs of tenants with free slots (slots
    freed by a process that sends no tasks, or lapsed): the most a held job waits for a free
    slot."""
    retry_after_s: int = Field(default=5, ge=1)
    """`Retry-After` of a refused job: about the time the service takes to finish a job when it is
    busy, so a slot has likely freed by then."""
    hold_s: float = Field(default=60.0, ge=0)
    """A job holds its slot until it finishes, or at most `WEBCTX_JOB_TIMEOUT_S` plus this long
    after its submission (its watchdog ends it by then, held or not; this frees the slot of
    one whose every message was lost)."""
