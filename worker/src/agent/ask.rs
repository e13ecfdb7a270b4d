//! ask_user's people: at the run's terminal (the question shown, the answer
//! typed back, one question at a time however many steps ask), or parked in
//! the store until someone answers with `steppe questions answer`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use serde_json::{json, Value};

/// A person is being asked at this process's terminal: the live status line keeps off it.
static ASKING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether a person is being asked at this process's terminal now.
pub fn person_is_answering() -> bool {
    ASKING.load(std::sync::atomic::Ordering::Relaxed)
}

/// Marks the terminal taken while it lives.
struct Asking;

impl Drop for Asking {
    fn drop(&mut self) {
        ASKING.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Asks at this process's terminal; None when there is none, nobody typed
/// an answer in time, or (with `options_required`) three answers were not
/// among the options.
pub(super) async fn ask_person(question: &str, options: &[String], options_required: bool, timeout: Option<Duration>) -> Option<Value> {
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    if !std::io::stdin().is_terminal() {
        return None;
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    ASKING.store(true, std::sync::atomic::Ordering::Relaxed);
    let _asking = Asking;
    let (q, opts) = (steppe_runtime::printable::escape_controls(question).into_owned(), options.to_vec());
    let read = tokio::task::spawn_blocking(move || -> Option<String> {
        let shown = if opts.is_empty() { String::new() } else { format!(" [{}]", opts.join(" | ")) };
        for _ in 0..3 {
            // One write, so the run's other lines cannot land inside the prompt.
            let prompt = format!("\r\x1b[2K? {q}{shown}\n> ");
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(prompt.as_bytes()).and_then(|()| err.flush());
            drop(err);
            let mut line = String::new();
            if std::io::stdin().lock().read_line(&mut line).ok()? == 0 {
                return None;
            }
            let answer = line.trim().to_string();
            if answer.is_empty() {
                return None;
            }
            if !options_required || opts.is_empty() || opts.contains(&answer) {
                return Some(answer);
            }
            let again = format!("  (answer with one of: {})\n", opts.join(", "));
            let _ = std::io::stderr().lock().write_all(again.as_bytes());
        }
        None
    });
    let answer = match timeout {
        Some(t) => tokio::time::timeout(t, read).await.ok()?.ok()?,
        None => read.await.ok()?,
    }?;
    Some(json!({"answered": true, "answer": answer, "source": "person"}))
}

/// How long a parked question is waited on when its grant sets no `timeout:`.
pub(super) const PARKED_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The tool result of an answer the run recorded (an earlier step's, or a
/// parked question's): `source` as the store has it.
pub(super) fn recorded(q: &steppe_runtime::store::QuestionRecord) -> Option<Value> {
    let answer = q.answer.as_deref()?;
    Some(match q.source.as_str() {
        "default" => json!({"answered": false, "answer": answer, "source": "default", "note": "nobody answered; the declared default was used"}),
        "expired" => return None,
        s => json!({"answered": true, "answer": answer, "source": s.strip_prefix("person:").map_or(s, |_| "person")}),
    })
}

/// Waits for question `id` to be settled in the run's ledger, up to `wait`;
/// None when nobody settled it by then (or it expired).
pub(super) async fn wait_parked(ledger: &dyn steppe_runtime::budget::Ledger, id: i64, wait: Duration) -> Result<Option<steppe_runtime::store::QuestionRecord>, String> {
    let until = tokio::time::Instant::now() + wait;
    let mut misses = 0;
    loop {
        match ledger.question(id).await {
            Ok(Some(q)) if !q.pending() => return Ok(Some(q)),
            Ok(Some(_)) => misses = 0,
            Ok(None) => return Err(format!("question {id} is gone from the store")),
            // A store or coordinator briefly away is waited out; a long outage is not.
            Err(e) => {
                misses += 1;
                if misses >= 30 {
                    return Err(e);
                }
            }
        }
        let now = tokio::time::Instant::now();
        if now >= until {
            return Ok(None);
        }
        tokio::time::sleep((until - now).min(Duration::from_millis(500))).await;
    }
}

/// A filed question its step may stop waiting on without settling (the step
/// aborted or timed out mid-wait): settled as expired when dropped armed, so
/// nobody is left answering a question no step waits for.
pub(super) struct Abandoned {
    ledger: std::sync::Arc<dyn steppe_runtime::budget::Ledger>,
    id: i64,
    armed: bool,
}

impl Abandoned {
    pub(super) fn new(ledger: std::sync::Arc<dyn steppe_runtime::budget::Ledger>, id: i64) -> Self {
        Abandoned { ledger, id, armed: true }
    }

    /// The question was settled as it should be.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (ledger, id) = (self.ledger.clone(), self.id);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let _ = ledger.settle(id, None, "expired").await;
            });
        }
    }
}
