"""The settings of per-tenant admission (WEBCTX_ADMISSION__<NAME>), a group of the one
Settings (`webctx.settings.Settings.admission`); the admission is webctx/jobs/admission.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdmissionSettings(BaseModel):
    """How many unfinished jobs one tenant may have (WEBCTX_ADMISSION__<NAME>): its first
    `running` go through the queues at the front, `queued` more wait behind every other
    tenant's front jobs, and a job past both is refused with 429 and `Retry-After`, so one
    tenant's burst neither delays another tenant's job nor grows the queues without bound.
    Counted for jobs submitted over HTTP, MCP and `webctx research`; batch items have their
    own caps (`WEBCTX_BATCH__*`)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    running: int = Field(default=2, ge=1)
    """A tenant's unfinished jobs whose tasks go at the front of the queues (priority 0), beside
    every other tenant's: another tenant's job waits behind at most this many of them at each
    stage (docs/benchmarks.md, `load`)."""
    queued: int = Field(default=30, ge=0)
    """More unfinished jobs a tenant may have, whose tasks wait behind every tenant's front jobs
    (`queued_priority`); a job past `running` + `queued` is refused with 429."""
    queued_priority: int = Field(default=3, ge=1, le=9)
    """Broker priority of a queued job's tasks (0 is served first; batch items: 9)."""
    retry_after_s: int = Field(default=5, ge=1)
    """`Retry-After` of a refused job: about the time the service takes to finish a job when it is
    busy, so a slot has likely freed by then."""
    hold_s: float = Field(default=60.0, ge=0)
    """A job holds its slot until it finishes, or at most `WEBCTX_JOB_TIMEOUT_S` plus this long
    (its watchdog ends it by then; this frees the slot of one whose every message was lost)."""
