//! Resource types (and their three backends), resources, container limits and MCP servers.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::Memory;

/// A resource type: how to check, fetch (`in`) and publish (`out`) a kind of resource.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceType {
    /// The type's name, which a resource's `type:` names; a type named like a
    /// built-in (`git`, `slack-mentions`, `slack-reply`) replaces it.
    pub name: String,
    /// Exactly one backend: shell `check`/`in`/`out`, `expr:`, or `mcp:`.
    pub config: Option<TypeConfig>,
    /// Run the shell stages in a container of this image instead of on the host (not with `expr:`).
    pub image: Option<String>,
    /// The user the stages' container runs as (`UID:GID` or a name the image
    /// knows; default: the invoking user's uid:gid).
    pub user: Option<String>,
    /// The stages' container network; `none` leaves only loopback. Needs `image:`.
    pub network: Option<String>,
    /// Run the stages' container privileged (default false). Needs `image:`.
    #[schemars(extend("default" = false))]
    pub privileged: Option<bool>,
    /// CPU share weight and memory limit of the stages' container. Needs `image:`.
    pub container_limits: Option<ContainerLimits>,
    /// NAMES of host environment variables the stages may read (never `NAME=value`).
    pub env: Option<Vec<String>>,
}

/// A resource type's backend: shell templates, `expr:` or `mcp:` (exactly one).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TypeConfig {
    /// Shell template printing a JSON array of versions, oldest first.
    pub check: Option<String>,
    /// Shell template that writes the fetched version into its working directory.
    #[serde(rename = "in")]
    pub in_: Option<String>,
    /// Shell template that publishes; may print one JSON object (the new version).
    pub out: Option<String>,
    /// A file (relative to the pipeline file) holding `check:`, read at load.
    pub check_file: Option<String>,
    /// A file (relative to the pipeline file) holding `in:`, read at load.
    pub in_file: Option<String>,
    /// A file (relative to the pipeline file) holding `out:`, read at load.
    pub out_file: Option<String>,
    /// In-process expression backend.
    pub expr: Option<ExprConfig>,
    /// MCP tool backend.
    pub mcp: Option<McpConfig>,
}

/// The `expr:` backend: stages written in the expression language, evaluated in-process.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExprConfig {
    /// Expression returning the versions, an array of objects, oldest first
    /// (sees `source` and `version`).
    pub check: Option<String>,
    /// Expression returning the files to write, `{path: text}` (sees `source`,
    /// `version` and `params`); without it only version.json is written.
    #[serde(rename = "in")]
    pub in_: Option<String>,
    /// Expression that publishes, returning the new version (an object) or nil
    /// (sees `source`, `params` and `file()`).
    pub out: Option<String>,
    /// A file (relative to the pipeline file) holding `check:`, read at load.
    pub check_file: Option<String>,
    /// A file (relative to the pipeline file) holding `in:`, read at load.
    pub in_file: Option<String>,
    /// A file (relative to the pipeline file) holding `out:`, read at load.
    pub out_file: Option<String>,
}

/// The `mcp:` backend: each stage a tool of an MCP server.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpConfig {
    /// The `mcp_servers:` entry whose tools serve the stages (required; its `cwd`, if any, absolute).
    pub server: Option<String>,
    /// The tool listing versions: an array of objects, oldest first.
    pub check: Option<McpStage>,
    /// The tool fetching a version; its results are written beside version.json.
    #[serde(rename = "in")]
    pub in_: Option<McpStage>,
    /// The tool publishing; an object it returns is the new version.
    pub out: Option<McpStage>,
}

/// One stage of an MCP-backed type.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpStage {
    /// The tool's name on the server (required).
    pub tool: Option<String>,
    /// Arguments sent instead of the default payload (`source`, or the put's
    /// `params`); string values are templates over `.source`, `.version`, `.params`.
    pub args: Option<Map<String, Value>>,
}

/// A resource: a named, configured instance of a resource type.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    /// The resource's name, unique; `get:` and `put:` steps name it.
    pub name: String,
    /// Its resource type: a `resource_types:` entry or a built-in (`git`,
    /// `slack-mentions`, `slack-reply`).
    #[serde(rename = "type")]
    pub type_: String,
    /// Free-form configuration handed to the type's stages as `.source`.
    #[schemars(example = serde_json::json!({"uri": "https://github.com/acme/app.git", "branch": "main"}))]
    pub source: Option<Value>,
    /// NAMES of host environment variables its stages may read, added to the
    /// type's `env:` (not on an MCP-backed type).
    pub env: Option<Vec<String>>,
    /// NAME of the environment variable holding the webhook token.
    pub webhook_token_env: Option<String>,
}

/// Resource limits of a container (at least one of the two).
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ContainerLimits {
    /// CPU share weight (1024 = docker's default).
    pub cpu: Option<i64>,
    /// Memory limit in bytes (or a size such as `512m`).
    pub memory: Option<Memory>,
}

/// An MCP server: a remote endpoint or a local stdio program.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The server's name, unique; grants (`mcp:`) and resource types (`mcp.server`) name it.
    pub name: String,
    /// Streamable HTTP endpoint, without credentials (exclusive with `command`).
    pub endpoint: Option<String>,
    /// A stdio server's program (argv, never a shell).
    pub command: Option<String>,
    /// Arguments of `command:` (argv).
    pub args: Option<Vec<String>>,
    /// Working directory of `command:`; a relative one resolves against the granting agent step's directory.
    pub cwd: Option<String>,
    /// How to authenticate to an `endpoint:` (omitted: none).
    pub auth: Option<McpAuth>,
    /// A Stepgate server of gated stepfiles, served by `steppe gate` on the
    /// worker that runs the granting step (exclusive with `endpoint` and `command`).
    pub stepgate: Option<StepgateServer>,
}

/// Stepfiles served to an agent step by `steppe gate` on its worker.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StepgateServer {
    /// The stepfiles (YAML or JSON), relative to the pipeline's directory.
    pub stepfiles: Vec<String>,
    /// NAMEs of the worker's environment variables the gate may read: its
    /// credentials (`<NAME>_API_KEY`) and settings. Nothing else is passed.
    pub env: Option<Vec<String>>,
}

/// How steppe authenticates to an MCP endpoint.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct McpAuth {
    /// `none` (default), `bearer` or `oauth`.
    #[serde(rename = "type")]
    #[schemars(extend("default" = "none"))]
    pub type_: Option<String>,
    /// bearer: the NAME of the environment variable holding the token (required).
    pub api_key_env: Option<String>,
    /// oauth: the client id.
    pub client_id: Option<String>,
    /// oauth: the NAME of the environment variable holding the client secret (needs `client_id`).
    pub client_secret_env: Option<String>,
    /// oauth: the loopback port of the login callback (1024–65535).
    pub callback_port: Option<i64>,
    /// oauth: the scopes asked for.
    pub scopes: Option<Vec<String>>,
}
