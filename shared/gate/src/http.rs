//! `steppe gate --http PORT` (§1.14): streamable HTTP on 127.0.0.1 only, at
//! `/mcp` only, refusing what a DNS-rebinding page would send (a Host or an
//! Origin that is not loopback), bodies over 4 MiB, invalid JSON and
//! unknown sessions, each with a JSON `{error}` body.

use std::sync::Arc;

use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::session::SessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::{json, Value};

use crate::egress::loopback;
use crate::server::Gate;

const MAX_BODY: usize = 4 * 1024 * 1024;

fn refuse(status: StatusCode, error: &str) -> Response {
    (status, axum::Json(json!({"error": error}))).into_response()
}

fn origin_host(origin: &str) -> &str {
    origin.split_once("://").map_or(origin, |(_, rest)| rest.split('/').next().unwrap_or_default())
}

async fn guard(State(sessions): State<Arc<LocalSessionManager>>, req: Request, next: Next) -> Response {
    let (host, origin, session) = {
        let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        (header("host"), header("origin"), header("mcp-session-id"))
    };
    if !host.is_some_and(|h| loopback(&h)) {
        return refuse(StatusCode::FORBIDDEN, "the Host header must name this loopback server");
    }
    if origin.is_some_and(|o| !loopback(origin_host(&o))) {
        return refuse(StatusCode::FORBIDDEN, "requests from a page on another origin are refused");
    }
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(_) => return refuse(StatusCode::PAYLOAD_TOO_LARGE, "the request body is over 4 MiB"),
    };
    if parts.method == axum::http::Method::POST {
        let Ok(message) = serde_json::from_slice::<Value>(&bytes) else {
            return refuse(StatusCode::BAD_REQUEST, "the request body is not JSON");
        };
        let initialize = message.get("method").and_then(Value::as_str) == Some("initialize");
        if !initialize {
            let known = match &session {
                Some(id) => sessions.has_session(&id.as_str().into()).await.unwrap_or(false),
                None => false,
            };
            if !known {
                return refuse(StatusCode::BAD_REQUEST, if session.is_some() { "unknown Mcp-Session-Id; initialize a new session" } else { "Mcp-Session-Id is missing; initialize a session first" });
            }
        }
    }
    let delete = parts.method == axum::http::Method::DELETE;
    let mut response = next.run(Request::from_parts(parts, Body::from(bytes))).await;
    // A closed session is done with: 200, as clients expect of DELETE.
    if delete && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// Serves on 127.0.0.1:`port` (0 picks one) until the process ends; calls
/// `ready` with the bound address first.
pub async fn serve_http(gate: Arc<Gate>, port: u16, ready: impl FnOnce(std::net::SocketAddr)) -> Result<(), String> {
    let sessions = Arc::new(LocalSessionManager::default());
    let config = StreamableHttpServerConfig::default().with_legacy_session_mode(true).with_json_response(true).with_max_request_body_bytes(MAX_BODY);
    let for_sessions = gate.clone();
    let service = StreamableHttpService::new(move || Ok(crate::server::handler(for_sessions.clone())), sessions.clone(), config);
    let app = axum::Router::new()
        .route_service("/mcp", service)
        .fallback(|| async { refuse(StatusCode::NOT_FOUND, "only /mcp is served here") })
        .layer(axum::middleware::from_fn_with_state(sessions.clone(), guard));
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    ready(addr);
    let sweeper = gate.sweeper();
    let served = axum::serve(listener, app).await.map_err(|e| e.to_string());
    sweeper.abort();
    served
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_authorities_pass() {
        for ok in ["127.0.0.1:8080", "localhost", "LOCALHOST:1", "[::1]:9", "127.0.0.1"] {
            assert!(loopback(ok), "{ok}");
        }
        for bad in ["evil.example:8080", "127.0.0.1.evil.example", "10.0.0.1:80", "[::2]:9", ""] {
            assert!(!loopback(bad), "{bad}");
        }
        assert_eq!(origin_host("http://localhost:3000"), "localhost:3000");
        assert!(!loopback(origin_host("https://attacker.example")));
    }
}
