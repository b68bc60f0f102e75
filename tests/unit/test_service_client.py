"""How a client tells the local service's state from the files in the data directory: the
lock decides, never a file a dead service left."""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

from webctx.workers import service_client
from webctx.workers.service_client import ServiceInfo, reach_early, running_service


def _hold_lock(data_dir: Path) -> int:
    fd = os.open(data_dir / service_client.LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def test_an_address_left_by_a_dead_service_is_not_trusted(tmp_path: Path) -> None:
    (tmp_path / service_client.LOCK_FILE).write_text("12345")
    address = {"pid": os.getpid(), "socket": str(tmp_path / "v.sock")}
    (tmp_path / service_client.ADDRESS_FILE).write_text(json.dumps(address))
    assert service_client._probe(tmp_path) == "free"  # nobody holds the lock
    assert running_service(tmp_path) is None


def test_a_held_lock_is_a_service_starting_until_its_address_names_a_live_process(
    tmp_path: Path,
) -> None:
    fd = _hold_lock(tmp_path)
    try:
        assert service_client._probe(tmp_path) == "starting"
        dead = {"pid": 2**22 + 7, "socket": "/nowhere.sock"}  # above pid_max: never alive
        (tmp_path / service_client.ADDRESS_FILE).write_text(json.dumps(dead))
        assert service_client._probe(tmp_path) == "starting"
        live = {"pid": os.getpid(), "socket": "/run/v.sock"}
        (tmp_path / service_client.ADDRESS_FILE).write_text(json.dumps(live))
        assert running_service(tmp_path) == ServiceInfo(pid=os.getpid(), socket="/run/v.sock")
    finally:
        os.close(fd)
    assert service_client._probe(tmp_path) == "free"  # the holder is gone


def test_only_client_commands_without_a_broker_reach_for_the_service(tmp_path: Path) -> None:
    env = {"WEBCTX_DATA_DIR": str(tmp_path / "data")}
    for argv in (["worker"], ["service", "run"], ["research", "--help"], ["demo"], []):
        reach_early(argv, env)
    reach_early(["research", "q"], {**env, "CELERY_BROKER_URL": "redis://x:6379/0"})
    assert not (tmp_path / "data").exists()  # nothing started, nothing created


def test_the_settings_fingerprint_ignores_the_data_directory_and_other_variables(
    tmp_path: Path,
) -> None:
    base = {"WEBCTX_SEARCH_PROVIDER": "searxng", "OPENAI_BASE_URL": "http://a/v1", "HOME": "/h",
            "WEBCTX_CONFIG_FILE": str(tmp_path / "none.toml")}  # fmt: skip
    same = service_client.settings_fingerprint
    assert same(base) == same({**base, "WEBCTX_DATA_DIR": "/elsewhere", "HOME": "/other"})
    assert same(base) == same({**base, "WEBCTX_LOG_LEVEL": "DEBUG"})  # changes no job
    assert same(base) != same({**base, "OPENAI_BASE_URL": "http://b/v1"})
    # What a Celery worker sets in its own environment as it starts: the service's worker
    # did, and then found itself running "with other settings" than its own.
    assert same(base) == same({**base, "CELERY_LOG_LEVEL": "20", "CELERY_LOG_REDIRECT": "1"})


def test_the_settings_fingerprint_covers_the_config_files_contents_not_its_place(
    tmp_path: Path,
) -> None:
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text('WEBCTX_SEARXNG_URL = "http://s"\n')
    second.write_text('# the same settings elsewhere\nWEBCTX_SEARXNG_URL = "http://s"\n')
    same = service_client.settings_fingerprint
    assert same({"WEBCTX_CONFIG_FILE": str(first)}) == same({"WEBCTX_CONFIG_FILE": str(second)})
    assert same({"WEBCTX_CONFIG_FILE": str(first)}) != same(
        {"WEBCTX_CONFIG_FILE": str(tmp_path / "none.toml")}
    )
    first.write_text('WEBCTX_SEARXNG_URL = "http://other"\n')
    assert same({"WEBCTX_CONFIG_FILE": str(first)}) != same({"WEBCTX_CONFIG_FILE": str(second)})


def test_a_data_directory_named_in_the_config_file_is_the_local_services(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text(f'WEBCTX_DATA_DIR = "{tmp_path / "from-file"}"\n')
    env = {"WEBCTX_CONFIG_FILE": str(config)}
    assert service_client.local_data_dir(env) == tmp_path / "from-file"
    assert service_client.local_data_dir({**env, "WEBCTX_DATA_DIR": "/env"}) == Path("/env")
    config.write_text('CELERY_BROKER_URL = "redis://x:6379/0"\n')
    assert service_client.local_data_dir(env) is None  # a broker in the file: no service
