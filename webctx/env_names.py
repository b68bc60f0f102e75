"""Deprecated second names of settings, and the settings source that still reads them."""

from __future__ import annotations

import os
import warnings
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

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
