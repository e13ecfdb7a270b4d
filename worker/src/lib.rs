//! steppe-worker: executes one assignment at a time on behalf of the coordinator.
//!
//! For now it holds the sandbox policy every agent tool call is checked
//! against; task execution and agent conversations land here next
//! (see ARCHITECTURE.md).

pub mod sandbox;
