//! oauth2 credentials (§1.3): `<NAME>_API_KEY` as an access token, or the
//! refresh-token grant at the credential's `token_url` from
//! `<NAME>_REFRESH_TOKEN` and `<NAME>_CLIENT_ID` (+`_CLIENT_SECRET`) — the
//! access token kept until a minute before it expires, a rotated refresh
//! token kept in memory, one refresh at a time, `invalid_grant` never retried.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::Mutex;

use crate::error::GateError;

/// The variable `<NAME>_<SUFFIX>` of a credential.
pub fn var(name: &str, suffix: &str) -> String {
    format!("{}_{suffix}", name.to_uppercase().replace('-', "_"))
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

#[derive(Debug, Clone)]
struct Token {
    access: String,
    until: Option<Instant>,
}

/// A run's access tokens and rotated refresh tokens, by credential.
#[derive(Clone, Default)]
pub struct Tokens {
    held: Arc<Mutex<HashMap<String, Token>>>,
    rotated: Arc<Mutex<HashMap<String, String>>>,
}

/// Whether a refresh grant can be made for `name` (the variables are set).
pub fn refreshable(name: &str) -> bool {
    env(&var(name, "REFRESH_TOKEN")).is_some() && env(&var(name, "CLIENT_ID")).is_some()
}

impl Tokens {
    /// An access token for credential `name`: the one held, or a fresh one
    /// (`renew` forces it, after a 401).
    pub async fn access(&self, client: &reqwest::Client, name: &str, token_url: &str, scopes: &[String], renew: bool) -> Result<String, GateError> {
        let mut held = self.held.lock().await;
        if let (false, Some(t)) = (renew, held.get(name)) {
            if t.until.is_none_or(|u| Instant::now() + Duration::from_secs(60) < u) {
                return Ok(t.access.clone());
            }
        }
        let refresh = match self.rotated.lock().await.get(name).cloned() {
            Some(r) => r,
            None => env(&var(name, "REFRESH_TOKEN")).ok_or_else(|| unavailable(name, "REFRESH_TOKEN"))?,
        };
        let client_id = env(&var(name, "CLIENT_ID")).ok_or_else(|| unavailable(name, "CLIENT_ID"))?;
        let mut form = vec![("grant_type", "refresh_token".to_string()), ("refresh_token", refresh), ("client_id", client_id)];
        if let Some(secret) = env(&var(name, "CLIENT_SECRET")) {
            form.push(("client_secret", secret));
        }
        if !scopes.is_empty() {
            form.push(("scope", scopes.join(" ")));
        }
        let resp = client.post(token_url).form(&form).send().await.map_err(|e| GateError::new("AuthorizationFailed", format!("credential {name}: the token endpoint {token_url} did not answer: {e}")))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.unwrap_or_default();
        if (status == 400 || status == 401) && body.contains("invalid_grant") {
            return Err(GateError::new("InvalidGrant", format!("credential {name} has an invalid grant: sign in again and set {}", var(name, "REFRESH_TOKEN"))));
        }
        let answer: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        let Some(access) = answer.get("access_token").and_then(Value::as_str).filter(|_| (200..300).contains(&status)) else {
            return Err(GateError::new("AuthorizationFailed", format!("credential {name}: the token endpoint answered HTTP {status}: {}", crate::reply::head(&body))));
        };
        if let Some(r) = answer.get("refresh_token").and_then(Value::as_str) {
            self.rotated.lock().await.insert(name.to_string(), r.to_string());
        }
        let until = answer.get("expires_in").and_then(Value::as_u64).map(|s| Instant::now() + Duration::from_secs(s));
        held.insert(name.to_string(), Token { access: access.to_string(), until });
        Ok(access.to_string())
    }
}

fn unavailable(name: &str, suffix: &str) -> GateError {
    GateError::new("CredentialUnavailable", format!("credential {name} unavailable: set {} or {}", var(name, "API_KEY"), var(name, suffix)))
}
