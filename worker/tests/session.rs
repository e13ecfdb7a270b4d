//! `steppe worker` against a stand-in coordinator: an assignment it cannot
//! read is reported errored under its id, and the session carries on.

use std::time::Duration;

use steppe_proto::v1::coordinator_server::{Coordinator, CoordinatorServer};
use steppe_proto::v1::{self as v1, coordinator_message, worker_message, CoordinatorMessage, WorkerMessage};
use steppe_runtime::assignment::Assignment;
use steppe_runtime::wire::assignment_to_wire;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

/// Welcomes one worker, sends it `assignments`, and passes on the results it sends back.
struct Stand {
    assignments: Vec<v1::Assignment>,
    results: mpsc::Sender<v1::AssignmentResult>,
}

#[tonic::async_trait]
impl Coordinator for Stand {
    type SessionStream = ReceiverStream<Result<CoordinatorMessage, Status>>;

    async fn spend(&self, _: Request<v1::SpendRequest>) -> Result<Response<v1::SpendReply>, Status> {
        Err(Status::unimplemented("this stand keeps no budgets"))
    }

    async fn ask(&self, _: Request<v1::QuestionRecord>) -> Result<Response<v1::AskReply>, Status> {
        Err(Status::unimplemented("this stand keeps no questions"))
    }

    async fn question(&self, _: Request<v1::QuestionRef>) -> Result<Response<v1::FoundQuestion>, Status> {
        Err(Status::unimplemented("this stand keeps no questions"))
    }

    async fn settle(&self, _: Request<v1::SettleRequest>) -> Result<Response<v1::SettleReply>, Status> {
        Err(Status::unimplemented("this stand keeps no questions"))
    }

    async fn session(&self, req: Request<Streaming<WorkerMessage>>) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(16);
        let welcome = v1::Welcome { heartbeat_ms: 1000, ephemeral: true, ..Default::default() };
        let mut out = vec![coordinator_message::Msg::Welcome(welcome)];
        out.extend(self.assignments.iter().cloned().map(coordinator_message::Msg::Assignment));
        for msg in out {
            let _ = tx.send(Ok(CoordinatorMessage { msg: Some(msg) })).await;
        }
        let results = self.results.clone();
        tokio::spawn(async move {
            // The session stays open while the worker talks.
            let _session = tx;
            while let Ok(Some(m)) = inbound.message().await {
                if let Some(worker_message::Msg::Result(r)) = m.msg {
                    let _ = results.send(r).await;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

#[tokio::test]
async fn an_unreadable_assignment_is_reported_errored_and_the_session_goes_on() {
    let work = std::env::temp_dir().join(format!("steppe-session-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let mut unreadable = assignment_to_wire(&Assignment { id: "bad".into(), epoch: 4, ..Assignment::command("r", "s", "true".into()) });
    unreadable.template = Some(v1::Json { nodes: vec![] });
    let readable = assignment_to_wire(&Assignment { id: "good".into(), ..Assignment::command("r", "s", "true".into()) });
    let (results_tx, mut results) = mpsc::channel(4);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stand = Stand { assignments: vec![unreadable, readable], results: results_tx };
    tokio::spawn(tonic::transport::Server::builder().add_service(CoordinatorServer::new(stand)).serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)));
    let worker = tokio::spawn(steppe_worker::remote::run(steppe_worker::remote::WorkerConfig {
        url,
        slots: 2,
        name: "w".into(),
        work_root: work.clone(),
        token: None,
        stream_artifacts: true,
        tls_ca: None,
        queue: None,
        pool: String::new(),
        reconnect_for: Duration::ZERO,
        exit_when_idle: None,
        metrics: None,
        containers: false,
    }));
    let mut got = Vec::new();
    while got.len() < 2 {
        let r = tokio::time::timeout(Duration::from_secs(30), results.recv()).await.expect("a result within 30 s").expect("the stand is up");
        got.push(r);
    }
    got.sort_by(|a, b| a.assignment_id.cmp(&b.assignment_id));
    let (bad, good) = (&got[0], &got[1]);
    assert_eq!((bad.assignment_id.as_str(), bad.epoch, bad.class), ("bad", 4, v1::OutcomeClass::Errored as i32));
    assert!(bad.message.contains("could not read assignment bad: Assignment.template: the nodes end"), "{}", bad.message);
    assert_eq!((good.assignment_id.as_str(), good.class), ("good", v1::OutcomeClass::Succeeded as i32), "{}", good.message);
    worker.abort();
    let _ = std::fs::remove_dir_all(&work);
}
