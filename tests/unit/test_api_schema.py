"""The API's OpenAPI schema, without a server: the bearer key is declared on the routes
that need one."""

from __future__ import annotations

import pytest
from fastapi import FastAPI

from webctx.api.http import create_app
from webctx.settings import Settings

PUBLIC = {"/healthz", "/readyz"}


@pytest.fixture(scope="module")
def app() -> FastAPI:
    # No lifespan runs: the schema needs no Redis.
    return create_app(Settings(api_auth="required"), host="127.0.0.1")


def test_openapi_declares_the_bearer_key_on_protected_routes_only(app: FastAPI) -> None:
    schema = app.openapi()
    scheme = schema["components"]["securitySchemes"]["bearerAuth"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    assert "webctx keys create" in scheme["description"]
    protected = 0
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path in PUBLIC:
                assert "security" not in operation, (method, path)
            else:
                assert operation.get("security") == [{"bearerAuth": []}], (method, path)
                protected += 1
    assert protected >= 12
