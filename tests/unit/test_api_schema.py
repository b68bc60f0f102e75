"""The API's OpenAPI schema and docs pages, without a server: the bearer key is declared
on the routes that need one, and the docs pages load nothing from another host."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from webctx.api.http import create_app
from webctx.settings import Settings

PUBLIC = {"/healthz", "/readyz"}


@pytest.fixture(scope="module")
def app() -> FastAPI:
    # No lifespan runs (TestClient outside `with`): the schema and docs need no Redis.
    return create_app(Settings(api_auth="required"), host="127.0.0.1")


@pytest.fixture(scope="module")
def client(app: FastAPI) -> Iterator[TestClient]:
    yield TestClient(app)


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


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_docs_pages_load_their_assets_from_this_server(client: TestClient, page: str) -> None:
    html = client.get(page)
    assert html.status_code == 200
    # The browser itself refuses any other host (ReDoc's sidebar links an image from its CDN).
    policy = html.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data:" in policy
    assert "http" not in policy
    urls = re.findall(r"""(?:src|href|spec-url)\s*=\s*["']([^"']+)["']""", html.text)
    urls += re.findall(r"""\burl\s*:\s*["']([^"']+)["']""", html.text)  # SwaggerUIBundle({url})
    assert urls and not [u for u in urls if re.match(r"^(https?:)?//", u)], urls
    scripts = [u for u in urls if u.endswith(".js")]
    assert scripts
    for url in scripts:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert "javascript" in asset.headers["content-type"] and len(asset.content) > 500_000


def test_api_responses_carry_no_docs_policy(client: TestClient) -> None:
    assert "content-security-policy" not in client.get("/healthz").headers
