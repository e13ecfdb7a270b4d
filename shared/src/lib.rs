//! steppe-shared: the pipeline model and everything that loads and checks it.
//!
//! Nothing here knows about actors, processes or HTTP servers (see ARCHITECTURE.md).

pub mod de;
pub mod duration;
pub mod expr;
pub mod agent_work;
pub mod artifacts;
pub mod assignment;
pub mod model;
pub mod outage;
pub mod outcome;
pub mod printable;
pub mod queue;
pub mod secrets;
pub mod source;
pub mod store;
pub mod store_outbox;
pub mod store_redis;
pub mod suggest;
pub mod template;
pub mod yaml;
pub mod builtins;
pub mod confine;
pub mod load;
pub mod machine;
pub mod schema;
pub mod scratch;
pub mod validate;
pub mod vars;

pub use load::{load_file, load_str, LoadOptions, Loaded};
pub use source::{Diagnostic, Diagnostics};
