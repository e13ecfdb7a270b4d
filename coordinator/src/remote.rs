//! A coordinator as the client commands reach it (`--coordinator URL
//! [--token-file F] [--tls-ca F]`).

use std::path::{Path, PathBuf};

use steppe_runtime::auth::WithToken;
use tonic::Status;

pub fn read_token(file: Option<&Path>) -> anyhow::Result<Option<String>> {
    file.map(|f| steppe_runtime::secrets::read_file(f, "--token-file")).transpose().map_err(anyhow::Error::msg)
}

/// A coordinator as the client commands reach it (`--coordinator URL
/// [--token-file F] [--tls-ca F]`).
#[derive(Clone)]
pub struct Remote {
    pub url: String,
    pub token: Option<String>,
    pub tls_ca: Option<PathBuf>,
}

impl Remote {
    pub fn new(url: &str, token_file: Option<&Path>, tls_ca: Option<&Path>) -> anyhow::Result<Remote> {
        check_url(url)?;
        Ok(Remote { url: url.to_string(), token: read_token(token_file)?, tls_ca: tls_ca.map(Path::to_path_buf) })
    }

    pub async fn channel(&self) -> anyhow::Result<tonic::transport::Channel> {
        Ok(steppe_worker::remote::connect(&self.url, self.tls_ca.as_deref()).await?)
    }

    pub fn bearer(&self) -> anyhow::Result<WithToken> {
        Ok(WithToken::new(self.token.as_deref())?)
    }

    /// What to try when a call failed the way a TLS mismatch fails.
    pub fn hint(&self, s: &Status) -> &'static str {
        // A plain-http client talking to a TLS server fails below gRPC, in
        // one of these ways depending on timing.
        let transport = matches!(s.code(), tonic::Code::Cancelled | tonic::Code::Unknown | tonic::Code::Unavailable | tonic::Code::Internal)
            && (s.message().contains("transport error") || s.message().contains("h2 protocol error") || s.code() == tonic::Code::Cancelled);
        if self.url.starts_with("http://") && transport {
            " (does the coordinator serve TLS? then use an https:// URL)"
        } else {
            ""
        }
    }
}

/// A coordinator's URL names its scheme; without one, says which to add.
pub fn check_url(url: &str) -> anyhow::Result<()> {
    if !url.contains("://") {
        anyhow::bail!("--coordinator {url}: a coordinator's URL starts with its scheme: http://{url} (or https://{url} when it serves TLS)");
    }
    Ok(())
}
