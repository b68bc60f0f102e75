"""`webctx index export` / `import`: move the persistent index to another vector store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from webctx.cli.common import fail, state_stores
from webctx.errors import WebctxError
from webctx.settings import get_settings

index = typer.Typer(help="The persistent index as a whole: export it, import it elsewhere.")
TimeoutOpt = Annotated[float, typer.Option(help="Seconds to wait for the worker.")]


@index.command("export")
def index_export(
    path: Annotated[Path, typer.Argument(help="The file to write (gzip'd JSON lines).")],
    timeout: TimeoutOpt = 6 * 3600.0,
) -> None:
    """Write the index (points and Redis keys) to PATH.

    With the embedded store, the worker holding it writes PATH on its machine (the local
    service: this one)."""
    from webctx.workers.index_client import run_transfer

    settings = get_settings()
    state_stores(settings)  # the state Redis is up (the local service started)
    try:
        counts = run_transfer(settings, "export", str(path.resolve()), timeout_s=timeout)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    _report(counts)


@index.command("import")
def index_import(
    path: Annotated[Path, typer.Argument(help="A file `webctx index export` wrote.")],
    to: Annotated[str | None, typer.Option(help="A Qdrant server's URL to import into.")] = None,
    timeout: TimeoutOpt = 6 * 3600.0,
) -> None:
    """Load an export into this index, or into the Qdrant server at --to.

    After --to, run webctx with WEBCTX_QDRANT_URL set to that server. Refuses, writing
    nothing, a truncated file, another version, or a Redis holding another index."""
    from webctx.workers.index_client import run_transfer

    settings = get_settings()
    state_stores(settings)
    try:
        if to is None:
            counts = run_transfer(settings, "import", str(path.resolve()), timeout_s=timeout)
        else:
            counts = _import_to_server(settings, path, to)
    except WebctxError as exc:
        raise fail(str(exc), code=1) from exc
    _report(counts)


def _import_to_server(settings: Any, path: Path, url: str) -> dict[str, int]:
    from qdrant_client import QdrantClient

    from webctx.adapters.point_io import point_io
    from webctx.adapters.qdrant_store import QdrantVectorStore
    from webctx.index.transfer import import_index
    from webctx.workers.deps import state_client

    key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
    qdrant = QdrantClient(url=url, api_key=key, timeout=30)
    store = QdrantVectorStore(qdrant, collection=settings.qdrant_collection,
                              datatype=settings.qdrant_vector_datatype)  # fmt: skip
    client = state_client(settings)
    try:
        return import_index(path, points=point_io(store), client=client, check=store.count)
    finally:
        client.close()
        qdrant.close()


def _report(counts: dict[str, Any]) -> None:
    names = {"r": "redis_keys", "d": "dense_points", "s": "sparse_points"}
    typer.echo(json.dumps({names.get(k, k): v for k, v in counts.items()}))
