//! Where an engine's steps with an image run: this process's own worker
//! loops (which reach a Docker engine or not), or remote workers.

#[derive(Clone)]
pub enum Docker {
    /// On this process's own worker loops (which reach the engine this
    /// process does).
    Local,
    /// On remote workers only: the registry says which reach one.
    Remote(crate::registry::WorkerRegistry),
}
