"""The ways in: the command line, the HTTP API and the MCP server."""
