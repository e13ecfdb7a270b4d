//! Bearer-token auth between steppe processes: the check every server puts in
//! front of its services (a caller's token makes its [`Identity`]: a team
//! and a role), and the header every client adds.

mod file;

pub use file::{digest, hex, new_token, role_of, role_word, AuthFile, Entry};

use std::sync::Arc;

use tonic::metadata::{Ascii, MetadataValue};
use tonic::{Request, Status};

#[derive(Debug, thiserror::Error)]
#[error("the token holds characters a header cannot carry")]
pub struct BadToken;

/// Adds the bearer token to every outgoing call.
#[derive(Clone)]
pub struct WithToken(Option<MetadataValue<Ascii>>);

impl WithToken {
    pub fn new(token: Option<&str>) -> Result<Self, BadToken> {
        Ok(WithToken(match token {
            Some(t) => Some(format!("Bearer {t}").parse().map_err(|_| BadToken)?),
            None => None,
        }))
    }
}

impl tonic::service::Interceptor for WithToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(t) = &self.0 {
            req.metadata_mut().insert("authorization", t.clone());
        }
        Ok(req)
    }
}

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Submit runs and read, approve and cancel its team's.
    Submit,
    /// Serve assignments (a worker's session, its artifacts).
    Worker,
    /// Everything, every team.
    Admin,
}

/// Who a call comes from, as its token says; put on every request the
/// server lets through, for the services to ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub team: String,
    pub role: Role,
    /// The pools a worker token may serve (empty: any).
    pub pools: Vec<String>,
}

impl Identity {
    /// A coordinator without teams: one token (or none) opens everything.
    pub fn admin() -> Self {
        Identity { team: String::new(), role: Role::Admin, pools: Vec::new() }
    }

    /// The identity the server's check put on `req` (a request that went
    /// round the check has none and may do nothing).
    pub fn of<T>(req: &Request<T>) -> Option<&Identity> {
        req.extensions().get::<Identity>()
    }

    /// The team whose history it may see: `None` for an admin (every team).
    pub fn team_filter(&self) -> Option<&str> {
        (self.role != Role::Admin).then_some(self.team.as_str())
    }

    /// Whether it may see and act on history of `team`.
    pub fn sees(&self, team: &str) -> bool {
        self.role == Role::Admin || self.team == team
    }

    /// Whether a worker with this token may serve `pool` (owned by team `owner`, if any).
    pub fn may_serve(&self, pool: &str, owner: Option<&str>) -> Result<(), String> {
        if self.role == Role::Admin {
            return Ok(());
        }
        if !self.pools.is_empty() && !self.pools.iter().any(|p| p == pool) {
            return Err(format!("this worker token serves pool(s) {}, not {pool}", self.pools.join(", ")));
        }
        match owner {
            Some(o) if o != self.team => Err(format!("pool {pool} belongs to another team")),
            _ => Ok(()),
        }
    }

    /// Whether runs submitted with this token may go to `pool` (owned by team `owner`, if any).
    pub fn may_submit_to(&self, pool: &str, owner: Option<&str>) -> Result<(), String> {
        match owner {
            Some(o) if self.role != Role::Admin && o != self.team => Err(format!("pool {pool} is not your team's")),
            _ => Ok(()),
        }
    }
}

/// The team that owns `pool` among the callers (none for a shared pool).
pub fn pool_owner(callers: &Callers, pool: &str) -> Option<String> {
    let c = callers.read().unwrap_or_else(|p| p.into_inner());
    c.as_ref().and_then(|f| f.pool_owners().ok()).and_then(|m| m.get(pool).cloned())
}

/// Told of every refused call: the peer's address and why.
pub type OnRefusal = Arc<dyn Fn(&str, &str) + Send + Sync>;

/// Who may call, shared by every clone of the check so a reload (SIGHUP)
/// reaches them all: `None` lets every call in as an admin (a coordinator
/// without tokens).
pub type Callers = Arc<std::sync::RwLock<Option<AuthFile>>>;

/// Checks the bearer token on every call, and puts the caller's [`Identity`]
/// on the request for the services to ask.
#[derive(Clone)]
pub struct TokenCheck {
    callers: Callers,
    on_refusal: OnRefusal,
}

impl TokenCheck {
    /// One admin token (`--token-file`), or none: every call an admin.
    pub fn new(token: Option<String>, on_refusal: OnRefusal) -> Self {
        let callers = token.map(|t| AuthFile::default().with_admin_token(&t));
        TokenCheck { callers: Arc::new(std::sync::RwLock::new(callers)), on_refusal }
    }

    /// The callers of an `--auth` file (and the `--token-file` admin, if any).
    pub fn with_callers(callers: Callers, on_refusal: OnRefusal) -> Self {
        TokenCheck { callers, on_refusal }
    }
}

/// Who `token` is among `callers` (every caller an admin when there are no
/// tokens); None for an unknown token or none where one is needed.
pub fn identify(callers: &Callers, token: Option<&str>) -> Option<Identity> {
    let callers = callers.read().unwrap_or_else(|p| p.into_inner());
    match callers.as_ref() {
        None => Some(Identity::admin()),
        Some(file) => token.and_then(|g| file.lookup(g)).map(|e| Identity { pools: e.pools.clone(), ..e.identity.clone() }),
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let got = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::to_string);
        let identity = identify(&self.callers, got.as_deref());
        match identity {
            Some(id) => {
                req.extensions_mut().insert(id);
                Ok(req)
            }
            None => {
                let peer = req.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
                let why = if req.metadata().contains_key("authorization") { "an unknown token" } else { "no token" };
                (self.on_refusal)(&peer, why);
                Err(Status::unauthenticated(if why == "no token" {
                    "this coordinator requires a token: pass --token-file F (a file holding its --token-file token, or an entry of its --auth file; `steppe token new` makes one)"
                } else {
                    "the coordinator does not know this token: check --token-file (it must hold the coordinator's --token-file token or a token of its --auth file)"
                }))
            }
        }
    }
}

/// Refuses a caller whose role is not among `allowed`, saying what it would take.
pub fn require(who: Option<&Identity>, allowed: &[Role], what: &str) -> Result<Identity, Status> {
    match who {
        Some(id) if allowed.contains(&id.role) => Ok(id.clone()),
        Some(id) => {
            let need: Vec<&str> = allowed.iter().map(|r| role_word(*r)).collect();
            Err(Status::permission_denied(format!("a {} token cannot {what}; that takes a {} token", role_word(id.role), need.join(" or "))))
        }
        None => Err(Status::unauthenticated("a valid token is required")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tonic::service::Interceptor;

    #[test]
    fn only_the_right_token_passes() {
        let refused = Arc::new(AtomicUsize::new(0));
        let r = refused.clone();
        let mut check = TokenCheck::new(Some("s3cret".into()), Arc::new(move |_, _| {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        let signed = |t: Option<&str>| WithToken::new(t).unwrap().call(Request::new(())).unwrap();
        assert!(check.call(signed(Some("s3cret"))).is_ok());
        for wrong in [Some("s3cre"), Some("s3cret2"), Some(""), None] {
            let err = check.call(signed(wrong)).expect_err("a wrong token passed");
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
        }
        assert_eq!(refused.load(Ordering::SeqCst), 4, "every refusal is told");
        let mut open = TokenCheck::new(None, Arc::new(|_, _| {}));
        let through = open.call(Request::new(())).expect("a server without a token lets calls through");
        assert_eq!(Identity::of(&through), Some(&Identity::admin()));
        assert!(WithToken::new(Some("line\nbreak")).is_err());
    }

    #[test]
    fn a_token_becomes_its_entrys_identity_and_a_reload_takes_effect_at_once() {
        let file = |entries: &[(&str, &str, &str)]| {
            let text: String = entries.iter().map(|(team, role, token)| format!("- team: {team}\n  role: {role}\n  sha256: {}\n", hex(&digest(token)))).collect();
            AuthFile::parse(&text).unwrap()
        };
        let callers: Callers = Arc::new(std::sync::RwLock::new(Some(file(&[("blue", "submit", "b"), ("red", "worker", "r")]))));
        let mut check = TokenCheck::with_callers(callers.clone(), Arc::new(|_, _| {}));
        let signed = |t: &str| WithToken::new(Some(t)).unwrap().call(Request::new(())).unwrap();
        let blue = check.call(signed("b")).unwrap();
        assert_eq!(Identity::of(&blue).map(|i| (i.team.as_str(), i.role)), Some(("blue", Role::Submit)));
        assert!(require(Identity::of(&blue), &[Role::Worker], "serve assignments").unwrap_err().message().contains("a submit token cannot serve assignments"));
        // The red entry is removed: its token is refused from the next call on.
        *callers.write().unwrap() = Some(file(&[("blue", "submit", "b")]));
        assert_eq!(check.call(signed("r")).unwrap_err().code(), tonic::Code::Unauthenticated);
        assert!(check.call(signed("b")).is_ok());
    }
}
