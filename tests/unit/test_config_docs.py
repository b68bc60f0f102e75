"""`webctx config` (each setting's value and source, secrets masked) and
docs/configuration.md, whose tables are generated from `Settings`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from webctx.cli.app import cli
from webctx.cli.config import (
    BEGIN,
    MASK,
    SECTIONS,
    mask_value,
    reference_markdown,
    replace_generated,
    setting_rows,
)
from webctx.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
OWN = ("WEBCTX_", "CELERY_", "OPENAI_")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.upper().startswith(OWN):
            monkeypatch.delenv(name)
    return monkeypatch


def _config(*args: str) -> list[dict[str, object]]:
    result = CliRunner().invoke(cli, ["config", "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_configuration_page_is_what_the_generator_writes() -> None:
    text = DOC.read_text()
    assert replace_generated(text, reference_markdown()) == text, (
        "docs/configuration.md differs from the settings: run scripts/gen-config-docs"
    )


def test_every_setting_has_a_type_default_and_description() -> None:
    rows = setting_rows()
    assert len(rows) > 80
    assert not [r.env for r in rows if not r.doc], "give each setting a docstring"
    assert not [r.env for r in rows if not (r.type and r.default)]
    assert set(SECTIONS) <= set(Settings.model_fields)
    generated = reference_markdown()
    assert all(f"`{r.env}`" in generated for r in rows)


def test_embedding_provider_lists_every_value_and_the_local_fallback() -> None:
    row = next(r for r in setting_rows() if r.env == "WEBCTX_EMBEDDING_PROVIDER")
    for value in ("auto", "openai", "local", "hash"):
        assert f"`{value}`" in row.type and f"`{value}`" in row.doc
    assert "local all-MiniLM-L6-v2 model when it is installed" in row.doc


def test_a_changed_docstring_makes_the_page_stale() -> None:
    text = DOC.read_text()
    stale = text.replace("Results asked for per query.", "Results per query.")
    assert stale != text
    assert replace_generated(stale, reference_markdown()) != stale
    with pytest.raises(ValueError, match="markers"):
        replace_generated(text.replace(BEGIN, ""), reference_markdown())


def test_config_names_each_setting_source(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WEBCTX_FETCH__MAX_BYTES", "1234")
    clean_env.setenv("webctx_search_provider", "searxng")  # names are case-insensitive
    clean_env.setenv("WEBCTX_RENDER", '{"settle_ms": 9}')
    with pytest.warns(FutureWarning, match="WEBCTX_EMBED_RPM is deprecated"):
        clean_env.setenv("WEBCTX_EMBED_RPM", "50")
        rows = {r["env"]: r for r in _config()}
    assert rows["WEBCTX_FETCH__MAX_BYTES"]["value"] == 1234
    assert rows["WEBCTX_FETCH__MAX_BYTES"]["source"] == "environment (WEBCTX_FETCH__MAX_BYTES)"
    assert rows["WEBCTX_SEARCH_PROVIDER"]["value"] == "searxng"
    assert rows["WEBCTX_SEARCH_PROVIDER"]["source"] == "environment (WEBCTX_SEARCH_PROVIDER)"
    assert rows["WEBCTX_RENDER__SETTLE_MS"]["value"] == 9
    assert rows["WEBCTX_RENDER__SETTLE_MS"]["source"] == "environment (WEBCTX_RENDER, JSON)"
    assert rows["WEBCTX_RENDER__JS_HEAP_MB"]["source"] == "default"  # not in that JSON
    assert rows["WEBCTX_EMBED__RPM"]["value"] == 50
    assert "WEBCTX_EMBED_RPM, deprecated" in str(rows["WEBCTX_EMBED__RPM"]["source"])
    assert rows["WEBCTX_FETCH__MAX_REDIRECTS"] == {
        "env": "WEBCTX_FETCH__MAX_REDIRECTS", "path": "fetch.max_redirects",
        "value": 5, "source": "default",
    }  # fmt: skip
    assert rows["CELERY_BROKER_URL"]["value"] is None


def test_config_masks_keys_and_passwords_in_urls(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("OPENAI_API_KEY", "sk-topsecret1")
    clean_env.setenv("WEBCTX_QDRANT_API_KEY", "qd-topsecret2")
    clean_env.setenv("CELERY_BROKER_URL", "redis://:topsecret3@broker:6379/0")
    clean_env.setenv("WEBCTX_REDIS_URL", "rediss://user:topsecret4@state:6380/1")
    clean_env.setenv("WEBCTX_SEARXNG_URL", "https://search.example/?token=topsecret5&x=1")
    for args in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["config", *args])
        assert result.exit_code == 0, result.output
        assert "topsecret" not in result.output
    rows = {r["env"]: r["value"] for r in _config()}
    assert rows["OPENAI_API_KEY"] == rows["WEBCTX_QDRANT_API_KEY"] == MASK
    assert rows["CELERY_BROKER_URL"] == f"redis://:{MASK}@broker:6379/0"
    assert rows["WEBCTX_REDIS_URL"] == f"rediss://user:{MASK}@state:6380/1"
    assert rows["WEBCTX_SEARXNG_URL"] == f"https://search.example/?token={MASK}&x=1"
    assert rows["WEBCTX_QDRANT_URL"] is None  # unset stays visibly unset


def test_mask_value_hides_secret_names_and_unparseable_urls() -> None:
    assert mask_value("WEBCTX_SOME_TOKEN", "abc") == MASK
    assert mask_value("WEBCTX_SEARXNG_URL", "http://[bad/?key=abc") == MASK
    assert mask_value("WEBCTX_SEARXNG_URL", "http://h/path?q=1") == "http://h/path?q=1"
    assert mask_value("WEBCTX_FETCH__MAX_BYTES", 5) == 5


def test_config_names_an_invalid_setting(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WEBCTX_FETCH__MAX_BYTES", "lots")
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 2
    assert "WEBCTX_FETCH__MAX_BYTES" in result.output and "integer" in result.output


def test_config_warns_about_a_variable_that_sets_nothing(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WEBCTX_FETCH__MAX_BYTE", "1234")  # a typo: pydantic ignores it
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 0
    assert "warning: WEBCTX_FETCH__MAX_BYTE is not a webctx setting (ignored)" in result.stderr
    assert "WEBCTX_FETCH__MAX_BYTE=" not in result.stdout


def test_config_names_a_group_error_by_its_group(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("WEBCTX_FETCH__USER_AGENT", "MyBot/1.0")  # lacks the product token
    result = CliRunner().invoke(cli, ["config"])
    assert result.exit_code == 2
    assert "error: invalid settings: WEBCTX_FETCH: " in result.output
    assert "Traceback" not in result.output


def test_config_shows_the_search_chain_and_masks_each_providers_key(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("WEBCTX_SEARCH_PROVIDER", "Brave, searxng")
    clean_env.setenv("BRAVE_API_KEY", "brave-secret-1")
    clean_env.setenv("WEBCTX_TAVILY__API_KEY", "tvly-secret-2")
    clean_env.setenv("TAVILY_API_KEY", "tvly-loses")
    rows = {r["env"]: r for r in _config()}
    assert rows["WEBCTX_SEARCH_PROVIDER"]["value"] == "brave,searxng"
    brave = rows["WEBCTX_BRAVE__API_KEY"]
    assert brave["value"] == MASK and brave["source"] == "environment (BRAVE_API_KEY)"
    assert rows["WEBCTX_TAVILY__API_KEY"]["source"] == "environment (WEBCTX_TAVILY__API_KEY)"
    assert rows["WEBCTX_EXA__API_KEY"]["value"] is None
    assert Settings().tavily.api_key.get_secret_value() == "tvly-secret-2"  # type: ignore[union-attr]
    text = CliRunner().invoke(cli, ["config"]).output
    assert "secret" not in text and "WEBCTX_BRAVE__API_KEY=****" in text
