"""An MCP server for steppe's tests that requires OAuth 2.1, written with the
Python `mcp` SDK and its built-in authorization server.

    mcp_oauth_server.py [EXPIRES_IN_SECONDS]

Serves streamable HTTP on a free loopback port (printed first); the MCP
endpoint is http://127.0.0.1:PORT/mcp and is also the authorization server
(issuer http://127.0.0.1:PORT). Everything is kept in memory:

- clients register dynamically (POST /register), with redirect URIs on
  127.0.0.1 or localhost only;
- GET /authorize approves at once, redirecting to the client's redirect_uri
  with `code` and `state` (the SDK checks PKCE at /token); a `resource`
  other than the MCP endpoint is refused (invalid_target), none is fine;
- POST /token serves the authorization_code and refresh_token grants; access
  tokens last EXPIRES_IN_SECONDS (default 3600), refresh tokens rotate;
- GET /stats (no auth) counts grants: {"codes", "refreshes", "registrations"}.

Tools: whoami ("authorized as CLIENT_ID") and echo.
"""

import math
import secrets
import socket
import sys
import time
from urllib.parse import urlparse

from starlette.requests import Request
from starlette.responses import JSONResponse

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    RegistrationError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.mcpserver import MCPServer
from mcp.shared.auth import OAuthClientInformationFull as ClientInfo
from mcp.shared.auth import OAuthToken


class AutoApprovingProvider:
    """An OAuthAuthorizationServerProvider that says yes to everyone."""

    def __init__(self, resource: str, expires_in: int):
        self.resource, self.expires_in = resource, expires_in
        self.clients: dict[str, ClientInfo] = {}
        self.codes: dict[str, AuthorizationCode] = {}
        self.access: dict[str, AccessToken] = {}
        self.refresh: dict[str, RefreshToken] = {}
        self.stats = {"codes": 0, "refreshes": 0, "registrations": 0}

    async def get_client(self, client_id: str) -> ClientInfo | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: ClientInfo) -> None:
        for uri in client_info.redirect_uris or []:
            if urlparse(str(uri)).hostname not in ("127.0.0.1", "localhost"):
                raise RegistrationError("invalid_redirect_uri", f"not a loopback redirect URI: {uri}")
        self.clients[client_info.client_id] = client_info
        self.stats["registrations"] += 1

    async def authorize(self, client: ClientInfo, params: AuthorizationParams) -> str:
        if params.resource is not None and params.resource.rstrip("/") != self.resource:
            raise AuthorizeError("invalid_target", f"unknown resource {params.resource}")
        code = secrets.token_urlsafe(32)
        self.codes[code] = AuthorizationCode(
            code=code,
            scopes=params.scopes or [],
            expires_at=time.time() + 300,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource,
        )
        return construct_redirect_uri(str(params.redirect_uri), code=code, state=params.state)

    async def load_authorization_code(self, client: ClientInfo, code: str) -> AuthorizationCode | None:
        return self.codes.get(code)

    async def exchange_authorization_code(self, client: ClientInfo, code: AuthorizationCode) -> OAuthToken:
        self.codes.pop(code.code, None)
        self.stats["codes"] += 1
        return self._issue(client.client_id, code.scopes)

    async def load_refresh_token(self, client: ClientInfo, token: str) -> RefreshToken | None:
        return self.refresh.get(token)

    async def exchange_refresh_token(self, client: ClientInfo, token: RefreshToken, scopes: list[str]) -> OAuthToken:
        self.refresh.pop(token.token, None)  # rotation: the old refresh token is spent
        self.stats["refreshes"] += 1
        return self._issue(client.client_id, scopes)

    async def load_access_token(self, token: str) -> AccessToken | None:
        found = self.access.get(token)
        if found is None or (found.expires_at is not None and found.expires_at < time.time()):
            return None
        return found

    async def revoke_token(self, token: AccessToken | RefreshToken) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    def _issue(self, client_id: str, scopes: list[str]) -> OAuthToken:
        access, refresh = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        # Rounded up: an access token lives at least expires_in seconds, under one more.
        expires_at = math.ceil(time.time() + self.expires_in)
        self.access[access] = AccessToken(
            token=access, client_id=client_id, scopes=scopes, expires_at=expires_at, resource=self.resource
        )
        self.refresh[refresh] = RefreshToken(token=refresh, client_id=client_id, scopes=scopes)
        return OAuthToken(
            access_token=access, expires_in=self.expires_in, scope=" ".join(scopes) or None, refresh_token=refresh
        )


def main() -> None:
    import uvicorn

    expires_in = int(sys.argv[1]) if len(sys.argv) > 1 else 3600
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    # Listening before the port is told: a client connecting at once waits in the backlog.
    sock.listen(128)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    provider = AutoApprovingProvider(f"{base}/mcp", expires_in)
    server = MCPServer(
        "steppe-oauth-fixture",
        auth_server_provider=provider,
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}/mcp",
            client_registration_options=ClientRegistrationOptions(enabled=True),
            validate_token_resource=True,
        ),
    )

    @server.tool()
    def whoami() -> str:
        """Names the OAuth client the request was authorized for."""
        token = get_access_token()
        return f"authorized as {token.client_id if token else 'nobody'}"

    @server.tool()
    def echo(text: str) -> str:
        """Gives the text back."""
        return text

    @server.custom_route("/stats", methods=["GET"])
    async def stats(request: Request) -> JSONResponse:
        return JSONResponse(provider.stats)

    app = server.streamable_http_app(json_response=True, stateless_http=True)
    print(sock.getsockname()[1], flush=True)
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    main()
