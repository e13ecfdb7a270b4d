//! Every request a run makes (§1.10): the host checked against the
//! stepfile's declared hosts before each connection and each redirect hop,
//! a credential attached on a hop only to its own hosts, responses capped,
//! and the retry rules.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::GateError;
use crate::openapi::{KeyPlace, Request};

/// How a credential rides on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    Bearer,
    Basic,
    Key(KeyPlace),
}

/// A declared credential: its kind and the hosts it may be sent to.
#[derive(Debug, Clone)]
pub struct Credential {
    pub name: String,
    pub kind: String,
    pub hosts: Vec<String>,
    /// oauth2: where a refresh-token grant is made, and the scopes asked.
    pub token_url: Option<String>,
    pub scopes: Vec<String>,
}

/// The environment variable holding a credential's value (`<NAME>_API_KEY`).
pub fn credential_var(name: &str) -> String {
    crate::oauth::var(name, "API_KEY")
}

/// Whether an authority (`host[:port]`, `[v6]:port`; the port may be a
/// stepfile's `{setting}`) names this machine.
pub fn loopback(authority: &str) -> bool {
    let port = |p: &str| p.chars().all(|c| c.is_ascii_digit()) || p.starts_with('{') && p.ends_with('}');
    let host = if let Some(rest) = authority.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        authority.rsplit_once(':').map_or(authority, |(h, p)| if port(p) { h } else { authority })
    };
    matches!(host.to_ascii_lowercase().as_str(), "localhost" | "127.0.0.1" | "::1")
}

/// Whether a credential can be had: its `<NAME>_API_KEY`, or an oauth2
/// credential's refresh-grant variables.
pub fn credential_available(c: &Credential) -> Result<(), GateError> {
    if c.kind == "oauth2" && c.token_url.is_some() && std::env::var(credential_var(&c.name)).map_or(true, |v| v.is_empty()) {
        return if crate::oauth::refreshable(&c.name) { Ok(()) } else { Err(GateError::new("CredentialUnavailable", format!("credential {} unavailable: set {} (an access token) or {} and {}", c.name, credential_var(&c.name), crate::oauth::var(&c.name, "REFRESH_TOKEN"), crate::oauth::var(&c.name, "CLIENT_ID")))) };
    }
    credential_value(c).map(|_| ())
}

/// A credential's `<NAME>_API_KEY`, read afresh each time it is attached.
pub fn credential_value(c: &Credential) -> Result<String, GateError> {
    let var = credential_var(&c.name);
    let v = std::env::var(&var).ok().filter(|v| !v.is_empty()).ok_or_else(|| GateError::new("CredentialUnavailable", format!("credential {} unavailable: {var} is not set", c.name)))?;
    if c.kind == "basic" && !v.contains(':') {
        return Err(GateError::new("CredentialUnavailable", format!("credential {} unavailable: it is basic, so {var} must be user:secret", c.name)));
    }
    Ok(v)
}

/// `host[:port]` of a URL, lowercase, the port only where it is not the scheme's default.
pub fn host_of(url: &reqwest::Url) -> Option<String> {
    let host = url.host_str()?.to_lowercase();
    Some(match url.port() {
        Some(p) => format!("{host}:{p}"),
        None => host,
    })
}

/// One retry, as the ledger records it.
#[derive(Debug, Clone)]
pub struct Retry {
    pub attempt: u32,
    pub status: Option<u16>,
    pub wait_ms: u64,
}

/// An answer that came back (any status).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub host: String,
}

/// A run's way out: the allow-list and the limits.
#[derive(Clone)]
pub struct Egress {
    client: reqwest::Client,
    allow: Vec<String>,
    response_bytes: usize,
    pub user_agent: String,
    /// The first wait between attempts (doubling); 500 ms.
    pub backoff: Duration,
    /// Each request's deadline (`--request-timeout-ms`).
    pub timeout: Duration,
    tokens: crate::oauth::Tokens,
}

const MAX_ATTEMPTS: u32 = 4;
const MAX_HOPS: usize = 5;
const LONGEST_WAIT: Duration = Duration::from_secs(60);

impl Egress {
    pub fn new(allow: Vec<String>, timeout: Duration, response_bytes: usize, contact: Option<&str>) -> Result<Egress, GateError> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .map_err(|e| GateError::new("ToolCallFailed", format!("cannot make an HTTP client: {e}")))?;
        let version = env!("CARGO_PKG_VERSION");
        let user_agent = match contact {
            Some(c) => format!("stepgate/{version} {c}"),
            None => format!("stepgate/{version} (+https://github.com/steppe-dev/steppe)"),
        };
        Ok(Egress { client, allow: allow.into_iter().map(|h| h.to_lowercase()).collect(), response_bytes, user_agent, backoff: Duration::from_millis(500), timeout, tokens: Default::default() })
    }

    /// Lets this copy reach `host` too (an OpenAPI document's own URL, fetched without credentials).
    pub fn allow_also(&mut self, host: &str) {
        self.allow.push(host.to_lowercase());
    }

    pub fn allows(&self, host: &str) -> bool {
        self.allow.iter().any(|a| a == host)
    }

    /// Checks that `url` is on the allow-list, or says `EgressDenied`
    /// before any connection is made.
    pub fn check(&self, url: &str, operation: &str) -> Result<reqwest::Url, GateError> {
        let u = reqwest::Url::parse(url).map_err(|e| GateError::new("EgressDenied", format!("egress denied: {operation} targeted {url}, which is not a URL: {e}")))?;
        let host = host_of(&u).unwrap_or_default();
        if !self.allows(&host) {
            return Err(GateError::new("EgressDenied", format!("egress denied: {operation} targeted undeclared host {host}")));
        }
        Ok(u)
    }

    /// Sends `req` with its retries, following redirects hop by hop.
    /// `idempotent`: GET, HEAD, OPTIONS, PUT, DELETE or `effect: read`.
    pub async fn send(&self, req: &Request, credential: Option<(&Credential, &Placement)>, idempotent: bool, operation: &str, retries: &mut Vec<Retry>) -> Result<Answer, GateError> {
        let failed = |status: Option<u16>, m: String| GateError::new("ToolCallFailed", format!("{operation} failed with status {}: {m}", status.map_or("none".to_string(), |s| s.to_string())));
        let mut wait = self.backoff;
        for attempt in 1..=MAX_ATTEMPTS {
            let last = attempt == MAX_ATTEMPTS;
            let asked: Option<Duration>;
            let status: Option<u16>;
            let last_body: String;
            match self.follow(req, credential, operation).await {
                Err(Hop::Refused(e)) => return Err(e),
                Err(Hop::Network(m)) => {
                    if !idempotent {
                        return Err(failed(None, format!("{m}; not retried, because a {} may already have taken effect", req.method)));
                    }
                    if last {
                        return Err(failed(None, format!("{m} (after {MAX_ATTEMPTS} attempts)")));
                    }
                    (asked, status, last_body) = (None, None, m);
                }
                Ok(a) => {
                    let limited = a.status == 429 || (a.status == 403 && (a.headers.contains_key("retry-after") || header(&a.headers, "x-ratelimit-remaining").as_deref() == Some("0") && a.headers.contains_key("x-ratelimit-reset")));
                    let server = a.status >= 500 && idempotent;
                    if !limited && !server {
                        return Ok(a);
                    }
                    if last {
                        return Err(failed(Some(a.status), crate::reply::head(&String::from_utf8_lossy(&a.body))));
                    }
                    (asked, status, last_body) = (asked_wait(&a.headers), Some(a.status), crate::reply::head(&String::from_utf8_lossy(&a.body)));
                }
            }
            let pause = match asked {
                Some(d) if d > LONGEST_WAIT => return Err(failed(status, format!("rate limited: asked to wait {}s, more than the {}s Stepgate allows. {last_body}", d.as_secs(), LONGEST_WAIT.as_secs()))),
                Some(d) => d,
                None => wait,
            };
            retries.push(Retry { attempt, status, wait_ms: pause.as_millis() as u64 });
            tokio::time::sleep(pause).await;
            wait *= 2;
        }
        Err(failed(None, "no attempt left".into()))
    }

    /// A credential's value now: `<NAME>_API_KEY`, else (oauth2) an access
    /// token from the refresh grant, renewed when `renew`.
    pub async fn secret(&self, c: &Credential, renew: bool) -> Result<String, GateError> {
        match (&c.token_url, credential_value(c)) {
            (_, Ok(v)) => Ok(v),
            (Some(url), Err(_)) if c.kind == "oauth2" => self.tokens.access(&self.client, &c.name, url, &c.scopes, renew).await,
            (_, Err(e)) => Err(e),
        }
    }

    async fn follow(&self, req: &Request, credential: Option<(&Credential, &Placement)>, operation: &str) -> Result<Answer, Hop> {
        let mut method = req.method.clone();
        let mut body = req.body.clone();
        let mut url = req.url.clone();
        let mut renew = false;
        for _ in 0..=MAX_HOPS + 1 {
            let mut u = self.check(&url, operation).map_err(Hop::Refused)?;
            let host = host_of(&u).unwrap_or_default();
            let mut headers = HeaderMap::new();
            let mut basic: Option<(String, Option<String>)> = None;
            for (k, v) in &req.headers {
                if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_str(v)) {
                    headers.insert(k, v);
                }
            }
            if let Some((c, place)) = credential.filter(|(c, _)| c.hosts.iter().any(|h| h.eq_ignore_ascii_case(&host))) {
                let value = self.secret(c, renew).await.map_err(Hop::Refused)?;
                match place {
                    Placement::Bearer => _ = headers.insert(reqwest::header::AUTHORIZATION, HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| Hop::Refused(unsendable(c)))?),
                    Placement::Basic => {
                        let (user, secret) = value.split_once(':').unwrap_or((&value, ""));
                        basic = Some((user.to_string(), Some(secret.to_string())));
                    }
                    Placement::Key(KeyPlace::Header(n)) => {
                        let name = HeaderName::from_bytes(n.as_bytes()).map_err(|_| Hop::Refused(unsendable(c)))?;
                        headers.insert(name, HeaderValue::from_str(&value).map_err(|_| Hop::Refused(unsendable(c)))?);
                    }
                    Placement::Key(KeyPlace::Query(n)) => _ = u.query_pairs_mut().append_pair(n, &value),
                }
            }
            let m = reqwest::Method::from_bytes(method.as_bytes()).map_err(|_| Hop::Network(format!("{method} is not an HTTP method")))?;
            let mut rb = self.client.request(m, u.clone()).header(reqwest::header::ACCEPT, "application/json").headers(headers).header(reqwest::header::USER_AGENT, &self.user_agent);
            if let Some((user, secret)) = basic {
                rb = rb.basic_auth(user, secret);
            }
            if let Some((ct, bytes)) = &body {
                rb = rb.header(reqwest::header::CONTENT_TYPE, ct).body(bytes.clone());
            }
            let mut resp = rb.send().await.map_err(|e| Hop::Network(describe(&e)))?;
            let status = resp.status().as_u16();
            // An access token the API no longer takes: one fresh one, and the request again.
            let refreshed = credential.is_some_and(|(c, _)| c.kind == "oauth2" && c.token_url.is_some() && credential_value(c).is_err());
            if status == 401 && refreshed && !renew {
                renew = true;
                continue;
            }
            if matches!(status, 301 | 302 | 303 | 307 | 308) {
                let Some(next) = resp.headers().get(reqwest::header::LOCATION).and_then(|l| l.to_str().ok()).and_then(|l| u.join(l).ok()) else {
                    return Err(Hop::Network(format!("HTTP {status} without a usable Location")));
                };
                if status == 303 || (matches!(status, 301 | 302) && method == "POST") {
                    method = "GET".into();
                    body = None;
                }
                url = next.to_string();
                continue;
            }
            let headers = resp.headers().clone();
            let mut bytes: Vec<u8> = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| Hop::Network(describe(&e)))? {
                if bytes.len() + chunk.len() > self.response_bytes {
                    return Err(Hop::Refused(GateError::new("ResponseTooLarge", format!("{operation} returned more than the {} bytes Stepgate reads (--response-bytes)", self.response_bytes))));
                }
                bytes.extend_from_slice(&chunk);
            }
            return Ok(Answer { status, headers, body: bytes, host });
        }
        Err(Hop::Network(format!("stopped after {MAX_HOPS} redirects, the last to {url}")))
    }
}

enum Hop {
    Refused(GateError),
    Network(String),
}

fn unsendable(c: &Credential) -> GateError {
    GateError::new("CredentialUnavailable", format!("credential {} holds characters a request header cannot carry", c.name))
}

fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer before the request timeout".into()
    } else {
        let mut s = e.to_string();
        let mut src = std::error::Error::source(e);
        while let Some(c) = src {
            s = format!("{s}: {c}");
            src = c.source();
        }
        s
    }
}

fn header(h: &HeaderMap, name: &str) -> Option<String> {
    h.get(name).and_then(|v| v.to_str().ok()).map(|s| s.trim().to_string())
}

/// The wait a server asked for: `Retry-After` seconds, else an
/// `x-ratelimit-reset` (seconds, or a Unix time).
fn asked_wait(h: &HeaderMap) -> Option<Duration> {
    if let Some(secs) = header(h, "retry-after").and_then(|s| s.parse::<f64>().ok()) {
        return Some(Duration::from_secs_f64(secs.max(0.0)));
    }
    let reset = header(h, "x-ratelimit-reset")?.parse::<f64>().ok()?;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64();
    Some(Duration::from_secs_f64(if reset > 1_000_000_000.0 { (reset - now).max(0.0) } else { reset.max(0.0) }))
}

/// The credentials a stepfile declares, by name.
pub fn credentials(doc: &crate::stepfile::Stepfile, settings: &BTreeMap<String, String>) -> BTreeMap<String, Credential> {
    doc.credentials
        .iter()
        .flatten()
        .map(|(name, c)| {
            let hosts = c.hosts.iter().map(|h| crate::settings::fill(h, settings).to_lowercase()).collect();
            (name.clone(), Credential { name: name.clone(), kind: c.kind.clone(), hosts, token_url: c.token_url.clone(), scopes: c.scopes.clone().unwrap_or_default() })
        })
        .collect()
}
