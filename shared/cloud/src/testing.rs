//! A moto server (the AWS APIs, from PyPI) on a free loopback port for one
//! test; `scripts/test` installs it in the venv `$STEPPE_VENV`.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::queues::QueueOptions;

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
