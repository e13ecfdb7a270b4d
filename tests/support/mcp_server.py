"""An MCP server for steppe's tests, written with the Python `mcp` SDK.

    mcp_server.py stdio              serve over stdin/stdout
    mcp_server.py http TOKEN         serve streamable HTTP on a free loopback
                                     port (printed first), every request
                                     needing `Authorization: Bearer TOKEN`

Tools: lookup (a small table), add (structured output), boom (fails every
time), env_names (the variables the server was started with); and for an
MCP-backed resource type: versions, fetch and publish.
"""

import json
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


@server.tool()
def versions(project: str) -> str:
    """The project's issues as resource versions, oldest first (a JSON array)."""
    return json.dumps([{"id": "1", "project": project}, {"id": "2", "project": project}])


@server.tool()
def fetch(id: str) -> str:
    """One issue's text."""
    return f"issue {id} text"


@server.tool()
def publish(title: str, body: str, log: str) -> dict:
    """Publishes a note (appending it to the file `log`) and gives its version."""
    with open(log, "a") as f:
        f.write(f"{title}: {body}\n")
    return {"id": "3", "title": title}


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
    # Listening before the port is told: a client connecting at once waits in the backlog.
    sock.listen(128)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(guarded, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    if WHERE == "remote":
        serve_http(sys.argv[2])
    else:
        server.run("stdio")
