"""What an OAuth-capable MCP client finds when it meets a 401: no OAuth, and why.

Claude Code, Cursor and the MCP Inspector answer any 401 from an HTTP MCP server by
starting OAuth discovery: the protected-resource metadata (RFC 9728) at the
`resource_metadata` URL of the `WWW-Authenticate` header, else at
/.well-known/oauth-protected-resource/mcp and /.well-known/oauth-protected-resource;
without it they fall back (2025-03-26 behaviour) to this origin as the authorization
server, its metadata at /.well-known/oauth-authorization-server and
/.well-known/openid-configuration, and with none of those to dynamic client
registration at POST /register. webctx takes static API keys, so every one of these
answers 404 with the reason; the client's error then carries it, where a bare 404 made
it say only "Dynamic Client Registration rejected (HTTP 404)". docs/api.md has the
whole finding.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

NO_OAUTH = (
    "webctx takes API keys, not OAuth: send 'Authorization: Bearer <key>' "
    "(create one with `webctx keys create --tenant <name>`)"
)

router = APIRouter(include_in_schema=False)

_METADATA = [
    "/.well-known/oauth-protected-resource",
    "/.well-known/oauth-protected-resource/{path:path}",
    "/.well-known/oauth-authorization-server",
    "/.well-known/oauth-authorization-server/{path:path}",
    "/.well-known/openid-configuration",
    "/.well-known/openid-configuration/{path:path}",
]


def no_oauth() -> JSONResponse:
    """404 in the OAuth error format (RFC 6749 5.2, RFC 7591 3.2.2), with the reason."""
    return JSONResponse({"error": "not_found", "error_description": NO_OAUTH}, 404)


for _path in _METADATA:
    router.add_api_route(_path, no_oauth, methods=["GET"])
router.add_api_route("/register", no_oauth, methods=["POST"])
