//! Google Cloud Pub/Sub as the queue of a cluster: a topic and a subscription
//! per pool, made if missing with a dead-letter topic after `max_receives`
//! deliveries; the lease is the ack deadline, extended while a step runs.
//! `PUBSUB_EMULATOR_HOST` points it at the emulator.

use std::time::Duration;

use gcloud_googleapis::pubsub::v1::{DeadLetterPolicy, PubsubMessage};
use gcloud_pubsub::apiv1::conn_pool::ConnectionManager;
use gcloud_pubsub::apiv1::subscriber_client::SubscriberClient;
use gcloud_googleapis::pubsub::v1::PullRequest;
use gcloud_pubsub::client::{Client, ClientConfig};
use gcloud_pubsub::publisher::{Publisher, PublisherConfig};
use gcloud_pubsub::subscriber::ReceivedMessage;
use gcloud_pubsub::subscription::SubscriptionConfig;
use prost::Message;
use steppe_runtime::assignment::Assignment;
use steppe_runtime::queue::{BoxFuture, Queue, QueueError};
use steppe_runtime::wire::{assignment_from_wire, assignment_to_wire};

use crate::held::{Held, Received};
use crate::queue_options::{queue_name, QueueOptions};

const ENCODING: &str = "steppe.v1.Assignment";
const ENC_ATTRIBUTE: &str = "enc";
/// Pub/Sub's limit on a message (10 MB), less room for attributes.
const DATA_MAX: usize = 10 * 1000 * 1000 - 4096;

pub struct PubSubQueue {
    shown: String,
    topic: String,
    publisher: Publisher,
    /// Pulls that return at once (a Pull left waiting on the server would
    /// take a message for an ack deadline after its caller gave up).
    puller: SubscriberClient,
    /// The subscription's full name.
    fqsn: String,
    /// The dead-letter subscription's full name, when there is one.
    dead: Option<String>,
    dead_topic: String,
    lease_secs: i32,
    /// The messages this consumer took, and the rest it keeps.
    held: Held<ReceivedMessage>,
}

/// `pubsub://PROJECT/PREFIX` → (project, prefix).
pub fn parse_url(url: &str) -> Result<(String, String), String> {
    let rest = url.strip_prefix("pubsub://").ok_or_else(|| format!("{url}: a Pub/Sub queue is pubsub://PROJECT/PREFIX"))?;
    match rest.trim_end_matches('/').split_once('/') {
        Some((project, prefix)) if !project.is_empty() && !prefix.is_empty() && !prefix.contains('/') => Ok((project.to_string(), prefix.to_string())),
        _ => Err(format!("{url}: a Pub/Sub queue is pubsub://PROJECT/PREFIX")),
    }
}

impl PubSubQueue {
    /// Opens pool key `key`'s topic and subscription in `project`, making
    /// them (and the dead-letter topic) when missing and allowed.
    pub async fn connect(project: &str, key: &str, lease: Duration, options: &QueueOptions) -> Result<Self, QueueError> {
        let name = queue_name(key);
        let shown = format!("pubsub://{project}/{name}");
        let err = |what: &str, e: String| QueueError::Backend { url: shown.clone(), message: format!("{what}: {e}") };
        crate::install_crypto();
        let config = || async { ClientConfig { project_id: Some(project.to_string()), ..ClientConfig::default() }.with_auth().await.map_err(|e| err("credentials", e.to_string())) };
        let client = Client::new(config().await?).await.map_err(|e| err("connecting", e.to_string()))?;
        let c = config().await?;
        let cm = || async { ConnectionManager::new(c.pool_size, &c.endpoint, &c.environment, &c.connection_option).await.map_err(|e| err("connecting", e.to_string())) };
        let puller = SubscriberClient::new(cm().await?, cm().await?);
        let lease_secs = i32::try_from(lease.as_secs().clamp(10, 600)).unwrap_or(60);
        let topic = client.topic(&name);
        let dead_topic = client.topic(&format!("{name}-dead"));
        let subscription = client.subscription(&format!("{name}-workers"));
        let dead_sub = client.subscription(&format!("{name}-dead-sub"));
        let exists = subscription.exists(None).await.map_err(|e| err("finding the subscription", e.message().to_string()))?;
        if !exists {
            if !options.create {
                return Err(err("the subscription does not exist", "make it, or start without --no-create-queues".into()));
            }
            for t in [&dead_topic, &topic] {
                if !t.exists(None).await.map_err(|e| err("finding a topic", e.message().to_string()))? {
                    t.create(None, None).await.map_err(|e| err("making a topic", e.message().to_string()))?;
                }
            }
            if !dead_sub.exists(None).await.map_err(|e| err("finding the dead-letter subscription", e.message().to_string()))? {
                dead_sub.create(dead_topic.fully_qualified_name(), SubscriptionConfig::default(), None).await.map_err(|e| err("making the dead-letter subscription", e.message().to_string()))?;
            }
            let config = SubscriptionConfig {
                ack_deadline_seconds: lease_secs,
                dead_letter_policy: Some(DeadLetterPolicy { dead_letter_topic: dead_topic.fully_qualified_name().to_string(), max_delivery_attempts: i32::try_from(options.max_receives.clamp(5, 100)).unwrap_or(5) }),
                ..SubscriptionConfig::default()
            };
            subscription.create(topic.fully_qualified_name(), config, None).await.map_err(|e| err("making the subscription", e.message().to_string()))?;
        }
        let dead = dead_sub.exists(None).await.ok().filter(|e| *e).map(|_| dead_sub.fully_qualified_name().to_string());
        // Each assignment goes at once: a step waits on it, and batching
        // (the client's default: 3 messages or 100 ms) would add the wait to every step.
        let publisher = topic.new_publisher(Some(PublisherConfig { bundle_size: 1, flush_interval: Duration::from_millis(5), ..PublisherConfig::default() }));
        Ok(PubSubQueue {
            shown,
            topic: name,
            publisher,
            puller,
            fqsn: subscription.fully_qualified_name().to_string(),
            dead,
            dead_topic: format!("{}-dead", queue_name(key)),
            lease_secs,
            held: Held::default(),
        })
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> QueueError {
        QueueError::Backend { url: self.shown.clone(), message: format!("{what}: {e}") }
    }

    /// Up to `max` messages of subscription `fqsn`, by a Pull that returns at once.
    async fn pull_now(&self, fqsn: &str, max: i32) -> Result<Vec<ReceivedMessage>, QueueError> {
        #[allow(deprecated)]
        let req = PullRequest { subscription: fqsn.to_string(), return_immediately: true, max_messages: max };
        let got = self.puller.pull(req, None).await.map_err(|e| self.err("pulling", e.message()))?.into_inner().received_messages;
        Ok(got
            .into_iter()
            .filter_map(|r| {
                Some(ReceivedMessage {
                    message: r.message?,
                    ack_id: r.ack_id,
                    subscription: fqsn.to_string(),
                    subscriber_client: self.puller.clone(),
                    delivery_attempt: (r.delivery_attempt > 0).then_some(r.delivery_attempt as usize),
                })
            })
            .collect())
    }

    async fn pull_once(&self) -> Result<Option<Assignment>, QueueError> {
        let Some(m) = self.pull_now(&self.fqsn, 1).await?.into_iter().next() else { return Ok(None) };
        let a = match decode(&m.message) {
            Ok(a) => a,
            Err(reason) => {
                // Never misread: acknowledged away with the reason logged by the taker.
                let _ = m.ack().await;
                let aside = "nowhere: it was acknowledged and dropped".to_string();
                return Err(QueueError::Refused { key: self.topic.clone(), entry: m.message.message_id.clone(), reason, encoding: ENCODING, aside });
            }
        };
        match self.held.received(&a, m) {
            Received::Run => Ok(Some(self.held.made_whole(a))),
            Received::Drop(m) => {
                let _ = m.ack().await;
                Ok(None)
            }
        }
    }
}

fn decode(m: &PubsubMessage) -> Result<Assignment, String> {
    let enc = m.attributes.get(ENC_ATTRIBUTE).map(String::as_str).unwrap_or_default();
    if enc != ENCODING {
        return Err(if enc.is_empty() { format!("a message without the attribute {ENC_ATTRIBUTE:?}") } else { format!("a message in encoding {enc:?}") });
    }
    let wire = steppe_proto::v1::Assignment::decode(m.data.as_slice()).map_err(|e| format!("data that does not decode: {e}"))?;
    assignment_from_wire(wire).map_err(|e| format!("an assignment that does not read: {e}"))
}

impl Queue for PubSubQueue {
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            let size = assignment_to_wire(&a).encoded_len();
            let a = self.held.to_send(a, size, DATA_MAX);
            let data = assignment_to_wire(&a).encode_to_vec();
            if let Some(m) = self.held.pushing(&a.id) {
                m.ack().await.map_err(|e| self.err("retiring the earlier handing-out", e.message()))?;
            }
            let m = PubsubMessage { data, attributes: [(ENC_ATTRIBUTE.to_string(), ENCODING.to_string())].into(), ..Default::default() };
            self.publisher.publish(m).await.get().await.map_err(|e| self.err("publishing", e.message()))?;
            Ok(())
        })
    }

    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                if let Some(a) = self.pop_within(Duration::from_secs(5)).await? {
                    return Ok(a);
                }
            }
        })
    }

    fn pop_within(&self, wait: Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                if let Some(a) = self.pull_once().await? {
                    return Ok(Some(a));
                }
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                tokio::time::sleep(left.min(Duration::from_millis(50))).await;
            }
        })
    }

    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        let held = self.held.release(id);
        Box::pin(async move {
            match held {
                Some(m) => m.ack().await.map_err(|e| self.err("acknowledging", e.message())),
                None => Ok(()),
            }
        })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        let waiting = self.held.remove(id);
        Box::pin(async move { Ok(waiting) })
    }

    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        let held = self.held.handles();
        Box::pin(async move {
            for m in held {
                m.modify_ack_deadline(self.lease_secs).await.map_err(|e| self.err("extending a lease", e.message()))?;
            }
            Ok(())
        })
    }

    fn lease(&self) -> Option<Duration> {
        Some(Duration::from_secs(self.lease_secs as u64))
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<(Assignment, String)>, QueueError>> {
        Box::pin(async move {
            let Some(dead) = &self.dead else { return Ok(Vec::new()) };
            let got = self.pull_now(dead, 10).await?;
            let mut found = Vec::new();
            for m in got {
                // Kept for whoever looks later: not acknowledged, hidden ten minutes.
                let _ = m.modify_ack_deadline(600).await;
                let Ok(a) = decode(&m.message) else { continue };
                if self.held.first_report(&a) {
                    let why = format!("{}: its assignment was delivered again and again without finishing (a worker lost each time) and went to the dead-letter topic {}", a.step, self.dead_topic);
                    found.push((a, why));
                }
            }
            Ok(found)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::testing::PubSubEmulator;
    use steppe_runtime::queue::conformance::{self, a};

    async fn queue(key: &str, lease: Duration) -> Arc<dyn Queue> {
        Arc::new(PubSubQueue::connect("steppe-test", key, lease, &QueueOptions::default()).await.expect("connect"))
    }

    #[tokio::test]
    async fn pubsub_queue_conforms() {
        let _emulator = PubSubEmulator::start();
        conformance::basics(queue("steppe:basics", Duration::from_secs(30)).await).await;
    }

    #[tokio::test]
    async fn a_lost_takers_message_comes_back_after_the_ack_deadline() {
        let _emulator = PubSubEmulator::start();
        let lease = Duration::from_secs(10);
        conformance::a_lost_takers_assignment_comes_back(queue("steppe:lease", lease).await, queue("steppe:lease", lease).await, lease).await;
    }

    #[tokio::test]
    async fn an_extended_deadline_keeps_a_message_with_its_taker() {
        let _emulator = PubSubEmulator::start();
        let lease = Duration::from_secs(10);
        conformance::an_extended_lease_keeps_it_with_its_taker(queue("steppe:extend", lease).await, queue("steppe:extend", lease).await, lease).await;
    }

    #[tokio::test]
    async fn a_requeued_message_is_delivered_once() {
        let _emulator = PubSubEmulator::start();
        let lease = Duration::from_secs(10);
        conformance::a_requeued_assignment_is_delivered_once(queue("steppe:requeue", lease).await, lease).await;
    }

    #[tokio::test]
    async fn an_assignment_travels_whole_through_pubsub() {
        let _emulator = PubSubEmulator::start();
        let sent = Assignment { pool: "gpu".into(), template: Some(serde_json::json!({"source": {"z": 1, "a": -2}, "params": null})), ..a("w1") };
        conformance::an_assignment_travels_whole(queue("steppe:whole", Duration::from_secs(30)).await, sent).await;
    }

    /// Delivered `max_receives` times (Pub/Sub's least is 5) without an
    /// acknowledgement: the message goes to the dead-letter topic and is
    /// reported once.
    #[tokio::test]
    async fn a_message_never_finished_goes_to_the_dead_letter_topic() {
        let _emulator = PubSubEmulator::start();
        let lease = Duration::from_secs(10);
        let q = PubSubQueue::connect("steppe-test", "steppe:dlq", lease, &QueueOptions { max_receives: 5, ..QueueOptions::default() }).await.expect("connect");
        q.push(a("doomed")).await.unwrap();
        let mut deliveries = 0;
        let t0 = std::time::Instant::now();
        let dead = loop {
            if let Some(got) = q.pop_within(Duration::from_millis(500)).await.unwrap() {
                deliveries += 1;
                // Taken and lost, as by a dead worker: not acknowledged, deadline cut short.
                if let Some(m) = q.held.release(&got.id) {
                    let _ = m.modify_ack_deadline(0).await;
                }
            }
            let dead = q.dead_letters().await.unwrap();
            if !dead.is_empty() {
                break dead;
            }
            assert!(t0.elapsed() < Duration::from_secs(90), "never dead-lettered after {deliveries} deliveries");
        };
        assert_eq!(deliveries, 5, "delivered max_receives times, then set aside");
        assert!(dead[0].1.contains("dead-letter topic steppe-dlq-dead"), "{}", dead[0].1);
        assert!(q.dead_letters().await.unwrap().is_empty(), "reported once");
    }

    #[test]
    fn pubsub_urls() {
        assert_eq!(parse_url("pubsub://proj/steppe"), Ok(("proj".into(), "steppe".into())));
        assert!(parse_url("pubsub://proj").is_err() && parse_url("pubsub:///x").is_err() && parse_url("pubsub://p/a/b").is_err());
    }
}
