//! steppe-worker: executes assignments on behalf of the coordinator.
//!
//! `exec` runs one assignment (a fresh directory of declared inputs, `sh -c`,
//! outputs stored by content hash). `local` runs worker loops inside the
//! coordinator's process (embedded mode); `remote` is `steppe worker`, the same
//! loop over a gRPC session (conversions to `steppe.v1` are `steppe_runtime::wire`).
//! `sandbox` is the policy every agent tool call is checked against;
//! `transfer` moves artifacts through the coordinator for workers that share
//! no directory with it.

pub mod agent;
mod command;
pub mod container;
pub mod exec;
pub mod hands;
pub mod host_env;
pub mod local;
pub mod metrics;
pub mod output;
pub mod process_group;
pub mod provider;
pub mod pull;
pub mod remote;
pub mod sandbox;
pub mod short_slice;
pub mod simple_command;
pub mod sink;
#[cfg(target_os = "linux")]
pub mod spawn;
pub mod step_dir;
pub mod stop;
pub mod telemetry;
pub mod tools;
pub mod transfer;
