"""Settings by their environment names: the deprecated second names and the source that
still reads them, and the user's config file (webctx/config_file.py) read as a second
environment, below the first."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource

from webctx.config_file import file_values

DEPRECATED_ENV: dict[str, str] = {
    "WEBCTX_EMBED_RPM": "WEBCTX_EMBED__RPM",
    "WEBCTX_EMBED_TPM": "WEBCTX_EMBED__TPM",
    "WEBCTX_BROKER_URL": "CELERY_BROKER_URL",
    "WEBCTX_RESULT_BACKEND": "CELERY_RESULT_BACKEND",
    "WEBCTX_OPENAI_BASE_URL": "OPENAI_BASE_URL",
    "WEBCTX_OPENAI_API_KEY": "OPENAI_API_KEY",
}
"""Old second names of settings: still read, with a warning, when the current name is unset."""


def setting_path(settings_cls: type[BaseSettings], env_name: str) -> tuple[str, ...]:
    """The field path an env name sets: `WEBCTX_FETCH__MAX_BYTES` -> ("fetch", "max_bytes")."""
    for name, field in settings_cls.model_fields.items():
        if field.validation_alias == env_name:  # the conventional CELERY_/OPENAI_ names
            return (name,)
    return tuple(env_name.removeprefix("WEBCTX_").lower().split("__"))


def setting_names(settings_cls: type[BaseSettings]) -> dict[str, tuple[str, ...]]:
    """Every setting's environment name and its field path, nested groups' fields in their
    place, in declaration order (`WEBCTX_FETCH__MAX_BYTES` -> ("fetch", "max_bytes"))."""
    names: dict[str, tuple[str, ...]] = {}
    for name, field in settings_cls.model_fields.items():
        group = field.annotation
        if isinstance(group, type) and issubclass(group, BaseModel):
            for sub in group.model_fields:
                names[f"WEBCTX_{name}__{sub}".upper()] = (name, sub)
            continue
        alias = field.validation_alias
        names[alias if isinstance(alias, str) else f"WEBCTX_{name}".upper()] = (name,)
    return names


class ConfigFileSource(EnvSettingsSource):
    """The user's config file, read as the environment is (its keys are environment names):
    below every other source, so the environment overrides it. Deprecated names are not
    read there (`webctx config set` refuses them; a command warns of one)."""

    def __init__(
        self, settings_cls: type[BaseSettings], values: Mapping[str, str] | None = None
    ) -> None:
        self._file = dict(file_values() if values is None else values)
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {k.lower(): v for k, v in self._file.items() if k.upper() not in DEPRECATED_ENV}


class RenamedEnvSource(PydanticBaseSettingsSource):
    """Reads the deprecated names of `DEPRECATED_ENV` and warns about each one set."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002
        """Unused: `__call__` reads the environment itself."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items()}
        data: dict[str, Any] = {}
        for old, new in DEPRECATED_ENV.items():
            if old not in environ:
                continue
            warnings.warn(f"{old} is deprecated; set {new} instead", FutureWarning, stacklevel=2)
            *groups, name = setting_path(self.settings_cls, new)
            target = data
            for group in groups:
                target = target.setdefault(group, {})
            target[name] = environ[old]
        return data
