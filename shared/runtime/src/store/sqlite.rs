//! The Store of embedded mode: SQLite in `.steppe/<file>.db`, created on first use.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};

use super::{canonical, ApprovalRecord, QuestionRecord, LogLine, PipelineSummary, RunFilter, RunEvent, RunRecord, Scope, StepRecord, Store, StoreError};

pub struct SqliteStore {
    path: String,
    conn: Mutex<Connection>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS runs (
  id TEXT PRIMARY KEY, job TEXT NOT NULL, started_ms INTEGER NOT NULL,
  finished_ms INTEGER, outcome TEXT, message TEXT NOT NULL DEFAULT '',
  team TEXT NOT NULL DEFAULT '', pipeline TEXT NOT NULL DEFAULT '',
  owner TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS owners (owner TEXT PRIMARY KEY, alive_until_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS spend (counter TEXT PRIMARY KEY, tokens INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS steps (
  run_id TEXT NOT NULL, seq INTEGER NOT NULL, name TEXT NOT NULL, outcome TEXT NOT NULL,
  message TEXT NOT NULL, duration_ms INTEGER NOT NULL, exit_code INTEGER,
  PRIMARY KEY (run_id, seq));
CREATE TABLE IF NOT EXISTS logs (
  run_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT, step TEXT NOT NULL,
  stderr INTEGER NOT NULL, line TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS logs_run ON logs (run_id, seq);
CREATE TABLE IF NOT EXISTS spans (
  run_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT, span TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS spans_run ON spans (run_id, seq);
CREATE INDEX IF NOT EXISTS runs_job ON runs (job, started_ms);
CREATE TABLE IF NOT EXISTS events (
  run_id TEXT NOT NULL, seq INTEGER PRIMARY KEY AUTOINCREMENT, at_ms INTEGER NOT NULL,
  kind TEXT NOT NULL, step TEXT NOT NULL, message TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, seq);
CREATE TABLE IF NOT EXISTS resource_versions (
  team TEXT NOT NULL, pipeline TEXT NOT NULL, resource TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL,
  PRIMARY KEY (team, pipeline, resource, version));
CREATE TABLE IF NOT EXISTS passed (
  team TEXT NOT NULL, pipeline TEXT NOT NULL, job TEXT NOT NULL, resource TEXT NOT NULL, version TEXT NOT NULL,
  PRIMARY KEY (team, pipeline, job, resource, version));
CREATE TABLE IF NOT EXISTS pipeline_values (
  team TEXT NOT NULL, pipeline TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL,
  PRIMARY KEY (team, pipeline, key));
CREATE TABLE IF NOT EXISTS chains (
  team TEXT NOT NULL, pipeline TEXT NOT NULL, job TEXT NOT NULL, hash TEXT NOT NULL,
  PRIMARY KEY (team, pipeline, job, hash));
CREATE TABLE IF NOT EXISTS approvals (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, job TEXT NOT NULL,
  message TEXT NOT NULL, requested_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL,
  decision TEXT, reason TEXT NOT NULL DEFAULT '', approver TEXT NOT NULL DEFAULT '',
  team TEXT NOT NULL DEFAULT '', pipeline TEXT NOT NULL DEFAULT '');
CREATE TABLE IF NOT EXISTS questions (
  id INTEGER PRIMARY KEY AUTOINCREMENT, team TEXT NOT NULL, pipeline TEXT NOT NULL,
  run_id TEXT NOT NULL, job TEXT NOT NULL, agent TEXT NOT NULL, question TEXT NOT NULL,
  options TEXT NOT NULL, memo TEXT NOT NULL, asked_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL,
  answer TEXT, source TEXT NOT NULL DEFAULT '', answered_ms INTEGER);
CREATE INDEX IF NOT EXISTS questions_memo ON questions (run_id, memo);
";

/// Set on every connection: a write-ahead log (readers never wait for the
/// writer), synced at checkpoints only, and copied into the database by the
/// commit that takes it past 256 pages (SQLite's default is 1,000: since
/// the last connection to close leaves the log, the next process to open
/// the store reads it back, and a shorter log is read sooner).
const PRAGMAS: &str = "PRAGMA busy_timeout=5000; PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=256;";

/// The schema this build writes, kept in `PRAGMA user_version`: a store at
/// it opens without running the schema again. Raise it with every change to
/// [`SCHEMA`], [`MIGRATE`] or the columns `open` adds.
const SCHEMA_VERSION: i64 = 1;

/// Brings a store made before history was kept per pipeline up to date:
/// its runs, approvals, versions and `passed:` records become the history
/// of `pipeline` (the file's own, by default), so nothing is lost.
const MIGRATE: &[&str] = &[
    "ALTER TABLE runs ADD COLUMN team TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE runs ADD COLUMN pipeline TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE approvals ADD COLUMN team TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE approvals ADD COLUMN pipeline TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE runs ADD COLUMN owner TEXT NOT NULL DEFAULT ''",
];

fn approval_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    Ok(ApprovalRecord {
        id: r.get(0)?,
        run_id: r.get(1)?,
        job: r.get(2)?,
        message: r.get(3)?,
        requested_ms: r.get(4)?,
        deadline_ms: r.get(5)?,
        decision: r.get(6)?,
        reason: r.get(7)?,
        approver: r.get(8)?,
        team: r.get(9)?,
        pipeline: r.get(10)?,
    })
}

fn question_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<QuestionRecord> {
    let options: String = r.get(7)?;
    Ok(QuestionRecord {
        id: r.get(0)?,
        team: r.get(1)?,
        pipeline: r.get(2)?,
        run_id: r.get(3)?,
        job: r.get(4)?,
        agent: r.get(5)?,
        question: r.get(6)?,
        options: serde_json::from_str(&options).unwrap_or_default(),
        asked_ms: r.get(8)?,
        deadline_ms: r.get(9)?,
        answer: r.get(10)?,
        source: r.get(11)?,
        answered_ms: r.get(12)?,
    })
}

const QUESTION_COLS: &str = "id, team, pipeline, run_id, job, agent, question, options, asked_ms, deadline_ms, answer, source, answered_ms";
const APPROVAL_COLS: &str = "id, run_id, job, message, requested_ms, deadline_ms, decision, reason, approver, team, pipeline";
const RUN_COLS: &str = "id, job, started_ms, finished_ms, outcome, message, team, pipeline, owner";

impl SqliteStore {
    /// Opens (creating if needed) the store at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let p = path.display().to_string();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| StoreError::Io { path: p.clone(), source })?;
        }
        let conn = Connection::open(path).map_err(|source| StoreError::Sqlite { path: p.clone(), source })?;
        let sql = |source| StoreError::Sqlite { path: p.clone(), source };
        conn.execute_batch(PRAGMAS).map_err(sql)?;
        // The last connection to close leaves the write-ahead log as it is
        // rather than copying it into the database with two fsyncs (a
        // millisecond of a one-step run's ten); see PRAGMAS.
        conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true).map_err(sql)?;
        let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(sql)?;
        if version < SCHEMA_VERSION {
            // One transaction for the whole schema: a fresh store is made in
            // one commit rather than one per table.
            conn.execute_batch("BEGIN IMMEDIATE").map_err(sql)?;
            let made = (|| {
                conn.execute_batch(SCHEMA)?;
                // Columns added after the first schema; an existing store gains them.
                for col in ["tokens INTEGER", "detail TEXT"] {
                    let _ = conn.execute_batch(&format!("ALTER TABLE steps ADD COLUMN {col}"));
                }
                let _ = conn.execute_batch("ALTER TABLE logs ADD COLUMN omitted TEXT");
                Self::migrate(&conn, &legacy_pipeline(path))?;
                conn.execute_batch(&format!("PRAGMA user_version = {SCHEMA_VERSION}"))
            })();
            conn.execute_batch(if made.is_ok() { "COMMIT" } else { "ROLLBACK" }).map_err(sql)?;
            made.map_err(sql)?;
        }
        Ok(SqliteStore { path: p, conn: Mutex::new(conn) })
    }

    fn migrate(conn: &Connection, pipeline: &str) -> rusqlite::Result<()> {
        for m in MIGRATE {
            // Fails only when the column is already there.
            let _ = conn.execute_batch(m);
        }
        let old: i64 = conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name IN ('versions', 'green')", [], |r| r.get(0))?;
        if old > 0 {
            conn.execute_batch("SAVEPOINT legacy")?;
            let moved = (|| {
                if conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'versions'", [], |r| r.get::<_, i64>(0))? > 0 {
                    conn.execute("INSERT OR IGNORE INTO resource_versions (team, pipeline, resource, seq, version) SELECT '', ?1, resource, seq, version FROM versions", params![pipeline])?;
                    conn.execute_batch("DROP TABLE versions")?;
                }
                if conn.query_row("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = 'green'", [], |r| r.get::<_, i64>(0))? > 0 {
                    conn.execute("INSERT OR IGNORE INTO passed (team, pipeline, job, resource, version) SELECT '', ?1, job, resource, version FROM green", params![pipeline])?;
                    conn.execute_batch("DROP TABLE green")?;
                }
                conn.execute("UPDATE runs SET pipeline = ?1 WHERE pipeline = ''", params![pipeline])?;
                conn.execute("UPDATE approvals SET pipeline = ?1 WHERE pipeline = ''", params![pipeline])
            })();
            conn.execute_batch(if moved.is_ok() { "RELEASE legacy" } else { "ROLLBACK TO legacy; RELEASE legacy" })?;
            moved?;
        }
        conn.execute_batch("CREATE INDEX IF NOT EXISTS runs_scope ON runs (team, pipeline, started_ms)")
    }

    /// Opens an existing store read-only views use; `None` if it was never created.
    pub fn open_existing(path: &Path) -> Result<Option<Self>, StoreError> {
        if !path.exists() {
            return Ok(None);
        }
        Self::open(path).map(Some)
    }

    fn with<T>(&self, f: impl FnOnce(&mut Connection) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut c).map_err(|source| StoreError::Sqlite { path: self.path.clone(), source })
    }
}


/// The pipeline an older store's history belongs to: the stem of the file
/// it records (`.steppe/ci.yml.db` → `ci`), as `steppe run` names it now.
fn legacy_pipeline(db: &Path) -> String {
    let name = db.file_stem().map(|n| Path::new(n).to_path_buf()).unwrap_or_default();
    match name.extension() {
        Some(_) => name.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default(),
        None => String::new(),
    }
}

fn run_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<RunRecord> {
    Ok(RunRecord {
        id: r.get(0)?,
        job: r.get(1)?,
        started_ms: r.get(2)?,
        finished_ms: r.get(3)?,
        outcome: r.get(4)?,
        message: r.get(5)?,
        team: r.get(6)?,
        pipeline: r.get(7)?,
        owner: r.get(8)?,
    })
}

fn insert_step(c: &rusqlite::Connection, s: &StepRecord) -> rusqlite::Result<()> {
    c.prepare_cached("INSERT OR REPLACE INTO steps (run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")?
        .execute(params![s.run_id, s.seq, s.name, s.outcome, s.message, s.duration_ms, s.exit_code, s.tokens, s.detail])
        .map(|_| ())
}

impl Store for SqliteStore {
    fn start_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.with(|c| {
            // A run taken over (its driver died) changes owner and goes on.
            c.execute(
                "INSERT INTO runs (id, job, started_ms, team, pipeline, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(id) DO UPDATE SET owner = ?6, finished_ms = NULL, outcome = NULL, message = ''",
                params![rec.id, rec.job, rec.started_ms, rec.team, rec.pipeline, rec.owner],
            )
            .map(|_| ())
        })
    }

    fn finish_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO runs (id, job, started_ms, finished_ms, outcome, message, team, pipeline, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT(id) DO UPDATE SET finished_ms = ?4, outcome = ?5, message = ?6",
                params![rec.id, rec.job, rec.started_ms, rec.finished_ms, rec.outcome, rec.message, rec.team, rec.pipeline, rec.owner],
            )
            .map(|_| ())
        })
    }

    fn record_step(&self, s: &StepRecord) -> Result<(), StoreError> {
        self.with(|c| insert_step(c, s))
    }

    fn record_batch(&self, b: &super::Batch) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached("INSERT INTO events (run_id, at_ms, kind, step, message) VALUES (?1, ?2, ?3, ?4, ?5)")?;
                for (run_id, e) in &b.events {
                    st.execute(params![run_id, e.at_ms, e.kind, e.step, e.message])?;
                }
                let mut st = tx.prepare_cached("INSERT INTO logs (run_id, step, stderr, line, omitted) VALUES (?1, ?2, ?3, ?4, ?5)")?;
                for (run_id, l) in &b.logs {
                    let omitted = l.omitted.as_ref().and_then(|o| serde_json::to_string(o).ok());
                    st.execute(params![run_id, l.step, l.stderr, l.line, omitted])?;
                }
                for s in &b.steps {
                    insert_step(&tx, s)?;
                }
                let mut st = tx.prepare_cached("INSERT INTO spans (run_id, span) VALUES (?1, ?2)")?;
                for (run_id, spans) in super::spans_by_run(&b.spans) {
                    st.execute(params![run_id, crate::trace::SpanRecord::encode_many(&spans)])?;
                }
                let mut st = tx.prepare_cached("INSERT OR IGNORE INTO chains (team, pipeline, job, hash) VALUES (?1, ?2, ?3, ?4)")?;
                for (scope, job, hash) in &b.chains {
                    st.execute(params![scope.team, scope.pipeline, job, hash])?;
                }
            }
            tx.commit()
        })
    }

    fn append_logs(&self, run_id: &str, lines: &[LogLine]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached("INSERT INTO logs (run_id, step, stderr, line, omitted) VALUES (?1, ?2, ?3, ?4, ?5)")?;
                for l in lines {
                    let omitted = l.omitted.as_ref().and_then(|o| serde_json::to_string(o).ok());
                    st.execute(params![run_id, l.step, l.stderr, l.line, omitted])?;
                }
            }
            tx.commit()
        })
    }

    fn runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        // Only the filters given are written (`?1 IS NULL OR team = ?1` is
        // served by no index): with a team and a pipeline, `runs_scope`
        // yields the runs newest first, and what is skipped is never read.
        let given = [("team", f.team), ("pipeline", f.pipeline), ("job", f.job)];
        let (mut conds, mut values) = (Vec::new(), Vec::new());
        for (column, value) in given {
            if let Some(v) = value {
                values.push(v);
                conds.push(format!("{column} = ?{}", values.len()));
            }
        }
        let filter = if conds.is_empty() { String::new() } else { format!("WHERE {}", conds.join(" AND ")) };
        let (limit, skip) = (i64::try_from(f.limit).unwrap_or(i64::MAX), i64::try_from(f.skip).unwrap_or(i64::MAX));
        self.with(|c| {
            let mut st = c.prepare(&format!("SELECT {RUN_COLS} FROM runs {filter} ORDER BY started_ms DESC, rowid DESC LIMIT {limit} OFFSET {skip}"))?;
            let rows = st.query_map(rusqlite::params_from_iter(values), run_row)?;
            rows.collect()
        })
    }

    fn pipelines(&self, team: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError> {
        self.with(|c| {
            // The newest run of each (team, pipeline).
            let mut st = c.prepare(&format!(
                "SELECT {RUN_COLS} FROM runs r
                 WHERE (?1 IS NULL OR team = ?1) AND rowid = (
                   SELECT rowid FROM runs x WHERE x.team = r.team AND x.pipeline = r.pipeline
                   ORDER BY started_ms DESC, rowid DESC LIMIT 1)
                 ORDER BY team, pipeline"
            ))?;
            let rows = st.query_map(params![team], run_row)?;
            rows.map(|r| r.map(|last| PipelineSummary { team: last.team.clone(), pipeline: last.pipeline.clone(), last })).collect()
        })
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        self.with(|c| c.query_row(&format!("SELECT {RUN_COLS} FROM runs WHERE id = ?1"), params![id], run_row).optional())
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(
                "SELECT run_id, seq, name, outcome, message, duration_ms, exit_code, tokens, detail FROM steps WHERE run_id = ?1 ORDER BY seq",
            )?;
            let rows = st.query_map(params![run_id], |r| {
                Ok(StepRecord {
                    run_id: r.get(0)?,
                    seq: r.get(1)?,
                    name: r.get(2)?,
                    outcome: r.get(3)?,
                    message: r.get(4)?,
                    duration_ms: r.get(5)?,
                    exit_code: r.get(6)?,
                    tokens: r.get(7)?,
                    detail: r.get(8)?,
                })
            })?;
            rows.collect()
        })
    }

    fn request_approval(&self, scope: &Scope, run_id: &str, job: &str, message: &str, requested_ms: i64, deadline_ms: i64) -> Result<i64, StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO approvals (run_id, job, message, requested_ms, deadline_ms, team, pipeline) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![run_id, job, message, requested_ms, deadline_ms, scope.team, scope.pipeline],
            )?;
            Ok(c.last_insert_rowid())
        })
    }

    fn approval(&self, id: i64) -> Result<Option<ApprovalRecord>, StoreError> {
        self.with(|c| c.query_row(&format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?1"), params![id], approval_row).optional())
    }

    fn pending_approvals(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare(&format!(
                "SELECT {APPROVAL_COLS} FROM approvals WHERE decision IS NULL AND (?1 IS NULL OR team = ?1) AND (?2 IS NULL OR pipeline = ?2) ORDER BY id"
            ))?;
            let rows = st.query_map(params![team, pipeline], approval_row)?;
            rows.collect()
        })
    }

    fn add_spend(&self, counter: &str, tokens: u64) -> Result<u64, StoreError> {
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
        self.with(|c| {
            c.query_row(
                "INSERT INTO spend (counter, tokens) VALUES (?1, ?2) ON CONFLICT(counter) DO UPDATE SET tokens = tokens + ?2 RETURNING tokens",
                params![counter, tokens],
                |r| r.get::<_, i64>(0),
            )
            .map(|t| t.max(0) as u64)
        })
    }

    fn heartbeat(&self, owner: &str, now_ms: i64, ttl_ms: i64) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT INTO owners (owner, alive_until_ms) VALUES (?1, ?2) ON CONFLICT(owner) DO UPDATE SET alive_until_ms = ?2",
                params![owner, now_ms + ttl_ms],
            )?;
            // Owners long gone are forgotten (their runs stay orphans).
            c.execute("DELETE FROM owners WHERE alive_until_ms < ?1", params![now_ms - 86_400_000]).map(|_| ())
        })
    }

    fn orphaned_runs(&self, now_ms: i64) -> Result<Vec<RunRecord>, StoreError> {
        self.with(|c| {
            // A run recorded before owners were (owner '') is left as it is.
            let mut st = c.prepare(&format!(
                "SELECT {RUN_COLS} FROM runs WHERE outcome IS NULL AND owner != ''
                   AND owner NOT IN (SELECT owner FROM owners WHERE alive_until_ms >= ?1) ORDER BY started_ms"
            ))?;
            let rows = st.query_map(params![now_ms], run_row)?;
            rows.collect()
        })
    }

    fn decide_approval(&self, id: i64, approved: bool, reason: &str, approver: &str) -> Result<bool, StoreError> {
        let decision = if approved { "approved" } else { "rejected" };
        self.with(|c| {
            c.execute(
                "UPDATE approvals SET decision = ?2, reason = ?3, approver = ?4 WHERE id = ?1 AND decision IS NULL",
                params![id, decision, reason, approver],
            )
            .map(|n| n == 1)
        })
    }

    fn ask_question(&self, q: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError> {
        let memo = q.memo_key();
        let options = serde_json::to_string(&q.options).unwrap_or_else(|_| "[]".into());
        self.with(|c| {
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
            let asked = tx
                .query_row(&format!("SELECT {QUESTION_COLS} FROM questions WHERE run_id = ?1 AND memo = ?2 AND source != 'expired' ORDER BY id LIMIT 1"), params![q.run_id, memo], question_row)
                .optional()?;
            let filed = match asked {
                Some(earlier) => (earlier, false),
                None => {
                    tx.execute(
                        "INSERT INTO questions (team, pipeline, run_id, job, agent, question, options, memo, asked_ms, deadline_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                        params![q.team, q.pipeline, q.run_id, q.job, q.agent, q.question, options, memo, q.asked_ms, q.deadline_ms],
                    )?;
                    (QuestionRecord { id: tx.last_insert_rowid(), answer: None, source: String::new(), answered_ms: None, ..q.clone() }, true)
                }
            };
            tx.commit()?;
            Ok(filed)
        })
    }

    fn question(&self, id: i64) -> Result<Option<QuestionRecord>, StoreError> {
        self.with(|c| c.query_row(&format!("SELECT {QUESTION_COLS} FROM questions WHERE id = ?1"), params![id], question_row).optional())
    }

    fn pending_questions(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError> {
        self.with(|c| {
            // One whose step went away before it expired is not listed past its deadline.
            let mut st = c.prepare(&format!(
                "SELECT {QUESTION_COLS} FROM questions WHERE source = '' AND (deadline_ms = 0 OR deadline_ms > ?3) AND (?1 IS NULL OR team = ?1) AND (?2 IS NULL OR pipeline = ?2) ORDER BY id"
            ))?;
            let rows = st.query_map(params![team, pipeline, super::now_ms()], question_row)?;
            rows.collect()
        })
    }

    fn settle_question(&self, id: i64, answer: Option<&str>, source: &str, at_ms: i64) -> Result<bool, StoreError> {
        self.with(|c| {
            c.execute("UPDATE questions SET answer = ?2, source = ?3, answered_ms = ?4 WHERE id = ?1 AND source = ''", params![id, answer, source, at_ms]).map(|n| n == 1)
        })
    }

    fn record_events(&self, run_id: &str, events: &[RunEvent]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let mut st = tx.prepare_cached("INSERT INTO events (run_id, at_ms, kind, step, message) VALUES (?1, ?2, ?3, ?4, ?5)")?;
                for e in events {
                    st.execute(params![run_id, e.at_ms, e.kind, e.step, e.message])?;
                }
            }
            tx.commit()
        })
    }

    fn events_after(&self, run_id: &str, after: usize) -> Result<Vec<RunEvent>, StoreError> {
        let after = i64::try_from(after).unwrap_or(i64::MAX);
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT at_ms, kind, step, message FROM events WHERE run_id = ?1 ORDER BY seq LIMIT -1 OFFSET ?2")?;
            let rows = st.query_map(params![run_id, after], |r| Ok(RunEvent { at_ms: r.get(0)?, kind: r.get(1)?, step: r.get(2)?, message: r.get(3)? }))?;
            rows.collect()
        })
    }

    fn record_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            {
                let next: i64 = tx.query_row(
                    "SELECT COALESCE(MAX(seq), -1) + 1 FROM resource_versions WHERE team = ?1 AND pipeline = ?2 AND resource = ?3",
                    params![scope.team, scope.pipeline, resource],
                    |r| r.get(0),
                )?;
                let mut st = tx.prepare_cached("INSERT OR IGNORE INTO resource_versions (team, pipeline, resource, seq, version) VALUES (?1, ?2, ?3, ?4, ?5)")?;
                for (i, v) in versions.iter().enumerate() {
                    st.execute(params![scope.team, scope.pipeline, resource, next + i as i64, canonical(v)])?;
                }
            }
            tx.commit()
        })
    }

    fn history(&self, scope: &Scope, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT version FROM resource_versions WHERE team = ?1 AND pipeline = ?2 AND resource = ?3 ORDER BY seq")?;
            let rows = st.query_map(params![scope.team, scope.pipeline, resource], |r| r.get::<_, String>(0))?;
            rows.map(|r| r.map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::Null))).collect()
        })
    }

    fn record_green(&self, scope: &Scope, job: &str, resource: &str, version: &serde_json::Value) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute(
                "INSERT OR IGNORE INTO passed (team, pipeline, job, resource, version) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![scope.team, scope.pipeline, job, resource, canonical(version)],
            )
            .map(|_| ())
        })
    }

    fn green(&self, scope: &Scope, job: &str, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT version FROM passed WHERE team = ?1 AND pipeline = ?2 AND job = ?3 AND resource = ?4")?;
            let rows = st.query_map(params![scope.team, scope.pipeline, job, resource], |r| r.get::<_, String>(0))?;
            rows.map(|r| r.map(|t| serde_json::from_str(&t).unwrap_or(serde_json::Value::Null))).collect()
        })
    }

    fn record_chain(&self, scope: &Scope, job: &str, hash: &str) -> Result<(), StoreError> {
        self.with(|c| {
            c.execute("INSERT OR IGNORE INTO chains (team, pipeline, job, hash) VALUES (?1, ?2, ?3, ?4)", params![scope.team, scope.pipeline, job, hash]).map(|_| ())
        })
    }

    fn forget_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value], jobs: &[String]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            for v in versions {
                let v = canonical(v);
                tx.execute("DELETE FROM resource_versions WHERE team = ?1 AND pipeline = ?2 AND resource = ?3 AND version = ?4", params![scope.team, scope.pipeline, resource, v])?;
                for j in jobs {
                    tx.execute("DELETE FROM passed WHERE team = ?1 AND pipeline = ?2 AND job = ?3 AND resource = ?4 AND version = ?5", params![scope.team, scope.pipeline, j, resource, v])?;
                }
            }
            tx.commit()
        })
    }

    fn delete_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            for table in ["steps", "logs", "spans", "events"] {
                tx.execute(&format!("DELETE FROM {table} WHERE run_id = ?1"), params![run.id])?;
            }
            tx.execute("DELETE FROM runs WHERE id = ?1", params![run.id])?;
            tx.commit()
        })
    }

    fn set_value(&self, scope: &Scope, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        self.with(|c| match value {
            Some(v) => c.execute("INSERT OR REPLACE INTO pipeline_values (team, pipeline, key, value) VALUES (?1, ?2, ?3, ?4)", params![scope.team, scope.pipeline, key, v]).map(|_| ()),
            None => c.execute("DELETE FROM pipeline_values WHERE team = ?1 AND pipeline = ?2 AND key = ?3", params![scope.team, scope.pipeline, key]).map(|_| ()),
        })
    }

    fn value(&self, scope: &Scope, key: &str) -> Result<Option<String>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT value FROM pipeline_values WHERE team = ?1 AND pipeline = ?2 AND key = ?3")?;
            let mut rows = st.query_map(params![scope.team, scope.pipeline, key], |r| r.get::<_, String>(0))?;
            rows.next().transpose()
        })
    }

    fn chain_succeeded(&self, scope: &Scope, job: &str, hash: &str) -> Result<bool, StoreError> {
        self.with(|c| {
            c.query_row("SELECT COUNT(*) FROM chains WHERE team = ?1 AND pipeline = ?2 AND job = ?3 AND hash = ?4", params![scope.team, scope.pipeline, job, hash], |r| r.get::<_, i64>(0))
                .map(|n| n > 0)
        })
    }

    fn chains_succeeded(&self, scope: &Scope, job: &str, hashes: &[String]) -> Result<std::collections::HashSet<String>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare_cached("SELECT COUNT(*) FROM chains WHERE team = ?1 AND pipeline = ?2 AND job = ?3 AND hash = ?4")?;
            let mut found = std::collections::HashSet::new();
            for h in hashes {
                if st.query_row(params![scope.team, scope.pipeline, job, h], |r| r.get::<_, i64>(0))? > 0 {
                    found.insert(h.clone());
                }
            }
            Ok(found)
        })
    }

    fn add_spans(&self, run_id: &str, spans: &[crate::trace::SpanRecord]) -> Result<(), StoreError> {
        self.with(|c| {
            let tx = c.transaction()?;
            {
                if !spans.is_empty() {
                    let mut st = tx.prepare_cached("INSERT INTO spans (run_id, span) VALUES (?1, ?2)")?;
                    st.execute(params![run_id, crate::trace::SpanRecord::encode_many(&spans.iter().collect::<Vec<_>>())])?;
                }
            }
            tx.commit()
        })
    }

    fn spans(&self, run_id: &str) -> Result<Vec<crate::trace::SpanRecord>, StoreError> {
        let raw: Vec<String> = self.with(|c| {
            let mut st = c.prepare("SELECT span FROM spans WHERE run_id = ?1 ORDER BY seq")?;
            let rows = st.query_map(params![run_id], |r| r.get(0))?;
            rows.collect()
        })?;
        Ok(raw.iter().flat_map(|r| crate::trace::SpanRecord::decode_many(r)).collect())
    }

    fn logs(&self, run_id: &str) -> Result<Vec<LogLine>, StoreError> {
        self.with(|c| {
            let mut st = c.prepare("SELECT step, stderr, line, omitted FROM logs WHERE run_id = ?1 ORDER BY seq")?;
            let rows = st.query_map(params![run_id], |r| {
                let omitted: Option<String> = r.get(3)?;
                Ok(LogLine { step: r.get(0)?, stderr: r.get(1)?, line: r.get(2)?, omitted: omitted.and_then(|o| serde_json::from_str(&o).ok()) })
            })?;
            rows.collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{db_path, tests::conformance};


    #[test]
    fn records_and_reads_back() {
        let dir = std::env::temp_dir().join(format!("steppe-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = db_path(&dir.join("ci.yml"));
        assert!(path.ends_with(".steppe/ci.yml.db"));
        assert!(SqliteStore::open_existing(&path).unwrap().is_none());
        let s = SqliteStore::open(&path).unwrap();
        conformance(&s);
        drop(s);
        // History survives reopening (the conformance suite's runs, less the one it deleted).
        let s = SqliteStore::open_existing(&path).unwrap().unwrap();
        assert_eq!(s.runs(&crate::store::RunFilter { limit: 10, ..Default::default() }).unwrap().len(), 9);
    }

    #[test]
    fn a_store_from_before_pipelines_keeps_its_history_as_the_files() {
        let dir = std::env::temp_dir().join(format!("steppe-store-legacy-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = db_path(&dir.join("deploy.yaml"));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "CREATE TABLE runs (id TEXT PRIMARY KEY, job TEXT NOT NULL, started_ms INTEGER NOT NULL, finished_ms INTEGER, outcome TEXT, message TEXT NOT NULL DEFAULT '');
             CREATE TABLE versions (resource TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL, PRIMARY KEY (resource, version));
             CREATE TABLE green (job TEXT NOT NULL, resource TEXT NOT NULL, version TEXT NOT NULL, PRIMARY KEY (job, resource, version));
             CREATE TABLE approvals (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL, job TEXT NOT NULL, message TEXT NOT NULL, requested_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL, decision TEXT, reason TEXT NOT NULL DEFAULT '', approver TEXT NOT NULL DEFAULT '');
             INSERT INTO runs (id, job, started_ms) VALUES ('old', 'ship', 1);
             INSERT INTO versions VALUES ('repo', 0, '{\"ref\":\"a\"}');
             INSERT INTO green VALUES ('ship', 'repo', '{\"ref\":\"a\"}');
             INSERT INTO approvals (run_id, job, message, requested_ms, deadline_ms) VALUES ('old', 'ship', 'go?', 1, 2);",
        )
        .unwrap();
        drop(c);
        let s = SqliteStore::open(&path).unwrap();
        let deploy = Scope::new("", "deploy");
        assert_eq!(s.run("old").unwrap().unwrap().pipeline, "deploy");
        assert_eq!(s.history(&deploy, "repo").unwrap(), vec![serde_json::json!({"ref": "a"})]);
        assert_eq!(s.green(&deploy, "ship", "repo").unwrap().len(), 1);
        assert_eq!(s.pending_approvals(None, Some("deploy")).unwrap().len(), 1);
        drop(s);
        // Opening again changes nothing.
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.history(&deploy, "repo").unwrap().len(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
