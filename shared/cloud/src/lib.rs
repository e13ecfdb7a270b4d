//! steppe-cloud: the queue and artifact backends of the cloud providers
//! (`sqs.rs`: Amazon SQS; `pubsub.rs`: Google Cloud Pub/Sub; `s3.rs`: artifacts in S3), and `connect`, which opens any queue by its URL.
//! Apart from the runtime crate so their heavy SDKs build once.

mod held;
pub mod pubsub;
pub mod queue_options;
pub mod queues;
pub mod s3;
pub mod sqs;

/// Makes ring the process's TLS crypto provider (the Pub/Sub client's HTTP
/// stack asks for one; tonic, reqwest and the AWS SDK already use ring).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod testing;
