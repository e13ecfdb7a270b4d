//! MCP servers that sign in with OAuth 2.1 (`auth: {type: oauth}`): `steppe
//! mcp login` (discovery, dynamic client registration or a declared client,
//! PKCE, the browser's redirect caught on loopback) leaves the credentials in
//! `${XDG_CONFIG_HOME:-~/.config}/steppe/mcp/<server>.json` (0600); a step
//! reads them and, when the access token has expired, refreshes it silently.

use std::path::PathBuf;

use rmcp::transport::auth::{AuthError, AuthorizationManager, AuthorizationRequest, CredentialStore, OAuthState, StoredCredentials};
use serde_json::json;

/// A server name as a file name: letters, digits, `.`, `_`, `-`, not leading with `.`.
fn check_server_name(server: &str) -> Result<(), String> {
    if server.is_empty() || server.starts_with('.') || !server.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)) {
        return Err(format!("MCP server name {server:?} cannot name a credentials file (letters, digits, '.', '_', '-')"));
    }
    Ok(())
}

/// One refresh at a time per server in this process: a rotated refresh
/// token is never spent twice.
fn refresh_lock(server: &str) -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static LOCKS: std::sync::OnceLock<std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<tokio::sync::Mutex<()>>>>> = std::sync::OnceLock::new();
    let mut m = LOCKS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    m.entry(server.to_string()).or_default().clone()
}

/// Where a server's credentials live on this machine.
pub fn credentials_path(server: &str) -> PathBuf {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
        .unwrap_or_else(|| PathBuf::from("."));
    base.join("steppe").join("mcp").join(format!("{server}.json"))
}

/// Credentials of one server in their file, with the endpoint they are for
/// (a server renamed or moved is not handed another's token).
struct FileCredentials {
    path: PathBuf,
    endpoint: String,
}

fn store_error(e: impl std::fmt::Display) -> AuthError {
    AuthError::InternalError(e.to_string())
}

#[async_trait::async_trait]
impl CredentialStore for FileCredentials {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(store_error(format!("{}: {e}", self.path.display()))),
        };
        let file: serde_json::Value = serde_json::from_str(&text).map_err(|e| store_error(format!("{}: {e}", self.path.display())))?;
        if file.get("endpoint").and_then(|v| v.as_str()) != Some(self.endpoint.as_str()) {
            return Ok(None);
        }
        let creds: StoredCredentials = serde_json::from_value(file["credentials"].clone()).map_err(|e| store_error(format!("{}: {e}", self.path.display())))?;
        if let Some(t) = &creds.token_response {
            remember_tokens(t);
        }
        Ok(Some(creds))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        if let Some(t) = &credentials.token_response {
            remember_tokens(t);
        }
        let dir = self.path.parent().ok_or_else(|| store_error("no directory for the credentials"))?;
        std::fs::create_dir_all(dir).map_err(|e| store_error(format!("{}: {e}", dir.display())))?;
        let text = json!({"endpoint": self.endpoint, "credentials": credentials}).to_string();
        // Written beside and renamed over, so a reader never sees half a file.
        static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let tmp = self.path.with_extension(format!("json.{}.{}", std::process::id(), WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed)));
        let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(|e| store_error(format!("{}: {e}", tmp.display())))?;
        f.write_all(text.as_bytes()).map_err(|e| store_error(format!("{}: {e}", tmp.display())))?;
        std::fs::rename(&tmp, &self.path).map_err(|e| store_error(format!("{}: {e}", self.path.display())))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(store_error(e)),
            _ => Ok(()),
        }
    }
}

/// Tokens are masked wherever they could surface.
fn remember_tokens(t: &rmcp::transport::auth::OAuthTokenResponse) {
    use oauth2::TokenResponse;
    steppe_runtime::secrets::remember(t.access_token().secret());
    if let Some(r) = t.refresh_token() {
        steppe_runtime::secrets::remember(r.secret());
    }
}

/// An OAuth sign-in as `auth:` declares it.
#[derive(Debug, Clone, Default)]
pub struct LoginSpec {
    pub server: String,
    pub endpoint: String,
    pub client_id: Option<String>,
    pub client_secret: Option<String>,
    /// The loopback port the browser is sent back to (0: any free one).
    pub callback_port: u16,
    pub scopes: Vec<String>,
}

fn plain(e: AuthError) -> String {
    steppe_runtime::secrets::mask(&e.to_string()).into_owned()
}

/// Signs in to `spec.server`: `show` is given the URL to open in a browser;
/// the redirect back is caught on 127.0.0.1 and the tokens stored.
pub async fn login(spec: &LoginSpec, show: &(dyn Fn(&str) + Sync)) -> Result<PathBuf, String> {
    check_server_name(&spec.server)?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", spec.callback_port)).await.map_err(|e| format!("the callback port 127.0.0.1:{}: {e}", spec.callback_port))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    let redirect = format!("http://127.0.0.1:{port}/callback");
    steppe_cloud::install_crypto();
    let mut manager = AuthorizationManager::new(spec.endpoint.as_str()).await.map_err(plain)?;
    let path = credentials_path(&spec.server);
    manager.set_credential_store(FileCredentials { path: path.clone(), endpoint: spec.endpoint.clone() });
    let mut request = AuthorizationRequest::new(redirect.clone()).with_client_name("steppe");
    if !spec.scopes.is_empty() {
        request = request.with_scopes(spec.scopes.iter().map(String::as_str));
    }
    if let Some(id) = &spec.client_id {
        request = request.with_preregistered_client(id.clone());
        if let Some(secret) = &spec.client_secret {
            request = request.with_client_secret(secret.clone());
        }
    }
    let mut state = OAuthState::Unauthorized(manager);
    state.start_authorization(request).await.map_err(plain)?;
    let url = state.get_authorization_url().await.map_err(plain)?;
    show(&url);
    // Only the redirect carrying this sign-in's state counts; ten minutes to sign in.
    let issued = url::Url::parse(&url).ok().and_then(|u| u.query_pairs().find(|(k, _)| k == "state").map(|(_, v)| v.into_owned())).unwrap_or_default();
    let (code, csrf) = tokio::time::timeout(std::time::Duration::from_secs(600), catch_redirect(listener, &issued))
        .await
        .map_err(|_| "nobody signed in within 10 minutes".to_string())??;
    state.handle_callback(&code, &csrf).await.map_err(plain)?;
    Ok(path)
}

/// Waits for the browser's one request to `/callback`: its code and state.
async fn catch_redirect(listener: tokio::net::TcpListener, issued: &str) -> Result<(String, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    loop {
        let (mut sock, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 16 * 1024];
        let n = sock.read(&mut buf).await.map_err(|e| e.to_string())?;
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let target = head.lines().next().and_then(|l| l.split_whitespace().nth(1)).unwrap_or_default().to_string();
        let Some(query) = target.strip_prefix("/callback?") else {
            let _ = sock.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
            continue;
        };
        let params: std::collections::HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        // Another page's request to this port is not this sign-in's redirect.
        if params.get("state").map(String::as_str) != Some(issued) {
            let _ = sock.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
            continue;
        }
        let (body, found): (&str, Option<Result<(String, String), String>>) = match (params.get("code"), params.get("state"), params.get("error")) {
            (Some(c), Some(s), _) => ("Signed in: steppe has the token. You can close this tab.", Some(Ok((c.clone(), s.clone())))),
            (_, _, Some(e)) => {
                let why = params.get("error_description").map(String::as_str).unwrap_or_default();
                ("Sign-in refused; see the terminal.", Some(Err(format!("the authorization server refused: {e} {why}"))))
            }
            _ => ("A callback without a code.", None),
        };
        let reply = format!("HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
        let _ = sock.write_all(reply.as_bytes()).await;
        if let Some(r) = found {
            return r;
        }
    }
}

/// The access token of a signed-in server, refreshed when it has expired.
pub async fn access_token(server: &str, endpoint: &str, pipeline_hint: &str) -> Result<String, String> {
    check_server_name(server)?;
    let lock = refresh_lock(server);
    let _one_at_a_time = lock.lock().await;
    steppe_cloud::install_crypto();
    let mut manager = AuthorizationManager::new(endpoint).await.map_err(plain)?;
    manager.set_credential_store(FileCredentials { path: credentials_path(server), endpoint: endpoint.to_string() });
    let signed_in = manager.initialize_from_store().await.map_err(plain)?;
    if !signed_in {
        return Err(format!("nobody has signed in to it on this machine: run `steppe mcp login {pipeline_hint} {server}` here first"));
    }
    match manager.get_access_token().await {
        Ok(t) => {
            steppe_runtime::secrets::remember(&t);
            Ok(t)
        }
        Err(AuthError::AuthorizationRequired) => Err(format!("its sign-in has expired and could not be refreshed: run `steppe mcp login {pipeline_hint} {server}` again")),
        Err(e) => Err(plain(e)),
    }
}
