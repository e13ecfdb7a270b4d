//! steppe-shared: the pipeline model and everything that loads and checks it.
//!
//! Nothing here knows about actors, processes or HTTP servers (see ARCHITECTURE.md).

pub mod de;
pub mod duration;
pub mod model;
pub mod source;
pub mod suggest;
pub mod yaml;
