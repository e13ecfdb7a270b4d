//! One run of a stepfile (§1.8): preflight, then steps in order — skipped,
//! run mechanically, or shown to the client and gated on its submissions —
//! every event in the run's ledger.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use crate::egress::Egress;
use crate::error::GateError;
use crate::expr;
use crate::jcs::{digest, digest_json};
use crate::ledger::Ledger;
use crate::reply::{self, Reply};
use crate::cases::{Attempt, CallSeen};
use crate::check::{self, Stage, Verdict};
use crate::schema;
use crate::stepfile::{Loaded, Step};
use crate::tools::{Outcome, Tools};

/// The limits and places of `steppe gate` (§1.11).
#[derive(Debug, Clone)]
pub struct Options {
    pub calls_per_step: u32,
    pub tool_result_chars: usize,
    pub run_idle: Duration,
    pub request_timeout: Duration,
    pub response_bytes: usize,
    /// Where ledgers go; standard error when unset.
    pub ledger_dir: Option<PathBuf>,
    pub contact: Option<String>,
    pub record_cases: Option<PathBuf>,
    /// `--test`: no network, `http` and `approve` gates skipped.
    pub offline: bool,
    /// Run ids 1, 2, … (a gate hosted for one pipeline step).
    pub sequential_runs: bool,
    /// What `stepgate_try` drafts may use (`--draft-credential`, `--draft-setting`).
    pub draft: crate::authoring::Grants,
    /// Where `stepgate_examples` and `--test NAME` find catalog entries.
    pub catalog: PathBuf,
    /// Whether the authoring tools are served (not to a pipeline's agent:
    /// they reach public URLs and run drafts).
    pub authoring: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            calls_per_step: 100,
            tool_result_chars: 20_000,
            run_idle: Duration::from_millis(1_800_000),
            request_timeout: Duration::from_millis(60_000),
            response_bytes: 10_485_760,
            ledger_dir: None,
            contact: None,
            record_cases: None,
            offline: false,
            sequential_runs: false,
            draft: Default::default(),
            catalog: PathBuf::from("stepfiles"),
            authoring: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Running,
    Finished,
    Failed,
    Abandoned,
}

pub struct Run {
    pub id: String,
    pub loaded: Arc<Loaded>,
    opts: Arc<Options>,
    inputs: Value,
    ledger: Ledger,
    tools: Option<Tools>,
    outputs: Map<String, Value>,
    /// Mechanical steps done since the client last saw a step.
    completed: Vec<String>,
    current: usize,
    attempt: u32,
    calls_made: u32,
    calls: Vec<CallSeen>,
    pub state: State,
    /// What ended the run, if an error did.
    pub error: Option<GateError>,
    pub last_used: Instant,
    /// What `--record-cases` keeps of each attempt.
    pub attempts: Vec<Attempt>,
    /// Who answers `approve` gates: the client that started the run.
    approver: Option<Arc<dyn Approver>>,
}

/// A fresh run id (a random UUID).
pub fn new_id() -> String {
    let mut b = [0u8; 16];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = std::io::Read::read_exact(&mut f, &mut b);
    } else {
        let n = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0) ^ u128::from(std::process::id());
        b = n.to_le_bytes();
    }
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

/// What a person said to an `approve` gate.
pub enum Approval {
    Accepted,
    Declined(Option<String>),
    Dismissed,
    /// The question could not be asked (the client went, or did not answer in time).
    Unavailable(String),
}

/// Asks the person behind the client (MCP form elicitation).
pub trait Approver: Send + Sync {
    /// Whether the client can show a form at all.
    fn form(&self) -> bool;
    fn ask(&self, message: String) -> std::pin::Pin<Box<dyn std::future::Future<Output = Approval> + Send + '_>>;
}

/// Now, RFC 3339 UTC with milliseconds.
pub fn now() -> String {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    let (y, m, dd) = steppe_language::calendar::civil_from_days(days);
    format!("{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:03}Z", rest / 3600, rest % 3600 / 60, rest % 60, d.subsec_millis())
}

fn sized(v: &Value) -> Value {
    let c = crate::jcs::canonical(v);
    json!({"sha256": digest(c.as_bytes()), "length": c.len()})
}

impl Run {
    /// Starts a run of `loaded` with `inputs`: the run's first reply, and the
    /// run itself while it goes on.
    pub async fn start(id: String, loaded: Arc<Loaded>, opts: Arc<Options>, inputs: Value, approver: Option<Arc<dyn Approver>>) -> (Option<Run>, Reply) {
        let ledger = match Ledger::open(opts.ledger_dir.as_deref(), &loaded.stepfile.id, &id) {
            Ok(l) => l,
            Err(e) => return (None, reply::failed(None, &GateError::new("PreflightFailed", format!("ledger: {e}")))),
        };
        let mut run = Run {
            id,
            loaded,
            opts,
            inputs,
            ledger,
            tools: None,
            outputs: Map::new(),
            completed: Vec::new(),
            current: 0,
            attempt: 1,
            calls_made: 0,
            calls: Vec::new(),
            state: State::Running,
            error: None,
            last_used: Instant::now(),
            attempts: Vec::new(),
            approver,
        };
        let identity = run.loaded.identity.clone();
        run.record("run_started", json!({"identity": identity, "inputs": digest_json(&run.inputs)}));
        let r = match run.preflight().await {
            Err(e) => run.fail(e).await,
            Ok(()) => run.advance().await,
        };
        // A start call names no run: what ends the run on it is reported without one.
        match (&run.state, &run.error) {
            (State::Failed, Some(e)) => {
                let r = reply::failed(None, e);
                (Some(run), r)
            }
            _ => (Some(run), r),
        }
    }

    fn record(&mut self, kind: &str, fields: Value) {
        if let Err(e) = self.ledger.record(kind, &now(), fields) {
            eprintln!("stepgate: the ledger of run {} could not be written: {e}", self.id);
        }
    }

    fn defs(&self) -> Option<&Value> {
        self.loaded.stepfile.defs.as_ref()
    }

    async fn preflight(&mut self) -> Result<(), GateError> {
        let doc = &self.loaded.stepfile;
        let settings = crate::settings::resolve(doc)?;
        let approvals = doc.steps.iter().flat_map(|s| s.gates.iter().flatten()).any(|g| g.approve.is_some());
        if approvals && !self.approver.as_ref().is_some_and(|a| a.form()) {
            return Err(crate::error::preflight("approval", "the stepfile has approve gates and this client cannot show a form (MCP form elicitation)"));
        }
        let problems = schema::problems(&doc.inputs, doc.defs.as_ref(), &self.inputs).map_err(|e| crate::error::preflight("inputs", format!("the inputs schema does not compile: {e}")))?;
        if !problems.is_empty() {
            return Err(crate::error::preflight("inputs", problems.join("; ")));
        }
        let allow = if self.opts.offline { Vec::new() } else { crate::tools::declared_hosts(doc, &settings) };
        let egress = Egress::new(allow, self.opts.request_timeout, self.opts.response_bytes, self.opts.contact.as_deref())?;
        self.tools = Some(Tools::prepare(doc, &settings, egress).await?);
        Ok(())
    }

    fn step(&self) -> &Step {
        &self.loaded.stepfile.steps[self.current]
    }

    fn context(&self) -> Value {
        json!({"inputs": self.inputs, "steps": self.outputs})
    }

    /// Moves on from the current step: skipped and mechanical steps are
    /// done here; stops at the next agent step, or finishes the run.
    async fn advance(&mut self) -> Reply {
        let loaded = self.loaded.clone();
        let steps = &loaded.stepfile.steps;
        while self.current < steps.len() {
            let step = &steps[self.current];
            if let Some(when) = &step.when {
                if !matches!(expr::passes(when, &self.context()), Ok(true)) {
                    self.record("step_skipped", json!({"step": step.id}));
                    self.current += 1;
                    continue;
                }
            }
            self.attempt = 1;
            self.calls_made = 0;
            self.calls.clear();
            self.record("step_started", json!({"step": step.id}));
            if step.do_.is_some() {
                if let Err(e) = self.mechanical(step).await {
                    return self.fail(e).await;
                }
                self.completed.push(step.id.clone());
                self.current += 1;
                continue;
            }
            return match self.view(step) {
                Ok(r) => r,
                Err(e) => self.fail(e).await,
            };
        }
        self.record("run_finished", json!({"outcome": "passed"}));
        self.state = State::Finished;
        self.close().await;
        reply::finished(&self.id, &self.loaded.identity, &self.outputs)
    }

    fn view(&mut self, step: &Step) -> Result<Reply, GateError> {
        let instructions = fill_placeholders(&step.id, step.instructions.as_deref().unwrap_or_default(), &self.context())?;
        let tools = self.tools.as_ref();
        let operations: Vec<Value> = step
            .tools
            .iter()
            .flatten()
            .filter_map(|name| tools.and_then(|t| t.ops.get(name)))
            .map(|op| json!({"name": op.name, "description": op.description, "inputSchema": op.input_schema}))
            .collect();
        let derived: Vec<&String> = step.derive.iter().flat_map(|d| d.keys()).collect();
        let produces = schema::inline_refs(&schema::without(&step.produces, &derived), &json!({"$defs": self.defs()}), 0);
        let completed = std::mem::take(&mut self.completed);
        let view = reply::StepView {
            step: &step.id,
            number: self.current + 1,
            total: self.loaded.stepfile.steps.len(),
            instructions: &instructions,
            operations: &operations,
            produces: &produces,
            attempts_left: self.attempts_left(step),
            completed: &completed,
        };
        Ok(reply::step(&self.id, &view))
    }

    fn attempts_left(&self, step: &Step) -> u32 {
        (step.retries.unwrap_or(0).max(0) as u32 + 1).saturating_sub(self.attempt - 1)
    }

    /// Ends the run with `e`.
    pub async fn fail(&mut self, e: GateError) -> Reply {
        self.record("run_failed", json!({"error": e.name}));
        self.state = State::Failed;
        self.close().await;
        let r = reply::failed(Some(&self.id), &e);
        self.error = Some(e);
        r
    }

    /// Ends a run nobody drives any more.
    pub async fn abandon(&mut self) {
        if self.state == State::Running {
            self.record("run_abandoned", json!({}));
            self.state = State::Abandoned;
            self.close().await;
        }
    }

    async fn close(&mut self) {
        if let Some(t) = self.tools.as_mut() {
            t.close().await;
        }
        if let Some(dir) = self.opts.record_cases.clone() {
            if !self.attempts.is_empty() && self.state != State::Abandoned {
                if let Err(e) = crate::cases::write(&dir, &self.loaded.stepfile.id, &self.id, &self.inputs, &self.attempts) {
                    eprintln!("stepgate: cases of run {} not recorded: {e}", self.id);
                }
            }
        }
    }

    fn not_active(&self) -> Option<Reply> {
        (self.state != State::Running).then(|| reply::failed(Some(&self.id), &not_active(&self.id)))
    }

    /// Counts a call toward the step's limit, or says the limit is reached.
    fn count_call(&mut self) -> Result<(), GateError> {
        if self.calls_made >= self.opts.calls_per_step {
            return Err(GateError::new("CallLimitReached", format!("step {} reached the limit of {} tool calls", self.step().id, self.opts.calls_per_step)));
        }
        self.calls_made += 1;
        Ok(())
    }

    /// `stepgate_call`: the client calls one of the step's operations.
    pub async fn call(&mut self, operation: &str, arguments: Value) -> Reply {
        self.last_used = Instant::now();
        if let Some(r) = self.not_active() {
            return r;
        }
        if let Err(e) = self.count_call() {
            return self.fail(e).await;
        }
        let loaded = self.loaded.clone();
        let step = &loaded.stepfile.steps[self.current];
        if !step.tools.iter().flatten().any(|t| t == operation) {
            self.record("tool_refused", json!({"step": step.id, "operation": operation}));
            return reply::refused(&self.id, operation);
        }
        let Some(tools) = self.tools.as_ref() else { return self.fail(GateError::new("ToolCallFailed", "the run has no tools")).await };
        let Some(op) = tools.ops.get(operation) else { return self.fail(GateError::new("ToolCallFailed", format!("{operation} is not prepared"))).await };
        let problems = if arguments.is_object() { op.schema.problems(&arguments) } else { Vec::new() };
        if !arguments.is_object() || !problems.is_empty() {
            return reply::invalid_arguments(&self.id, operation, &problems);
        }
        match self.invoke(operation, &arguments, None).await {
            Ok((_, shown)) => reply::call(&self.id, shown.text, shown.is_error),
            Err(e) => self.fail(e).await,
        }
    }

    /// Calls an operation and logs it: the outcome and what the client is
    /// shown of it (a mechanical call, `call_id`, is shown uncut), or the
    /// error that ends the run.
    async fn invoke(&mut self, operation: &str, arguments: &Value, call_id: Option<&str>) -> Result<(Outcome, Reply), GateError> {
        let tools = self.tools.as_ref().ok_or_else(|| GateError::new("ToolCallFailed", "the run has no tools"))?;
        let op = tools.ops.get(operation).ok_or_else(|| GateError::new("ToolCallFailed", format!("{operation} is not prepared")))?;
        let started = Instant::now();
        let mut retries = Vec::new();
        let result = tools.call(op, arguments, &mut retries).await;
        let tool = op.tool.clone();
        let credential = op.credential.as_ref().map(|(c, _)| c.name.clone());
        let select = op.select.clone();
        for r in &retries {
            self.record("retry", json!({"operation": operation, "attempt": r.attempt, "status": r.status, "wait_ms": r.wait_ms}));
        }
        let out = result?;
        let selected = select.is_some() && !out.is_error;
        let shown = match &select {
            Some(rule) if selected => expr::eval(rule, &out.result).unwrap_or(Value::Null).to_string(),
            _ => out.content.clone(),
        };
        let limit = if call_id.is_some() { usize::MAX } else { self.opts.tool_result_chars };
        let shown_len = reply::js_len(&shown);
        let step = self.step().id.clone();
        let mut fields = json!({
            "step": step, "caller": if call_id.is_some() { "stepgate" } else { "client" }, "tool": tool, "operation": operation,
            "host": out.host, "status": out.status, "is_error": out.is_error,
            "duration_ms": started.elapsed().as_millis() as u64, "credential": credential,
            "response": {"sha256": digest(out.content.as_bytes()), "length": reply::js_len(&out.content)},
            "shown": {"length": shown_len, "selected": selected}, "truncated_to": (shown_len > limit).then_some(limit),
        });
        if let Some(id) = call_id {
            fields["call"] = json!(id);
        }
        self.record("tool_call", fields);
        self.calls.push(CallSeen { tool: operation.to_string(), arguments: arguments.clone(), result: out.result.clone(), is_error: out.is_error });
        let shown = reply::plain(reply::cut(&shown, limit), out.is_error);
        Ok((out, shown))
    }

    fn calls_json(&self) -> Value {
        crate::cases::calls_json(&self.calls)
    }

    /// A mechanical step: its calls, its output, its produces and gates.
    async fn mechanical(&mut self, step: &Step) -> Result<(), GateError> {
        let Some(d) = &step.do_ else { return Ok(()) };
        let mut responses = Map::new();
        for call in d.calls.iter().flatten() {
            let base = json!({"inputs": self.inputs, "steps": self.outputs, "responses": responses});
            let items = match &call.each {
                None => None,
                Some(each) => match expr::template(each, &base).map_err(|e| argument_error(step, call, &e.0))? {
                    Value::Array(a) => Some(a),
                    other => return Err(argument_error(step, call, &format!("each must give an array, and gave {other}"))),
                },
            };
            let mut got = Vec::new();
            for item in items.clone().unwrap_or_else(|| vec![Value::Null]) {
                let mut data = base.clone();
                if items.is_some() {
                    data["item"] = item;
                }
                let args = expr::template(call.arguments.as_ref().unwrap_or(&json!({})), &data).map_err(|e| argument_error(step, call, &e.0))?;
                if !args.is_object() {
                    return Err(argument_error(step, call, "arguments must be an object"));
                }
                let problems = self.tools.as_ref().and_then(|t| t.ops.get(&call.operation)).map(|op| op.schema.problems(&args)).unwrap_or_default();
                if !problems.is_empty() {
                    return Err(argument_error(step, call, &problems.join("; ")));
                }
                self.count_call()?;
                let (out, _) = self.invoke(&call.operation, &args, Some(&call.id)).await?;
                let accepted = out.status.is_some_and(|s| call.accept.iter().flatten().any(|a| *a == i64::from(s)));
                if out.is_error && !accepted {
                    let status = out.status.map_or("none".to_string(), |s| s.to_string());
                    return Err(GateError::new("ToolCallFailed", format!("call {} ({}) failed with status {status}: {}", call.id, call.operation, crate::reply::head(&out.content))));
                }
                got.push(if accepted { out.body } else { out.result });
            }
            let value = if items.is_some() { Value::Array(got) } else { got.pop().unwrap_or(Value::Null) };
            responses.insert(call.id.clone(), value);
        }
        let data = json!({"inputs": self.inputs, "steps": self.outputs, "responses": responses});
        let output = expr::template(&d.output, &data).map_err(|e| GateError::new("GateFailed", format!("step {}: its output: {}", step.id, e.0)))?;
        self.record("computed", json!({"step": step.id, "output": sized(&output)}));
        let (_, failures) = self.evaluate(step, output.clone()).await?;
        let failed = failures.iter().map(|(g, _)| g.clone()).collect();
        self.attempts.push(Attempt { step: step.id.clone(), calls: self.calls.clone(), output: output.clone(), failed });
        if !failures.is_empty() {
            return Err(gate_failed(step, &failures));
        }
        self.outputs.insert(step.id.clone(), output);
        self.record("step_passed", json!({"step": step.id, "attempt": 1}));
        Ok(())
    }

    /// Every gate of `step` over `output`, in file order, each recorded;
    /// the failures as (gate, message and diagnosis).
    async fn gates(&mut self, step: &Step, output: &Value, lets: &Value) -> Result<Vec<(String, String)>, GateError> {
        let ctx = check::context(&self.inputs, &Value::Object(self.outputs.clone()), output, &self.calls_json(), lets);
        let mut failures = Vec::new();
        for g in step.gates.iter().flatten() {
            let verdict = match check::verdict(g, self.defs(), &ctx)? {
                Verdict::Pass => None,
                Verdict::Fail(d) => Some(d),
                Verdict::Elsewhere => match (&g.http, &g.approve) {
                    (Some(h), _) => self.verify(step, &g.id, &h.tool, output).await?,
                    (None, Some(a)) => self.approve(&a.message, output).await?,
                    (None, None) => None,
                },
            };
            let attempt = self.attempt;
            self.record("gate", json!({"step": step.id, "attempt": attempt, "gate": g.id, "verdict": if verdict.is_some() { "fail" } else { "pass" }, "diagnosis": verdict.as_ref().map(|d| digest(d.as_bytes()))}));
            if let Some(d) = verdict {
                failures.push((g.id.clone(), d));
            }
        }
        Ok(failures)
    }

    /// An `approve` gate: the person's answer to the message and the output
    /// (cut to `--tool-result-chars`), waited for up to `--run-idle-ms`.
    async fn approve(&mut self, message: &str, output: &Value) -> Result<Option<String>, GateError> {
        let approver = self.approver.clone().ok_or_else(|| crate::error::preflight("approval", "no client to ask"))?;
        let shown = reply::cut(&serde_json::to_string_pretty(output).unwrap_or_default(), self.opts.tool_result_chars);
        let asked = approver.ask(format!("{message}\n\n{shown}"));
        let answer = tokio::time::timeout(self.opts.run_idle, asked).await.unwrap_or(Approval::Unavailable("nobody answered in time".into()));
        match answer {
            Approval::Accepted => Ok(None),
            Approval::Declined(reason) => Ok(Some(format!("a person declined to approve this output{}", reason.filter(|r| !r.trim().is_empty()).map(|r| format!(": {r}")).unwrap_or_default()))),
            Approval::Dismissed => Ok(Some("a person dismissed the approval without deciding".into())),
            Approval::Unavailable(why) => Err(GateError::new("ToolCallFailed", format!("approval could not be asked: {why}"))),
        }
    }

    /// An `http` gate: the verifier's verdict, or the error that ends the run.
    async fn verify(&mut self, step: &Step, gate: &str, tool: &str, output: &Value) -> Result<Option<String>, GateError> {
        let tools = self.tools.as_ref().ok_or_else(|| GateError::new("ToolCallFailed", "the run has no tools"))?;
        let (url, credential) = tools.verifiers.get(tool).cloned().ok_or_else(|| GateError::new("ToolCallFailed", format!("verifier {tool} is not prepared")))?;
        let body = json!({"stepfile": self.loaded.stepfile.id, "step": step.id, "gate": gate, "inputs": self.inputs, "steps": self.outputs, "output": output, "calls": self.calls_json()});
        let req = crate::openapi::Request { method: "POST".into(), url, headers: Vec::new(), body: Some(("application/json".into(), body.to_string().into_bytes())) };
        let placement = crate::egress::Placement::Bearer;
        let a = tools.egress.send(&req, credential.as_ref().map(|c| (c, &placement)), false, tool, &mut Vec::new()).await?;
        let answer: Value = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
        match (a.status, answer.get("pass")) {
            (200..=299, Some(Value::Bool(true))) => Ok(None),
            (200..=299, Some(Value::Bool(false))) => Ok(Some(answer.get("message").and_then(Value::as_str).unwrap_or("verifier returned pass: false").to_string())),
            (s, _) => Err(GateError::new("ToolCallFailed", format!("verifier {tool} answered HTTP {s}: {}", String::from_utf8_lossy(&a.body)))),
        }
    }

    /// `stepgate_submit`: the client's output for the current step.
    pub async fn submit(&mut self, output: Value) -> Reply {
        self.last_used = Instant::now();
        if let Some(r) = self.not_active() {
            return r;
        }
        let loaded = self.loaded.clone();
        let step = &loaded.stepfile.steps[self.current];
        let attempt = self.attempt;
        self.record("submit", json!({"step": step.id, "attempt": attempt, "output": sized(&output)}));
        let evaluated = self.evaluate(step, output.clone()).await;
        let (full, failures) = match evaluated {
            Ok(x) => x,
            Err(e) => return self.fail(e).await,
        };
        let expect: Vec<String> = failures.iter().map(|(g, _)| g.clone()).collect();
        self.attempts.push(Attempt { step: step.id.clone(), calls: self.calls.clone(), output: output.clone(), failed: expect });
        if failures.is_empty() {
            self.outputs.insert(step.id.clone(), full);
            self.record("step_passed", json!({"step": step.id, "attempt": attempt}));
            self.current += 1;
            return self.advance().await;
        }
        self.attempt += 1;
        if self.attempts_left(step) == 0 {
            return self.fail(gate_failed(step, &failures)).await;
        }
        reply::rejected(&self.id, &failures, self.attempts_left(step))
    }

    /// A submission's evaluation (§1.7): the output with derived fields, and the failures.
    async fn evaluate(&mut self, step: &Step, output: Value) -> Result<(Value, Vec<(String, String)>), GateError> {
        let attempt = self.attempt;
        let stage = check::prepare(step, self.defs(), &self.inputs, &Value::Object(self.outputs.clone()), &output, &self.calls_json())?;
        match stage {
            Stage::Refused { gate, diagnosis } => {
                self.record("gate", json!({"step": step.id, "attempt": attempt, "gate": gate, "verdict": "fail", "diagnosis": digest(diagnosis.as_bytes())}));
                Ok((output, vec![(gate.to_string(), diagnosis)]))
            }
            Stage::Ready { full, lets, derived } => {
                if derived {
                    self.record("derived", json!({"step": step.id, "attempt": attempt, "output": sized(&full)}));
                }
                let failures = self.gates(step, &full, &lets).await?;
                Ok((full, failures))
            }
        }
    }
}

/// `RunNotActive` for `run`.
pub fn not_active(run: &str) -> GateError {
    GateError::new("RunNotActive", format!("run {run} is not active; it finished, failed or expired, so call the stepfile's tool again to start a new run"))
}

fn argument_error(step: &Step, call: &crate::stepfile::Call, why: &str) -> GateError {
    GateError::new("CallArgumentsInvalid", format!("step {} computed arguments for call {} ({}) that its schema refuses: {why}", step.id, call.id, call.operation))
}

fn gate_failed(step: &Step, failures: &[(String, String)]) -> GateError {
    let parts: Vec<String> = failures.iter().map(|(g, d)| format!("{g}: {d}")).collect();
    GateError::new("GateFailed", format!("step {} failed gates: {}", step.id, parts.join("; ")))
}

/// `{{inputs.x}}` and `{{steps.id.x}}` in instructions: strings raw, other
/// values as indented JSON; one that resolves to nothing is an error.
fn fill_placeholders(step: &str, text: &str, ctx: &Value) -> Result<String, GateError> {
    let mut out = String::new();
    let mut from = 0;
    for (span, path) in crate::stepfile::placeholders(text) {
        out.push_str(&text[from..span.start]);
        let v = expr::get_path(ctx, path).filter(|v| !v.is_null()).ok_or_else(|| GateError::new("PlaceholderUnresolved", format!("step {step}: placeholder {{{{{path}}}}} did not resolve")))?;
        match v {
            Value::String(s) => out.push_str(&s),
            other => out.push_str(&serde_json::to_string_pretty(&other).unwrap_or_default()),
        }
        from = span.end;
    }
    out.push_str(&text[from..]);
    Ok(out)
}

