//! The History service (the coordinator's store, read over gRPC) and
//! `RemoteStore`, its client behind the `Store` trait, so `steppe runs`,
//! `approvals`, `approve` and `reject` print the same views with or without
//! `--coordinator`.

use std::sync::Arc;

use steppe_proto::v1::artifacts_client::ArtifactsClient;
use steppe_proto::v1::history_client::HistoryClient;
use steppe_proto::v1::history_query::What;
use steppe_proto::v1::history_server::History;
use steppe_proto::v1::history_reply::Reply;
use steppe_proto::v1::{self as v1, AnswerReply, AnswerRequest, DecideReply, DecideRequest, HistoryQuery, HistoryReply, RunsQuery};
use steppe_runtime::auth::{Identity, Role};
use steppe_runtime::store::{ApprovalRecord, LogLine, PipelineSummary, QuestionRecord, RunEvent, RunFilter, RunRecord, Scope, StepRecord, Store, StoreError};
use steppe_runtime::wire::history::{
    approval_from_wire, approval_to_wire, question_from_wire, question_to_wire, event_from_wire, event_to_wire, log_from_wire, log_to_wire, pipeline_from_wire, pipeline_to_wire, reply_kind, run_from_wire, run_to_wire, step_from_wire,
    step_to_wire,
};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

use crate::remote::Remote;
use steppe_runtime::auth::WithToken;

pub struct HistoryService {
    pub store: Arc<dyn Store>,
}

/// Who may read history: anyone but a worker, each its own team's (an admin every team's).
fn reader(req_identity: Option<&Identity>) -> Result<Identity, Status> {
    steppe_runtime::auth::require(req_identity, &[Role::Submit, Role::Admin], "read or decide history")
}

#[tonic::async_trait]
impl History for HistoryService {
    async fn query(&self, req: Request<HistoryQuery>) -> Result<Response<HistoryReply>, Status> {
        let who = reader(Identity::of(&req))?;
        let store = self.store.clone();
        let what = req.into_inner().what.ok_or_else(|| Status::invalid_argument("an empty query"))?;
        let reply = tokio::task::spawn_blocking(move || -> Result<Reply, StoreError> {
            // A run of another team is answered as one that does not exist.
            let visible = |id: &str| -> Result<bool, StoreError> { Ok(store.run(id)?.is_some_and(|r| who.sees(&r.team))) };
            let nonempty = |s: &str| Some(s.to_string()).filter(|s| !s.is_empty());
            Ok(match what {
                What::Runs(q) => {
                    let (job, pipeline) = (nonempty(&q.job), nonempty(&q.pipeline));
                    let f = RunFilter { team: who.team_filter(), pipeline: pipeline.as_deref(), job: job.as_deref(), limit: q.limit as usize, skip: 0 };
                    Reply::Runs(v1::RunList { runs: store.runs(&f)?.into_iter().map(run_to_wire).collect() })
                }
                What::Run(id) => Reply::Run(v1::FoundRun { run: store.run(&id)?.filter(|r| who.sees(&r.team)).map(run_to_wire) }),
                What::Steps(id) => Reply::Steps(v1::StepList { steps: if visible(&id)? { store.steps(&id)?.into_iter().map(step_to_wire).collect() } else { Vec::new() } }),
                What::Logs(id) => Reply::Logs(v1::LogList { lines: if visible(&id)? { store.logs(&id)?.into_iter().map(log_to_wire).collect() } else { Vec::new() } }),
                What::Events(id) => Reply::Events(v1::EventList { events: if visible(&id)? { store.events(&id)?.into_iter().map(event_to_wire).collect() } else { Vec::new() } }),
                What::EventsAfter(q) => {
                    let after = usize::try_from(q.after).unwrap_or(usize::MAX);
                    Reply::Events(v1::EventList { events: if visible(&q.run_id)? { store.events_after(&q.run_id, after)?.into_iter().map(event_to_wire).collect() } else { Vec::new() } })
                }
                What::Approval(id) => Reply::Approval(v1::FoundApproval { approval: store.approval(id)?.filter(|a| who.sees(&a.team)).map(approval_to_wire) }),
                What::Pending(q) => {
                    let pipeline = nonempty(&q.pipeline);
                    Reply::Approvals(v1::ApprovalList { approvals: store.pending_approvals(who.team_filter(), pipeline.as_deref())?.into_iter().map(approval_to_wire).collect() })
                }
                What::Question(id) => Reply::Question(v1::FoundQuestion { question: store.question(id)?.filter(|q| who.sees(&q.team)).map(question_to_wire) }),
                What::PendingQuestions(q) => {
                    let pipeline = nonempty(&q.pipeline);
                    Reply::Questions(v1::QuestionList { questions: store.pending_questions(who.team_filter(), pipeline.as_deref())?.into_iter().map(question_to_wire).collect() })
                }
                What::Spans(id) => Reply::Spans(v1::SpanList {
                    spans: if visible(&id)? { store.spans(&id)?.iter().map(steppe_runtime::wire::trace::span_to_wire).collect() } else { Vec::new() },
                }),
                What::Pipelines(_) => Reply::Pipelines(v1::PipelineList { pipelines: store.pipelines(who.team_filter())?.into_iter().map(pipeline_to_wire).collect() }),
            })
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?;
        let reply = reply.map_err(|e| Status::unavailable(e.to_string()))?;
        Ok(Response::new(HistoryReply { reply: Some(reply) }))
    }

    async fn decide(&self, req: Request<DecideRequest>) -> Result<Response<DecideReply>, Status> {
        let who = reader(Identity::of(&req))?;
        let store = self.store.clone();
        let d = req.into_inner();
        let decided = tokio::task::spawn_blocking(move || -> Result<Option<bool>, StoreError> {
            match store.approval(d.id)? {
                Some(a) if who.sees(&a.team) => store.decide_approval(d.id, d.approve, &d.reason, &d.approver).map(Some),
                _ => Ok(None),
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::unavailable(e.to_string()))?
        .ok_or_else(|| Status::not_found(format!("no approval {} in your team's history", d.id)))?;
        Ok(Response::new(DecideReply { decided }))
    }

    async fn answer(&self, req: Request<AnswerRequest>) -> Result<Response<AnswerReply>, Status> {
        let who = reader(Identity::of(&req))?;
        let store = self.store.clone();
        let a = req.into_inner();
        let answered = tokio::task::spawn_blocking(move || -> Result<Option<bool>, StoreError> {
            match store.question(a.id)? {
                Some(q) if who.sees(&q.team) => store.settle_question(a.id, Some(&a.answer), &format!("person:{}", a.answerer), steppe_runtime::store::now_ms()).map(Some),
                _ => Ok(None),
            }
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(|e| Status::unavailable(e.to_string()))?
        .ok_or_else(|| Status::not_found(format!("no question {} in your team's history", a.id)))?;
        Ok(Response::new(AnswerReply { answered }))
    }
}

/// A coordinator's store seen from the command line. Only reads and
/// approval decisions go over the wire; recording is the coordinator's job.
pub struct RemoteStore {
    url: String,
    rt: tokio::runtime::Runtime,
    client: HistoryClient<InterceptedService<Channel, WithToken>>,
    artifacts: ArtifactsClient<InterceptedService<Channel, WithToken>>,
}

impl RemoteStore {
    pub fn connect(remote: &Remote) -> anyhow::Result<RemoteStore> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let channel = rt.block_on(remote.channel())?;
        Ok(RemoteStore {
            url: remote.url.clone(),
            client: HistoryClient::with_interceptor(channel.clone(), remote.bearer()?),
            artifacts: ArtifactsClient::with_interceptor(channel, remote.bearer()?),
            rt,
        })
    }

    /// Fetches a stored tree from the coordinator into `dest` (through a
    /// local store under `scratch`, so its digest is checked on arrival).
    pub fn fetch(&self, digest: &str, scratch: &std::path::Path, dest: &std::path::Path) -> anyhow::Result<()> {
        use std::io::Write;
        let mut client = self.artifacts.clone();
        let tar_path = scratch.join("fetched.tar");
        let mut tar = std::fs::File::create(&tar_path)?;
        self.rt.block_on(async {
            let mut stream = client.fetch(steppe_proto::v1::ArtifactRef { digest: digest.to_string() }).await.map_err(|s| anyhow::anyhow!("the coordinator refused: {}", s.message()))?.into_inner();
            while let Some(chunk) = stream.message().await.map_err(|s| anyhow::anyhow!("fetching artifact {digest}: {}", s.message()))? {
                tar.write_all(&chunk.data)?;
            }
            anyhow::Ok(())
        })?;
        let store = steppe_runtime::artifacts::LocalArtifactStore::new(&scratch.join("store"))?;
        let got = store.put_tar(&mut std::fs::File::open(&tar_path)?)?;
        if got.digest != digest {
            anyhow::bail!("artifact {digest} arrived with digest {}", got.digest);
        }
        steppe_runtime::artifacts::ArtifactStore::materialize(&store, &got, dest)?;
        Ok(())
    }

    fn err(&self, message: impl ToString) -> StoreError {
        StoreError::Remote { url: self.url.clone(), message: message.to_string() }
    }

    fn ask(&self, what: What) -> Result<Reply, StoreError> {
        let mut client = self.client.clone();
        let reply = self.rt.block_on(client.query(HistoryQuery { what: Some(what) })).map_err(|s| self.err(s.message()))?;
        reply.into_inner().reply.ok_or_else(|| self.err("an empty reply"))
    }

    /// A reply of another kind than was asked for.
    fn unexpected(&self, asked: &str, got: &Reply) -> StoreError {
        self.err(format!("asked for {asked}, the reply holds {}", reply_kind(got)))
    }

    fn read_only(&self) -> StoreError {
        self.err("the coordinator records runs itself; this client only reads")
    }
}

impl Store for RemoteStore {
    fn start_run(&self, _: &RunRecord) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn finish_run(&self, _: &RunRecord) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn record_step(&self, _: &StepRecord) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn append_logs(&self, _: &str, _: &[LogLine]) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    /// The coordinator applies the team its token belongs to; `f.team` is not sent.
    fn runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        let limit = u32::try_from(f.limit.saturating_add(f.skip)).unwrap_or(u32::MAX);
        let q = RunsQuery { job: f.job.unwrap_or_default().to_string(), pipeline: f.pipeline.unwrap_or_default().to_string(), limit };
        match self.ask(What::Runs(q))? {
            Reply::Runs(l) => Ok(l.runs.into_iter().skip(f.skip).map(run_from_wire).collect()),
            other => Err(self.unexpected("runs", &other)),
        }
    }
    fn pipelines(&self, _team: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError> {
        match self.ask(What::Pipelines(v1::PipelinesQuery {}))? {
            Reply::Pipelines(l) => Ok(l.pipelines.into_iter().filter_map(pipeline_from_wire).collect()),
            other => Err(self.unexpected("pipelines", &other)),
        }
    }
    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        match self.ask(What::Run(id.to_string()))? {
            Reply::Run(found) => Ok(found.run.map(run_from_wire)),
            other => Err(self.unexpected("a run", &other)),
        }
    }
    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        match self.ask(What::Steps(run_id.to_string()))? {
            Reply::Steps(l) => Ok(l.steps.into_iter().map(step_from_wire).collect()),
            other => Err(self.unexpected("steps", &other)),
        }
    }
    fn add_spans(&self, _: &str, _: &[steppe_runtime::trace::SpanRecord]) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn spans(&self, run_id: &str) -> Result<Vec<steppe_runtime::trace::SpanRecord>, StoreError> {
        match self.ask(What::Spans(run_id.to_string()))? {
            Reply::Spans(l) => Ok(l.spans.into_iter().map(steppe_runtime::wire::trace::span_from_wire).collect()),
            other => Err(self.unexpected("spans", &other)),
        }
    }
    fn logs(&self, run_id: &str) -> Result<Vec<LogLine>, StoreError> {
        match self.ask(What::Logs(run_id.to_string()))? {
            Reply::Logs(l) => Ok(l.lines.into_iter().map(log_from_wire).collect()),
            other => Err(self.unexpected("logs", &other)),
        }
    }
    fn record_events(&self, _: &str, _: &[RunEvent]) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn heartbeat(&self, _: &str, _: i64, _: i64) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn add_spend(&self, _: &str, _: u64) -> Result<u64, StoreError> {
        Err(self.read_only())
    }
    fn orphaned_runs(&self, _: i64) -> Result<Vec<RunRecord>, StoreError> {
        Err(self.read_only())
    }
    fn events_after(&self, run_id: &str, after: usize) -> Result<Vec<RunEvent>, StoreError> {
        match self.ask(What::EventsAfter(v1::EventsQuery { run_id: run_id.to_string(), after: after as u64 }))? {
            Reply::Events(l) => Ok(l.events.into_iter().map(event_from_wire).collect()),
            other => Err(self.unexpected("events", &other)),
        }
    }
    fn request_approval(&self, _: &Scope, _: &str, _: &str, _: &str, _: i64, _: i64) -> Result<i64, StoreError> {
        Err(self.read_only())
    }
    fn approval(&self, id: i64) -> Result<Option<ApprovalRecord>, StoreError> {
        match self.ask(What::Approval(id))? {
            Reply::Approval(found) => Ok(found.approval.map(approval_from_wire)),
            other => Err(self.unexpected("an approval", &other)),
        }
    }
    fn pending_approvals(&self, _team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> {
        match self.ask(What::Pending(v1::PendingQuery { pipeline: pipeline.unwrap_or_default().to_string() }))? {
            Reply::Approvals(l) => Ok(l.approvals.into_iter().map(approval_from_wire).collect()),
            other => Err(self.unexpected("pending approvals", &other)),
        }
    }
    fn decide_approval(&self, id: i64, approve: bool, reason: &str, approver: &str) -> Result<bool, StoreError> {
        let mut client = self.client.clone();
        let req = DecideRequest { id, approve, reason: reason.to_string(), approver: approver.to_string() };
        let reply = self.rt.block_on(client.decide(req)).map_err(|s| self.err(s.message()))?;
        Ok(reply.into_inner().decided)
    }
    fn ask_question(&self, _: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError> {
        Err(self.read_only())
    }
    fn question(&self, id: i64) -> Result<Option<QuestionRecord>, StoreError> {
        match self.ask(What::Question(id))? {
            Reply::Question(found) => Ok(found.question.map(question_from_wire)),
            other => Err(self.unexpected("a question", &other)),
        }
    }
    fn pending_questions(&self, _team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError> {
        match self.ask(What::PendingQuestions(v1::PendingQuery { pipeline: pipeline.unwrap_or_default().to_string() }))? {
            Reply::Questions(l) => Ok(l.questions.into_iter().map(question_from_wire).collect()),
            other => Err(self.unexpected("pending questions", &other)),
        }
    }
    /// Only a person's answer goes over the wire (`source` is `person:<name>`).
    fn settle_question(&self, id: i64, answer: Option<&str>, source: &str, _: i64) -> Result<bool, StoreError> {
        let (Some(answer), Some(answerer)) = (answer, source.strip_prefix("person:")) else {
            return Err(self.read_only());
        };
        let mut client = self.client.clone();
        let req = AnswerRequest { id, answer: answer.to_string(), answerer: answerer.to_string() };
        let reply = self.rt.block_on(client.answer(req)).map_err(|s| self.err(s.message()))?;
        Ok(reply.into_inner().answered)
    }
    fn record_versions(&self, _: &Scope, _: &str, _: &[serde_json::Value]) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn history(&self, _: &Scope, _: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        Err(self.read_only())
    }
    fn record_green(&self, _: &Scope, _: &str, _: &str, _: &serde_json::Value) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn green(&self, _: &Scope, _: &str, _: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        Err(self.read_only())
    }
    fn record_chain(&self, _: &Scope, _: &str, _: &str) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn chain_succeeded(&self, _: &Scope, _: &str, _: &str) -> Result<bool, StoreError> {
        Err(self.read_only())
    }
    fn set_value(&self, _: &Scope, _: &str, _: Option<&str>) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn forget_versions(&self, _: &Scope, _: &str, _: &[serde_json::Value], _: &[String]) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn delete_run(&self, _: &steppe_runtime::store::RunRecord) -> Result<(), StoreError> {
        Err(self.read_only())
    }
    fn value(&self, _: &Scope, _: &str) -> Result<Option<String>, StoreError> {
        Err(self.read_only())
    }
}
