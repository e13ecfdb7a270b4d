//! The Redis queue against a real redis-server: the conformance cases,
//! leases, first deliveries, entries this build cannot read.

use crate::queue::conformance::{self, a};
use std::sync::Arc;
use super::*;
use std::process::{Child, Command, Stdio};

/// A throwaway redis-server on a free loopback port (scripts/test installs it).
pub(crate) struct Server {
    child: Child,
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn redis_server() -> Server {
    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("free port");
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH (scripts/test installs it)");
    for _ in 0..100 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Server { child, url: format!("redis://127.0.0.1:{port}/") }
}

#[tokio::test]
async fn redis_queue_conforms() {
    let s = redis_server();
    let q = RedisQueue::connect(&s.url, "steppe:test", "c1", Duration::from_secs(30)).await.expect("connect");
    conformance::basics(Arc::new(q)).await;
}

#[tokio::test]
async fn a_lost_consumers_entry_comes_back_after_the_lease() {
    let s = redis_server();
    let lease = Duration::from_millis(300);
    let first = RedisQueue::connect(&s.url, "steppe:lease", "doomed", lease).await.expect("connect");
    let second = RedisQueue::connect(&s.url, "steppe:lease", "survivor", lease).await.expect("connect");
    conformance::a_lost_takers_assignment_comes_back(Arc::new(first), Arc::new(second), lease).await;
}

#[tokio::test]
async fn an_extended_lease_keeps_an_entry_with_its_taker() {
    let s = redis_server();
    let lease = Duration::from_millis(300);
    let holder = RedisQueue::connect(&s.url, "steppe:extend", "holder", lease).await.expect("connect");
    let other = RedisQueue::connect(&s.url, "steppe:extend", "other", lease).await.expect("connect");
    conformance::an_extended_lease_keeps_it_with_its_taker(Arc::new(holder), Arc::new(other), lease).await;
}

#[tokio::test]
async fn a_requeued_entry_is_delivered_once() {
    let s = redis_server();
    let lease = Duration::from_millis(300);
    let q = RedisQueue::connect(&s.url, "steppe:requeue", "c1", lease).await.expect("connect");
    conformance::a_requeued_assignment_is_delivered_once(Arc::new(q), lease).await;
}

#[tokio::test]
async fn an_entry_read_for_the_first_time_says_so() {
    let s = redis_server();
    let q = RedisQueue::connect(&s.url, "steppe:first", "c1", Duration::from_secs(30)).await.expect("connect");
    q.push(conformance::a("job-1")).await.unwrap();
    let taken = q.pop().await.unwrap();
    assert!(taken.first_delivery);
    // Pushed back by its taker: a new entry, read for the first time.
    q.push(taken).await.unwrap();
    assert!(q.pop().await.unwrap().first_delivery);
    // (One back after its taker's lease ran out is not: the conformance case.)
}

/// A queue on `key` and a plain connection to write its stream directly.
async fn queue_and_raw(s: &Server, key: &str) -> (RedisQueue, redis::aio::MultiplexedConnection) {
    let q = RedisQueue::connect(&s.url, key, "c1", Duration::from_secs(30)).await.expect("connect");
    let c = redis::Client::open(s.url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    (q, c)
}

#[tokio::test]
async fn many_waiting_are_taken_in_one_read_and_a_refused_one_among_them_is_told() {
    let s = redis_server();
    let key = "steppe:batch";
    let (q, mut c) = queue_and_raw(&s, key).await;
    q.push(a("one")).await.unwrap();
    let _: String = redis::cmd("XADD").arg(key).arg("*").arg("enc").arg("steppe.v9.Assignment").arg("pb").arg("x").query_async(&mut c).await.unwrap();
    q.push(a("two")).await.unwrap();
    q.push(a("three")).await.unwrap();
    let taken = q.pop_up_to(3, Duration::from_secs(1)).await.expect("read");
    assert_eq!(taken.len(), 3, "three asked for, three taken in one read: {taken:?}");
    assert_eq!(taken[0].as_ref().map(|a| a.id.as_str()).ok(), Some("one"));
    assert!(matches!(&taken[1], Err(QueueError::Refused { .. })), "{:?}", taken[1]);
    assert_eq!(taken[2].as_ref().map(|a| a.id.as_str()).ok(), Some("two"));
    let rest = q.pop_up_to(8, Duration::from_secs(1)).await.expect("read");
    assert_eq!(rest.into_iter().map(|t| t.unwrap().id).collect::<Vec<_>>(), ["three"]);
    let moved: usize = redis::cmd("XLEN").arg("steppe:batch:refused").query_async(&mut c).await.unwrap();
    assert_eq!(moved, 1, "the refused entry was moved aside");
}

#[tokio::test]
async fn entries_this_build_cannot_read_are_refused_and_moved_aside() {
    let s = redis_server();
    let key = "steppe:refuse";
    let (q, mut c) = queue_and_raw(&s, key).await;
    let old = r#"{"id":"old","run_id":"r","step":"s","attempt":1,"command":"true"}"#;
    let writes: [&[&[u8]]; 3] = [
        &[b"a", old.as_bytes()],
        &[b"enc", b"steppe.v9.Assignment", b"pb", b"\x0a\x01x"],
        &[b"enc", b"steppe.v1.Assignment", b"pb", b"\xff\xff\xff\xff"],
    ];
    for fields in writes {
        let _: String = redis::cmd("XADD").arg(key).arg("*").arg(fields).query_async(&mut c).await.unwrap();
    }
    q.push(a("good")).await.unwrap();
    let mut refused = Vec::new();
    let good = loop {
        match q.pop_within(Duration::from_millis(500)).await {
            Err(e @ QueueError::Refused { .. }) => {
                assert!(!e.is_outage());
                refused.push(e.to_string());
            }
            Ok(Some(a)) => break a,
            other => panic!("expected a refusal or the good entry, got {other:?}"),
        }
    };
    assert_eq!(good.id, "good", "a valid entry after the refused ones is delivered");
    assert_eq!(refused.len(), 3, "{refused:#?}");
    for (message, problem) in refused.iter().zip([r#"an assignment as JSON in the field "a" (written by an earlier steppe)"#, r#"an entry in the encoding "steppe.v9.Assignment""#, "its steppe.v1.Assignment bytes do not decode"]) {
        assert!(message.contains(problem), "{message}");
        assert!(message.contains("this steppe reads only entries with enc=steppe.v1.Assignment"), "{message}");
        assert!(message.contains("moved to the stream steppe:refuse:refused"), "{message}");
    }
    let moved: redis::Value = redis::cmd("XRANGE").arg("steppe:refuse:refused").arg("-").arg("+").query_async(&mut c).await.unwrap();
    let moved = parse_entries(&moved);
    assert_eq!(moved.len(), 3);
    for ((_, fields), written) in moved.iter().zip(writes) {
        let (last, original) = fields.split_last().unwrap();
        assert_eq!(last.0, b"reason");
        assert!(!last.1.is_empty());
        let original: Vec<&[u8]> = original.iter().flat_map(|(k, v)| [k.as_slice(), v.as_slice()]).collect();
        assert_eq!(original, written, "the original fields are kept");
    }
    // Only the good entry is left on the queue (taken, not yet done with).
    let len: usize = redis::cmd("XLEN").arg(key).query_async(&mut c).await.unwrap();
    assert_eq!(len, 1);
    q.ack("good").await.unwrap();
    let len: usize = redis::cmd("XLEN").arg(key).query_async(&mut c).await.unwrap();
    assert_eq!(len, 0);
    assert!(q.pop_within(Duration::from_millis(100)).await.unwrap().is_none(), "nothing refused comes back");
}

#[tokio::test]
async fn an_assignment_travels_whole_through_the_queue() {
    let s = redis_server();
    let q = RedisQueue::connect(&s.url, "steppe:whole", "c1", Duration::from_secs(30)).await.expect("connect");
    conformance::an_assignment_travels_whole(Arc::new(q), whole()).await;
}

/// An assignment with the parts that are easy to lose on the way.
fn whole() -> Assignment {
    Assignment {
        pool: "gpu".into(),
        template: Some(serde_json::json!({"source": {"z": 1, "a": -2}, "version": {"ref": "x"}, "params": null})),
        ..crate::queue::conformance::a("w1")
    }
}

/// The coordinator's queues are Redis queues behind a hand-over in memory:
/// together they still keep every case.
#[tokio::test]
async fn a_handoff_over_redis_conforms() {
    let s = redis_server();
    let over = |q: RedisQueue| Arc::new(crate::queue::Handoff::new(Arc::new(q))) as Arc<dyn crate::queue::Queue>;
    let q = RedisQueue::connect(&s.url, "steppe:handoff", "c1", Duration::from_secs(30)).await.expect("connect");
    conformance::basics(over(q)).await;
    let lease = Duration::from_millis(300);
    let q = RedisQueue::connect(&s.url, "steppe:handoff-requeue", "c1", lease).await.expect("connect");
    conformance::a_requeued_assignment_is_delivered_once(over(q), lease).await;
    let first = RedisQueue::connect(&s.url, "steppe:handoff-lease", "doomed", lease).await.expect("connect");
    let second = RedisQueue::connect(&s.url, "steppe:handoff-lease", "survivor", lease).await.expect("connect");
    conformance::a_lost_takers_assignment_comes_back(over(first), over(second), lease).await;
}
