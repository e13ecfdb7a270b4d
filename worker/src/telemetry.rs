//! This process's spans. Made with the OpenTelemetry API; each one that
//! names its run (`steppe.run`) is kept for the run's store (a worker's go
//! back with their assignment's result), and all of them are exported over
//! OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `…_TRACES_ENDPOINT`)
//! says where. Before [`init`] (a library user, a unit test) the API is a
//! no-op and nothing is kept.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::{SpanBuilder, SpanContext, SpanId, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanProcessor};
use steppe_runtime::trace::{parse_traceparent, traceparent, SpanRecord, RUN_ATTRIBUTE};

/// Spans kept per run, at most this many per run (a runaway loop of tool
/// calls cannot hold a worker's memory).
const KEEP_PER_RUN: usize = 20_000;

struct Kept {
    by_run: Mutex<HashMap<String, Vec<SpanRecord>>>,
    process: String,
}

impl std::fmt::Debug for Kept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Kept")
    }
}

#[derive(Debug)]
struct KeepProcessor(Arc<Kept>);

fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)).unwrap_or(0)
}

impl SpanProcessor for KeepProcessor {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        // A span of no run (a submitter's) is only exported.
        let Some(run) = span.attributes.iter().find(|kv| kv.key.as_str() == RUN_ATTRIBUTE).map(|kv| kv.value.to_string()).filter(|r| !r.is_empty()) else { return };
        let parent = if span.parent_span_id == SpanId::INVALID { String::new() } else { span.parent_span_id.to_string() };
        let record = SpanRecord {
            trace_id: span.span_context.trace_id().to_string(),
            span_id: span.span_context.span_id().to_string(),
            parent_id: parent,
            name: span.name.to_string(),
            start_ns: unix_ns(span.start_time),
            end_ns: unix_ns(span.end_time),
            attributes: span.attributes.iter().filter(|kv| kv.key.as_str() != RUN_ATTRIBUTE).map(|kv| (kv.key.to_string(), kv.value.to_string())).collect(),
            error: match &span.status {
                Status::Error { description } => Some(description.to_string()),
                _ => None,
            },
            process: self.0.process.clone(),
        };
        if let Ok(mut m) = self.0.by_run.lock() {
            let v = m.entry(run).or_default();
            if v.len() < KEEP_PER_RUN {
                v.push(record);
            }
        }
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        Ok(())
    }
}

static KEPT: OnceLock<Arc<Kept>> = OnceLock::new();
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();
/// The provider's tracer, made once (the global one is looked up and boxed
/// on every call).
static TRACER: OnceLock<opentelemetry_sdk::trace::SdkTracer> = OnceLock::new();

/// Whether the standard variables ask for an OTLP export.
pub fn exporting() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|v| std::env::var(v).is_ok_and(|x| !x.trim().is_empty()))
}

/// Starts this process's tracing as `role` (`run`, `coordinator`,
/// `worker`, `submit`, …). Call it inside the tokio runtime that lives as
/// long as the process (the OTLP exporter's channel runs on it); once.
pub fn init(role: &str) {
    let host = std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()).unwrap_or_else(|| "localhost".into());
    let instance = format!("{host}:{}", std::process::id());
    let kept = KEPT.get_or_init(|| Arc::new(Kept { by_run: Mutex::new(HashMap::new()), process: format!("{role} {instance}") })).clone();
    if PROVIDER.get().is_some() {
        return;
    }
    let service = std::env::var("OTEL_SERVICE_NAME").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| "steppe".into());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service)
        .with_attributes([KeyValue::new("service.instance.id", instance), KeyValue::new("steppe.role", role.to_string())])
        .build();
    let mut builder = SdkTracerProvider::builder().with_resource(resource).with_span_processor(KeepProcessor(kept));
    if exporting() {
        match opentelemetry_otlp::SpanExporter::builder().with_tonic().build() {
            Ok(exporter) => builder = builder.with_batch_exporter(exporter),
            Err(e) => eprintln!("steppe: OTLP export is configured but cannot start: {e}; spans are kept in the run store only"),
        }
    }
    let provider = builder.build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    let _ = TRACER.set(opentelemetry::trace::TracerProvider::tracer(&provider, "steppe"));
    let _ = PROVIDER.set(provider);
}

/// Sends what the exporter still holds (at the end of a command; waits at
/// most a few seconds for a collector).
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        let _ = p.shutdown_with_timeout(Duration::from_secs(5));
    }
}

/// The spans of `run` ended in this process so far (taken: each is handed
/// out once).
pub fn take(run: &str) -> Vec<SpanRecord> {
    KEPT.get().and_then(|k| k.by_run.lock().ok().and_then(|mut m| m.remove(run))).unwrap_or_default()
}

/// This process as spans name it (`worker HOST:PID`).
pub fn process() -> String {
    KEPT.get().map(|k| k.process.clone()).unwrap_or_default()
}

/// A span of `run` under `parent`, started now (or at `start`): the context
/// that holds it. It ends with [`end`], or when its last context is dropped.
pub fn start(parent: &Context, run: &str, name: impl Into<Cow<'static, str>>, attributes: Vec<KeyValue>, at: Option<SystemTime>) -> Context {
    let mut attrs = attributes;
    attrs.push(KeyValue::new(RUN_ATTRIBUTE, run.to_string()));
    let mut b = SpanBuilder::from_name(name).with_attributes(attrs);
    if let Some(t) = at {
        b = b.with_start_time(t);
    }
    match TRACER.get() {
        Some(tracer) => parent.with_span(tracer.build_with_context(b, parent)),
        None => parent.with_span(opentelemetry::global::tracer("steppe").build_with_context(b, parent)),
    }
}

/// Ends the span `cx` holds: in error with `error`'s words, or ok.
pub fn end(cx: &Context, error: Option<&str>) {
    let span = cx.span();
    match error {
        Some(e) => span.set_status(Status::error(e.to_string())),
        None => span.set_status(Status::Ok),
    }
    span.end();
}

/// Sets attributes on the span `cx` holds.
pub fn set(cx: &Context, attributes: Vec<KeyValue>) {
    let span = cx.span();
    for kv in attributes {
        span.set_attribute(kv);
    }
}

/// The W3C traceparent of the span `cx` holds (empty when there is none).
pub fn parent_of(cx: &Context) -> String {
    let sc = cx.span().span_context().clone();
    if !sc.is_valid() {
        return String::new();
    }
    traceparent(&sc.trace_id().to_string(), &sc.span_id().to_string(), sc.is_sampled())
}

/// A context whose span is the remote one `traceparent` names (from a
/// queue entry or gRPC metadata); the current one when it names none.
pub fn remote(traceparent: &str) -> Context {
    let Some((trace, span, sampled)) = parse_traceparent(traceparent) else { return Context::current() };
    let (Ok(trace), Ok(span)) = (TraceId::from_hex(&trace), SpanId::from_hex(&span)) else { return Context::current() };
    let flags = if sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
    Context::current().with_remote_span_context(SpanContext::new(trace, span, flags, true, TraceState::default()))
}

/// A Unix time in nanoseconds as a SystemTime.
pub fn at_unix_ns(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

/// Now, in Unix nanoseconds.
pub fn now_ns() -> u64 {
    unix_ns(SystemTime::now())
}
