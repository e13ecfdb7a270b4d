//! `steppe mcp list` and `steppe mcp tools`: a pipeline's MCP servers,
//! reached as a worker would reach them.

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
        }
    }
}

fn servers(pipeline: &Path, vars: &VarArgs) -> Result<std::result::Result<Vec<McpServer>, ExitCode>> {
    Ok(load_reporting(pipeline, &LoadOptions::from_env(vars.resolve()?)).map(|l| l.pipeline.mcp_servers.clone()))
}

/// Where a server is: its command line, or its endpoint and auth.
fn place(s: &McpServerWork) -> (&'static str, String) {
    match &s.endpoint {
        Some(e) => ("http", format!("{e}{}", s.bearer_env.as_ref().map(|v| format!(" (bearer ${v})")).unwrap_or_default())),
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
        let (transport, place, state) = match crate::engine::mcp_server_work(decl) {
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
    let work = crate::engine::mcp_server_work(decl).map_err(anyhow::Error::msg)?;
    for (name, description) in probe(&work, &dir_of(&a.pipeline)).map_err(anyhow::Error::msg)? {
        say!("{}", shown(&name));
        for line in description.lines().filter(|l| !l.trim().is_empty()) {
            say!("    {}", shown(line.trim()));
        }
    }
    Ok(ExitCode::SUCCESS)
}
