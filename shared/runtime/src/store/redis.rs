//! The Store on Redis, for a cluster: every coordinator (and restart) sees the
//! same history. Keys live under one prefix; versions keep first-seen order.

use std::sync::Mutex;

use redis::Commands;

use super::{canonical, ApprovalRecord, QuestionRecord, LogLine, PipelineSummary, RunFilter, RunEvent, RunRecord, Scope, StepRecord, Store, StoreError};

pub struct RedisStore {
    /// The URL as messages show it (password masked).
    url: String,
    client: redis::Client,
    /// None after a connection broke: the next call connects again.
    conn: Mutex<Option<redis::Connection>>,
    /// While Redis is unreachable: not before this instant is connecting
    /// tried again, and how long the wait after the next failure is.
    retry: Mutex<(std::time::Instant, std::time::Duration)>,
    prefix: String,
}

/// How long to wait for Redis to accept a connection, and to answer.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
const RESPONSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

const BACKOFF_MIN: std::time::Duration = std::time::Duration::from_secs(1);
const BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(10);

/// An error of the connection rather than of the command: it is made again.
fn broken(e: &redis::RedisError) -> bool {
    crate::queue::connection_lost(e) || e.is_timeout()
}

impl RedisStore {
    pub fn connect(url: &str, prefix: &str) -> Result<Self, StoreError> {
        // Messages name the store without its password.
        let shown = crate::secrets::mask_urls(url).into_owned();
        let client = redis::Client::open(url).map_err(|e| StoreError::Redis { url: shown.clone(), message: crate::queue::redis_message(&e) })?;
        let store = RedisStore { url: shown, client, conn: Mutex::new(None), retry: Mutex::new((std::time::Instant::now(), BACKOFF_MIN)), prefix: prefix.to_string() };
        let first = store.open()?;
        *store.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(first);
        Ok(store)
    }

    /// A new connection; while Redis is unreachable, tried at most once
    /// per backoff (1 s doubling to 10 s), failing at once in between.
    fn open(&self) -> Result<redis::Connection, StoreError> {
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        if std::time::Instant::now() < retry.0 {
            return Err(StoreError::Unavailable { url: self.url.clone(), message: "not reachable (retrying)".into() });
        }
        let opened = self.client.get_connection_with_timeout(CONNECT_TIMEOUT).and_then(|c| {
            c.set_read_timeout(Some(RESPONSE_TIMEOUT))?;
            c.set_write_timeout(Some(RESPONSE_TIMEOUT))?;
            Ok(c)
        });
        match opened {
            Ok(c) => {
                *retry = (std::time::Instant::now(), BACKOFF_MIN);
                Ok(c)
            }
            Err(e) => {
                *retry = (std::time::Instant::now() + retry.1, (retry.1 * 2).min(BACKOFF_MAX));
                Err(self.err(e))
            }
        }
    }

    fn err(&self, e: redis::RedisError) -> StoreError {
        let message = crate::queue::redis_message(&e);
        if broken(&e) {
            StoreError::Unavailable { url: self.url.clone(), message }
        } else {
            StoreError::Redis { url: self.url.clone(), message }
        }
    }

    /// A key under this store's prefix. Parts are escaped, so a job or
    /// resource name with a `:` cannot make another's key.
    fn k(&self, parts: &[&str]) -> String {
        let escaped: Vec<String> = parts.iter().map(|p| p.replace('%', "%25").replace(':', "%3A")).collect();
        format!("{}:{}", self.prefix, escaped.join(":"))
    }

    /// The run indexes a run is listed in, most specific last.
    fn run_indexes(&self, r: &RunRecord) -> [String; 4] {
        [self.k(&["runs"]), self.k(&["runs", "team", &r.team]), self.k(&["runs", "scope", &r.team, &r.pipeline]), self.k(&["runs", "scope", &r.team, &r.pipeline, "job", &r.job])]
    }

    fn index_run(&self, r: &RunRecord) -> Result<(), StoreError> {
        let key = self.k(&["run", &r.id]);
        let indexes = self.run_indexes(r);
        let (pipelines, member) = (self.k(&["pipelines"]), format!("{}:{}", r.team, r.pipeline));
        let running = self.k(&["running"]);
        self.with(|c| {
            let mut p = redis::pipe();
            p.set(&key, Self::encode(r)).ignore();
            for i in &indexes {
                p.zadd(i, &r.id, r.started_ms).ignore();
            }
            // The pipeline's newest run: its start time and id.
            p.zadd(&pipelines, &member, r.started_ms).ignore();
            // Unfinished runs, for finding orphans.
            if r.outcome.is_none() {
                p.sadd(&running, &r.id).ignore();
            } else {
                p.srem(&running, &r.id).ignore();
            }
            p.query::<()>(c)
        })
    }

    /// Runs `f` on the connection; a broken connection (Redis restarted,
    /// the network dropped) is replaced and `f` tried once more on the new one.
    fn with<T>(&self, f: impl Fn(&mut redis::Connection) -> redis::RedisResult<T>) -> Result<T, StoreError> {
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        for fresh in [false, true] {
            let conn = match c.as_mut() {
                Some(conn) => conn,
                None => c.insert(self.open()?),
            };
            match f(conn) {
                Ok(v) => return Ok(v),
                // Lost before an answer: try once more on a new connection.
                Err(e) if crate::queue::connection_lost(&e) && !fresh => *c = None,
                // A timeout may have been carried out: not repeated, but the
                // connection (which may still get that answer) is replaced.
                Err(e) => {
                    if broken(&e) {
                        *c = None;
                    }
                    return Err(self.err(e));
                }
            }
        }
        Err(StoreError::Redis { url: self.url.clone(), message: "no connection".into() })
    }

    fn decode<T: serde::de::DeserializeOwned>(&self, raw: &str) -> Result<T, StoreError> {
        serde_json::from_str(raw).map_err(|e| StoreError::Redis { url: self.url.clone(), message: format!("a record that does not decode: {e}") })
    }

    /// An event as stored now, or as a (kind, step, message) triple, as
    /// earlier versions stored them (time unknown: 0).
    fn event(&self, raw: &str) -> Result<RunEvent, StoreError> {
        match serde_json::from_str::<(String, String, String)>(raw) {
            Ok((kind, step, message)) => Ok(RunEvent { at_ms: 0, kind, step, message }),
            Err(_) => self.decode(raw),
        }
    }

    fn encode<T: serde::Serialize>(v: &T) -> String {
        serde_json::to_string(v).unwrap_or_default()
    }
}

impl Store for RedisStore {
    fn start_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.index_run(rec)
    }

    fn finish_run(&self, rec: &RunRecord) -> Result<(), StoreError> {
        self.index_run(rec)
    }

    /// One round trip for the whole batch: each run's step records in one
    /// HSET, its events, lines and spans each in one RPUSH, chains in SADDs.
    fn record_batch(&self, b: &super::Batch) -> Result<(), StoreError> {
        if b.is_empty() {
            return Ok(());
        }
        let mut p = redis::pipe();
        for (run_id, events) in super::group(&b.events) {
            p.rpush(self.k(&["events", &run_id]), events.iter().map(Self::encode).collect::<Vec<_>>()).ignore();
        }
        for (run_id, lines) in super::group(&b.logs) {
            p.rpush(self.k(&["logs", &run_id]), lines.iter().map(Self::encode).collect::<Vec<_>>()).ignore();
        }
        let mut steps: Vec<(&str, Vec<(i64, String)>)> = Vec::new();
        for s in &b.steps {
            let rec = (s.seq, Self::encode(s));
            match steps.iter_mut().find(|(r, _)| *r == s.run_id) {
                Some((_, v)) => v.push(rec),
                None => steps.push((&s.run_id, vec![rec])),
            }
        }
        for (run_id, recs) in steps {
            p.hset_multiple(self.k(&["steps", run_id]), &recs).ignore();
        }
        for (run_id, spans) in super::spans_by_run(&b.spans) {
            p.rpush(self.k(&["spans", run_id]), crate::trace::SpanRecord::encode_many(&spans)).ignore();
        }
        for (scope, job, hash) in &b.chains {
            p.sadd(self.k(&["chains", &scope.team, &scope.pipeline, job]), hash).ignore();
        }
        self.with(|c| p.query::<()>(c))
    }

    fn record_step(&self, s: &StepRecord) -> Result<(), StoreError> {
        let key = self.k(&["steps", &s.run_id]);
        self.with(|c| c.hset(&key, s.seq, Self::encode(s)))
    }

    fn append_logs(&self, run_id: &str, lines: &[LogLine]) -> Result<(), StoreError> {
        if lines.is_empty() {
            return Ok(());
        }
        let key = self.k(&["logs", run_id]);
        let encoded: Vec<String> = lines.iter().map(Self::encode).collect();
        self.with(|c| c.rpush(&key, &encoded))
    }

    fn runs(&self, f: &RunFilter) -> Result<Vec<RunRecord>, StoreError> {
        // The most specific index the filter names; what it does not name is
        // filtered from the records, a page at a time.
        let index = match (f.team, f.pipeline, f.job) {
            (Some(t), Some(p), Some(j)) => self.k(&["runs", "scope", t, p, "job", j]),
            (Some(t), Some(p), None) => self.k(&["runs", "scope", t, p]),
            (Some(t), None, _) => self.k(&["runs", "team", t]),
            (None, _, _) => self.k(&["runs"]),
        };
        const PAGE: isize = 200;
        let mut out = Vec::new();
        let (mut start, mut skip) = (0, f.skip);
        while out.len() < f.limit {
            let ids: Vec<String> = self.with(|c| c.zrevrange(&index, start, start + PAGE - 1))?;
            if ids.is_empty() {
                break;
            }
            start += PAGE;
            for id in ids {
                if let Some(r) = self.run(&id)?.filter(|r| f.admits(r)) {
                    if skip > 0 {
                        skip -= 1;
                        continue;
                    }
                    out.push(r);
                    if out.len() == f.limit {
                        break;
                    }
                }
            }
        }
        Ok(out)
    }

    fn pipelines(&self, team: Option<&str>) -> Result<Vec<PipelineSummary>, StoreError> {
        let key = self.k(&["pipelines"]);
        let members: Vec<String> = self.with(|c| c.zrange(&key, 0, -1))?;
        let mut out = Vec::new();
        for m in members {
            let Some((t, p)) = m.split_once(':') else { continue };
            if team.is_some_and(|want| want != t) {
                continue;
            }
            let newest = RunFilter { team: Some(t), pipeline: Some(p), limit: 1, ..Default::default() };
            if let Some(last) = self.runs(&newest)?.into_iter().next() {
                out.push(PipelineSummary { team: t.to_string(), pipeline: p.to_string(), last });
            }
        }
        out.sort_by(|a, b| (&a.team, &a.pipeline).cmp(&(&b.team, &b.pipeline)));
        Ok(out)
    }

    fn run(&self, id: &str) -> Result<Option<RunRecord>, StoreError> {
        let key = self.k(&["run", id]);
        let raw: Option<String> = self.with(|c| c.get(&key))?;
        raw.map(|r| self.decode(&r)).transpose()
    }

    fn steps(&self, run_id: &str) -> Result<Vec<StepRecord>, StoreError> {
        let key = self.k(&["steps", run_id]);
        let all: Vec<(i64, String)> = self.with(|c| c.hgetall(&key))?;
        let mut steps: Vec<StepRecord> = all.iter().map(|(_, r)| self.decode(r)).collect::<Result<_, _>>()?;
        steps.sort_by_key(|s| s.seq);
        Ok(steps)
    }

    fn add_spans(&self, run_id: &str, spans: &[crate::trace::SpanRecord]) -> Result<(), StoreError> {
        if spans.is_empty() {
            return Ok(());
        }
        let key = self.k(&["spans", run_id]);
        let encoded = crate::trace::SpanRecord::encode_many(&spans.iter().collect::<Vec<_>>());
        self.with(|c| c.rpush(&key, &encoded))
    }

    fn spans(&self, run_id: &str) -> Result<Vec<crate::trace::SpanRecord>, StoreError> {
        let key = self.k(&["spans", run_id]);
        let raw: Vec<String> = self.with(|c| c.lrange(&key, 0, -1))?;
        Ok(raw.iter().flat_map(|r| crate::trace::SpanRecord::decode_many(r)).collect())
    }

    fn logs(&self, run_id: &str) -> Result<Vec<LogLine>, StoreError> {
        let key = self.k(&["logs", run_id]);
        let raw: Vec<String> = self.with(|c| c.lrange(&key, 0, -1))?;
        raw.iter().map(|r| self.decode(r)).collect()
    }

    fn record_events(&self, run_id: &str, events: &[RunEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let key = self.k(&["events", run_id]);
        let encoded: Vec<String> = events.iter().map(Self::encode).collect();
        self.with(|c| c.rpush(&key, &encoded))
    }

    fn events_after(&self, run_id: &str, after: usize) -> Result<Vec<RunEvent>, StoreError> {
        let key = self.k(&["events", run_id]);
        let raw: Vec<String> = self.with(|c| c.lrange(&key, isize::try_from(after).unwrap_or(isize::MAX), -1))?;
        raw.iter().map(|r| self.event(r)).collect()
    }

    fn request_approval(&self, scope: &Scope, run_id: &str, job: &str, message: &str, requested_ms: i64, deadline_ms: i64) -> Result<i64, StoreError> {
        let seq = self.k(&["approvals", "seq"]);
        let id: i64 = self.with(|c| c.incr(&seq, 1))?;
        let rec = ApprovalRecord {
            id,
            team: scope.team.clone(),
            pipeline: scope.pipeline.clone(),
            run_id: run_id.into(),
            job: job.into(),
            message: message.into(),
            requested_ms,
            deadline_ms,
            decision: None,
            reason: String::new(),
            approver: String::new(),
        };
        let (key, pending) = (self.k(&["approval", &id.to_string()]), self.k(&["approvals", "pending"]));
        self.with(|c| redis::pipe().set(&key, Self::encode(&rec)).ignore().zadd(&pending, id, id).ignore().query::<()>(c))?;
        Ok(id)
    }

    fn approval(&self, id: i64) -> Result<Option<ApprovalRecord>, StoreError> {
        let key = self.k(&["approval", &id.to_string()]);
        let raw: Option<String> = self.with(|c| c.get(&key))?;
        raw.map(|r| self.decode(&r)).transpose()
    }

    fn pending_approvals(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<ApprovalRecord>, StoreError> {
        let pending = self.k(&["approvals", "pending"]);
        let ids: Vec<i64> = self.with(|c| c.zrange(&pending, 0, -1))?;
        let mut out = Vec::new();
        for id in ids {
            if let Some(a) = self.approval(id)?.filter(|a| team.is_none_or(|t| t == a.team) && pipeline.is_none_or(|p| p == a.pipeline)) {
                out.push(a);
            }
        }
        Ok(out)
    }

    fn add_spend(&self, counter: &str, tokens: u64) -> Result<u64, StoreError> {
        let key = self.k(&["spend", counter]);
        let tokens = i64::try_from(tokens).unwrap_or(i64::MAX);
        // A run's counters go a week after its last spending.
        let total: i64 = self.with(|c| redis::pipe().atomic().incr(&key, tokens).expire(&key, 7 * 86_400).ignore().query::<(i64,)>(c).map(|(t,)| t))?;
        Ok(total.max(0) as u64)
    }

    fn heartbeat(&self, owner: &str, now_ms: i64, ttl_ms: i64) -> Result<(), StoreError> {
        let owners = self.k(&["owners"]);
        self.with(|c| {
            redis::pipe()
                .zadd(&owners, owner, now_ms + ttl_ms)
                .ignore()
                // Owners long gone are forgotten (their runs stay orphans).
                .zrembyscore(&owners, "-inf", now_ms - 86_400_000)
                .ignore()
                .query::<()>(c)
        })
    }

    fn orphaned_runs(&self, now_ms: i64) -> Result<Vec<RunRecord>, StoreError> {
        let (running, owners) = (self.k(&["running"]), self.k(&["owners"]));
        let ids: Vec<String> = self.with(|c| redis::cmd("SMEMBERS").arg(&running).query(c))?;
        let alive: std::collections::HashSet<String> = self.with(|c| redis::cmd("ZRANGEBYSCORE").arg(&owners).arg(now_ms).arg("+inf").query::<Vec<String>>(c))?.into_iter().collect();
        let mut orphans = Vec::new();
        for id in ids {
            match self.run(&id)? {
                // A run recorded before owners were (owner "") is left as it is.
                Some(r) if r.outcome.is_none() && !r.owner.is_empty() && !alive.contains(&r.owner) => orphans.push(r),
                Some(r) if r.outcome.is_none() => {}
                _ => {
                    let _ = self.with(|c| redis::cmd("SREM").arg(&running).arg(&id).query::<()>(c));
                }
            }
        }
        orphans.sort_by_key(|r| r.started_ms);
        Ok(orphans)
    }

    fn decide_approval(&self, id: i64, approved: bool, reason: &str, approver: &str) -> Result<bool, StoreError> {
        // Removing the id from the pending set is the atomic claim: only one decider wins.
        let pending = self.k(&["approvals", "pending"]);
        let won: i64 = self.with(|c| c.zrem(&pending, id))?;
        if won != 1 {
            return Ok(false);
        }
        let Some(mut rec) = self.approval(id)? else { return Ok(false) };
        rec.decision = Some(if approved { "approved" } else { "rejected" }.to_string());
        rec.reason = reason.to_string();
        rec.approver = approver.to_string();
        let key = self.k(&["approval", &id.to_string()]);
        self.with(|c| c.set::<_, _, ()>(&key, Self::encode(&rec)))?;
        Ok(true)
    }

    fn ask_question(&self, q: &QuestionRecord) -> Result<(QuestionRecord, bool), StoreError> {
        let (memo, field) = (self.k(&["questions", "memo", &q.run_id]), q.memo_key());
        let asked_before = |id: Option<i64>| -> Result<Option<QuestionRecord>, StoreError> {
            Ok(match id {
                Some(id) => self.question(id)?.filter(|e| e.source != "expired"),
                None => None,
            })
        };
        if let Some(earlier) = asked_before(self.with(|c| c.hget(&memo, &field))?)? {
            return Ok((earlier, false));
        }
        let seq = self.k(&["questions", "seq"]);
        let id: i64 = self.with(|c| c.incr(&seq, 1))?;
        let rec = QuestionRecord { id, answer: None, source: String::new(), answered_ms: None, ..q.clone() };
        let (key, pending) = (self.k(&["question", &id.to_string()]), self.k(&["questions", "pending"]));
        self.with(|c| c.set::<_, _, ()>(&key, Self::encode(&rec)))?;
        // Setting the memo field only where there is none is the claim: of two
        // steps asking at once, one files the question and the other waits on it.
        let won: bool = self.with(|c| c.hset_nx(&memo, &field, id))?;
        if !won {
            if let Some(other) = asked_before(self.with(|c| c.hget(&memo, &field))?)? {
                let _ = self.with(|c| c.del::<_, ()>(&key));
                return Ok((other, false));
            }
            self.with(|c| c.hset::<_, _, _, ()>(&memo, &field, id))?;
        }
        self.with(|c| redis::pipe().zadd(&pending, id, id).ignore().expire(&memo, 7 * 86_400).ignore().query::<()>(c))?;
        Ok((rec, true))
    }

    fn question(&self, id: i64) -> Result<Option<QuestionRecord>, StoreError> {
        let key = self.k(&["question", &id.to_string()]);
        let raw: Option<String> = self.with(|c| c.get(&key))?;
        raw.map(|r| self.decode(&r)).transpose()
    }

    fn pending_questions(&self, team: Option<&str>, pipeline: Option<&str>) -> Result<Vec<QuestionRecord>, StoreError> {
        let pending = self.k(&["questions", "pending"]);
        let ids: Vec<i64> = self.with(|c| c.zrange(&pending, 0, -1))?;
        let mut out = Vec::new();
        for id in ids {
            // One whose step went away before it expired is not listed past its deadline.
            let live = |q: &QuestionRecord| q.deadline_ms == 0 || q.deadline_ms > super::now_ms();
            if let Some(q) = self.question(id)?.filter(|q| live(q) && team.is_none_or(|t| t == q.team) && pipeline.is_none_or(|p| p == q.pipeline)) {
                out.push(q);
            }
        }
        Ok(out)
    }

    fn settle_question(&self, id: i64, answer: Option<&str>, source: &str, at_ms: i64) -> Result<bool, StoreError> {
        // Removing the id from the pending set is the atomic claim: only one answer wins.
        let pending = self.k(&["questions", "pending"]);
        let won: i64 = self.with(|c| c.zrem(&pending, id))?;
        if won != 1 {
            return Ok(false);
        }
        let Some(mut rec) = self.question(id)? else { return Ok(false) };
        rec.answer = answer.map(str::to_string);
        rec.source = source.to_string();
        rec.answered_ms = Some(at_ms);
        let key = self.k(&["question", &id.to_string()]);
        self.with(|c| c.set::<_, _, ()>(&key, Self::encode(&rec)))?;
        Ok(true)
    }

    fn record_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value]) -> Result<(), StoreError> {
        let key = self.k(&["versions", &scope.team, &scope.pipeline, resource]);
        // First-seen order: a new version's score is one more than the highest.
        let script = redis::Script::new(
            "for i, v in ipairs(ARGV) do
               if not redis.call('ZSCORE', KEYS[1], v) then
                 local top = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
                 local next = 0
                 if top[2] then next = tonumber(top[2]) + 1 end
                 redis.call('ZADD', KEYS[1], next, v)
               end
             end
             return 1",
        );
        let args: Vec<String> = versions.iter().map(canonical).collect();
        self.with(|c| {
            let mut inv = script.key(&key);
            for a in &args {
                inv.arg(a);
            }
            inv.invoke::<i64>(c).map(|_| ())
        })
    }

    fn history(&self, scope: &Scope, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        let key = self.k(&["versions", &scope.team, &scope.pipeline, resource]);
        let raw: Vec<String> = self.with(|c| c.zrange(&key, 0, -1))?;
        raw.iter().map(|r| self.decode(r)).collect()
    }

    fn record_green(&self, scope: &Scope, job: &str, resource: &str, version: &serde_json::Value) -> Result<(), StoreError> {
        let key = self.k(&["green", &scope.team, &scope.pipeline, job, resource]);
        self.with(|c| c.sadd(&key, canonical(version)))
    }

    fn green(&self, scope: &Scope, job: &str, resource: &str) -> Result<Vec<serde_json::Value>, StoreError> {
        let key = self.k(&["green", &scope.team, &scope.pipeline, job, resource]);
        let raw: Vec<String> = self.with(|c| c.smembers(&key))?;
        raw.iter().map(|r| self.decode(r)).collect()
    }

    fn record_chain(&self, scope: &Scope, job: &str, hash: &str) -> Result<(), StoreError> {
        let key = self.k(&["chains", &scope.team, &scope.pipeline, job]);
        self.with(|c| c.sadd(&key, hash))
    }

    fn forget_versions(&self, scope: &Scope, resource: &str, versions: &[serde_json::Value], jobs: &[String]) -> Result<(), StoreError> {
        let key = self.k(&["versions", &scope.team, &scope.pipeline, resource]);
        let greens: Vec<String> = jobs.iter().map(|j| self.k(&["green", &scope.team, &scope.pipeline, j, resource])).collect();
        let vs: Vec<String> = versions.iter().map(canonical).collect();
        if vs.is_empty() {
            return Ok(());
        }
        self.with(|c| {
            let mut p = redis::pipe();
            p.zrem(&key, &vs).ignore();
            for g in &greens {
                p.srem(g, &vs).ignore();
            }
            p.query::<()>(c)
        })
    }

    fn delete_run(&self, run: &RunRecord) -> Result<(), StoreError> {
        let keys: Vec<String> = ["run", "steps", "logs", "spans", "events"].iter().map(|k| self.k(&[k, &run.id])).collect();
        let indexes = self.run_indexes(run);
        let running = self.k(&["running"]);
        self.with(|c| {
            let mut p = redis::pipe();
            p.del(&keys).ignore();
            for i in &indexes {
                p.zrem(i, &run.id).ignore();
            }
            p.srem(&running, &run.id).ignore();
            p.query::<()>(c)
        })
    }

    fn set_value(&self, scope: &Scope, key: &str, value: Option<&str>) -> Result<(), StoreError> {
        let hash = self.k(&["values", &scope.team, &scope.pipeline]);
        match value {
            Some(v) => self.with(|c| c.hset(&hash, key, v)),
            None => self.with(|c| c.hdel(&hash, key)),
        }
    }

    fn value(&self, scope: &Scope, key: &str) -> Result<Option<String>, StoreError> {
        let hash = self.k(&["values", &scope.team, &scope.pipeline]);
        self.with(|c| c.hget(&hash, key))
    }

    fn chain_succeeded(&self, scope: &Scope, job: &str, hash: &str) -> Result<bool, StoreError> {
        let key = self.k(&["chains", &scope.team, &scope.pipeline, job]);
        self.with(|c| c.sismember(&key, hash))
    }

    fn chains_succeeded(&self, scope: &Scope, job: &str, hashes: &[String]) -> Result<std::collections::HashSet<String>, StoreError> {
        if hashes.is_empty() {
            return Ok(Default::default());
        }
        let key = self.k(&["chains", &scope.team, &scope.pipeline, job]);
        let member: Vec<bool> = self.with(|c| {
            let mut p = redis::pipe();
            for h in hashes {
                p.sismember(&key, h);
            }
            p.query(c)
        })?;
        Ok(hashes.iter().zip(member).filter(|(_, m)| *m).map(|(h, _)| h.clone()).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_store_conforms() {
        let server = crate::queue::redis_server();
        let url = server.url.clone();
        let s = RedisStore::connect(&url, "steppe-test").expect("connect");
        super::super::tests::conformance(&s);
        drop(s);
        // A new connection (a restarted coordinator) sees the same history
        // (the conformance suite's runs, less the one it deleted).
        let s = RedisStore::connect(&url, "steppe-test").expect("connect");
        assert_eq!(s.runs(&RunFilter { limit: 10, ..Default::default() }).unwrap().len(), 9);
    }
}
