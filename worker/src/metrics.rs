//! What a coordinator or worker tells an autoscaler and an operator:
//! Prometheus text on `/metrics` (`--metrics ADDR`), and `/healthz` and
//! `/readyz` for probes.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabel {
    pub pool: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

/// Every figure; the gauges are set when scraped (see [`serve`]).
pub struct Metrics {
    registry: Registry,
    pub backlog: Family<PoolLabel, Gauge>,
    pub in_flight: Family<PoolLabel, Gauge>,
    pub oldest_waiting_seconds: Family<PoolLabel, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub workers_connected: Family<PoolLabel, Gauge>,
    pub slots_free: Family<PoolLabel, Gauge>,
    pub steps_started: Counter,
    pub steps_finished: Family<OutcomeLabel, Counter>,
    pub queue_wait_seconds: Histogram,
    pub run_seconds: Histogram,
    pub tokens: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("steppe");
        let m = Metrics {
            registry: Registry::default(),
            backlog: Family::default(),
            in_flight: Family::default(),
            oldest_waiting_seconds: Family::default(),
            workers_connected: Family::default(),
            slots_free: Family::default(),
            steps_started: Counter::default(),
            steps_finished: Family::default(),
            queue_wait_seconds: Histogram::new(exponential_buckets(0.001, 4.0, 10)),
            run_seconds: Histogram::new(exponential_buckets(0.01, 4.0, 10)),
            tokens: Counter::default(),
        };
        registry.register("queue_backlog", "Assignments waiting for a worker, per pool", m.backlog.clone());
        registry.register("queue_in_flight", "Assignments a worker is running, per pool", m.in_flight.clone());
        registry.register("queue_oldest_waiting_seconds", "How long the oldest waiting assignment has waited, per pool", m.oldest_waiting_seconds.clone());
        registry.register("workers_connected", "Workers connected, per pool", m.workers_connected.clone());
        registry.register("worker_slots_free", "Worker slots not running a step, per pool", m.slots_free.clone());
        registry.register("steps_started", "Steps handed to the queue", m.steps_started.clone());
        registry.register("steps_finished", "Steps finished, by outcome", m.steps_finished.clone());
        registry.register("queue_wait_seconds", "Time from queueing to a worker taking it", m.queue_wait_seconds.clone());
        registry.register("run_seconds", "Time from a worker taking a step to its result", m.run_seconds.clone());
        registry.register("tokens", "Model tokens agent steps used", m.tokens.clone());
        Metrics { registry, ..m }
    }
}

impl Metrics {
    /// A step ended: its outcome counted, its tokens added.
    pub fn finished(&self, r: &steppe_runtime::assignment::AssignmentResult) {
        let outcome = steppe_runtime::outcome::Outcome::of(&r.result).word().to_string();
        self.steps_finished.get_or_create(&OutcomeLabel { outcome }).inc();
        if let Some(a) = &r.agent {
            self.tokens.inc_by(a.tokens);
        }
    }

    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

pub type Refresh = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;
pub type Ready = Arc<dyn Fn() -> bool + Send + Sync>;

/// Serves `/metrics` (after `refresh` sets the gauges), `/healthz` (the
/// process answers) and `/readyz` (`ready`: it can take work) on `addr`.
pub async fn serve(addr: std::net::SocketAddr, metrics: Arc<Metrics>, refresh: Refresh, ready: Ready) -> std::io::Result<std::net::SocketAddr> {
    use axum::http::{header, StatusCode};
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let (metrics, refresh) = (metrics.clone(), refresh.clone());
                async move {
                    refresh().await;
                    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render())
                }
            }),
        )
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let ready = ready();
                async move {
                    if ready {
                        (StatusCode::OK, "ready\n")
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
                    }
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_render_as_prometheus_text() {
        let m = Metrics::default();
        m.backlog.get_or_create(&PoolLabel { pool: "gpu".into() }).set(3);
        m.steps_started.inc();
        m.finished(&steppe_runtime::assignment::AssignmentResult::with_id("a", 0, Ok(())));
        m.queue_wait_seconds.observe(0.02);
        let t = m.render();
        assert!(t.contains("steppe_queue_backlog{pool=\"gpu\"} 3"), "{t}");
        assert!(t.contains("steppe_steps_started_total 1"), "{t}");
        assert!(t.contains("steppe_steps_finished_total{outcome=\"succeeded\"} 1"), "{t}");
        assert!(t.contains("steppe_queue_wait_seconds_count 1"), "{t}");
    }
}
