//! Any queue by its URL: `redis://`/`rediss://` (Redis Streams) or
//! `sqs://PREFIX` (Amazon SQS, configured by the standard AWS environment)
//! or `pubsub://PROJECT/PREFIX` (Google Cloud Pub/Sub; `PUBSUB_EMULATOR_HOST`).

use std::sync::Arc;
use std::time::Duration;

use steppe_runtime::queue::{pool_key, Pools, Queue, QueueError, RedisQueue};

pub use crate::queue_options::QueueOptions;
use crate::queue_options::QueueOptions as Options;

/// Whether `url` names a queue this build can open.
pub fn is_queue_url(url: &str) -> bool {
    ["redis://", "rediss://", "sqs://", "pubsub://"].iter().any(|s| url.starts_with(s))
}

/// Whether a worker that takes from `url` itself may also be handed steps on
/// its session (which then never reach the queue): on Redis only. An
/// autoscaler that counts an SQS or Pub/Sub queue's messages (the KEDA
/// overlays) would not see a step handed over, and would scale its busy
/// worker away.
pub fn hands_over_to_pullers(url: &str) -> bool {
    url.starts_with("redis://") || url.starts_with("rediss://")
}

/// The name of the default pool's queue: `key` for Redis (a stream under the
/// installation's prefix), the URL's prefix for SQS (`sqs://steppe` → `steppe`).
pub fn base_key(url: &str, redis_key: &str) -> String {
    if let Some(prefix) = url.strip_prefix("sqs://") {
        return prefix.trim_end_matches('/').to_string();
    }
    match crate::pubsub::parse_url(url) {
        Ok((_, prefix)) => prefix,
        Err(_) => redis_key.to_string(),
    }
}

/// Opens the queue `key` (a pool's, see [`pool_key`]) at `url` as `consumer`.
pub async fn connect(url: &str, key: &str, consumer: &str, lease: Duration, options: &Options) -> Result<Arc<dyn Queue>, QueueError> {
    if url.starts_with("sqs://") {
        Ok(Arc::new(crate::sqs::SqsQueue::connect(key, lease, options).await?))
    } else if url.starts_with("pubsub://") {
        let (project, _) = crate::pubsub::parse_url(url).map_err(|message| QueueError::Backend { url: url.to_string(), message })?;
        Ok(Arc::new(crate::pubsub::PubSubQueue::connect(&project, key, lease, options).await?))
    } else if url.starts_with("redis://") || url.starts_with("rediss://") {
        Ok(Arc::new(RedisQueue::connect(url, key, consumer, lease).await?))
    } else {
        Err(QueueError::Backend {
            url: steppe_runtime::secrets::mask_urls(url).into_owned(),
            message: "not a queue URL: use redis://HOST:PORT/, rediss://…, sqs://QUEUE_PREFIX or pubsub://PROJECT/PREFIX".into(),
        })
    }
}

/// A queue per pool at `url`, the default pool's being `base`.
pub async fn pools(url: &str, base: &str, consumer: &str, lease: Duration, options: Options) -> Result<Pools, QueueError> {
    let default = connect(url, base, consumer, lease, &options).await?;
    let (url, base, consumer) = (url.to_string(), base.to_string(), consumer.to_string());
    Ok(Pools::with(
        default,
        Box::new(move |pool| {
            let (url, key, consumer, options) = (url.clone(), pool_key(&base, &pool), consumer.clone(), options.clone());
            Box::pin(async move { connect(&url, &key, &consumer, lease, &options).await })
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_redis_worker_is_handed_steps_beside_its_queue() {
        assert!(hands_over_to_pullers("redis://127.0.0.1:6379"));
        assert!(hands_over_to_pullers("rediss://user@redis.example:6380/0"));
        assert!(!hands_over_to_pullers("sqs://steppe"), "KEDA counts an SQS queue's messages");
        assert!(!hands_over_to_pullers("pubsub://project/steppe"), "KEDA counts a subscription's messages");
    }
}
