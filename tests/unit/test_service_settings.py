"""Which settings a client and the local service must share for a job, and how the
service records them without writing any value down."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from webctx.settings import Settings
from webctx.workers import service_client
from webctx.workers.service_client import ServiceInfo
from webctx.workers.service_settings import (
    ServiceRestarting,
    _turn,
    compared_values,
    differing,
    service_record,
    work_on_service,
)


def _service(settings: Settings) -> ServiceInfo:
    record = service_record(settings)
    return ServiceInfo(pid=1, socket="/s", salt=str(record["salt"]),
                       digests=record["digests"])  # type: ignore[arg-type]  # fmt: skip


def test_the_settings_that_differ_are_named_and_no_value_is_recorded(tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path, searxng_url="http://a", openai_api_key=SecretStr("sk-1"))
    service = _service(base)
    assert "sk-1" not in json.dumps(service.digests) and "http://a" not in json.dumps(
        service.digests
    )
    assert differing(service, base) == []
    other = base.model_copy(update={"searxng_url": "http://b",
                                    "openai_api_key": SecretStr("sk-2")})  # fmt: skip
    assert differing(service, other) == ["OPENAI_API_KEY", "WEBCTX_SEARXNG_URL"]
    nested = base.model_copy(update={"fetch": base.fetch.model_copy(update={"max_bytes": 7})})
    assert differing(service, nested) == ["WEBCTX_FETCH__MAX_BYTES"]


def test_logs_metrics_and_the_servers_own_settings_do_not_count(tmp_path: Path) -> None:
    base = Settings(data_dir=tmp_path)
    service = _service(base)
    loud = base.model_copy(update={"log_level": "DEBUG", "metrics_port": 9100,
                                   "mcp_wait_s": 5.0, "service_idle_s": 1.0,
                                   "data_dir": tmp_path / "elsewhere"})  # fmt: skip
    assert differing(service, loud) == []
    assert "WEBCTX_LOG_LEVEL" not in compared_values(base)
    # The vector store's default place follows the data directory; one set by hand counts.
    moved = Settings(data_dir=tmp_path, qdrant_path=tmp_path / "q")
    assert differing(service, moved) == ["WEBCTX_QDRANT_PATH"]


def test_a_service_that_recorded_no_digests_differs() -> None:
    assert differing(ServiceInfo(pid=1, socket="/s"), Settings()) == ["settings"]


def test_the_service_takes_no_work_while_a_client_restarts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its inbox's submission would otherwise reach the queue of the service that replaces
    # it, under the restarting client's settings: it leaves the request to its client.
    monkeypatch.setattr(service_client, "_in_service", True)
    settings = Settings(data_dir=tmp_path)
    with work_on_service(settings) as info:
        assert info is None  # nothing to compare inside the service
    with _turn(tmp_path, exclusive=True), pytest.raises(ServiceRestarting):
        work_on_service(settings).__enter__()
    with work_on_service(Settings(data_dir=tmp_path, broker_url="redis://x:6379/0")) as info:
        assert info is None  # with a broker there is no local service to ask
