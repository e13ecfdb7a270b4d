//! The plan walker: interprets a job's plan (blocks, modifiers, hooks,
//! routing, asserts) in the coordinator and hands every step that does work
//! to the worker pool as an [`Assignment`].

mod across;
mod agents;
pub(crate) use agents::{mcp_server_work, secret_env_names};
mod approval;
mod attempts;
mod blocks;
pub mod chain;
pub mod checkpoint;
mod containers;
mod context;
pub mod docker;
mod every;
mod load_var;
mod merkle;
mod output_cache;
mod plan;
mod preflight;
mod progress;
mod run;
mod record;
mod retention;
mod resources;
mod step;
mod spans;
mod submission;
mod task;
mod temp;

pub use run::{Done, Engine, JobResult, JobRun};
pub use submission::Submission;
