//! One trace per run, across processes: a real OTLP/gRPC receiver on
//! loopback (the collector's own `TraceService`, from opentelemetry-proto)
//! gets the spans of a submitter, a coordinator and two workers, and they
//! form one trace with every parent present; the run's store keeps the
//! same spans, drawn by `steppe runs --trace`.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

/// A span as received: (trace id, span id, parent id, name, start, end, the sending process, its attributes).
#[derive(Clone, Debug)]
struct Got {
    trace: String,
    span: String,
    parent: String,
    name: String,
    start: u64,
    end: u64,
    process: String,
    attributes: HashMap<String, String>,
}

#[derive(Default, Clone)]
struct Receiver(Arc<Mutex<Vec<Got>>>);

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(&self, req: tonic::Request<ExportTraceServiceRequest>) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = Vec::new();
        for rs in req.into_inner().resource_spans {
            let process = rs.resource.iter().flat_map(|r| &r.attributes).find(|a| a.key == "service.instance.id").map(|a| text(&a.value)).unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    got.push(Got {
                        trace: hex(&s.trace_id),
                        span: hex(&s.span_id),
                        parent: hex(&s.parent_span_id),
                        name: s.name,
                        start: s.start_time_unix_nano,
                        end: s.end_time_unix_nano,
                        process: process.clone(),
                        attributes: s.attributes.iter().map(|a| (a.key.clone(), text(&a.value))).collect(),
                    });
                }
            }
        }
        self.0.lock().expect("lock").extend(got);
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The receiver on a free loopback port, served on a runtime of its own.
fn receiver() -> (Receiver, String, tokio::runtime::Runtime) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
    let r = Receiver::default();
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).expect("bind");
    let addr = listener.local_addr().expect("addr");
    let served = r.clone();
    rt.spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let _ = tonic::transport::Server::builder().add_service(TraceServiceServer::new(served)).serve_with_incoming(incoming).await;
    });
    (r, format!("http://{addr}"), rt)
}

#[test]
fn a_run_through_a_cluster_is_one_trace_across_its_processes() {
    let (got, endpoint, _rt) = receiver();
    let work = scratch("telemetry");
    let otel = [("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()), ("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let (mut redis, redis_url) = redis_server();
    let spawn = |args: &[&str]| {
        let mut c = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
        c.args(args).current_dir(&work).envs(otel).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c
    };
    let (mut coord, url, _log) = serving_child_logged(spawn(&["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--queue", &redis_url, "--store", &redis_url]).spawn().expect("coordinator"));
    let worker = |name: &str| {
        let mut c = child_of_this_test(env!("CARGO_BIN_EXE_steppe"));
        c.args(["worker", "--coordinator", &url, "--slots", "1"]).envs(otel).env("HOSTNAME", name).stderr(std::process::Stdio::null());
        c.spawn().expect("worker")
    };
    let mut workers = [worker("w-one"), worker("w-two")];
    std::fs::write(work.join("p.yml"), "jobs:\n- name: spread\n  plan:\n  - in_parallel:\n    - {task: a, run: sleep 0.4}\n    - {task: b, run: sleep 0.4}\n    - {task: c, run: sleep 0.4}\n    - {task: d, run: sleep 0.4}\n").expect("write");
    let out = child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["submit", "p.yml", "--coordinator", &url]).current_dir(&work).envs(otel).env("HOSTNAME", "submitter").output().expect("submit");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    // The run's spans from the submitter, the coordinator and both workers.
    let processes = || got.0.lock().map(|g| g.iter().map(|s| s.process.split(':').next().unwrap_or_default().to_string()).collect::<HashSet<_>>()).unwrap_or_default();
    wait_for("spans from the submitter and both workers", Duration::from_secs(20), || ["submitter", "w-one", "w-two"].iter().all(|p| processes().contains(*p)));
    // Each process exports in its own batches: wait for the run's span and every step's execution.
    wait_for("the run's own span and every execution", Duration::from_secs(20), || {
        got.0.lock().is_ok_and(|g| ["run spread", "execute a", "execute b", "execute c", "execute d"].iter().all(|n| g.iter().any(|s| s.name == *n)))
    });
    let spans = got.0.lock().expect("lock").clone();
    let traces: HashSet<&str> = spans.iter().map(|s| s.trace.as_str()).collect();
    assert_eq!(traces.len(), 1, "one trace: {spans:#?}");
    // Every parent is a span of the trace; the one root is the submitter's.
    let ids: HashSet<&str> = spans.iter().map(|s| s.span.as_str()).collect();
    let roots: Vec<&Got> = spans.iter().filter(|s| s.parent.is_empty()).collect();
    assert_eq!(roots.len(), 1, "{roots:#?}");
    assert!(roots[0].name.starts_with("submit ") && roots[0].process.starts_with("submitter"), "{roots:#?}");
    for s in &spans {
        assert!(s.parent.is_empty() || ids.contains(s.parent.as_str()), "{} has no parent in the trace: {spans:#?}", s.name);
    }
    let by_id: HashMap<&str, &Got> = spans.iter().map(|s| (s.span.as_str(), s)).collect();
    let parent_name = |s: &Got| by_id.get(s.parent.as_str()).map(|p| p.name.clone()).unwrap_or_default();
    let run = spans.iter().find(|s| s.name == "run spread").expect("run span");
    assert_eq!(parent_name(run), roots[0].name, "the run is under the submission");
    assert!(!run.process.starts_with("w-") && !run.process.starts_with("submitter"), "the coordinator made the run's span: {run:?}");
    // Each step's execution on a worker, under its attempt, after a queue wait.
    for step in ["a", "b", "c", "d"] {
        let exec = spans.iter().find(|s| s.name == format!("execute {step}")).unwrap_or_else(|| panic!("execute {step}: {spans:#?}"));
        assert!(exec.process.starts_with("w-"), "{exec:?}");
        assert_eq!(parent_name(exec), "attempt 1");
        assert_eq!(exec.attributes.get("pool").map(String::as_str), Some("default"));
        let wait = spans.iter().find(|s| s.name == "queue wait" && s.parent == exec.parent).unwrap_or_else(|| panic!("queue wait of {step}"));
        assert!(wait.end >= wait.start && wait.end <= exec.start + 1_000_000, "{wait:?} {exec:?}");
        let attempt = by_id[exec.parent.as_str()];
        assert_eq!(parent_name(attempt), format!("step {step}"));
    }
    // Both workers ran some.
    let ran: HashSet<String> = spans.iter().filter(|s| s.name.starts_with("execute ")).map(|s| s.process.split(':').next().unwrap_or_default().to_string()).collect();
    assert_eq!(ran.len(), 2, "{ran:?}");
    // The store has the run's spans too: the waterfall with no collector.
    let trace = String::from_utf8_lossy(&child_of_this_test(env!("CARGO_BIN_EXE_steppe")).args(["runs", "--coordinator", &url, "--trace"]).output().expect("runs").stdout).into_owned();
    assert!(trace.contains("run spread") && trace.contains("execute a") && trace.contains("queue wait") && trace.contains(roots[0].trace.as_str()), "{trace}");
    stop(workers.iter_mut().chain([&mut coord, &mut redis]));
}
