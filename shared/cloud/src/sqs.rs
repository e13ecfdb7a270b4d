//! Amazon SQS as the queue of a cluster: a queue per pool, made if missing
//! with a dead-letter queue after `max_receives` deliveries; the lease is the
//! visibility timeout, extended while a step runs; long polling.

use std::time::Duration;

use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{MessageAttributeValue, MessageSystemAttributeName, QueueAttributeName};
use base64::Engine;
use prost::Message;
use steppe_runtime::assignment::Assignment;
use steppe_runtime::queue::{BoxFuture, Queue, QueueError};
use steppe_runtime::wire::{assignment_from_wire, assignment_to_wire};

use crate::held::{Held, Received};
use crate::queue_options::{queue_name, QueueOptions};

/// What a message's `enc` attribute names: the encoding of its body (base64).
const ENCODING: &str = "steppe.v1.Assignment";
const ENC_ATTRIBUTE: &str = "enc";
/// SQS's limit on a message, attributes included, less room for them.
const BODY_MAX: usize = 256 * 1024 - 1024;
/// The longest a receive waits (SQS's own ceiling).
const LONG_POLL_MAX: u64 = 20;

pub struct SqsQueue {
    client: aws_sdk_sqs::Client,
    /// `sqs://NAME`, as messages show it.
    shown: String,
    name: String,
    url: String,
    /// The dead-letter queue's URL, when there is one.
    dead_url: Option<String>,
    dead_name: String,
    lease: Duration,
    /// Receipt handles of what this consumer took, and the rest it keeps.
    held: Held<String>,
}

/// The AWS configuration of the environment (region, credentials,
/// `AWS_ENDPOINT_URL[_SQS|_S3]`), its HTTPS on rustls with ring.
pub async fn aws_config(endpoint: Option<&str>) -> aws_config::SdkConfig {
    let http = aws_smithy_http_client::Builder::new().tls_provider(aws_smithy_http_client::tls::Provider::Rustls(aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring)).build_https();
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(http);
    if let Some(e) = endpoint {
        loader = loader.endpoint_url(e);
    }
    loader.load().await
}

impl SqsQueue {
    /// Opens the queue of pool key `key`, making it (and its dead-letter
    /// queue) when missing and `options.create` allows.
    pub async fn connect(key: &str, lease: Duration, options: &QueueOptions) -> Result<Self, QueueError> {
        let conf = aws_config(options.endpoint.as_deref()).await;
        let name = queue_name(key);
        let shown = format!("sqs://{name}");
        if conf.region().is_none() {
            return Err(QueueError::Backend { url: shown, message: "no AWS region: set AWS_REGION (or a profile's region)".into() });
        }
        let client = aws_sdk_sqs::Client::new(&conf);
        let dead_name = format!("{name}-dead");
        let err = |what: &str, e: String| QueueError::Backend { url: shown.clone(), message: format!("{what}: {e}") };
        let url = match client.get_queue_url().queue_name(&name).send().await {
            Ok(r) => r.queue_url().unwrap_or_default().to_string(),
            Err(e) if e.as_service_error().is_some_and(|s| s.is_queue_does_not_exist()) => {
                if !options.create {
                    return Err(err("the queue does not exist", "make it, or start without --no-create-queues".into()));
                }
                let dead = client.create_queue().queue_name(&dead_name).attributes(QueueAttributeName::MessageRetentionPeriod, "1209600").send().await.map_err(|e| err("making the dead-letter queue", DisplayErrorContext(&e).to_string()))?;
                let dead_url = dead.queue_url().unwrap_or_default().to_string();
                let arn = client
                    .get_queue_attributes()
                    .queue_url(&dead_url)
                    .attribute_names(QueueAttributeName::QueueArn)
                    .send()
                    .await
                    .map_err(|e| err("reading the dead-letter queue", DisplayErrorContext(&e).to_string()))?
                    .attributes()
                    .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
                    .unwrap_or_default();
                let redrive = format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{}"}}"#, options.max_receives.max(1));
                client
                    .create_queue()
                    .queue_name(&name)
                    .attributes(QueueAttributeName::VisibilityTimeout, lease.as_secs().max(1).to_string())
                    .attributes(QueueAttributeName::RedrivePolicy, redrive)
                    .send()
                    .await
                    .map_err(|e| err("making the queue", DisplayErrorContext(&e).to_string()))?
                    .queue_url()
                    .unwrap_or_default()
                    .to_string()
            }
            Err(e) => return Err(err("finding the queue", DisplayErrorContext(&e).to_string())),
        };
        let dead_url = client.get_queue_url().queue_name(&dead_name).send().await.ok().and_then(|r| r.queue_url().map(str::to_string));
        Ok(SqsQueue {
            client,
            shown,
            name,
            url,
            dead_url,
            dead_name,
            lease,
            held: Held::default(),
        })
    }

    fn err(&self, what: &str, e: impl std::error::Error) -> QueueError {
        QueueError::Backend { url: self.shown.clone(), message: format!("{what}: {}", DisplayErrorContext(&e)) }
    }

    fn lease_secs(&self) -> i32 {
        i32::try_from(self.lease.as_secs().clamp(1, 43_200)).unwrap_or(60)
    }

    async fn delete(&self, receipt: &str) -> Result<(), QueueError> {
        self.client.delete_message().queue_url(&self.url).receipt_handle(receipt).send().await.map_err(|e| self.err("deleting a message", e))?;
        Ok(())
    }

    /// One receive of at most `wait` (whole seconds, up to 20); the
    /// assignment of the message it got, if one is for this process to run.
    async fn receive_once(&self, wait: Duration) -> Result<Option<Assignment>, QueueError> {
        let out = self
            .client
            .receive_message()
            .queue_url(&self.url)
            .max_number_of_messages(1)
            .wait_time_seconds(i32::try_from(wait.as_secs().min(LONG_POLL_MAX)).unwrap_or(0))
            .visibility_timeout(self.lease_secs())
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::ApproximateReceiveCount)
            .send()
            .await
            .map_err(|e| self.err("receiving", e))?;
        let Some(m) = out.messages.unwrap_or_default().into_iter().next() else { return Ok(None) };
        let receipt = m.receipt_handle().unwrap_or_default().to_string();
        let entry = m.message_id().unwrap_or_default().to_string();
        let a = match decode(&m) {
            Ok(a) => a,
            Err(reason) => {
                self.set_aside(&m, &reason).await?;
                self.delete(&receipt).await?;
                let aside = format!("the dead-letter queue {}", self.dead_name);
                return Err(QueueError::Refused { key: self.name.clone(), entry, reason, encoding: ENCODING, aside });
            }
        };
        match self.held.received(&a, receipt) {
            Received::Run => Ok(Some(self.held.made_whole(a))),
            Received::Drop(receipt) => {
                self.delete(&receipt).await?;
                Ok(None)
            }
        }
    }

    /// An unreadable message goes to the dead-letter queue as it was, with the reason.
    async fn set_aside(&self, m: &aws_sdk_sqs::types::Message, reason: &str) -> Result<(), QueueError> {
        let Some(dead) = &self.dead_url else { return Ok(()) };
        let reason_attr = MessageAttributeValue::builder().data_type("String").string_value(reason).build().map_err(|e| self.err("a reason", e))?;
        self.client
            .send_message()
            .queue_url(dead)
            .message_body(m.body().unwrap_or(" "))
            .message_attributes("reason", reason_attr)
            .send()
            .await
            .map_err(|e| self.err("setting aside an unreadable message", e))?;
        Ok(())
    }
}

fn decode(m: &aws_sdk_sqs::types::Message) -> Result<Assignment, String> {
    let enc = m.message_attributes().and_then(|a| a.get(ENC_ATTRIBUTE)).and_then(|v| v.string_value()).unwrap_or_default();
    if enc != ENCODING {
        return Err(if enc.is_empty() { format!("a message without the attribute {ENC_ATTRIBUTE:?}") } else { format!("a message in encoding {enc:?}") });
    }
    let bytes = base64::engine::general_purpose::STANDARD.decode(m.body().unwrap_or_default()).map_err(|e| format!("a body that is not base64: {e}"))?;
    let wire = steppe_proto::v1::Assignment::decode(bytes.as_slice()).map_err(|e| format!("a body that does not decode: {e}"))?;
    assignment_from_wire(wire).map_err(|e| format!("an assignment that does not read: {e}"))
}

impl Queue for SqsQueue {
    fn push(&self, a: Assignment) -> BoxFuture<'_, Result<(), QueueError>> {
        Box::pin(async move {
            let size = assignment_to_wire(&a).encoded_len().div_ceil(3) * 4;
            // Too large for a message: a stand-in goes, the whole stays here.
            let a = self.held.to_send(a, size, BODY_MAX);
            let body = base64::engine::general_purpose::STANDARD.encode(assignment_to_wire(&a).encode_to_vec());
            // Pushing back what this consumer took (a requeue): the old
            // message goes first, or it would be delivered again.
            if let Some(receipt) = self.held.pushing(&a.id) {
                self.delete(&receipt).await?;
            }
            let enc = MessageAttributeValue::builder().data_type("String").string_value(ENCODING).build().map_err(|e| self.err("an attribute", e))?;
            self.client.send_message().queue_url(&self.url).message_body(body).message_attributes(ENC_ATTRIBUTE, enc).send().await.map_err(|e| self.err("sending", e))?;
            Ok(())
        })
    }

    fn pop(&self) -> BoxFuture<'_, Result<Assignment, QueueError>> {
        Box::pin(async move {
            loop {
                if let Some(a) = self.receive_once(Duration::from_secs(LONG_POLL_MAX)).await? {
                    return Ok(a);
                }
            }
        })
    }

    fn pop_within(&self, wait: Duration) -> BoxFuture<'_, Result<Option<Assignment>, QueueError>> {
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + wait;
            loop {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if let Some(a) = self.receive_once(left).await? {
                    return Ok(Some(a));
                }
                if left < Duration::from_secs(1) {
                    // A short poll answered at once: wait a little, within what is left.
                    if left.is_zero() {
                        return Ok(None);
                    }
                    tokio::time::sleep(left.min(Duration::from_millis(100))).await;
                }
            }
        })
    }

    fn ack(&self, id: &str) -> BoxFuture<'_, Result<(), QueueError>> {
        let held = self.held.release(id);
        Box::pin(async move {
            match held {
                Some(receipt) => self.delete(&receipt).await,
                None => Ok(()),
            }
        })
    }

    fn remove(&self, id: &str) -> BoxFuture<'_, Result<bool, QueueError>> {
        // SQS deletes only what was received: a waiting message is marked.
        let waiting = self.held.remove(id);
        Box::pin(async move { Ok(waiting) })
    }

    fn extend_held(&self) -> BoxFuture<'_, Result<(), QueueError>> {
        let held = self.held.handles();
        Box::pin(async move {
            for receipt in held {
                self.client
                    .change_message_visibility()
                    .queue_url(&self.url)
                    .receipt_handle(&receipt)
                    .visibility_timeout(self.lease_secs())
                    .send()
                    .await
                    .map_err(|e| self.err("extending a lease", e))?;
            }
            Ok(())
        })
    }

    fn lease(&self) -> Option<Duration> {
        Some(self.lease)
    }

    fn dead_letters(&self) -> BoxFuture<'_, Result<Vec<(Assignment, String)>, QueueError>> {
        Box::pin(async move {
            let Some(dead) = &self.dead_url else { return Ok(Vec::new()) };
            // Read without taking: what is reported stays in the queue for
            // whoever looks later, hidden from these reads for 12 hours.
            let out = self
                .client
                .receive_message()
                .queue_url(dead)
                .max_number_of_messages(10)
                .visibility_timeout(43_200)
                .message_attribute_names("All")
                .send()
                .await
                .map_err(|e| self.err("reading the dead-letter queue", e))?;
            let mut found = Vec::new();
            for m in out.messages.unwrap_or_default() {
                let Ok(a) = decode(&m) else { continue };
                if self.held.first_report(&a) {
                    let why = format!("{}: its assignment was delivered again and again without finishing (a worker lost each time) and went to the dead-letter queue {}", a.step, self.dead_name);
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
    use crate::testing::Moto;
    use steppe_runtime::queue::conformance::{self, a};

    async fn queue(moto: &Moto, key: &str, lease: Duration) -> Arc<dyn Queue> {
        Arc::new(SqsQueue::connect(key, lease, &moto.options()).await.expect("connect"))
    }

    #[tokio::test]
    async fn sqs_queue_conforms() {
        let moto = Moto::start();
        conformance::basics(queue(&moto, "steppe:basics", Duration::from_secs(30)).await).await;
    }

    #[tokio::test]
    async fn a_lost_takers_message_comes_back_after_the_visibility_timeout() {
        let moto = Moto::start();
        let lease = Duration::from_secs(1);
        conformance::a_lost_takers_assignment_comes_back(queue(&moto, "steppe:lease", lease).await, queue(&moto, "steppe:lease", lease).await, lease).await;
    }

    #[tokio::test]
    async fn an_extended_visibility_keeps_a_message_with_its_taker() {
        let moto = Moto::start();
        let lease = Duration::from_secs(1);
        conformance::an_extended_lease_keeps_it_with_its_taker(queue(&moto, "steppe:extend", lease).await, queue(&moto, "steppe:extend", lease).await, lease).await;
    }

    #[tokio::test]
    async fn a_requeued_message_is_delivered_once() {
        let moto = Moto::start();
        let lease = Duration::from_secs(1);
        conformance::a_requeued_assignment_is_delivered_once(queue(&moto, "steppe:requeue", lease).await, lease).await;
    }

    #[tokio::test]
    async fn an_assignment_travels_whole_through_sqs() {
        let moto = Moto::start();
        let sent = Assignment { pool: "gpu".into(), template: Some(serde_json::json!({"source": {"z": 1, "a": -2}, "version": {"ref": "x"}, "params": null})), ..a("w1") };
        conformance::an_assignment_travels_whole(queue(&moto, "steppe:whole", Duration::from_secs(30)).await, sent).await;
    }

    /// A message delivered more than `max_receives` times without an
    /// acknowledgement goes to the dead-letter queue, and is reported once.
    #[tokio::test]
    async fn a_message_never_finished_goes_to_the_dead_letter_queue() {
        let moto = Moto::start();
        let lease = Duration::from_secs(1);
        let options = QueueOptions { max_receives: 2, ..moto.options() };
        let q = SqsQueue::connect("steppe:dlq", lease, &options).await.expect("connect");
        q.push(a("doomed")).await.unwrap();
        let mut deliveries = 0;
        for _ in 0..6 {
            if let Some(got) = q.pop_within(Duration::from_secs(2)).await.unwrap() {
                deliveries += 1;
                // Taken and lost: forget the receipt, as a dead worker does.
                q.held.forget(&got.id);
            }
            tokio::time::sleep(lease + Duration::from_millis(200)).await;
        }
        assert_eq!(deliveries, 2, "delivered max_receives times, then set aside");
        let dead = q.dead_letters().await.unwrap();
        assert_eq!(dead.len(), 1, "{dead:?}");
        assert!(dead[0].1.contains("dead-letter queue steppe-dlq-dead"), "{}", dead[0].1);
        assert!(q.dead_letters().await.unwrap().is_empty(), "reported once");
    }

    #[tokio::test]
    async fn a_missing_queue_is_not_made_when_creation_is_forbidden() {
        let moto = Moto::start();
        let options = QueueOptions { create: false, ..moto.options() };
        let e = SqsQueue::connect("steppe:absent", Duration::from_secs(5), &options).await.err().expect("refused");
        assert!(e.to_string().contains("sqs://steppe-absent") && e.to_string().contains("does not exist"), "{e}");
    }

    #[test]
    fn pool_keys_become_queue_names() {
        assert_eq!(queue_name("steppe"), "steppe");
        assert_eq!(queue_name("steppe:gpu.a100"), "steppe-gpu-a100");
        assert_eq!(queue_name(&"x".repeat(100)).len(), 75);
    }
}
