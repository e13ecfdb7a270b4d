//! The dashboard (`steppe web` over a pipeline's own store, `steppe
//! coordinator --web` over the cluster's): pages rendered here from the run
//! store, a run's page kept live by server-sent events, approvals decided
//! from the page. With tokens (a coordinator's `--auth`/`--token-file`) a
//! person signs in with the same token as the CLI and sees their team's
//! history only; the session is an HttpOnly, SameSite=Strict cookie, and
//! every form carries the session's CSRF token. Embedded, it listens on
//! loopback and answers only requests addressed to it there.

mod fleet;
pub mod html;
mod pages;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use steppe_runtime::auth::{Callers, Identity};
use steppe_runtime::store::{RunFilter, Store};

pub use fleet::Fleet;

/// What the pages read and act on.
pub struct Web {
    pub store: Arc<dyn Store>,
    /// The callers who may sign in; None: open (embedded, on loopback).
    pub callers: Option<Callers>,
    pub fleet: Option<Fleet>,
    /// Signed-in sessions: id → (who, CSRF token).
    sessions: Mutex<HashMap<String, (Identity, String)>>,
    /// The CSRF token of an open dashboard.
    open_csrf: String,
}

impl Web {
    pub fn new(store: Arc<dyn Store>, callers: Option<Callers>, fleet: Option<Fleet>) -> std::io::Result<Arc<Web>> {
        Ok(Arc::new(Web { store, callers, fleet, sessions: Mutex::new(HashMap::new()), open_csrf: steppe_runtime::auth::new_token()? }))
    }
}

/// The caller of a request: who, their CSRF token, whether they signed in.
struct Caller {
    who: Identity,
    csrf: String,
    signed_in: bool,
}

const COOKIE: &str = "steppe_session";

fn cookie_of(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| c.trim().strip_prefix(&format!("{COOKIE}=")).map(str::to_string))
}

/// A loopback dashboard answers only requests addressed to loopback (a
/// page elsewhere cannot reach it by rebinding a name).
fn addressed_to_loopback(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
    let name = host.rsplit_once(':').map(|(h, _)| h).unwrap_or(host);
    matches!(name, "127.0.0.1" | "localhost" | "[::1]")
}

// A refusal is the response itself (a redirect, a 403): large, and rare.
#[allow(clippy::result_large_err)]
impl Web {
    fn caller(&self, headers: &HeaderMap) -> Result<Caller, Response> {
        let Some(callers) = &self.callers else {
            if !addressed_to_loopback(headers) {
                return Err((StatusCode::FORBIDDEN, "this dashboard answers on loopback only").into_response());
            }
            return Ok(Caller { who: Identity::admin(), csrf: self.open_csrf.clone(), signed_in: false });
        };
        // A coordinator without tokens lets everyone in, as its gRPC API does.
        if let Some(who) = steppe_runtime::auth::identify(callers, None) {
            return Ok(Caller { who, csrf: self.open_csrf.clone(), signed_in: false });
        }
        let session = cookie_of(headers).and_then(|id| self.sessions.lock().ok().and_then(|s| s.get(&id).cloned()));
        match session {
            Some((who, csrf)) => Ok(Caller { who, csrf, signed_in: true }),
            None => Err(Redirect::to("/login").into_response()),
        }
    }

    /// A form's POST: from a page of this dashboard (Origin, when sent, is
    /// this host) and carrying the caller's CSRF token.
    fn check_post(&self, headers: &HeaderMap, c: &Caller, csrf: &str) -> Result<(), Response> {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or_default();
        // ("null" is what a browser sends when it withholds the origin; the token still decides.)
        if let Some(origin) = headers.get(header::ORIGIN).and_then(|o| o.to_str().ok()).filter(|o| *o != "null") {
            let origin_host = origin.split("://").nth(1).unwrap_or(origin);
            if origin_host != host {
                return Err((StatusCode::FORBIDDEN, "a form from another site").into_response());
            }
        }
        if !constant_time_eq(csrf.as_bytes(), c.csrf.as_bytes()) {
            return Err((StatusCode::FORBIDDEN, "the form's token is missing or stale: reload the page").into_response());
        }
        Ok(())
    }

    fn page(&self, c: &Caller, title: &str, body: &str) -> Response {
        let who = if c.signed_in || self.callers.is_some() { if c.who.team.is_empty() { "admin".to_string() } else { format!("team {}", c.who.team) } } else { String::new() };
        Html(html::page(title, &who, c.signed_in, &c.csrf, self.fleet.is_some(), body)).into_response()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// The store asked off the async threads.
#[allow(clippy::result_large_err)]
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, steppe_runtime::store::StoreError> + Send + 'static) -> Result<T, Response> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err((StatusCode::SERVICE_UNAVAILABLE, format!("the run store: {e}")).into_response()),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()),
    }
}

type W = State<Arc<Web>>;

#[derive(serde::Deserialize, Default)]
struct RunsQuery {
    #[serde(default)]
    pipeline: String,
    #[serde(default)]
    job: String,
    #[serde(default)]
    outcome: String,
}

async fn runs(State(web): W, headers: HeaderMap, Query(q): Query<RunsQuery>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (store, team) = (web.store.clone(), c.who.team_filter().map(str::to_string));
    let (pipeline, job, outcome) = (q.pipeline.clone(), q.job.clone(), q.outcome.clone());
    let list = blocking(move || {
        let f = RunFilter { team: team.as_deref(), pipeline: Some(pipeline.as_str()).filter(|p| !p.is_empty()), job: Some(job.as_str()).filter(|j| !j.is_empty()), limit: 200, skip: 0 };
        let mut out = Vec::new();
        for r in store.runs(&f)? {
            if !outcome.is_empty() && r.outcome.as_deref().unwrap_or("running") != outcome {
                continue;
            }
            let (spend, steps, priced) = steppe_runtime::prices::Spend::total(&store.steps(&r.id)?);
            out.push((r, spend.tokens, steppe_runtime::prices::show_cost(spend.cost_usd, steps, priced)));
        }
        Ok(out)
    })
    .await;
    match list {
        Ok(list) => web.page(&c, "Runs", &pages::runs(&list, &q.pipeline, &q.job, &q.outcome, now_ms())),
        Err(r) => r,
    }
}

/// A run's record and the parts of its page, when the caller may see it.
async fn run_parts(web: &Arc<Web>, who: &Identity, id: String) -> Result<Option<(steppe_runtime::store::RunRecord, Vec<(&'static str, String)>)>, Response> {
    let (store, who) = (web.store.clone(), who.clone());
    blocking(move || {
        let Some(run) = store.run(&id)?.filter(|r| who.sees(&r.team)) else { return Ok(None) };
        let (steps, events, spans) = (store.steps(&id)?, store.events(&id)?, store.spans(&id)?);
        let parts = pages::run_parts(&run, &steps, &events, &spans, now_ms());
        Ok(Some((run, parts)))
    })
    .await
}

async fn run(State(web): W, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match run_parts(&web, &c.who, id).await {
        Ok(Some((run, parts))) => web.page(&c, &format!("Run {}", run.id), &pages::run(&run, &parts)),
        Ok(None) => (StatusCode::NOT_FOUND, "no such run").into_response(),
        Err(r) => r,
    }
}

/// The run's live parts as server-sent events: sent when they change, the
/// last one (`done`) when the run has ended.
async fn live(State(web): W, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let stream = futures::stream::unfold((web, c.who, id, String::new(), false), |(web, who, id, last, finished)| async move {
        if finished {
            return None;
        }
        loop {
            let Ok(Some((run, parts))) = run_parts(&web, &who, id.clone()).await else { return None };
            let done = run.outcome.is_some();
            let mut map: serde_json::Map<String, serde_json::Value> = parts.into_iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v))).collect();
            if done {
                map.insert("done".into(), serde_json::Value::Bool(true));
            }
            let data = serde_json::Value::Object(map).to_string();
            if data != last || done {
                let ev: Result<Event, std::convert::Infallible> = Ok(Event::default().data(data.clone()));
                return Some((ev, (web, who, id, data, done)));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

async fn step(State(web): W, headers: HeaderMap, Path((id, seq)): Path<(String, i64)>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (store, who) = (web.store.clone(), c.who.clone());
    let found = blocking(move || {
        let Some(run) = store.run(&id)?.filter(|r| who.sees(&r.team)) else { return Ok(None) };
        let Some(step) = store.steps(&id)?.into_iter().find(|s| s.seq == seq) else { return Ok(None) };
        let logs = store.logs(&id)?;
        Ok(Some((run, step, logs)))
    })
    .await;
    match found {
        Ok(Some((run, s, logs))) => web.page(&c, &s.name, &pages::step(&run, &s, &logs)),
        Ok(None) => (StatusCode::NOT_FOUND, "no such step").into_response(),
        Err(r) => r,
    }
}

async fn approvals(State(web): W, headers: HeaderMap) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (store, team) = (web.store.clone(), c.who.team_filter().map(str::to_string));
    match blocking(move || Ok((store.pending_approvals(team.as_deref(), None)?, store.pending_questions(team.as_deref(), None)?))).await {
        Ok((list, questions)) => web.page(&c, "Approvals", &(pages::approvals(&list, &c.csrf) + &pages::questions(&questions, &c.csrf))),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct Answer {
    #[serde(default)]
    csrf: String,
    answer: String,
}

/// An ask_user question answered from the page, as `steppe questions answer` does.
async fn answer(State(web): W, headers: HeaderMap, Path(id): Path<i64>, Form(a): Form<Answer>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = web.check_post(&headers, &c, &a.csrf) {
        return r;
    }
    if a.answer.trim().is_empty() {
        return (StatusCode::BAD_REQUEST, "an empty answer").into_response();
    }
    let by = if c.who.team.is_empty() { "person:web".to_string() } else { format!("person:web ({})", c.who.team) };
    let (store, who) = (web.store.clone(), c.who.clone());
    let answered = blocking(move || match store.question(id)? {
        Some(q) if who.sees(&q.team) => store.settle_question(id, Some(&a.answer), &by, steppe_runtime::store::now_ms()),
        _ => Ok(false),
    })
    .await;
    match answered {
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(r) => r,
    }
}

#[derive(serde::Deserialize)]
struct Decision {
    #[serde(default)]
    csrf: String,
    decision: String,
    #[serde(default)]
    reason: String,
}

async fn decide(State(web): W, headers: HeaderMap, Path(id): Path<i64>, Form(d): Form<Decision>) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    if let Err(r) = web.check_post(&headers, &c, &d.csrf) {
        return r;
    }
    let approve = d.decision == "approve";
    let approver = if c.who.team.is_empty() { "web".to_string() } else { format!("web ({})", c.who.team) };
    let (store, who) = (web.store.clone(), c.who.clone());
    let decided = blocking(move || match store.approval(id)? {
        Some(a) if who.sees(&a.team) => store.decide_approval(id, approve, &d.reason, &approver),
        _ => Ok(false),
    })
    .await;
    match decided {
        Ok(_) => Redirect::to("/approvals").into_response(),
        Err(r) => r,
    }
}

async fn fleet(State(web): W, headers: HeaderMap) -> Response {
    let c = match web.caller(&headers) {
        Ok(c) => c,
        Err(r) => return r,
    };
    match &web.fleet {
        Some(f) => {
            let body = f.page().await;
            web.page(&c, "Fleet", &body)
        }
        None => (StatusCode::NOT_FOUND, "no fleet here: this dashboard shows one pipeline's store").into_response(),
    }
}

async fn login_form() -> Response {
    Html(html::page("Sign in", "", false, "", false, &pages::login(""))).into_response()
}

#[derive(serde::Deserialize)]
struct Login {
    token: String,
}

async fn login(State(web): W, Form(l): Form<Login>) -> Response {
    let Some(callers) = &web.callers else { return Redirect::to("/").into_response() };
    let Some(who) = steppe_runtime::auth::identify(callers, Some(l.token.trim())) else {
        return (StatusCode::UNAUTHORIZED, Html(html::page("Sign in", "", false, "", false, &pages::login("That token is not known here.")))).into_response();
    };
    if who.role == steppe_runtime::auth::Role::Worker {
        return (StatusCode::FORBIDDEN, Html(html::page("Sign in", "", false, "", false, &pages::login("A worker's token cannot sign in.")))).into_response();
    }
    let (Ok(id), Ok(csrf)) = (steppe_runtime::auth::new_token(), steppe_runtime::auth::new_token()) else {
        return (StatusCode::INTERNAL_SERVER_ERROR, "no randomness for a session").into_response();
    };
    if let Ok(mut s) = web.sessions.lock() {
        s.insert(id.clone(), (who, csrf));
    }
    ([(header::SET_COOKIE, format!("{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/"))], Redirect::to("/")).into_response()
}

#[derive(serde::Deserialize)]
struct Logout {
    #[serde(default)]
    csrf: String,
}

async fn logout(State(web): W, headers: HeaderMap, Form(l): Form<Logout>) -> Response {
    if let Ok(c) = web.caller(&headers) {
        if web.check_post(&headers, &c, &l.csrf).is_ok() {
            if let (Some(id), Ok(mut s)) = (cookie_of(&headers), web.sessions.lock()) {
                s.remove(&id);
            }
        }
    }
    ([(header::SET_COOKIE, format!("{COOKIE}=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0"))], Redirect::to("/login")).into_response()
}

fn router(web: Arc<Web>) -> Router {
    let security = |mut r: Response| {
        let h = r.headers_mut();
        h.insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
        h.insert(header::X_FRAME_OPTIONS, header::HeaderValue::from_static("DENY"));
        h.insert(header::CONTENT_SECURITY_POLICY, header::HeaderValue::from_static("default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"));
        h.insert(header::REFERRER_POLICY, header::HeaderValue::from_static("same-origin"));
        r
    };
    Router::new()
        .route("/", get(runs))
        .route("/runs/{id}", get(run))
        .route("/runs/{id}/live", get(live))
        .route("/runs/{id}/steps/{seq}", get(step))
        .route("/approvals", get(approvals))
        .route("/approvals/{id}", post(decide))
        .route("/questions/{id}", post(answer))
        .route("/fleet", get(fleet))
        .route("/login", get(login_form).post(login))
        .route("/logout", post(logout))
        .route("/static/app.css", get(|| async { ([(header::CONTENT_TYPE, "text/css")], html::CSS) }))
        .route("/static/app.js", get(|| async { ([(header::CONTENT_TYPE, "application/javascript")], html::JS) }))
        .layer(axum::middleware::map_response(move |r: Response| async move { security(r) }))
        .with_state(web)
}

/// Serves the dashboard on `addr` (port 0: any free one), from inside the
/// async runtime: the address it listens on.
pub fn serve(addr: std::net::SocketAddr, web: Arc<Web>) -> std::io::Result<std::net::SocketAddr> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let bound = listener.local_addr()?;
    let app = router(web);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}
