//! A moto server (the AWS APIs, from PyPI) on a free loopback port for one
//! test; `scripts/test` installs it in the venv `$STEPPE_VENV`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::queue_options::QueueOptions;

pub struct Moto {
    child: Child,
    pub url: String,
}

impl Moto {
    pub fn start() -> Moto {
        // The SDK reads region and credentials from the environment; moto takes any.
        for (k, v) in [("AWS_REGION", "us-east-1"), ("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")] {
            if std::env::var_os(k).is_none() {
                // Every test sets the same values.
                std::env::set_var(k, v);
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
        let bin = std::env::var_os("STEPPE_VENV").map(|v| std::path::PathBuf::from(v).join("bin/moto_server")).filter(|p| p.exists()).unwrap_or_else(|| "moto_server".into());
        let child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} ({e}): scripts/test installs moto[server] in $STEPPE_VENV", bin.display()));
        let t0 = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(30), "moto_server did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Moto { child, url: format!("http://127.0.0.1:{port}") }
    }

    pub fn options(&self) -> QueueOptions {
        QueueOptions { endpoint: Some(self.url.clone()), ..QueueOptions::default() }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Pub/Sub emulator of the Google Cloud SDK (in this machine image) on
/// a free loopback port; `PUBSUB_EMULATOR_HOST` of this test points at it.
pub struct PubSubEmulator {
    child: Child,
}

impl PubSubEmulator {
    pub fn start() -> PubSubEmulator {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port");
        let bin = pubsub_emulator();
        let child = Command::new(&bin)
            .args(["--host=127.0.0.1", &format!("--port={port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{} ({e}): the Pub/Sub emulator ships with the Google Cloud SDK (platform/pubsub-emulator/bin)", bin.display()));
        let t0 = std::time::Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(t0.elapsed() < Duration::from_secs(60), "the Pub/Sub emulator did not listen on {port}");
            std::thread::sleep(Duration::from_millis(100));
        }
        // Each test is a process of its own under nextest.
        std::env::set_var("PUBSUB_EMULATOR_HOST", format!("127.0.0.1:{port}"));
        PubSubEmulator { child }
    }
}

/// Where the emulator is: $PUBSUB_EMULATOR_BIN, else under the SDK gcloud belongs to.
pub fn pubsub_emulator() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("PUBSUB_EMULATOR_BIN") {
        return p.into();
    }
    let sdk = Command::new("gcloud").args(["info", "--format=value(installation.sdk_root)"]).output().ok().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).filter(|s| !s.is_empty());
    std::path::PathBuf::from(sdk.unwrap_or_else(|| "/usr/lib/google-cloud-sdk".into())).join("platform/pubsub-emulator/bin/cloud-pubsub-emulator")
}

impl Drop for PubSubEmulator {
    fn drop(&mut self) {
        // The emulator's launcher starts a JVM under it: the whole group goes.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
