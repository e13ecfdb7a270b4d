//! `steppe mcp list`, `steppe mcp tools` and `steppe mcp login`: a
//! pipeline's MCP servers, reached as a worker would reach them, and the
//! OAuth sign-in of those that need one.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use steppe_language::model::McpServer;
use steppe_language::LoadOptions;
use steppe_runtime::agent_work::{McpServerWork, ToolDef};
use steppe_worker::tools::mcp::McpSessions;

use super::args::VarArgs;
use super::{load_reporting, runtime};
use crate::text::shown;

/// Inspect the MCP servers a pipeline declares.
#[derive(Args, Debug)]
pub struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Subcommand, Debug)]
enum McpCommand {
    List(ListArgs),
    Tools(ToolsArgs),
    Login(LoginArgs),
}

/// Sign in to an MCP server declared with `auth: {type: oauth}`.
///
/// OAuth 2.1 with PKCE: the server's authorization server is discovered from
/// its endpoint, steppe registers itself as a client (or uses the declared
/// client_id, with the secret from client_secret_env), prints the URL to open
/// in a browser and waits on 127.0.0.1 (callback_port, or any free port) for
/// the redirect back. The tokens are kept in
/// ${XDG_CONFIG_HOME:-~/.config}/steppe/mcp/SERVER.json (mode 0600) on this
/// machine; a step granted the server's tools uses them, refreshing the
/// access token silently when it has expired. Sign in on every machine that
/// runs such steps (a worker's user).
///
/// Examples:
///   steppe mcp login ci.yml tracker
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
struct LoginArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// The server's name in mcp_servers:.
    server: String,
    /// Do not try to open a browser; only print the URL.
    #[arg(long)]
    no_browser: bool,
    #[command(flatten)]
    vars: VarArgs,
}

/// List a pipeline's MCP servers, each probed (started or reached, its
/// tools listed) as a worker on this machine would.
///
/// Exits 0 whether or not the servers answer: the STATE column says.
///
/// Examples:
///   steppe mcp list ci.yml
///   steppe mcp list ci.yml --offline
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
struct ListArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// List the servers without starting or reaching any.
    #[arg(long)]
    offline: bool,
    #[command(flatten)]
    vars: VarArgs,
}

/// List the tools one MCP server offers: the names agents are granted them
/// by (`server__tool`) and their descriptions.
///
/// Examples:
///   steppe mcp tools ci.yml tracker
#[derive(Args, Debug)]
#[command(verbatim_doc_comment)]
struct ToolsArgs {
    /// The pipeline file.
    pipeline: PathBuf,
    /// The server's name in mcp_servers:.
    server: String,
    #[command(flatten)]
    vars: VarArgs,
}

impl McpArgs {
    pub fn run(self) -> Result<ExitCode> {
        match self.command {
            McpCommand::List(a) => list(a),
            McpCommand::Tools(a) => tools(a),
            McpCommand::Login(a) => login(a),
        }
    }
}

fn servers(pipeline: &Path, vars: &VarArgs) -> Result<std::result::Result<Vec<McpServer>, ExitCode>> {
    Ok(load_reporting(pipeline, &LoadOptions::from_env(vars.resolve()?)).map(|l| l.pipeline.mcp_servers.clone()))
}

/// Where a server is: its command line, or its endpoint and auth.
fn place(s: &McpServerWork) -> (&'static str, String) {
    match &s.endpoint {
        Some(e) => ("http", format!("{e}{}{}", s.bearer_env.as_ref().map(|v| format!(" (bearer ${v})")).unwrap_or_default(), if s.oauth { " (oauth)" } else { "" })),
        None if !s.stepfiles.is_empty() => ("stepgate", s.stepfiles.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(" ")),
        None => ("stdio", s.command.join(" ")),
    }
}

/// Starts or reaches `server` from `dir`, lists its tools (name as granted,
/// description) and closes it again.
fn probe(server: &McpServerWork, dir: &Path) -> Result<Vec<(String, String)>, String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    let all = ToolDef::Mcp { server: server.name.clone(), tool: None, tools: Vec::new(), description: None, required: false, max_calls: 0, max_output_bytes: None, timeout_ms: None };
    rt.block_on(async {
        let sessions = McpSessions::open(std::slice::from_ref(server), &[&all], dir).await.map_err(|e| steppe_runtime::causes::of(&e))?;
        let tools = sessions.tools.iter().map(|t| (t.name.clone(), t.description.clone())).collect();
        sessions.close().await;
        Ok(tools)
    })
}

fn dir_of(pipeline: &Path) -> PathBuf {
    pipeline.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")).to_path_buf()
}

fn list(a: ListArgs) -> Result<ExitCode> {
    let declared = match servers(&a.pipeline, &a.vars)? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    if declared.is_empty() {
        say!("no MCP servers in {}", a.pipeline.display());
        return Ok(ExitCode::SUCCESS);
    }
    let dir = dir_of(&a.pipeline);
    say!("{:<20} {:<9} {:<50} STATE", "SERVER", "TRANSPORT", "WHERE");
    for decl in &declared {
        let (transport, place, state) = match crate::engine::mcp_server_work(decl, &dir) {
            Err(e) => ("-", String::new(), format!("unusable: {e}")),
            Ok(w) => {
                let (t, p) = place(&w);
                let state = if a.offline {
                    "not probed (--offline)".to_string()
                } else {
                    match probe(&w, &dir) {
                        Ok(tools) => format!("ok: {} tool(s)", tools.len()),
                        Err(e) => format!("unreachable: {e}"),
                    }
                };
                (t, p, state)
            }
        };
        say!("{:<20} {:<9} {:<50} {}", shown(&decl.name), transport, shown(&place), shown(&state));
    }
    Ok(ExitCode::SUCCESS)
}

fn tools(a: ToolsArgs) -> Result<ExitCode> {
    let declared = match servers(&a.pipeline, &a.vars)? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let names: Vec<&str> = declared.iter().map(|s| s.name.as_str()).collect();
    let decl = declared.iter().find(|s| s.name == a.server).with_context(|| format!("no MCP server \"{}\" in {} (it declares: {})", a.server, a.pipeline.display(), if names.is_empty() { "none".into() } else { names.join(", ") }))?;
    let work = crate::engine::mcp_server_work(decl, &dir_of(&a.pipeline)).map_err(anyhow::Error::msg)?;
    for (name, description) in probe(&work, &dir_of(&a.pipeline)).map_err(anyhow::Error::msg)? {
        say!("{}", shown(&name));
        for line in description.lines().filter(|l| !l.trim().is_empty()) {
            say!("    {}", shown(line.trim()));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn login(a: LoginArgs) -> Result<ExitCode> {
    let servers = match servers(&a.pipeline, &a.vars)? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let names: Vec<&str> = servers.iter().map(|s| s.name.as_str()).collect();
    let Some(decl) = servers.iter().find(|s| s.name == a.server) else {
        anyhow::bail!("no MCP server {:?} in {} (it declares: {})", a.server, a.pipeline.display(), names.join(", "));
    };
    let auth = decl.auth.clone().unwrap_or_default();
    if auth.type_.as_deref() != Some("oauth") {
        anyhow::bail!("MCP server {:?} does not sign in with OAuth (its auth is {}); only auth: {{type: oauth}} servers need steppe mcp login", a.server, auth.type_.as_deref().unwrap_or("none"));
    }
    let endpoint = decl.endpoint.clone().context("an OAuth server needs an endpoint:")?;
    let client_secret = match &auth.client_secret_env {
        Some(var) => Some(std::env::var(var).ok().filter(|v| !v.is_empty()).with_context(|| format!("client_secret_env names {var}, which is not set here"))?),
        None => None,
    };
    let spec = steppe_worker::tools::mcp_oauth::LoginSpec {
        server: a.server.clone(),
        endpoint,
        client_id: auth.client_id.clone(),
        client_secret,
        callback_port: auth.callback_port.and_then(|p| u16::try_from(p).ok()).unwrap_or(0),
        scopes: auth.scopes.clone().unwrap_or_default(),
    };
    let no_browser = a.no_browser;
    let show = move |url: &str| {
        eprintln!("Open this URL in a browser to sign in to {}:\n\n  {url}\n\nWaiting for the sign-in to come back…", spec_name(url));
        println!("{url}");
        if !no_browser && (std::env::var_os("DISPLAY").is_some() || std::env::var_os("WAYLAND_DISPLAY").is_some() || std::env::var_os("BROWSER").is_some()) {
            let opener = std::env::var("BROWSER").unwrap_or_else(|_| "xdg-open".into());
            let _ = std::process::Command::new(opener).arg(url).stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn();
        }
    };
    let path = runtime()?.block_on(steppe_worker::tools::mcp_oauth::login(&spec, &show)).map_err(|e| anyhow::anyhow!("signing in to MCP server {:?}: {e}", a.server))?;
    say!("signed in to {}: credentials in {}", a.server, path.display());
    Ok(ExitCode::SUCCESS)
}

/// The host a sign-in URL goes to, for the prompt.
fn spec_name(url: &str) -> String {
    url.split("://").nth(1).and_then(|r| r.split('/').next()).unwrap_or(url).to_string()
}
