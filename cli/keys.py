"""`webctx keys`: create and revoke API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from webctx.cli.common import fail, state_stores
from webctx.errors import WebctxError
from webctx.jobs.tenants import TenantStore
from webctx.settings import get_settings

keys = typer.Typer(help="Create and revoke API keys (stored hashed in the job store's Redis).")


def _tenant_store() -> TenantStore:
    return state_stores(get_settings()).tenants


@keys.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key acts for.")],
    rate_limit: Annotated[
        int | None, typer.Option(min=1, help="Requests per minute [WEBCTX_API_RATE_LIMIT_...].")
    ] = None,
) -> None:
    """Create a key for TENANT and print it (shown once; only its hash is stored)."""
    try:
        key, record = _tenant_store().create_key(tenant, rate_limit=rate_limit)
    except WebctxError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"key id {record.key_id} for tenant {record.tenant}", err=True)
    typer.echo(key)


@keys.command("revoke")
def keys_revoke(key_or_id: Annotated[str, typer.Argument(help="The key, or its key id.")]) -> None:
    """Revoke a key: requests with it get 401 from now on."""
    if not _tenant_store().revoke(key_or_id):
        raise fail("no such key", code=1)
    typer.echo("revoked", err=True)
