//! What ships with steppe: the `@builtin/` agent profiles, the built-in
//! resource types, the built-in tool names and the provider prefix table.

use crate::duration::Duration;
use crate::model::{AgentDef, ResourceType, ToolGrant, ToolSpec, TypeConfig, ExprConfig};

/// The built-in tools, in the order the format documents them.
pub const BUILTIN_TOOLS: &[&str] = &[
    "read_file",
    "list_dir",
    "search_files",
    "run_shell",
    "write_file",
    "edit_file",
    "web_fetch",
    "ask_user",
];

/// The grant of an agent that declares no `tools:`.
pub const DEFAULT_TOOLS: &[&str] = &["read_file", "list_dir", "search_files"];

/// Host variables every command run on a host sees (besides the names its
/// `env:` declares), when set on the worker; nothing else of the worker's
/// environment reaches it. The worker runs commands with it; docs/reference.md
/// lists it.
pub const HOST_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TERM", "TMPDIR", "TMP", "TEMP",
    "USER", "LOGNAME", "SHELL", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy",
    "no_proxy",
];

/// A provider prefix of `source.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Provider {
    pub prefix: &'static str,
    pub base_url: &'static str,
    pub key_env: Option<&'static str>,
    pub key_required: bool,
    pub string_tool_choice: bool,
}

pub const PROVIDERS: &[Provider] = &[
    Provider { prefix: "openai", base_url: "https://api.openai.com/v1/", key_env: Some("OPENAI_API_KEY"), key_required: true, string_tool_choice: false },
    Provider { prefix: "openrouter", base_url: "https://openrouter.ai/api/v1/", key_env: Some("OPENROUTER_API_KEY"), key_required: true, string_tool_choice: false },
    Provider { prefix: "groq", base_url: "https://api.groq.com/openai/v1/", key_env: Some("GROQ_API_KEY"), key_required: true, string_tool_choice: false },
    Provider { prefix: "together", base_url: "https://api.together.xyz/v1/", key_env: Some("TOGETHER_API_KEY"), key_required: true, string_tool_choice: false },
    Provider { prefix: "lmstudio", base_url: "http://localhost:1234/v1/", key_env: None, key_required: false, string_tool_choice: true },
    Provider { prefix: "ollama", base_url: "http://localhost:11434/v1/", key_env: None, key_required: false, string_tool_choice: true },
    Provider { prefix: "opencode", base_url: "https://opencode.ai/zen/go/v1/", key_env: Some("OPENCODE_API_KEY"), key_required: true, string_tool_choice: false },
    Provider { prefix: "anthropic", base_url: "https://api.anthropic.com/v1/", key_env: Some("ANTHROPIC_API_KEY"), key_required: true, string_tool_choice: false },
];

/// Coding-agent CLIs an `@cli/model` source may name.
pub const CLIS: &[&str] = &["claude"];

/// Splits `provider/model` on the first `/` and finds the provider.
pub fn provider_of(model: &str) -> Option<&'static Provider> {
    let (prefix, rest) = model.split_once('/')?;
    if rest.is_empty() {
        return None;
    }
    PROVIDERS.iter().find(|p| p.prefix == prefix)
}

pub const PROFILE_NAMES: &[&str] = &["explorer", "planner", "reviewer", "builder"];

/// The persona text of a built-in profile (`system_file: "@builtin/<name>"`).
pub fn profile_persona(name: &str) -> Option<&'static str> {
    Some(match name {
        "explorer" => "You are an explorer: you find one thing in a codebase or a set of files and answer in one message. Search before you read, read only what the search points at, and stop as soon as you can answer. Quote the file and line your answer rests on. If you cannot find it, say where you looked.",
        "planner" => "You are a planner: you read a codebase or a change in full, then write a plan about it. Read before you plan; delegate narrow lookups to your explorer. Your plan names files and functions, orders the work so each step can be checked, and says what could go wrong and how it would show.",
        "reviewer" => "You are a reviewer: you trace control flow, callers and error paths across files to decide whether a change is correct. Report only problems you can point at in the code, each with its file and line and why it is wrong. Say plainly when you found nothing worth changing.",
        "builder" => "You are a builder: you change code and prove it works. Read what you will change, make the smallest change that does the job, run the build and the tests, and fix what they report. Finish with what you changed and how you checked it.",
        _ => return None,
    })
}

fn names(tools: &[&str]) -> Vec<ToolGrant> {
    tools.iter().map(|t| ToolGrant::Name(t.to_string())).collect()
}

fn sub_agent(name: &str) -> ToolGrant {
    ToolGrant::Spec(Box::new(ToolSpec {
        agent: Some(name.to_string()),
        description: Some("Find something in the working directory; pass what to look for in `request`.".into()),
        ..Default::default()
    }))
}

/// The built-in profile `@builtin/<name>`: a persona, a grant and dials, no source.
pub fn profile(name: &str) -> Option<AgentDef> {
    let persona = profile_persona(name)?;
    let mut a = AgentDef {
        name: format!("@builtin/{name}"),
        system: Some(persona.to_string()),
        description: Some(persona.split(':').next().unwrap_or(name).to_string()),
        ..Default::default()
    };
    match name {
        "explorer" => {
            a.max_turns = Some(15);
            a.timeout = Some(Duration::from_secs(600));
            a.tools = Some(names(&["read_file", "list_dir", "search_files", "run_shell"]));
            a.description = Some("Finds one thing in the working directory and answers in one message.".into());
        }
        "planner" => {
            a.max_turns = Some(25);
            a.max_context_bytes = Some(400_000);
            a.temperature = Some(0.2);
            let mut t = names(&["read_file", "list_dir", "search_files"]);
            t.push(sub_agent("@builtin/explorer"));
            a.tools = Some(t);
            a.description = Some("Reads a codebase or a change in full and writes a plan.".into());
        }
        "reviewer" => {
            a.max_turns = Some(30);
            a.max_context_bytes = Some(400_000);
            a.temperature = Some(0.1);
            a.tools = Some(names(&["read_file", "list_dir", "search_files"]));
            a.description = Some("Reviews a change for correctness across files.".into());
        }
        "builder" => {
            a.max_turns = Some(50);
            a.max_context_bytes = Some(400_000);
            a.timeout = Some(Duration::from_secs(3600));
            let mut t = names(&["read_file", "list_dir", "run_shell", "write_file", "edit_file", "search_files"]);
            t.push(sub_agent("@builtin/explorer"));
            a.tools = Some(t);
            a.description = Some("Changes code, builds it and runs the tests.".into());
        }
        _ => return None,
    }
    Some(a)
}

/// Merges a user's `agents:` entry over a base definition (a profile or an
/// included document): every field the entry sets wins, `source` as a whole;
/// `privileged` is on if either says so.
pub fn merge_agent(base: AgentDef, over: AgentDef) -> AgentDef {
    macro_rules! pick {
        ($($f:ident),*) => { AgentDef { $($f: over.$f.or(base.$f),)* name: over.name, file: over.file,
            privileged: match (base.privileged, over.privileged) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (b, o) => o.or(b),
            },
        } };
    }
    pick!(source, fallback, budget, delegate_budget_percent, preflight, description, system,
          system_file, temperature, top_p, max_tokens, reasoning_effort, max_turns, timeout,
          attempts, compact_after_tokens, context_window, max_context_bytes, max_questions, tools,
          settings, image, env, user, network, container_limits)
}

pub const BUILTIN_RESOURCE_TYPES: &[&str] = &["git", "slack-mentions", "slack-reply"];

/// One key of a built-in resource type's `source:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceKey {
    pub key: &'static str,
    /// A resource of the type must set it.
    pub required: bool,
    /// What it means, with its default when it has one.
    pub description: &'static str,
}

/// A built-in resource type as the language documents it: what it does and
/// the keys its `source:` takes. Validation refuses any other key, and a
/// missing required one, on a resource of the (unshadowed) type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuiltinResourceType {
    pub name: &'static str,
    pub description: &'static str,
    pub source: &'static [SourceKey],
}

const SLACK_BASE_URL: SourceKey = SourceKey {
    key: "base_url",
    required: false,
    description: "The Slack Web API to call (default https://slack.com/api): a proxy's or a test server's address.",
};

const SLACK_TOKEN_ENV: SourceKey = SourceKey {
    key: "token_env",
    required: false,
    description: "The NAME of the environment variable holding the bot token (default SLACK_BOT_TOKEN, which the type's env: lists; another name must be listed in the resource's env:).",
};

/// Every built-in resource type, in the order of [`BUILTIN_RESOURCE_TYPES`].
pub const BUILTIN_RESOURCE_TYPE_DOCS: &[BuiltinResourceType] = &[
    BuiltinResourceType {
        name: "git",
        description: "A branch of a git repository. check: the branch's head commit (`[{\"ref\": sha}]`, an error when there is none); in: a shallow fetch of that commit, checked out. Get only (no out); the host's SSH_AUTH_SOCK reaches it.",
        source: &[
            SourceKey { key: "uri", required: true, description: "The repository: any URL or path `git ls-remote` and `git fetch` accept." },
            SourceKey { key: "branch", required: false, description: "The branch to follow (default: the remote's HEAD)." },
        ],
    },
    BuiltinResourceType {
        name: "slack-mentions",
        description: "Slack messages that mention the bot. check: the matches of a search for it, each version `{channel, ts, thread_ts}`; in: writes version.json and thread.json. Get only.",
        source: &[
            SourceKey { key: "channels", required: false, description: "The channel IDs to watch (default [], every channel and direct message). This build's check searches them all whatever it says." },
            SourceKey { key: "limit", required: false, description: "How many matches one check asks Slack for (default 200)." },
            SLACK_BASE_URL,
            SLACK_TOKEN_ENV,
        ],
    },
    BuiltinResourceType {
        name: "slack-reply",
        description: "A reply posted to Slack. out: posts answer/reply.md to the channel in thread/channel, in the thread of thread/ts when that file is there, and publishes `{channel, ts}`; a reply Slack refuses fails the put. Put only.",
        source: &[SLACK_BASE_URL, SLACK_TOKEN_ENV],
    },
];

/// The documented `source:` of the built-in resource type `name`.
pub fn resource_type_doc(name: &str) -> Option<&'static BuiltinResourceType> {
    BUILTIN_RESOURCE_TYPE_DOCS.iter().find(|t| t.name == name)
}

/// A built-in resource type, registered unless a user type shadows it.
pub fn resource_type(name: &str) -> Option<ResourceType> {
    let config = match name {
        "git" => TypeConfig {
            check: Some(
                r#"set -eu
ref=$(git ls-remote {{ .source.uri | shellquote }} {{ index .source "branch" | default "HEAD" | shellquote }} | awk 'NR==1 {print $1}')
[ -n "$ref" ] || { echo "git: no ref found for {{ .source.uri }}" >&2; exit 1; }
printf '[{"ref": "%s"}]' "$ref""#
                    .into(),
            ),
            in_: Some(
                r#"set -eu
git init -q .
git remote add origin {{ .source.uri | shellquote }}
if git fetch -q --depth 1 origin {{ .version.ref | shellquote }}; then
  git checkout -q FETCH_HEAD
else
  git fetch -q origin {{ index .source "branch" | default "HEAD" | shellquote }}
  git checkout -q {{ .version.ref | shellquote }}
fi"#
                .into(),
            ),
            ..Default::default()
        },
        "slack-mentions" => TypeConfig {
            expr: Some(ExprConfig {
                check: Some(r#"let base = source.base_url ?? "https://slack.com/api"; let r = http({url: base + "/search.messages", query: {query: "<@me>", count: string(source.limit ?? 200)}}, {headers: {Authorization: "Bearer " + env(source.token_env ?? "SLACK_BOT_TOKEN")}}); (r.json?.messages?.matches ?? []) | map(({channel: #.channel.id, ts: #.ts, thread_ts: #.thread_ts ?? #.ts}))"#.into()),
                in_: Some(r#"{"version.json": toJSON(version), "thread.json": toJSON(version)}"#.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        "slack-reply" => TypeConfig {
            expr: Some(ExprConfig {
                out: Some(r#"let base = source.base_url ?? "https://slack.com/api"; let ts = file("thread/ts", ""); let r = http({url: base + "/chat.postMessage", json: {channel: trim(file("thread/channel")), thread_ts: ts == "" ? nil : trim(ts), text: file("answer/reply.md")}}, {headers: {Authorization: "Bearer " + env(source.token_env ?? "SLACK_BOT_TOKEN")}}); r.json?.ok ? {channel: r.json.channel, ts: r.json.ts} : fail("slack: " + string(r.json?.error ?? r.status))"#.into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        _ => return None,
    };
    Some(ResourceType {
        name: name.to_string(),
        config: Some(config),
        env: Some(match name {
            "git" => vec!["SSH_AUTH_SOCK".into()],
            _ => vec!["SLACK_BOT_TOKEN".into()],
        }),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_prefixes() {
        assert_eq!(provider_of("openrouter/qwen/qwen3").map(|p| p.prefix), Some("openrouter"));
        assert!(provider_of("gpt-4o").is_none());
        assert!(provider_of("mystery/x").is_none());
        assert!(!provider_of("ollama/llama3").unwrap().key_required);
    }

    /// Every built-in type is documented, and the source keys its stages
    /// read are among its documented ones.
    #[test]
    fn every_builtin_type_documents_its_source() {
        let documented: Vec<&str> = BUILTIN_RESOURCE_TYPE_DOCS.iter().map(|t| t.name).collect();
        assert_eq!(documented, BUILTIN_RESOURCE_TYPES);
        for t in BUILTIN_RESOURCE_TYPE_DOCS {
            let config = resource_type(t.name).and_then(|r| r.config).unwrap_or_else(|| panic!("{} has no definition", t.name));
            let expr = config.expr.unwrap_or_default();
            let stages = [config.check, config.in_, config.out, expr.check, expr.in_, expr.out];
            for text in stages.iter().flatten() {
                // `.source.uri` (templates), `source.limit` (expr), `index .source "branch"`.
                for (marker, close) in [("source.", None), ("index .source \"", Some('"'))] {
                    for (i, _) in text.match_indices(marker) {
                        let rest = &text[i + marker.len()..];
                        let len = match close {
                            Some(c) => rest.find(c),
                            None => rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')),
                        };
                        let key = &rest[..len.unwrap_or(rest.len())];
                        assert!(t.source.iter().any(|k| k.key == key), "{} reads source.{key}, which its table does not list", t.name);
                    }
                }
            }
        }
    }

    #[test]
    fn profiles_carry_their_dials() {
        let b = profile("builder").unwrap();
        assert_eq!(b.max_turns, Some(50));
        assert_eq!(b.timeout, Some(Duration::from_secs(3600)));
        assert!(profile("nope").is_none());
        let merged = merge_agent(profile("reviewer").unwrap(), AgentDef {
            name: "@builtin/reviewer".into(),
            max_turns: Some(5),
            ..Default::default()
        });
        assert_eq!(merged.max_turns, Some(5));
        assert_eq!(merged.max_context_bytes, Some(400_000));
        assert!(merged.system.is_some());
    }
}
