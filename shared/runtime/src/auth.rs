//! Bearer-token auth between steppe processes: the check every server puts in
//! front of its services, and the header every client adds.

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
}

impl Identity {
    /// A coordinator without teams: one token (or none) opens everything.
    pub fn admin() -> Self {
        Identity { team: String::new(), role: Role::Admin }
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
}

/// Told of every refused call (the peer's address).
pub type OnRefusal = Arc<dyn Fn(&str) + Send + Sync>;

/// Checks the bearer token on every call when the server has one, and puts
/// the caller's [`Identity`] on the request.
#[derive(Clone)]
pub struct TokenCheck {
    token: Option<Arc<String>>,
    on_refusal: OnRefusal,
}

impl TokenCheck {
    pub fn new(token: Option<String>, on_refusal: OnRefusal) -> Self {
        TokenCheck { token: token.map(Arc::new), on_refusal }
    }
}

impl tonic::service::Interceptor for TokenCheck {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let Some(want) = &self.token else {
            req.extensions_mut().insert(Identity::admin());
            return Ok(req);
        };
        let got = req.metadata().get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
        // In constant time: how much of a guess matched must not show in how long the refusal took.
        if got.is_some_and(|g| bool::from(subtle::ConstantTimeEq::ct_eq(g.as_bytes(), want.as_bytes()))) {
            req.extensions_mut().insert(Identity::admin());
            return Ok(req);
        }
        let peer = req.remote_addr().map(|a| a.to_string()).unwrap_or_else(|| "unknown".into());
        (self.on_refusal)(&peer);
        Err(Status::unauthenticated("a valid token is required (steppe … --token-file F)"))
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
        let mut check = TokenCheck::new(Some("s3cret".into()), Arc::new(move |_| {
            r.fetch_add(1, Ordering::SeqCst);
        }));
        let signed = |t: Option<&str>| WithToken::new(t).unwrap().call(Request::new(())).unwrap();
        assert!(check.call(signed(Some("s3cret"))).is_ok());
        for wrong in [Some("s3cre"), Some("s3cret2"), Some(""), None] {
            let err = check.call(signed(wrong)).expect_err("a wrong token passed");
            assert_eq!(err.code(), tonic::Code::Unauthenticated);
        }
        assert_eq!(refused.load(Ordering::SeqCst), 4, "every refusal is told");
        let mut open = TokenCheck::new(None, Arc::new(|_| {}));
        assert!(open.call(Request::new(())).is_ok(), "a server without a token lets calls through");
        assert!(WithToken::new(Some("line\nbreak")).is_err());
    }
}
