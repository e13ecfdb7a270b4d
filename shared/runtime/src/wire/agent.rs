//! Agent work and its outcome ↔ the `steppe.v1` messages of agent.proto.

use steppe_proto::v1;

use super::json::{json_from_wire, json_to_wire, object_to_wire};
use super::WireError;
use crate::agent_work::{AgentAssert, AgentMessage, AgentOutcome, AgentWork, AskSpec, CliWork, ContainerSettings, DenialRecord, Endpoint, McpServerWork, SubAgent, ToolDef, TrajectoryEntry, TranscriptEvent, Usage};

pub fn work_to_wire(w: &AgentWork) -> v1::AgentWork {
    // Taken apart whole: a field added to AgentWork cannot be forgotten here.
    let AgentWork {
        agent,
        model,
        base_url,
        api_key_env,
        key_required,
        string_tool_choice,
        persona,
        messages,
        dir,
        tools,
        verdicts,
        note_required,
        max_turns,
        attempts,
        timeout_ms,
        temperature,
        top_p,
        max_tokens,
        reasoning_effort,
        context_paths,
        max_context_bytes,
        budget_tokens,
        job_budget,
        job_counter,
        across_counter,
        assert,
        upstream,
        sub_agents,
        fallbacks,
        image,
        container,
        env,
        answers,
        max_questions,
        ask,
        mcp_servers,
        compact_budget,
        delegate_percent,
        session,
        cli,
    } = w;
    v1::AgentWork {
        cli: cli.as_ref().map(|c| v1::CliWork { program: c.program.clone(), model: c.model.clone(), project_settings: c.project_settings, budget_usd: c.budget_usd }),
        agent: agent.clone(),
        model: model.clone(),
        base_url: base_url.clone(),
        api_key_env: api_key_env.clone(),
        key_required: *key_required,
        string_tool_choice: *string_tool_choice,
        persona: persona.clone(),
        messages: messages.iter().map(message_to_wire).collect(),
        dir: dir.clone(),
        tools: tools.iter().map(tool_to_wire).collect(),
        verdicts: verdicts.clone(),
        note_required: *note_required,
        max_turns: *max_turns,
        attempts: *attempts,
        timeout_ms: *timeout_ms,
        temperature: *temperature,
        top_p: *top_p,
        max_tokens: *max_tokens,
        reasoning_effort: reasoning_effort.clone(),
        context_paths: context_paths.clone(),
        max_context_bytes: *max_context_bytes,
        budget_tokens: *budget_tokens,
        job_budget: job_budget.map(|(cap, spent)| v1::JobBudget { cap, spent, counter: job_counter.clone().unwrap_or_default() }),
        across_counter: across_counter.clone().unwrap_or_default(),
        assert: Some(assert_to_wire(assert)),
        upstream: upstream.iter().map(|(sender, text)| v1::Delivery { sender: sender.clone(), text: text.clone() }).collect(),
        sub_agents: sub_agents.iter().map(sub_agent_to_wire).collect(),
        fallbacks: fallbacks.iter().map(endpoint_to_wire).collect(),
        answers: answers.iter().map(|(m, a)| v1::Answer { r#match: m.clone(), answer: a.clone() }).collect(),
        max_questions: *max_questions,
        ask: ask.as_deref().map(|a| {
            let answered_by = a.answered_by.as_ref().map(|s| Box::new(sub_agent_to_wire(s)));
            Box::new(v1::AskSpec { answered_by, default: a.default.clone(), options_required: a.options_required, inline: a.inline, timeout_ms: a.timeout_ms, park: a.park, answer_with: a.answer_with.clone() })
        }),
        image: image.clone(),
        container: Some(container_to_wire(container)),
        env: env.clone(),
        mcp_servers: mcp_servers.iter().map(mcp_server_to_wire).collect(),
        compact_budget: *compact_budget,
        delegate_percent: *delegate_percent,
        session: session.clone(),
    }
}

pub fn work_from_wire(w: v1::AgentWork) -> Result<AgentWork, WireError> {
    let v1::AgentWork {
        agent,
        model,
        base_url,
        api_key_env,
        key_required,
        string_tool_choice,
        persona,
        messages,
        dir,
        tools,
        verdicts,
        note_required,
        max_turns,
        attempts,
        timeout_ms,
        temperature,
        top_p,
        max_tokens,
        reasoning_effort,
        context_paths,
        max_context_bytes,
        budget_tokens,
        job_budget,
        assert,
        upstream,
        sub_agents,
        fallbacks,
        answers,
        max_questions,
        ask,
        across_counter,
        image,
        container,
        env,
        mcp_servers,
        compact_budget,
        delegate_percent,
        session,
        cli,
    } = w;
    let job_counter = job_budget.as_ref().map(|b| b.counter.clone()).filter(|c| !c.is_empty());
    Ok(AgentWork {
        agent,
        model,
        base_url,
        api_key_env,
        key_required,
        string_tool_choice,
        persona,
        messages: messages.into_iter().map(message_from_wire).collect::<Result<_, _>>()?,
        dir,
        tools: tools.into_iter().map(tool_from_wire).collect::<Result<_, _>>()?,
        verdicts,
        note_required,
        max_turns,
        attempts,
        timeout_ms,
        temperature,
        top_p,
        max_tokens,
        reasoning_effort,
        context_paths,
        max_context_bytes,
        budget_tokens,
        job_budget: job_budget.map(|b| (b.cap, b.spent)),
        job_counter,
        across_counter: Some(across_counter).filter(|c| !c.is_empty()),
        assert: assert_from_wire(assert.ok_or(WireError::Missing("AgentWork.assert"))?)?,
        upstream: upstream.into_iter().map(|d| (d.sender, d.text)).collect(),
        sub_agents: sub_agents.into_iter().map(sub_agent_from_wire).collect::<Result<_, _>>()?,
        fallbacks: fallbacks.into_iter().map(endpoint_from_wire).collect(),
        answers: answers.into_iter().map(|a| (a.r#match, a.answer)).collect(),
        max_questions,
        ask: match ask {
            None => None,
            Some(a) => Some(Box::new(AskSpec {
                answered_by: a.answered_by.map(|s| sub_agent_from_wire(*s)).transpose()?,
                default: a.default,
                options_required: a.options_required,
                inline: a.inline,
                timeout_ms: a.timeout_ms,
                park: a.park,
                answer_with: a.answer_with,
            })),
        },
        image,
        container: container.map(container_from_wire).unwrap_or_default(),
        env,
        mcp_servers: mcp_servers.into_iter().map(mcp_server_from_wire).collect(),
        compact_budget,
        delegate_percent,
        session,
        cli: cli.map(|c| CliWork { program: c.program, model: c.model, project_settings: c.project_settings, budget_usd: c.budget_usd }),
    })
}

pub fn mcp_server_to_wire(m: &McpServerWork) -> v1::McpServer {
    v1::McpServer {
        name: m.name.clone(),
        command: m.command.clone(),
        cwd: m.cwd.clone(),
        endpoint: m.endpoint.clone(),
        bearer_env: m.bearer_env.clone(),
        oauth: m.oauth,
        stepfiles: m.stepfiles.iter().map(|(name, text)| v1::Stepfile { name: name.clone(), text: text.clone() }).collect(),
        env: m.env.clone(),
    }
}

pub fn mcp_server_from_wire(m: v1::McpServer) -> McpServerWork {
    McpServerWork {
        name: m.name,
        command: m.command,
        cwd: m.cwd,
        endpoint: m.endpoint,
        bearer_env: m.bearer_env,
        oauth: m.oauth,
        stepfiles: m.stepfiles.into_iter().map(|f| (f.name, f.text)).collect(),
        env: m.env,
    }
}

pub fn container_to_wire(c: &ContainerSettings) -> v1::ContainerSettings {
    v1::ContainerSettings {
        user: c.user.clone().unwrap_or_default(),
        network: c.network.clone().unwrap_or_default(),
        privileged: c.privileged,
        cpu_shares: c.cpu_shares.unwrap_or(0),
        memory_bytes: c.memory_bytes.unwrap_or(0),
    }
}

pub fn container_from_wire(c: v1::ContainerSettings) -> ContainerSettings {
    ContainerSettings {
        user: Some(c.user).filter(|u| !u.is_empty()),
        network: Some(c.network).filter(|n| !n.is_empty()),
        privileged: c.privileged,
        cpu_shares: Some(c.cpu_shares).filter(|n| *n > 0),
        memory_bytes: Some(c.memory_bytes).filter(|n| *n > 0),
    }
}

fn sub_agent_to_wire(s: &SubAgent) -> v1::SubAgent {
    v1::SubAgent { name: s.name.clone(), description: s.description.clone(), work: Some(Box::new(work_to_wire(&s.work))) }
}

fn sub_agent_from_wire(s: v1::SubAgent) -> Result<SubAgent, WireError> {
    let work = s.work.ok_or(WireError::Missing("SubAgent.work"))?;
    Ok(SubAgent { name: s.name, description: s.description, work: work_from_wire(*work)? })
}

fn endpoint_to_wire(e: &Endpoint) -> v1::Endpoint {
    v1::Endpoint { model: e.model.clone(), base_url: e.base_url.clone(), api_key_env: e.api_key_env.clone(), key_required: e.key_required, string_tool_choice: e.string_tool_choice, compact_budget: e.compact_budget }
}

fn endpoint_from_wire(e: v1::Endpoint) -> Endpoint {
    Endpoint { model: e.model, base_url: e.base_url, api_key_env: e.api_key_env, key_required: e.key_required, string_tool_choice: e.string_tool_choice, compact_budget: e.compact_budget }
}

fn assert_to_wire(a: &AgentAssert) -> v1::AgentAssert {
    v1::AgentAssert {
        stdout: a.stdout.clone(),
        verdict: a.verdict.clone(),
        files: a.files.clone(),
        tool_calls: a.tool_calls.iter().map(|(name, args)| v1::ExpectedCall { name: name.clone(), args: Some(object_to_wire(args)) }).collect(),
        nudge: a.nudge,
    }
}

fn assert_from_wire(a: v1::AgentAssert) -> Result<AgentAssert, WireError> {
    let tool_calls = a
        .tool_calls
        .into_iter()
        .map(|c| Ok((c.name, super::object_from_wire(c.args, "AgentAssert.tool_calls.args")?)))
        .collect::<Result<_, WireError>>()?;
    Ok(AgentAssert { stdout: a.stdout, verdict: a.verdict, files: a.files, tool_calls, nudge: a.nudge })
}

fn message_to_wire(m: &AgentMessage) -> v1::AgentMessage {
    use v1::agent_message::Kind;
    let kind = match m {
        AgentMessage::Text(t) => Kind::Text(t.clone()),
        AgentMessage::Artifact { artifact, path } => Kind::Artifact(v1::ArtifactMessage { artifact: artifact.clone(), path: path.clone() }),
    };
    v1::AgentMessage { kind: Some(kind) }
}

fn message_from_wire(m: v1::AgentMessage) -> Result<AgentMessage, WireError> {
    use v1::agent_message::Kind;
    Ok(match m.kind.ok_or(WireError::Missing("AgentMessage.kind"))? {
        Kind::Text(t) => AgentMessage::Text(t),
        Kind::Artifact(a) => AgentMessage::Artifact { artifact: a.artifact, path: a.path },
    })
}

fn tool_to_wire(t: &ToolDef) -> v1::ToolDef {
    use v1::tool_def::Kind;
    let kind = match t {
        ToolDef::Builtin { name, allow, timeout_ms } => Kind::Builtin(v1::BuiltinTool { name: name.clone(), allow: allow.clone(), timeout_ms: *timeout_ms }),
        ToolDef::Custom { name, description, run, required, max_calls, pinned, max_output_bytes, timeout_ms, literal } => Kind::Custom(v1::CustomTool {
            name: name.clone(),
            description: description.clone(),
            run: run.clone(),
            required: *required,
            max_calls: *max_calls,
            pinned: Some(object_to_wire(pinned)),
            max_output_bytes: *max_output_bytes,
            timeout_ms: *timeout_ms,
            literal: *literal,
        }),
        ToolDef::Mcp { server, tool, tools, description, required, max_calls, max_output_bytes, timeout_ms } => Kind::Mcp(v1::McpGrant {
            server: server.clone(),
            tool: tool.clone(),
            tools: tools.clone(),
            description: description.clone(),
            required: *required,
            max_calls: *max_calls,
            max_output_bytes: *max_output_bytes,
            timeout_ms: *timeout_ms,
        }),
    };
    v1::ToolDef { kind: Some(kind) }
}

fn tool_from_wire(t: v1::ToolDef) -> Result<ToolDef, WireError> {
    use v1::tool_def::Kind;
    Ok(match t.kind.ok_or(WireError::Missing("ToolDef.kind"))? {
        Kind::Builtin(b) => ToolDef::Builtin { name: b.name, allow: b.allow, timeout_ms: b.timeout_ms },
        Kind::Custom(c) => ToolDef::Custom {
            pinned: super::object_from_wire(c.pinned, "CustomTool.pinned")?,
            name: c.name,
            description: c.description,
            run: c.run,
            required: c.required,
            max_calls: c.max_calls,
            max_output_bytes: c.max_output_bytes,
            timeout_ms: c.timeout_ms,
            literal: c.literal,
        },
        Kind::Mcp(m) => ToolDef::Mcp {
            server: m.server,
            tool: m.tool,
            tools: m.tools,
            description: m.description,
            required: m.required,
            max_calls: m.max_calls,
            max_output_bytes: m.max_output_bytes,
            timeout_ms: m.timeout_ms,
        },
    })
}

pub fn outcome_to_wire(o: &AgentOutcome) -> v1::AgentOutcome {
    let AgentOutcome { response, verdict, note, trajectory, tokens, turns, wrapped_up, denials, fallback_model, transcript, usage } = o;
    let Usage { prompt, completion, cached, reasoning, cost_usd, finish, model, responses } = usage;
    v1::AgentOutcome {
        usage: Some(v1::Usage { prompt: *prompt, completion: *completion, cached: *cached, reasoning: *reasoning, cost_usd: *cost_usd, finish: finish.clone(), model: model.clone(), responses: *responses }),
        response: response.clone(),
        verdict: verdict.clone(),
        note: note.clone(),
        trajectory: trajectory.iter().map(|t| v1::TrajectoryEntry { name: t.name.clone(), args: Some(json_to_wire(&t.args)), ok: t.ok }).collect(),
        tokens: *tokens,
        turns: *turns,
        wrapped_up: *wrapped_up,
        denials: denials.iter().map(|d| v1::DenialRecord { tool: d.tool.clone(), path: d.path.clone(), reason: d.reason.clone() }).collect(),
        fallback_model: fallback_model.clone(),
        transcript: transcript.iter().map(|e| v1::TranscriptEvent { kind: e.kind.clone(), name: e.name.clone(), content: e.content.clone() }).collect(),
    }
}

pub fn outcome_from_wire(o: v1::AgentOutcome) -> Result<AgentOutcome, WireError> {
    let v1::AgentOutcome { response, verdict, note, trajectory, tokens, turns, wrapped_up, denials, fallback_model, transcript, usage } = o;
    let usage = usage.map(|u| Usage { prompt: u.prompt, completion: u.completion, cached: u.cached, reasoning: u.reasoning, cost_usd: u.cost_usd, finish: u.finish, model: u.model, responses: u.responses }).unwrap_or_default();
    let trajectory = trajectory
        .into_iter()
        .map(|t| {
            let args = t.args.ok_or(WireError::Missing("TrajectoryEntry.args"))?;
            let args = json_from_wire(args).map_err(|problem| WireError::Json { field: "TrajectoryEntry.args", problem })?;
            Ok(TrajectoryEntry { name: t.name, args, ok: t.ok })
        })
        .collect::<Result<_, WireError>>()?;
    Ok(AgentOutcome {
        response,
        verdict,
        note,
        trajectory,
        tokens,
        turns,
        wrapped_up,
        denials: denials.into_iter().map(|d| DenialRecord { tool: d.tool, path: d.path, reason: d.reason }).collect(),
        fallback_model,
        transcript: transcript.into_iter().map(|e| TranscriptEvent { kind: e.kind, name: e.name, content: e.content }).collect(),
        usage,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::through_bytes;
    use serde_json::json;

    fn endpoint(n: &str) -> Endpoint {
        Endpoint { model: format!("m-{n}"), base_url: format!("http://{n}/v1/"), api_key_env: Some(format!("{n}_KEY")), key_required: true, string_tool_choice: true, compact_budget: 4096 }
    }

    /// Every field set to something other than its default.
    pub(crate) fn full_work(depth: u32) -> AgentWork {
        let pinned = json!({"repo": "acme/ci", "n": -3, "deep": {"z": [1.5, null, u64::MAX]}, "a": true});
        AgentWork {
            agent: format!("reviewer{depth}"),
            model: "gpt-x".into(),
            base_url: "http://models/v1/".into(),
            api_key_env: Some("OPENAI_API_KEY".into()),
            key_required: true,
            string_tool_choice: true,
            persona: "You review.".into(),
            messages: vec![AgentMessage::Text("look at this".into()), AgentMessage::Artifact { artifact: "src".into(), path: "main.rs".into() }],
            dir: Some("src".into()),
            tools: vec![
                ToolDef::Builtin { name: "web_fetch".into(), allow: vec!["example.com".into()], timeout_ms: Some(5000) },
                ToolDef::Builtin { name: "read_file".into(), allow: vec![], timeout_ms: None },
                ToolDef::Custom {
                    name: "gh".into(),
                    description: "GitHub".into(),
                    run: "gh {{ .args.q }}".into(),
                    required: true,
                    max_calls: 4,
                    pinned: pinned.as_object().cloned().unwrap_or_default(),
                    max_output_bytes: Some(1024),
                    timeout_ms: Some(30_000),
                    literal: true,
                },
                ToolDef::Mcp {
                    server: "files".into(),
                    tool: Some("lookup".into()),
                    tools: vec![],
                    description: Some("Look it up".into()),
                    required: true,
                    max_calls: 2,
                    max_output_bytes: Some(512),
                    timeout_ms: Some(1_000),
                },
                ToolDef::Mcp { server: "docs".into(), tool: None, tools: vec!["a".into(), "b".into()], description: None, required: false, max_calls: 0, max_output_bytes: None, timeout_ms: None },
            ],
            verdicts: vec!["approve".into(), "reject".into()],
            note_required: true,
            max_turns: 12,
            attempts: 3,
            timeout_ms: Some(60_000),
            temperature: Some(0.25),
            top_p: Some(0.9),
            max_tokens: Some(-1),
            reasoning_effort: Some("high".into()),
            context_paths: vec!["README.md".into()],
            max_context_bytes: 4096,
            budget_tokens: Some(10_000),
            job_budget: Some((50_000, 1234)),
            job_counter: Some("r-1:job".into()),
            across_counter: Some("r-1:across:0".into()),
            assert: AgentAssert {
                stdout: Some("ok".into()),
                verdict: Some("approve".into()),
                files: vec!["out/report".into()],
                tool_calls: vec![("gh".into(), json!({"q": "issues", "z": 1, "a": 2}).as_object().cloned().unwrap_or_default())],
                nudge: true,
            },
            upstream: vec![("planner".into(), "the plan".into())],
            sub_agents: if depth == 0 { vec![] } else { vec![SubAgent { name: "helper".into(), description: "helps".into(), work: full_work(depth - 1) }] },
            fallbacks: vec![endpoint("a"), endpoint("b")],
            answers: vec![("continue?".into(), "yes".into())],
            max_questions: 5,
            ask: Some(Box::new(AskSpec {
                answered_by: (depth > 0).then(|| SubAgent { name: "oracle".into(), description: "knows".into(), work: full_work(depth - 1) }),
                default: Some("no".into()),
                options_required: true,
                inline: true,
                timeout_ms: Some(300_000),
                park: true,
                answer_with: "ci.yml".into(),
            })),
            image: Some("python:3.12".into()),
            container: ContainerSettings { user: Some("0".into()), network: Some("none".into()), privileged: false, cpu_shares: Some(256), memory_bytes: None },
            env: vec!["GOFLAGS".into()],
            mcp_servers: vec![
                McpServerWork { name: "files".into(), command: vec!["python3".into(), "server.py".into()], cwd: Some("tools".into()), ..Default::default() },
                McpServerWork { name: "docs".into(), endpoint: Some("http://127.0.0.1:9/mcp".into()), bearer_env: Some("DOCS_TOKEN".into()), ..Default::default() },
                McpServerWork { name: "tracker".into(), endpoint: Some("http://127.0.0.1:9/mcp".into()), oauth: true, ..Default::default() },
                McpServerWork { name: "audit".into(), stepfiles: vec![("shelf.yaml".into(), "stepgate: \"1\"\n".into())], env: vec!["INV_API_KEY".into()], ..Default::default() },
            ],
            compact_budget: 102_400,
            delegate_percent: 25,
            session: "build-r-1-reviewer".into(),
            cli: (depth == 1).then(|| CliWork { program: "claude".into(), model: "sonnet".into(), project_settings: true, budget_usd: Some(0.5) }),
        }
    }

    #[test]
    fn agent_work_round_trips_whole() {
        let w = full_work(2);
        let back = work_from_wire(through_bytes(work_to_wire(&w))).unwrap();
        assert_eq!(back, w);
        // Key order inside pinned and expected arguments is kept, too.
        let ToolDef::Custom { pinned, .. } = &back.tools[2] else { panic!("a custom tool") };
        assert_eq!(pinned.keys().collect::<Vec<_>>(), ["repo", "n", "deep", "a"]);
        assert_eq!(back.assert.tool_calls[0].1.keys().collect::<Vec<_>>(), ["q", "z", "a"]);
        let bare = AgentWork::default();
        assert_eq!(work_from_wire(through_bytes(work_to_wire(&bare))).unwrap(), bare);
    }

    #[test]
    fn agent_outcome_round_trips_whole() {
        let o = AgentOutcome {
            response: "done".into(),
            verdict: Some("approve".into()),
            note: Some("fine".into()),
            trajectory: vec![
                TrajectoryEntry { name: "gh".into(), args: json!({"q": "x", "n": [1, -2, 2.5]}), ok: true },
                TrajectoryEntry { name: "odd".into(), args: json!("not an object"), ok: false },
            ],
            tokens: 12_345,
            turns: 7,
            wrapped_up: true,
            denials: vec![DenialRecord { tool: "read_file".into(), path: "/etc/passwd".into(), reason: "outside".into() }],
            fallback_model: Some("m-b".into()),
            transcript: vec![TranscriptEvent { kind: "call".into(), name: "gh".into(), content: "{}".into() }],
            usage: Usage { prompt: 10_000, completion: 2_345, cached: 4_000, reasoning: 12, cost_usd: Some(0.0125), finish: "stop".into(), model: "anthropic/claude-sonnet-4".into(), responses: 7 },
        };
        assert_eq!(outcome_from_wire(through_bytes(outcome_to_wire(&o))).unwrap(), o);
        assert_eq!(outcome_from_wire(v1::AgentOutcome::default()).unwrap(), AgentOutcome::default());
    }

    #[test]
    fn malformed_agent_messages_are_errors() {
        let mut w = work_to_wire(&full_work(1));
        w.assert = None;
        assert_eq!(work_from_wire(w).unwrap_err().to_string(), "AgentWork.assert is missing");
        let mut w = work_to_wire(&full_work(1));
        w.sub_agents[0].work = None;
        assert!(matches!(work_from_wire(w), Err(WireError::Missing("SubAgent.work"))));
        let mut w = work_to_wire(&full_work(0));
        w.tools[2] = v1::ToolDef { kind: Some(v1::tool_def::Kind::Custom(v1::CustomTool { pinned: Some(json_to_wire(&json!([1]))), ..Default::default() })) };
        assert_eq!(work_from_wire(w).unwrap_err().to_string(), "CustomTool.pinned: not a JSON object");
        let mut w = work_to_wire(&full_work(0));
        w.messages.push(v1::AgentMessage { kind: None });
        assert!(matches!(work_from_wire(w), Err(WireError::Missing("AgentMessage.kind"))));
        let bad = v1::AgentOutcome { trajectory: vec![v1::TrajectoryEntry { name: "t".into(), args: Some(v1::Json { nodes: vec![] }), ok: true }], ..Default::default() };
        assert!(outcome_from_wire(bad).unwrap_err().to_string().starts_with("TrajectoryEntry.args: "));
    }
}
