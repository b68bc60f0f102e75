"""The user's config file: `webctx config set/unset/path` (real CLI processes, each test's
own file), read below the environment by the settings, checked before it is written."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from webctx.config_file import read_values, toml_string, write_value
from webctx.errors import ConfigError
from webctx.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def _env(config: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WEBCTX_", "OPENAI_"))}
    return {**env, "WEBCTX_CONFIG_FILE": str(config), **extra}


def _webctx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "webctx.cli", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip


def _sources(env: dict[str, str]) -> dict[str, dict[str, object]]:
    shown = _webctx(env, "config", "--json")
    assert shown.returncode == 0, shown.stderr
    return {row["env"]: row for row in json.loads(shown.stdout)}


def test_config_set_unset_and_path_edit_the_file_and_config_says_where_each_value_came_from(
    tmp_path: Path,
) -> None:
    config = tmp_path / "conf" / "webctx.toml"
    env = _env(config)
    assert _webctx(env, "config", "path").stdout.strip() == str(config)
    done = _webctx(env, "config", "set", "webctx_searxng_url", "http://127.0.0.1:8888")
    assert done.returncode == 0, done.stderr
    done = _webctx(env, "config", "set", "OPENAI_API_KEY", "sk-topsecret")
    assert done.returncode == 0 and "sk-topsecret" not in done.stderr
    assert config.stat().st_mode & 0o777 == 0o600  # it may hold a key
    assert tomllib.loads(config.read_text()) == {
        "WEBCTX_SEARXNG_URL": "http://127.0.0.1:8888", "OPENAI_API_KEY": "sk-topsecret"
    }  # fmt: skip
    rows = _sources({**env, "WEBCTX_SEARCH_PROVIDER": "searxng"})
    assert rows["WEBCTX_SEARXNG_URL"]["source"] == "file"
    assert rows["OPENAI_API_KEY"]["source"] == "file" and rows["OPENAI_API_KEY"]["value"] == "****"
    assert rows["WEBCTX_SEARCH_PROVIDER"]["source"] == "environment (WEBCTX_SEARCH_PROVIDER)"
    assert rows["WEBCTX_LOG_LEVEL"]["source"] == "default"
    # The environment overrides the file, and `config set` says so when it would.
    over = {**env, "WEBCTX_SEARXNG_URL": "http://127.0.0.1:9999"}
    rows = _sources(over)
    assert rows["WEBCTX_SEARXNG_URL"] == {
        "env": "WEBCTX_SEARXNG_URL", "path": "searxng_url", "value": "http://127.0.0.1:9999",
        "source": "environment (WEBCTX_SEARXNG_URL), over the file",
    }  # fmt: skip
    assert "overrides the file" in _webctx(over, "config", "set", "WEBCTX_SEARXNG_URL", "x").stderr
    done = _webctx(env, "config", "unset", "WEBCTX_SEARXNG_URL")
    assert done.returncode == 0, done.stderr
    assert _sources(env)["WEBCTX_SEARXNG_URL"] == {
        "env": "WEBCTX_SEARXNG_URL", "path": "searxng_url", "value": None, "source": "default"
    }  # fmt: skip
    assert _webctx(env, "config", "unset", "WEBCTX_SEARXNG_URL").returncode == 0  # already gone


def test_config_set_refuses_unknown_names_deprecated_ones_and_invalid_values(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.toml"
    env = _env(config)
    typo = _webctx(env, "config", "set", "WEBCTX_SEARXNG_ULR", "http://x")
    assert typo.returncode == 2
    assert "WEBCTX_SEARXNG_ULR is not a webctx setting; did you mean WEBCTX_SEARXNG_URL?" in (
        typo.stderr
    )
    old = _webctx(env, "config", "set", "WEBCTX_OPENAI_BASE_URL", "http://x")
    assert old.returncode == 2 and "set OPENAI_BASE_URL instead" in old.stderr
    bad = _webctx(env, "config", "set", "WEBCTX_FETCH__MAX_BYTES", "lots")
    assert bad.returncode == 2
    assert "invalid value for WEBCTX_FETCH__MAX_BYTES" in bad.stderr and "integer" in bad.stderr
    assert not config.exists()  # nothing written
    # A value is checked with the file's others, not with whatever the environment says.
    done = _webctx({**env, "WEBCTX_SEARCH_PROVIDER": "bing"}, "config", "set",
                   "WEBCTX_SEARCH_PROVIDER", "searxng")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _webctx(env, "config", "unset", "WEBCTX_NO_SUCH").returncode == 2


def test_the_platform_config_directory_holds_the_file_when_no_variable_names_one(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in _env(tmp_path / "unused").items()
           if k not in ("WEBCTX_CONFIG_FILE", "XDG_CONFIG_HOME")}  # fmt: skip
    env["HOME"] = str(tmp_path)
    assert _webctx(env, "config", "path").stdout.strip() == str(
        tmp_path / ".config" / "webctx" / "config.toml"
    )


def test_a_command_warns_once_of_a_key_in_the_file_that_sets_nothing(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('WEBCTX_SEARXNG_ULR = "http://x"\nWEBCTX_EMBED_RPM = "5"\n')
    done = _webctx(_env(config), "config", "path")
    assert done.returncode == 0
    assert done.stderr.splitlines() == [
        f"warning: WEBCTX_EMBED_RPM in {config} is not a webctx setting (ignored) "
        "(deprecated: use WEBCTX_EMBED__RPM)",
        f"warning: WEBCTX_SEARXNG_ULR in {config} is not a webctx setting (ignored); "
        "did you mean WEBCTX_SEARXNG_URL?",
    ]


def test_a_malformed_file_is_named_by_every_command_and_left_as_it_is(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('WEBCTX_SEARXNG_URL = "http://x\n')
    env = _env(config)
    shown = _webctx(env, "config")
    assert shown.returncode == 2 and f"config file {config} is not valid TOML" in shown.stderr
    assert _webctx(env, "config", "set", "WEBCTX_SEARXNG_URL", "http://y").returncode == 2
    assert config.read_text() == 'WEBCTX_SEARXNG_URL = "http://x\n'
    assert "Traceback" not in shown.stderr


def test_the_file_is_read_below_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.toml"
    config.write_text('WEBCTX_SEARCH_PROVIDER = "searxng"\nWEBCTX_SEARXNG_URL = "http://f"\n'
                      'OPENAI_API_KEY = "sk-f"\nWEBCTX_FETCH__MAX_BYTES = 1234\n'
                      'WEBCTX_RENDER__ALWAYS_DOMAINS = "a.org, B.org"\n')  # fmt: skip
    monkeypatch.setenv("WEBCTX_CONFIG_FILE", str(config))
    monkeypatch.setenv("WEBCTX_SEARXNG_URL", "http://env")
    settings = Settings()
    assert settings.search_provider == "searxng" and settings.searxng_url == "http://env"
    assert settings.openai_api_key is not None
    assert settings.openai_api_key.get_secret_value() == "sk-f"
    assert settings.fetch.max_bytes == 1234 and settings.render.always_domains == ["a.org", "b.org"]
    config.write_text("WEBCTX_SEARCH_PROVIDER = [")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        Settings()


def test_an_edit_keeps_the_files_other_lines_and_comments(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('# mine\nWEBCTX_LOG_LEVEL = "DEBUG"  # loud\n\nOPENAI_BASE_URL = "http://a"')
    write_value(config, "OPENAI_BASE_URL", "http://b")
    write_value(config, "WEBCTX_SEARXNG_URL", "http://s")
    assert config.read_text() == (
        '# mine\nWEBCTX_LOG_LEVEL = "DEBUG"  # loud\n\n'
        'OPENAI_BASE_URL = "http://b"\nWEBCTX_SEARXNG_URL = "http://s"\n'
    )
    write_value(config, "WEBCTX_LOG_LEVEL", None)
    assert read_values(config) == {"OPENAI_BASE_URL": "http://b", "WEBCTX_SEARXNG_URL": "http://s"}
    config.write_text('WEBCTX_SEARXNG_URL = """\nhttp://x"""\n')  # not one line: left alone
    with pytest.raises(ConfigError, match="by hand"):
        write_value(config, "WEBCTX_SEARXNG_URL", "http://y")
    assert config.read_text() == 'WEBCTX_SEARXNG_URL = """\nhttp://x"""\n'


@pytest.mark.parametrize(
    "value", ['a "quoted" \\ path', "tab\tnew\nline\r\x00\x1f\x7f", "ünïcødé 🔋", "", "'"]
)
def test_any_value_is_written_as_toml_that_reads_back_the_same(value: str) -> None:
    assert tomllib.loads(f"K = {toml_string(value)}") == {"K": value}
