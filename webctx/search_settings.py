"""The search providers' settings: the chain (`WEBCTX_SEARCH_PROVIDER=brave,searxng`) and each
keyed provider's key and endpoint (WEBCTX_<PROVIDER>__API_KEY, WEBCTX_<PROVIDER>__BASE_URL),
groups of the one Settings (`webctx.settings.Settings`, which inherits `SearchProviderGroups`).
The adapters are webctx/adapters/{brave,tavily,exa,serper}_search.py."""

from __future__ import annotations

import os
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from webctx.search_names import DEFAULT_BASE_URLS as DEFAULT_BASE_URLS
from webctx.search_names import KEYED as KEYED
from webctx.search_names import PROVIDERS as PROVIDERS
from webctx.search_names import VENDOR_KEY_ENV as VENDOR_KEY_ENV


def chain_names(value: str) -> list[str]:
    """The providers of a chain (`brave, searxng`), in order; ValueError naming what is wrong."""
    names = [part.strip().lower() for part in value.split(",") if part.strip()]
    if not names:
        raise ValueError(f"name at least one search provider ({', '.join(PROVIDERS)})")
    unknown = [n for n in names if n not in PROVIDERS]
    if unknown:
        raise ValueError(f"unknown search provider {unknown[0]!r}; one of {', '.join(PROVIDERS)}")
    if len(set(names)) != len(names):
        raise ValueError("a search provider is named twice in the chain")
    return names


def _normalised(value: str) -> str:
    return ",".join(chain_names(value))


ChainSpec = Annotated[str, AfterValidator(_normalised)]
"""A comma-separated chain of search providers, tried in order."""


class KeyedProvider(BaseModel):
    """A keyed search API: its key and the endpoint it is asked at."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    api_key: SecretStr | None = None
    """The API key (also read from the vendor's own variable, `<PROVIDER>_API_KEY`)."""
    base_url: str | None = None
    """Another endpoint: a proxy or a compatible service; unset: the vendor's API."""
    timeout_s: float = Field(default=10.0, gt=0)
    """Longest wait for one answer."""


class BraveSettings(KeyedProvider):
    """Brave Search API (WEBCTX_BRAVE__<NAME>; key also BRAVE_API_KEY): an independent index,
    20 results per request, 1 request/s on the free plan."""


class TavilySettings(KeyedProvider):
    """Tavily (WEBCTX_TAVILY__<NAME>; key also TAVILY_API_KEY): at most 20 results, each with the
    page's text, used when the page's own download fails."""

    include_raw_content: bool = True
    """Ask for each result's page text (`include_raw_content`); it stands in for a page whose
    download fails (timeout, 5xx, blocked), never for one robots.txt or an opt-out refuses."""


class ExaSettings(KeyedProvider):
    """Exa (WEBCTX_EXA__<NAME>; key also EXA_API_KEY): neural search, each result with the page's
    text, used when the page's own download fails."""

    text_max_chars: int = Field(default=10_000, ge=0)
    """Characters of each result's page text asked for (`contents.text.maxCharacters`); `0`:
    none."""


class SerperSettings(KeyedProvider):
    """Serper (WEBCTX_SERPER__<NAME>; key also SERPER_API_KEY): Google's results through
    google.serper.dev."""


class SearchProviderGroups(BaseModel):
    """The keyed search providers' groups of Settings."""

    brave: BraveSettings = BraveSettings()
    tavily: TavilySettings = TavilySettings()
    exa: ExaSettings = ExaSettings()
    serper: SerperSettings = SerperSettings()


class VendorKeySource(PydanticBaseSettingsSource):
    """Reads each keyed provider's key from the vendor's variable (`BRAVE_API_KEY`), below
    WEBCTX_<PROVIDER>__API_KEY and above the config file."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:  # noqa: ARG002
        """Unused: `__call__` reads the environment itself."""
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        environ = {name.upper(): value for name, value in os.environ.items()}
        return {p: {"api_key": environ[env]} for p, env in VENDOR_KEY_ENV.items() if env in environ}
