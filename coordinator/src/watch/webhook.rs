//! `steppe watch --listen`: `POST /check/RESOURCE` checks a resource now and
//! queues the jobs it triggers, for callers holding the token its
//! `webhook_token_env` variable names (`?token=` or `Authorization: Bearer`).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;

use super::{triggers, Watcher};

#[derive(serde::Deserialize)]
pub struct TokenQuery {
    token: Option<String>,
}

/// The token a resource's webhook takes: the value of its
/// `webhook_token_env` variable, when it has one and it is set.
fn expected(w: &Watcher, resource: &str) -> Option<String> {
    let r = w.loaded.pipeline.resources.iter().find(|r| r.name == resource)?;
    let var = r.webhook_token_env.as_deref()?;
    std::env::var(var).ok().filter(|v| !v.is_empty())
}

fn same(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn check(State(w): State<Arc<Watcher>>, Path(resource): Path<String>, Query(q): Query<TokenQuery>, headers: HeaderMap) -> (StatusCode, String) {
    let given = q.token.or_else(|| headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::to_string));
    // An unknown resource and a wrong token get the same answer.
    let refused = (StatusCode::UNAUTHORIZED, "unknown resource or wrong token\n".to_string());
    let (Some(want), Some(given)) = (expected(&w, &resource), given) else { return refused };
    if !same(&want, &given) {
        return refused;
    }
    let jobs = triggers(&w.loaded.pipeline).remove(&resource).unwrap_or_default();
    match w.poll_one(&resource, &jobs, true).await {
        Ok(()) => (StatusCode::ACCEPTED, format!("queued: {}\n", jobs.join(", "))),
        Err(e) => {
            // The check failed: the jobs are queued all the same.
            let _ = w.enqueue(&jobs, &format!("webhook for {resource}")).await;
            (StatusCode::ACCEPTED, format!("queued: {} (the check failed: {e})\n", jobs.join(", ")))
        }
    }
}

/// Serves the webhooks on `addr` until the process ends; the address it took.
pub async fn serve(w: Arc<Watcher>, addr: std::net::SocketAddr) -> anyhow::Result<std::net::SocketAddr> {
    let app = Router::new().route("/check/{resource}", post(check)).with_state(w);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(local)
}
