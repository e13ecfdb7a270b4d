//! What ends work before it ends on its own: a cancel turning true, or a
//! deadline passing (a step's command, an agent's conversation).

use std::time::Duration;

use tokio::sync::watch;

/// Returns once `cancel` is true; never, if its sender is gone first.
pub async fn cancelled(cancel: &mut watch::Receiver<bool>) {
    loop {
        if *cancel.borrow() {
            return;
        }
        if cancel.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Returns once `after` has passed; never without one.
pub async fn deadline(after: Option<Duration>) {
    match after {
        Some(t) => tokio::time::sleep(t).await,
        None => std::future::pending().await,
    }
}
