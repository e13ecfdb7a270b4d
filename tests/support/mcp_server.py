"""An MCP server for steppe's tests, written with the Python `mcp` SDK.

    mcp_server.py stdio              serve over stdin/stdout
    mcp_server.py http TOKEN         serve streamable HTTP on a free loopback
                                     port (printed first), every request
                                     needing `Authorization: Bearer TOKEN`

Tools: lookup (a small table), add (structured output), boom (fails every
time), env_names (the variables the server was started with).
"""

import os
import socket
import sys

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

WHERE = "remote" if len(sys.argv) > 1 and sys.argv[1] == "http" else "local"
server = MCPServer("steppe-fixture")


@server.tool()
def lookup(key: str) -> str:
    """Look up a key in the fixture's table."""
    table = {"alpha": "first letter", "omega": "last letter"}
    return f"{WHERE}: {table.get(key, 'no entry for ' + key)}"


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def boom() -> str:
    """Fails every time."""
    raise ToolError("the fixture failed on purpose")


@server.tool()
def env_names() -> str:
    """The names of the environment variables this server was started with."""
    return "env: " + ",".join(sorted(os.environ))


def serve_http(token: str) -> None:
    import uvicorn

    app = server.streamable_http_app(json_response=True, stateless_http=True)

    async def guarded(scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization") != f"Bearer {token}".encode():
                await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
                await send({"type": "http.response.body", "body": b"a bearer token is required"})
                return
        await app(scope, receive, send)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if WHERE == "remote":
        serve_http(sys.argv[2])
    else:
        server.run("stdio")
