//! `steppe questions`: the ask_user questions a run parked for a person, and
//! `steppe questions answer ID TEXT` to answer one (the run goes on).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use super::args::RemoteArgs;
use super::format::fmt_time;
use super::history_source::History;
use crate::text::shown;

/// List the ask_user questions waiting for a person, or answer one.
///
/// An agent granted ask_user that nobody can answer at once (no answer
/// given ahead with --answer, no answered_by agent, no terminal) parks its
/// question and waits up to its grant's timeout (default 24h). Answering it
/// here lets the run go on; an answer given once counts for the whole run.
///
/// Examples:
///   steppe questions -p ci.yml
///   steppe questions answer 1 minor -p ci.yml
///   steppe questions --coordinator http://10.0.0.5:7070 --token-file token
///   steppe questions answer 4 'yes, mention it' --coordinator http://10.0.0.5:7070 --token-file token
#[derive(Args, Debug)]
#[command(verbatim_doc_comment, subcommand_negates_reqs = true)]
pub struct QuestionsArgs {
    #[command(subcommand)]
    command: Option<QuestionsCommand>,
    #[command(flatten)]
    target: Target,
}

#[derive(Subcommand, Debug)]
enum QuestionsCommand {
    /// Answer a parked question: the step that asked goes on with the answer.
    Answer(AnswerArgs),
}

#[derive(Args, Debug)]
struct AnswerArgs {
    /// The question's id (`steppe questions` lists them).
    id: i64,
    /// The answer, as the agent will read it.
    answer: String,
    #[command(flatten)]
    target: Target,
}

/// Whose questions: a pipeline file's store, or a coordinator's.
#[derive(Args, Debug)]
struct Target {
    /// The pipeline file whose store holds the questions (not needed with --coordinator).
    #[arg(short = 'p', long = "file", value_name = "PIPELINE", required_unless_present = "coordinator")]
    file: Option<PathBuf>,
    /// Only this pipeline's (default: the file's own; with --coordinator, every one your token sees).
    #[arg(long = "pipeline", value_name = "NAME")]
    name: Option<String>,
    #[command(flatten)]
    remote: RemoteArgs,
}

impl QuestionsArgs {
    pub fn run(self) -> Result<ExitCode> {
        match self.command {
            Some(QuestionsCommand::Answer(a)) => answer(&a),
            None => list(&History::open(self.target.file.as_deref(), self.target.name.as_deref(), &self.target.remote)?),
        }
    }
}

fn list(h: &History) -> Result<ExitCode> {
    let pending = match &h.store {
        Some(store) => store.pending_questions(None, h.pipeline.as_deref())?,
        None => Vec::new(),
    };
    if pending.is_empty() {
        say!("no questions waiting for {}", h.label);
        return Ok(ExitCode::SUCCESS);
    }
    say!("{:<4} {:<16} {:<16} {:<16} {:<21} QUESTION", "ID", "PIPELINE", "JOB", "AGENT", "ASKED");
    for q in pending {
        say!("{:<4} {:<16} {:<16} {:<16} {:<21} {}", q.id, shown(&q.pipeline), shown(&q.job), shown(&q.agent), fmt_time(q.asked_ms), shown(&q.question));
        let pad = " ".repeat(4 + 1 + 16 + 1 + 16 + 1 + 16 + 1 + 21 + 1);
        if !q.options.is_empty() {
            say!("{pad}options: {}", q.options.iter().map(|o| shown(o).into_owned()).collect::<Vec<_>>().join(" | "));
        }
        if q.deadline_ms > 0 {
            say!("{pad}expires {}", fmt_time(q.deadline_ms));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn answer(a: &AnswerArgs) -> Result<ExitCode> {
    let h = History::open(a.target.file.as_deref(), a.target.name.as_deref(), &a.target.remote)?;
    let store = h.store.as_ref().with_context(|| format!("nothing has run yet for {}", h.label))?;
    let id = a.id;
    let Some(q) = store.question(id)? else {
        anyhow::bail!("no question {id} for {} (`steppe questions` lists the waiting ones)", h.label);
    };
    if !q.pending() {
        match &q.answer {
            Some(ans) if q.source != "expired" => anyhow::bail!("question {id} was already answered by {}: {}", q.source.strip_prefix("person:").unwrap_or(&q.source), shown(ans)),
            _ => anyhow::bail!("question {id} expired unanswered; its step did not wait for it"),
        }
    }
    if a.answer.trim().is_empty() {
        anyhow::bail!("an empty answer: say what the agent should read");
    }
    if !q.options.is_empty() && !q.options.contains(&a.answer) {
        // The grant may accept any answer; say what was offered either way.
        eprintln!("note: question {id} offered {}; answering {:?} anyway", q.options.join(" | "), a.answer);
    }
    let by = format!("person:{}", steppe_runtime::store::person_here());
    if !store.settle_question(id, Some(&a.answer), &by, steppe_runtime::store::now_ms())? {
        anyhow::bail!("question {id} was answered (or expired) just now, before this answer");
    }
    say!("answered: question {id}");
    Ok(ExitCode::SUCCESS)
}
