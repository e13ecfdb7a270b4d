//! What every queue backend must do alike, as functions each backend's tests
//! call with queues of its own (in-process, Redis, SQS, …).

use std::sync::Arc;
use std::time::Duration;

use super::Queue;
use crate::assignment::Assignment;

/// A trivial assignment with id `id`.
pub fn a(id: &str) -> Assignment {
    Assignment { id: id.into(), ..Assignment::command("r", "s", "true".into()) }
}

/// Order, removal of what waits, acknowledgement, and a pop that waits.
pub async fn basics(q: Arc<dyn Queue>) {
    q.push(a("1")).await.unwrap();
    q.push(a("2")).await.unwrap();
    q.push(a("3")).await.unwrap();
    assert!(q.remove("2").await.unwrap(), "a waiting assignment can be removed");
    assert!(!q.remove("2").await.unwrap());
    let first = q.pop().await.unwrap();
    assert_eq!(first.id, "1", "first in, first out");
    assert!(!q.remove("1").await.unwrap(), "a taken assignment is not removed");
    q.ack("1").await.unwrap();
    assert_eq!(q.pop().await.unwrap().id, "3");
    q.ack("3").await.unwrap();
    let q2 = q.clone();
    let waiter = tokio::spawn(async move { q2.pop().await.unwrap().id });
    tokio::time::sleep(Duration::from_millis(50)).await;
    q.push(a("4")).await.unwrap();
    assert_eq!(waiter.await.unwrap(), "4", "pop waits for a push");
    q.ack("4").await.unwrap();
    // Taken several at a time: never more than asked, none lost, in order.
    for id in ["5", "6", "7"] {
        q.push(a(id)).await.unwrap();
    }
    let mut got = Vec::new();
    while got.len() < 3 {
        let batch = q.pop_up_to(2, Duration::from_secs(2)).await.unwrap();
        assert!(!batch.is_empty() && batch.len() <= 2, "{batch:?}");
        got.extend(batch.into_iter().map(|t| t.unwrap().id));
    }
    assert_eq!(got, ["5", "6", "7"]);
    for id in &got {
        q.ack(id).await.unwrap();
    }
    assert!(q.pop_up_to(3, Duration::from_millis(50)).await.unwrap().is_empty(), "nothing waits: none taken");
}

/// A taker that dies without acknowledging: after the lease, another gets
/// the assignment; once acknowledged, it never comes back.
pub async fn a_lost_takers_assignment_comes_back(first: Arc<dyn Queue>, second: Arc<dyn Queue>, lease: Duration) {
    first.push(a("job-1")).await.unwrap();
    assert_eq!(first.pop().await.unwrap().id, "job-1");
    drop(first);
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let again = second.pop().await.unwrap();
    assert_eq!(again.id, "job-1");
    assert!(!again.first_delivery, "an entry back after its taker's lease ran out is no first delivery");
    second.ack("job-1").await.unwrap();
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let none = second.pop_within(Duration::from_millis(1500)).await.unwrap();
    assert!(none.is_none(), "an acknowledged assignment must not be delivered again: {none:?}");
}

/// Held three leases long, extended every third of one: nobody else gets
/// it; no more extensions, and it comes back.
pub async fn an_extended_lease_keeps_it_with_its_taker(holder: Arc<dyn Queue>, other: Arc<dyn Queue>, lease: Duration) {
    holder.push(a("long")).await.unwrap();
    assert_eq!(holder.pop().await.unwrap().id, "long");
    for _ in 0..9 {
        tokio::time::sleep(lease / 3).await;
        holder.extend_held().await.unwrap();
    }
    assert!(other.pop_within(Duration::from_millis(50)).await.unwrap().is_none(), "an extended assignment must stay with its taker");
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    // Back within a while: a backend looks for expired leases now and then.
    let within = (lease / 2).max(Duration::from_secs(1));
    assert_eq!(other.pop_within(within).await.unwrap().map(|a| a.id).as_deref(), Some("long"));
    other.ack("long").await.unwrap();
}

/// Pushed back by its taker (its worker was lost): taken again once, and the
/// first taking does not come back when its lease runs out.
pub async fn a_requeued_assignment_is_delivered_once(q: Arc<dyn Queue>, lease: Duration) {
    q.push(a("job-1")).await.unwrap();
    let taken = q.pop().await.unwrap();
    q.push(taken).await.unwrap();
    assert_eq!(q.pop().await.unwrap().id, "job-1");
    q.ack("job-1").await.unwrap();
    tokio::time::sleep(lease + Duration::from_millis(200)).await;
    let ghost = q.pop_within(Duration::from_millis(500)).await.unwrap();
    assert!(ghost.is_none(), "a requeued assignment was delivered again: {ghost:?}");
}

/// Everything an assignment carries arrives.
pub async fn an_assignment_travels_whole(q: Arc<dyn Queue>, sent: Assignment) {
    q.push(sent.clone()).await.unwrap();
    // Whether it was taken before is the queue's to say, not the sender's.
    let got = Assignment { first_delivery: sent.first_delivery, ..q.pop().await.unwrap() };
    assert_eq!(format!("{got:?}"), format!("{sent:?}"));
    q.ack(&got.id).await.unwrap();
}
