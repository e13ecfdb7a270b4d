//! steppe-cloud: the queue and artifact backends of the cloud providers
//! (`sqs.rs`: Amazon SQS), and `connect`, which opens any queue by its URL.
//! Apart from the runtime crate so their heavy SDKs build once.

pub mod queues;
pub mod sqs;

#[cfg(test)]
mod testing;
