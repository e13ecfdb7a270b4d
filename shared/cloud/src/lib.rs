//! steppe-cloud: the queue and artifact backends of the cloud providers
//! (`sqs.rs`: Amazon SQS; `s3.rs`: artifacts in S3), and `connect`, which opens any queue by its URL.
//! Apart from the runtime crate so their heavy SDKs build once.

pub mod queues;
pub mod s3;
pub mod sqs;

#[cfg(test)]
mod testing;
