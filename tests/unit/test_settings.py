"""Settings: env names, nested groups, and the configuration reference staying complete."""

from __future__ import annotations

from pathlib import Path

import pytest

from webctx.settings import Settings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
ALIASES = {
    "broker_url": "CELERY_BROKER_URL",
    "result_backend": "CELERY_RESULT_BACKEND",
    "openai_base_url": "OPENAI_BASE_URL",
    "openai_api_key": "OPENAI_API_KEY",
}


def _env_names() -> list[str]:
    names = []
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
            names += [f"WEBCTX_{name}__{sub}".upper() for sub in annotation.model_fields]
        else:
            names.append(ALIASES.get(name, f"WEBCTX_{name}".upper()))
    return names


def test_every_setting_is_documented() -> None:
    text = DOC.read_text()
    missing = [name for name in _env_names() if f"`{name}`" not in text]
    assert not missing, f"settings missing from docs/configuration.md: {missing}"


def test_conventional_names_and_nested_groups_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://example:6379/3")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("WEBCTX_FETCH__MAX_BYTES", "1234")
    monkeypatch.setenv("WEBCTX_ALLOWED_NETWORKS", "127.0.0.1/32, 10.1.0.0/16")
    s = Settings()
    assert s.broker_url == "redis://example:6379/3"
    assert not s.embedded
    assert s.state_url() == "redis://example:6379/3"
    assert s.openai_base_url == "http://127.0.0.1:9/v1"
    assert s.fetch.max_bytes == 1234
    assert s.allowed_networks == ["127.0.0.1/32", "10.1.0.0/16"]


def test_no_broker_means_embedded_with_no_state_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("WEBCTX_REDIS_URL", raising=False)
    s = Settings()
    assert s.embedded and s.state_url() is None


def test_the_embedded_state_lives_in_the_data_dir_not_the_working_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("WEBCTX_DATA_DIR", str(tmp_path / "data"))
    assert Settings().qdrant_path == tmp_path / "data" / "qdrant"
    monkeypatch.setenv("WEBCTX_QDRANT_PATH", str(tmp_path / "mine"))
    assert Settings().qdrant_path == tmp_path / "mine"  # an explicit path still wins
    monkeypatch.delenv("WEBCTX_DATA_DIR")
    monkeypatch.delenv("WEBCTX_QDRANT_PATH")
    default = Settings()
    assert default.data_dir.is_absolute() and default.data_dir.name == "webctx"
    assert default.qdrant_path == default.data_dir / "qdrant"
    assert "qdrant_path" not in default.model_fields_set  # the embedded default may move it


def test_a_deprecated_name_still_works_but_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBCTX_EMBED_RPM", "50")
    monkeypatch.setenv("WEBCTX_BROKER_URL", "redis://old:6379/0")
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    with pytest.warns(FutureWarning) as warned:
        s = Settings()
    # Only our own warnings: a socket another test left open may be collected in this block.
    assert sorted(str(w.message) for w in warned if w.category is FutureWarning) == [
        "WEBCTX_BROKER_URL is deprecated; set CELERY_BROKER_URL instead",
        "WEBCTX_EMBED_RPM is deprecated; set WEBCTX_EMBED__RPM instead",
    ]
    assert s.embed.rpm == 50 and s.broker_url == "redis://old:6379/0"
    assert not hasattr(s, "embed_rpm")  # one field, one name


def test_the_current_name_wins_over_a_deprecated_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBCTX_EMBED_RPM", "50")
    monkeypatch.setenv("WEBCTX_EMBED__RPM", "7")
    monkeypatch.setenv("WEBCTX_EMBED__TPM", "9")
    with pytest.warns(FutureWarning):
        s = Settings()
    assert (s.embed.rpm, s.embed.tpm) == (7, 9)
