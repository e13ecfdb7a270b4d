//! `web_fetch`: an HTTP GET to an allowed host (or any, when the grant names none), refused before connecting otherwise.

use super::*;

pub(super) fn host_allowed(host: &str, allow: &[String]) -> bool {
    let h = host.to_ascii_lowercase();
    allow.is_empty() || allow.iter().any(|a| {
        let a = a.to_ascii_lowercase();
        h == a || h.ends_with(&format!(".{a}"))
    })
}

/// Fetches a URL whose host (and every redirect's) is in the allow list; a
/// refused host is named in the tool's answer and recorded as a denial.
pub(super) async fn web_fetch(args: &Value, allow: &[String], denials: &mut Vec<DenialRecord>) -> Value {
    let Some(url) = arg_str(args, "url") else { return error("web_fetch: missing required argument \"url\"") };
    let Ok(parsed) = reqwest::Url::parse(url) else { return error(format!("web_fetch: {url:?} is not a URL")) };
    if !matches!(parsed.scheme(), "http" | "https") {
        return error("web_fetch: only http:// and https:// URLs can be fetched");
    }
    let shown = steppe_runtime::secrets::mask_urls(url).into_owned();
    let mut refuse = |host: &str, how: String| {
        let reason = format!("{how} \"{host}\", which is not in this tool's allow: list ({})", allow.join(", "));
        denials.push(DenialRecord { tool: "web_fetch".into(), path: shown.clone(), reason: reason.clone() });
        error(format!("web_fetch: {reason}"))
    };
    let host = parsed.host_str().unwrap_or_default().to_string();
    if !host_allowed(&host, allow) {
        return refuse(&host, "host".into());
    }
    let allow_owned = allow.to_vec();
    let refused_redirect = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen = refused_redirect.clone();
    let policy = reqwest::redirect::Policy::custom(move |attempt| {
        if attempt.previous().len() >= 10 {
            return attempt.error("too many redirects");
        }
        let h = attempt.url().host_str().unwrap_or_default().to_string();
        if host_allowed(&h, &allow_owned) {
            attempt.follow()
        } else {
            if let Ok(mut s) = seen.lock() {
                *s = Some(h.clone());
            }
            attempt.error(format!("redirect to host \"{h}\", which is not in this tool's allow: list"))
        }
    });
    let client = match reqwest::Client::builder().redirect(policy).timeout(Duration::from_secs(30)).build() {
        Ok(c) => c,
        Err(e) => return error(format!("web_fetch: {e}")),
    };
    match client.get(parsed).send().await {
        Ok(resp) => {
            let status = resp.status().as_u16();
            let ctype = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
            let bytes = resp.bytes().await.unwrap_or_default();
            let truncated = bytes.len() > READ_CAP;
            let body = String::from_utf8_lossy(&bytes[..bytes.len().min(READ_CAP)]).into_owned();
            json!({"status": status, "content_type": ctype, "body": body, "truncated": truncated})
        }
        Err(e) => match refused_redirect.lock().ok().and_then(|s| s.clone()) {
            Some(h) => refuse(&h, format!("{host} redirected to host")),
            None => error(format!("web_fetch: {}", steppe_runtime::secrets::mask_urls(&e.to_string()))),
        },
    }
}
