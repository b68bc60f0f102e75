"""The search providers' names, the variables their keys come from and their endpoints: plain
data, so a command's early path (workers/service_client.py's settings fingerprint, read before
the command hands its words to the local service) reads them without loading pydantic."""

from __future__ import annotations

PROVIDERS = ("ddgs", "searxng", "brave", "tavily", "exa", "serper")
"""Every search provider webctx has an adapter for."""
KEYED = ("brave", "tavily", "exa", "serper")
"""The providers that need an API key (each a group of Settings)."""
VENDOR_KEY_ENV = {p: f"{p.upper()}_API_KEY" for p in KEYED}
"""The variable each vendor's own clients read the key from: a second name of
WEBCTX_<PROVIDER>__API_KEY (which wins when both are set)."""
DEFAULT_BASE_URLS = {
    "brave": "https://api.search.brave.com",
    "tavily": "https://api.tavily.com",
    "exa": "https://api.exa.ai",
    "serper": "https://google.serper.dev",
}
