//! A question an agent asked (`ask_user`): filed before anyone is asked, so the
//! record of who answered never depends on which channel did, or on the run
//! still being alive when someone answers a parked one.

/// One `ask_user` question of a run.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuestionRecord {
    pub id: i64,
    /// The team and pipeline of the run that asked.
    #[serde(default)]
    pub team: String,
    #[serde(default)]
    pub pipeline: String,
    pub run_id: String,
    pub job: String,
    /// The agent that asked (not the step that ran it).
    pub agent: String,
    pub question: String,
    pub options: Vec<String>,
    pub asked_ms: i64,
    /// When nobody answering expires it (0: never).
    pub deadline_ms: i64,
    pub answer: Option<String>,
    /// Who answered: `person:<name>`, `preset`, `agent:<name>`, `default`;
    /// `expired` when nobody did; empty while it waits.
    pub source: String,
    pub answered_ms: Option<i64>,
}

impl QuestionRecord {
    /// Still waiting for an answer.
    pub fn pending(&self) -> bool {
        self.source.is_empty()
    }

    /// What an answer within a run is remembered by: the text and the options offered.
    pub fn memo_key(&self) -> String {
        let mut key = self.question.clone();
        for o in &self.options {
            key.push('\u{0}');
            key.push_str(o);
        }
        key
    }
}

/// Who this process answers or decides for: `$STEPPE_APPROVER`, else the
/// login name.
pub fn person_here() -> String {
    ["STEPPE_APPROVER", "USER", "LOGNAME"].iter().find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty())).unwrap_or_else(|| "unknown".into())
}
