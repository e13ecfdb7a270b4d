//! A cluster on the cloud's parts, on a local moto server: assignments on
//! SQS and artifacts in S3, with workers that take from the queue
//! themselves and read and write the bucket directly.

mod common;

use std::process::Command;

use common::*;

fn curl(args: &[&str]) -> String {
    let out = Command::new("curl").args(["-sS", "--fail"]).args(args).output().expect("curl");
    assert!(out.status.success(), "curl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Each test points the AWS environment of this process (and of every
/// process it starts) at its own moto server: one test at a time, or the
/// other's coordinator reaches a server without its bucket (`cargo test`
/// runs the tests of a file as threads of one process; nextest does not).
static ONE_MOTO_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_cluster_on_sqs_and_s3() {
    let _moto = ONE_MOTO_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let work = scratch("cloud");
    std::fs::write(
        work.join("p.yml"),
        "jobs:\n- name: j\n  plan:\n  - task: make\n    outputs: [o]\n    run: echo sealed > o/f\n  - task: read\n    inputs: [o]\n    run: cat o/f\n    assert:\n      stdout: sealed\n",
    )
    .expect("write");
    let (mut moto, queue_url, queue_args) = Backend::Sqs.start();
    let endpoint = std::env::var("AWS_ENDPOINT_URL").expect("the SQS backend set it");
    curl(&["-X", "PUT", &format!("{endpoint}/arts")]);
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state", "--artifacts", "s3://arts/steppe"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, log) = serving_logged(&args, &work);
    let mut workers = [spawn_worker(&url, &["--slots", "1", "--queue", &queue_url]), spawn_worker(&url, &["--slots", "1"])];
    let out = steppe(&["submit", "p.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), log.lock().expect("log"));
    assert!(text(&out).contains("[read] sealed"), "{}", text(&out));
    // The output tree went to the bucket, content-addressed.
    let listed = curl(&[&format!("{endpoint}/arts?list-type=2&prefix=steppe/")]);
    assert!(listed.matches("<Key>steppe/").count() >= 1 && listed.contains(".tar</Key>"), "{listed}");
    // A missing bucket is said before anything runs.
    let out = steppe(&["coordinator", "--listen", "127.0.0.1:0", "--state", "s2", "--artifacts", "s3://no-such-bucket/x"], &work);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out).contains("s3://no-such-bucket/x") && text(&out).contains("does it exist"), "{}", text(&out));
    stop(workers.iter_mut().chain([&mut coord, &mut moto]));
}

/// An assignment over a queue's message limit (SQS: 256 KiB) travels by
/// reference: a stand-in on the queue, the whole from the coordinator, to a
/// worker that takes from the queue itself and to one sent work alike.
#[test]
fn an_assignment_too_large_for_a_message_travels_by_reference() {
    let _moto = ONE_MOTO_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let work = scratch("cloud-by-reference");
    // A long allow-list of environment names (none set) makes each assignment about 300 KiB.
    let names: Vec<String> = (0..2600).map(|n| format!("STEPPE_FILLER_{n:05}_{}", "X".repeat(96))).collect();
    let env = names.join(", ");
    let tasks: String = (0..4).map(|i| format!("    - task: big{i}\n      env: [{env}]\n      run: echo big-{i}-ran\n")).collect();
    std::fs::write(work.join("p.yml"), format!("jobs:\n- name: j\n  plan:\n  - in_parallel:\n{tasks}")).expect("write");
    let (mut moto, queue_url, queue_args) = Backend::Sqs.start();
    let mut args = vec!["coordinator", "--listen", "127.0.0.1:0", "--workers", "0", "--state", "state"];
    args.extend(queue_args.iter().map(String::as_str));
    let (mut coord, url, log) = serving_logged(&args, &work);
    let mut workers = [spawn_worker(&url, &["--slots", "2", "--queue", &queue_url]), spawn_worker(&url, &["--slots", "2"])];
    let out = steppe(&["submit", "p.yml", "--coordinator", &url], &work);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), log.lock().expect("log"));
    for i in 0..4 {
        assert!(text(&out).contains(&format!("big-{i}-ran")), "{}", text(&out));
    }
    stop(workers.iter_mut().chain([&mut coord, &mut moto]));
}
