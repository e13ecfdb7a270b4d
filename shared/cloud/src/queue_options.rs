//! What every queue backend shares: the options it is opened with and the
//! name a pool's queue goes by.

/// What a queue backend may do beyond taking and giving assignments.
#[derive(Debug, Clone)]
pub struct QueueOptions {
    /// Make a pool's queue (and its dead-letter queue) when it is missing.
    pub create: bool,
    /// Deliveries after which an assignment goes to the dead-letter queue.
    pub max_receives: u32,
    /// The service's endpoint, over the environment's (`AWS_ENDPOINT_URL`).
    pub endpoint: Option<String>,
}

impl Default for QueueOptions {
    fn default() -> Self {
        QueueOptions { create: true, max_receives: 5, endpoint: None }
    }
}

/// A queue name SQS accepts for a pool key (`steppe:gpu` → `steppe-gpu`):
/// letters, digits, `-` and `_`, at most 75 (the dead-letter queue adds `-dead`).
pub fn queue_name(key: &str) -> String {
    let mut n: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '-' }).collect();
    n.truncate(75);
    n
}
