//! steppe-worker: executes assignments on behalf of the coordinator.
//!
//! `exec` runs one assignment (a fresh directory of declared inputs, `sh -c`,
//! outputs stored by content hash); `pool` is the in-process pool embedded
//! mode uses; `sandbox` is the policy every agent tool call is checked against.

pub mod exec;
pub mod pool;
pub mod sandbox;
