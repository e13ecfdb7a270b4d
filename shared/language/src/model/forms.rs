//! Keys that may be written in more than one shape (`fix: agent` or
//! `fix: {agent: …}`), with their decoders and schemas.

use std::borrow::Cow;
use std::fmt;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use super::{FixSpec, InParallelSpec, RaceSpec, Step, ToolSpec};
use crate::de::{scalar_or_map, seq_or_map};

/// A user message of an agent step: text known at load, or a file inside an
/// input artifact read at run time.
#[derive(Debug, Clone, PartialEq)]
pub enum Message {
    Text(String),
    Artifact { artifact: String, path: String },
}

/// `when: CMD` or `when: {run: CMD}`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct When {
    pub run: String,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WhenMap {
    /// The guard command, run with `sh -c` among the step's inputs.
    run: String,
}

impl<'de> Deserialize<'de> for When {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar_or_map(d, "a command or {run: command}", |run| When { run }, |m: WhenMap| When {
            run: m.run,
        })
    }
}

impl JsonSchema for When {
    fn schema_name() -> Cow<'static, str> {
        "When".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A guard command run before the step: exit 0 runs the step, anything else skips it.",
            "anyOf": [{"type": "string"}, g.subschema_for::<WhenMap>()]
        })
    }
}

/// `fix: AGENT` or the mapping form with per-task overrides.
#[derive(Debug, Clone)]
pub enum Fix {
    Agent(String),
    Spec(Box<FixSpec>),
}

impl Fix {
    pub fn agent(&self) -> Option<&str> {
        match self {
            Fix::Agent(a) => Some(a),
            Fix::Spec(s) => s.agent.as_deref(),
        }
    }
    pub fn spec(&self) -> Option<&FixSpec> {
        match self {
            Fix::Agent(_) => None,
            Fix::Spec(s) => Some(s),
        }
    }
}

impl<'de> Deserialize<'de> for Fix {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar_or_map(d, "an agent name or a fix mapping", Fix::Agent, |m: FixSpec| {
            Fix::Spec(Box::new(m))
        })
    }
}

impl JsonSchema for Fix {
    fn schema_name() -> Cow<'static, str> {
        "Fix".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "An agent that repairs the task when it misses its success criteria.",
            "anyOf": [{"type": "string"}, g.subschema_for::<FixSpec>()]
        })
    }
}

/// A file named in the pipeline: a path relative to the pipeline file (read
/// at load), or `{artifact, path}` inside an input artifact (read at run time).
#[derive(Debug, Clone, PartialEq)]
pub enum FileRef {
    Path(String),
    Artifact { artifact: String, path: String },
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ArtifactFile {
    /// An input artifact of the step.
    artifact: String,
    /// The file's path inside the artifact.
    path: String,
}

impl<'de> Deserialize<'de> for FileRef {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar_or_map(d, "a path or {artifact, path}", FileRef::Path, |m: ArtifactFile| {
            FileRef::Artifact {
                artifact: m.artifact,
                path: m.path,
            }
        })
    }
}

impl JsonSchema for FileRef {
    fn schema_name() -> Cow<'static, str> {
        "FileRef".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A path relative to the pipeline file (read at load), or {artifact, path} inside an input artifact (read at run time).",
            "anyOf": [{"type": "string"}, g.subschema_for::<ArtifactFile>()]
        })
    }
}

/// One entry of a `tools:` grant: a bare built-in name, or a mapping.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolGrant {
    Name(String),
    Spec(Box<ToolSpec>),
}

impl<'de> Deserialize<'de> for ToolGrant {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        scalar_or_map(d, "a tool name or a tool mapping", ToolGrant::Name, |m: ToolSpec| {
            ToolGrant::Spec(Box::new(m))
        })
    }
}

impl JsonSchema for ToolGrant {
    fn schema_name() -> Cow<'static, str> {
        "ToolGrant".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A tool: a name, or a mapping granting a built-in, a custom tool, a sub-agent or MCP tools.",
            "anyOf": [
                {"type": "string", "description": "A built-in tool (or, on a step, any tool the agent grants)."},
                g.subschema_for::<ToolSpec>()
            ]
        })
    }
}

/// One verdict: `approve` (falls through) or `revise: draft` (routes).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub name: String,
    pub target: Option<String>,
}

impl<'de> Deserialize<'de> for Verdict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Verdict;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a verdict name or {name: target}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Verdict, E> {
                Ok(Verdict { name: v.to_string(), target: None })
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Verdict, A::Error> {
                let Some((name, target)) = m.next_entry::<String, Option<String>>()? else {
                    return Err(de::Error::custom("a verdict mapping needs one entry: {name: target}"));
                };
                if m.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom(
                        "a verdict mapping has exactly one entry: {name: target}; write one list item per verdict",
                    ));
                }
                Ok(Verdict { name, target })
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Verdict {
    fn schema_name() -> Cow<'static, str> {
        "Verdict".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A verdict: NAME (falls through to the next step) or {NAME: STEP} (routes there).",
            "anyOf": [
                {"type": "string"},
                {"type": "object", "minProperties": 1, "maxProperties": 1,
                 "additionalProperties": {"type": "string"}}
            ]
        })
    }
}

/// `version:` on a get: `latest` (default), `every`, or a pin (field subset).
#[derive(Debug, Clone, PartialEq)]
pub enum VersionSpec {
    Latest,
    Every,
    Pinned(Map<String, Value>),
    /// Any other word; reported by the validator.
    Other(String),
}

impl<'de> Deserialize<'de> for VersionSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = VersionSpec;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("latest, every, or a mapping of version fields")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<VersionSpec, E> {
                Ok(match v {
                    "latest" => VersionSpec::Latest,
                    "every" => VersionSpec::Every,
                    other => VersionSpec::Other(other.to_string()),
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, m: A) -> Result<VersionSpec, A::Error> {
                let map = Map::deserialize(de::value::MapAccessDeserializer::new(m))?;
                Ok(VersionSpec::Pinned(map))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for VersionSpec {
    fn schema_name() -> Cow<'static, str> {
        "VersionSpec".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "latest, every, or a mapping of version fields (a pin).",
            "anyOf": [{"enum": ["latest", "every"]}, {"type": "object"}]
        })
    }
}

/// `inputs:` — artifact names, or `all` (put steps only).
#[derive(Debug, Clone, PartialEq)]
pub enum Inputs {
    Names(Vec<String>),
    All,
    /// A word other than `all`; reported by the validator.
    Other(String),
}

impl<'de> Deserialize<'de> for Inputs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Inputs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of artifact names, or all")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Inputs, E> {
                Ok(if v == "all" { Inputs::All } else { Inputs::Other(v.to_string()) })
            }
            fn visit_unit<E: de::Error>(self) -> Result<Inputs, E> {
                Ok(Inputs::Names(Vec::new()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, s: A) -> Result<Inputs, A::Error> {
                Ok(Inputs::Names(Vec::deserialize(de::value::SeqAccessDeserializer::new(s))?))
            }
        }
        d.deserialize_any(V)
    }
}

impl JsonSchema for Inputs {
    fn schema_name() -> Cow<'static, str> {
        "Inputs".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Artifact names, or all (put steps: every artifact produced so far).",
            "anyOf": [{"type": "array", "items": {"type": "string"}}, {"const": "all"}]
        })
    }
}

/// `in_parallel:` — a list of steps, or `{steps, limit, fail_fast}`.
#[derive(Debug, Clone, Default)]
pub struct InParallel {
    pub steps: Vec<Step>,
    pub limit: Option<i64>,
    pub fail_fast: Option<bool>,
    /// Written as a bare list (paths then read `in_parallel[i]`).
    pub list_form: bool,
}

impl InParallel {
    pub fn step_path(&self, i: usize) -> String {
        if self.list_form {
            format!("in_parallel[{i}]")
        } else {
            format!("in_parallel.steps[{i}]")
        }
    }
}

impl<'de> Deserialize<'de> for InParallel {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        seq_or_map(
            d,
            "a list of steps or {steps, limit, fail_fast}",
            |steps| InParallel { steps, list_form: true, ..Default::default() },
            |m: InParallelSpec| InParallel {
                steps: m.steps,
                limit: m.limit,
                fail_fast: m.fail_fast,
                list_form: false,
            },
        )
    }
}

impl JsonSchema for InParallel {
    fn schema_name() -> Cow<'static, str> {
        "InParallel".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "The branches as a list of steps, or {steps, limit, fail_fast}.",
            "anyOf": [g.subschema_for::<InParallelSpec>(), g.subschema_for::<Vec<Step>>()]
        })
    }
}

/// `race:` — `{steps}` (or a bare list): the first branch to succeed wins.
#[derive(Debug, Clone, Default)]
pub struct Race {
    pub steps: Vec<Step>,
    pub list_form: bool,
}

impl Race {
    pub fn step_path(&self, i: usize) -> String {
        if self.list_form {
            format!("race[{i}]")
        } else {
            format!("race.steps[{i}]")
        }
    }
}

impl<'de> Deserialize<'de> for Race {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        seq_or_map(
            d,
            "{steps: [...]}",
            |steps| Race { steps, list_form: true },
            |m: RaceSpec| Race { steps: m.steps, list_form: false },
        )
    }
}

impl JsonSchema for Race {
    fn schema_name() -> Cow<'static, str> {
        "Race".into()
    }
    fn json_schema(g: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "The branches as {steps}, or a bare list of steps.",
            "anyOf": [g.subschema_for::<RaceSpec>(), g.subschema_for::<Vec<Step>>()]
        })
    }
}

/// A memory limit: bytes, or a size with a unit (`512m`, `2g`).
#[derive(Debug, Clone, PartialEq)]
pub struct Memory(pub String);

impl Memory {
    /// The limit in bytes, when the text is a valid size.
    pub fn bytes(&self) -> Option<u64> {
        let t = self.0.trim().to_ascii_lowercase();
        let t = t.strip_suffix('b').unwrap_or(&t);
        let (num, mult) = match t.chars().last()? {
            'k' => (&t[..t.len() - 1], 1u64 << 10),
            'm' => (&t[..t.len() - 1], 1 << 20),
            'g' => (&t[..t.len() - 1], 1 << 30),
            't' => (&t[..t.len() - 1], 1 << 40),
            _ => (t, 1),
        };
        num.trim().parse::<u64>().ok().map(|n| n.saturating_mul(mult))
    }
}

impl<'de> Deserialize<'de> for Memory {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match v {
            Value::Number(n) => Ok(Memory(n.to_string())),
            Value::String(s) => Ok(Memory(s)),
            other => Err(de::Error::custom(format!(
                "memory must be a number of bytes or a size like 512m, not {other}"
            ))),
        }
    }
}

impl JsonSchema for Memory {
    fn schema_name() -> Cow<'static, str> {
        "Memory".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"type": ["integer", "string"], "description": "Bytes, or a size such as 512m."})
    }
}
