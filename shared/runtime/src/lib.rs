//! steppe-runtime: what the processes of a run share — assignments and
//! their results, the outcome model, agent work, the `Queue`, `Store` and
//! `ArtifactStore` traits with their backends, and the small guards every
//! process needs (secrets out of messages, scratch directories, outages said
//! once, text made safe for a terminal).
//!
//! Nothing here knows about actors or servers (see ARCHITECTURE.md).

pub mod agent_work;
pub mod artifacts;
pub mod auth;
pub mod budget;
pub mod causes;
pub mod assignment;
pub mod merkle;
pub mod outage;
pub mod outcome;
pub mod prices;
pub mod printable;
pub mod queue;
pub mod scratch;
pub mod secrets;
pub mod store;
pub mod trace;
pub mod wire;
