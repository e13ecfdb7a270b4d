//! steppe-coordinator: the coordinator's actors and services (Dispatcher,
//! EventHub, WorkerRegistry, the run walker, the gRPC services) and the
//! `steppe` command line (`cli`), which `main.rs` only parses and calls.

#[macro_use]
mod macros;

pub mod artifacts;
pub mod bundle;
pub mod cli;
pub mod dispatch;
pub mod engine;
pub mod event_hub;
mod hand_over;
pub mod history;
pub mod liveness;
pub mod queue_writer;
pub mod registry;
pub mod remote;
pub mod run_actor;
pub mod runs_service;
pub mod scripted;
pub mod service;
pub mod server;
pub mod services;
pub mod text;
pub mod waits;
pub mod watch;
pub mod web;
