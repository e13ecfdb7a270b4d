//! The fleet page: connected workers (slots, pool, containers, last
//! heartbeat) and each pool's backlog, in flight and oldest wait.

use std::sync::Arc;

use super::html::esc;

/// Where the fleet page reads from (a coordinator's; embedded has none).
#[derive(Clone)]
pub struct Fleet {
    pub registry: crate::registry::WorkerRegistry,
    pub dispatcher: Arc<crate::dispatch::Dispatcher>,
}

impl Fleet {
    pub async fn page(&self) -> String {
        let workers = self.registry.list().await;
        let figures = self.dispatcher.figures().await;
        let mut w = String::new();
        for x in &workers {
            w.push_str(&format!(
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}s ago</td></tr>",
                esc(&x.name),
                esc(&x.pool),
                x.slots,
                if x.remote { "remote" } else { "local" },
                if x.containers { "yes" } else { "no" },
                x.last_seen_ago.as_secs_f64()
            ));
        }
        let mut p = String::new();
        for f in &figures {
            p.push_str(&format!("<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1}s</td></tr>", esc(&f.pool), f.waiting, f.in_flight, f.oldest_waiting.as_secs_f64()));
        }
        format!(
            r#"<h1>Fleet</h1><h2>Workers</h2><table id="workers"><tr><th>Worker</th><th>Pool</th><th>Slots</th><th>Where</th><th>Containers</th><th>Heartbeat</th></tr>{w}</table>
<h2>Pools</h2><table id="pools"><tr><th>Pool</th><th>Waiting</th><th>In flight</th><th>Oldest waiting</th></tr>{p}</table>"#
        )
    }
}
