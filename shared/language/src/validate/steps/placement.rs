//! Key placement: which step kinds take which keys, as one table, and the
//! message for a key set where its kind does not take it.

use crate::model::{Inputs, Step, StepKind};
use crate::model::StepKind::*;

/// A key of a step and whether the step sets it.
type Key = (&'static str, fn(&Step) -> bool);

/// What a misplaced key is told.
#[derive(Clone, Copy)]
enum Say {
    /// Exactly this.
    Text(&'static str),
    /// `{key} is only valid on {…}`.
    OnlyOn(&'static str),
    /// `{key} is not valid on {the step, as a block names it}`.
    NotOnThis,
    /// `{key} is only valid on task and agent steps, not on {kind} step`.
    TaskAndAgentOnly,
    /// `verdicts` off an agent step: an ensemble keeps them inside its
    /// block; blocks and try: pass them to what they wrap.
    Verdicts,
}

/// A placement rule: these keys, set on a step of one of `on` (or of any kind
/// not in `on` when `except`), are misplaced. `first_only` reports only the
/// first key the step sets (a block names one problem, not ten).
struct Rule {
    keys: &'static [Key],
    kinds: &'static [StepKind],
    except: bool,
    say: Say,
    first_only: bool,
}

const fn only_on(keys: &'static [Key], kinds: &'static [StepKind], say: Say) -> Rule {
    Rule { keys, kinds, except: true, say, first_only: false }
}

const fn not_on(keys: &'static [Key], kinds: &'static [StepKind], say: Say) -> Rule {
    Rule { keys, kinds, except: false, say, first_only: false }
}

const BLOCKS: &[StepKind] = &[Try, Do, InParallel, Race, Ensemble];

const CONTAINER: &[Key] = &[
    ("image", |s| s.image.is_some()),
    ("env", |s| s.env.is_some()),
    ("user", |s| s.user.is_some()),
    ("network", |s| s.network.is_some()),
    ("privileged", |s| s.privileged.is_some()),
    ("container_limits", |s| s.container_limits.is_some()),
    ("assert", |s| s.assert.is_some()),
];

const AGENT_ONLY: &[Key] = &[
    ("max_turns", |s| s.max_turns.is_some()),
    ("prompt", |s| s.prompt.is_some()),
    ("messages", |s| s.messages.is_some()),
    ("dir", |s| s.dir.is_some()),
    ("tools", |s| s.tools.is_some()),
    ("context_paths", |s| s.context_paths.is_some()),
    ("max_context_bytes", |s| s.max_context_bytes.is_some()),
    ("max_questions", |s| s.max_questions.is_some()),
];

/// Where every key may go. The rules that need more than a kind (a key
/// that means something only beside another) follow in [`misplaced`].
const PLACEMENT: &[Rule] = &[
    only_on(&[("trigger", |s| s.trigger.is_some())], &[Get], Say::OnlyOn("get steps")),
    only_on(&[("version", |s| s.version.is_some())], &[Get], Say::OnlyOn("get steps")),
    only_on(&[("passed", |s| s.passed.is_some())], &[Get], Say::OnlyOn("get steps")),
    only_on(&[("resource", |s| s.resource.is_some())], &[Get], Say::Text("resource: is only valid on get steps")),
    only_on(&[("params", |s| s.params.is_some())], &[Get, Put], Say::OnlyOn("get and put steps")),
    only_on(&[("inputs", |s| matches!(s.inputs, Some(Inputs::All)))], &[Put], Say::Text("inputs: all is only valid on put steps")),
    only_on(
        &[("input_mapping", |s| s.input_mapping.is_some()), ("output_mapping", |s| s.input_mapping.is_none() && s.output_mapping.is_some())],
        &[Task],
        Say::Text("input_mapping/output_mapping are only valid on task steps"),
    ),
    only_on(&[("run", |s| s.run.is_some() && s.run_file.is_none())], &[Task], Say::OnlyOn("task steps")),
    only_on(&[("fix", |s| s.fix.is_some())], &[Task], Say::OnlyOn("task steps")),
    // The load reports these three first (reading their files); here they
    // keep the table whole.
    only_on(&[("run_file", |s| s.run_file.is_some())], &[Task], Say::Text("run_file: is only valid on task steps")),
    only_on(
        &[("prompt_file", |s| s.prompt_file.is_some()), ("message_files", |s| s.message_files.is_some())],
        &[Agent],
        Say::Text("{key}: is only valid on agent steps"),
    ),
    only_on(AGENT_ONLY, &[Agent], Say::OnlyOn("agent steps")),
    only_on(&[("verdicts", |s| s.verdicts.is_some())], &[Agent], Say::Verdicts),
    only_on(&[("context", |s| s.context.is_some())], &[Agent, Task], Say::OnlyOn("agent and task steps")),
    only_on(&[("volatile", |s| s.volatile.is_some())], &[Task, Agent], Say::OnlyOn("task and agent steps")),
    only_on(&[("file", |s| s.file.is_some())], &[LoadVar], Say::Text("file: without load_var: has no meaning here")),
    only_on(&[("across", |s| s.across.is_some())], &[Task, Put, Agent], Say::OnlyOn("task, put and agent steps")),
    // On any kind: these mean something only beside across:.
    only_on(&[("max_in_flight", |s| s.across.is_none() && s.max_in_flight.is_some())], &[], Say::Text("max_in_flight is only valid on an across: step")),
    only_on(&[("budget", |s| s.across.is_none() && s.budget.is_some())], &[], Say::Text("budget is only valid on an across: step")),
    not_on(&[("inputs", |s| s.inputs.is_some()), ("outputs", |s| s.inputs.is_none() && s.outputs.is_some())], &[Get], Say::Text("inputs/outputs are not valid on get steps")),
    not_on(&[("outputs", |s| s.outputs.is_some())], &[Put], Say::Text("outputs are not valid on put steps")),
    not_on(CONTAINER, &[Get], Say::Text("{key} is not valid on get steps")),
    not_on(CONTAINER, &[Put], Say::Text("{key} is not valid on put steps")),
    not_on(
        &[
            ("when", |s| s.when.is_some()),
            ("to", |s| s.to.is_some()),
            ("max_visits", |s| s.max_visits.is_some()),
            ("verdicts", |s| s.verdicts.is_some()),
            ("volatile", |s| s.volatile.is_some()),
            ("context", |s| s.context.is_some()),
        ],
        &[Get],
        Say::Text("{key} is not valid on get steps"),
    ),
    not_on(&[("outputs", |s| s.outputs.is_some())], &[LoadVar, Approval], Say::TaskAndAgentOnly),
    not_on(CONTAINER, &[LoadVar, Approval], Say::TaskAndAgentOnly),
    not_on(&[("inputs", |s| s.inputs.is_some())], &[Approval], Say::Text("inputs is not valid on approval steps")),
    Rule {
        keys: &[
            ("inputs", |s| s.inputs.is_some()),
            ("outputs", |s| s.outputs.is_some()),
            ("image", |s| s.image.is_some()),
            ("run", |s| s.run.is_some()),
            ("prompt", |s| s.prompt.is_some() || s.prompt_file.is_some() || s.messages.is_some() || s.message_files.is_some()),
            ("params", |s| s.params.is_some()),
            ("trigger", |s| s.trigger.is_some()),
            ("version", |s| s.version.is_some()),
            ("verdicts", |s| s.verdicts.is_some()),
            ("assert", |s| s.assert.is_some()),
        ],
        kinds: BLOCKS,
        except: false,
        say: Say::NotOnThis,
        first_only: true,
    },
    not_on(
        &[
            ("env", |s| s.env.is_some()),
            ("user", |s| s.user.is_some()),
            ("network", |s| s.network.is_some()),
            ("privileged", |s| s.privileged.is_some()),
            ("container_limits", |s| s.container_limits.is_some()),
        ],
        &[Try],
        Say::Text("{key} is not valid on a try: step"),
    ),
];

fn article(kind: StepKind) -> &'static str {
    match kind {
        InParallel | Ensemble => "an",
        _ => "a",
    }
}

/// How a message names a step of this kind (`a try: step`, `an in_parallel step`).
pub(crate) fn block_label(kind: StepKind) -> String {
    match kind {
        Try => "a try: step".to_string(),
        k => format!("{} {} step", article(k), k.key()),
    }
}

/// What a misplaced key is told (None: nothing, it is in place after all).
fn message(say: Say, key: &str, kind: StepKind) -> Option<String> {
    Some(match say {
        Say::Text(t) => t.replace("{key}", key),
        Say::OnlyOn(on) => format!("{key} is only valid on {on}"),
        Say::NotOnThis if kind == Try && key == "assert" => "assert is not valid on a try: step or the step it wraps".to_string(),
        Say::NotOnThis => format!("{key} is not valid on {}", block_label(kind)),
        Say::TaskAndAgentOnly => format!("{key} is only valid on task and agent steps, not on {} step", kind.key()),
        Say::Verdicts if kind == Ensemble => "verdicts belong inside the ensemble: block (ensemble.verdicts)".to_string(),
        Say::Verdicts if kind.is_container() || kind == Try => return None,
        Say::Verdicts => format!("verdicts is only valid on agent steps and ensemble blocks, not on {}", block_label(kind)),
    })
}

/// Keys set on a step that its kind does not take: (key path, message).
/// The key reference (`crate::reference`) reads the table through it too.
pub(crate) fn misplaced(s: &Step, kind: StepKind, path: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut e = |key: &str, msg: String| out.push((format!("{path}.{key}"), msg));
    let mut block_first: Option<&str> = None;
    for rule in PLACEMENT {
        if rule.kinds.contains(&kind) == rule.except {
            continue;
        }
        for (key, set) in rule.keys {
            if set(s) {
                if let Some(m) = message(rule.say, key, kind) {
                    e(key, m);
                }
                if rule.first_only {
                    block_first = Some(key);
                    break;
                }
            }
        }
    }
    // A try: step's image is named once, by whichever of its keys comes first.
    if kind == Try && s.image.is_some() && block_first.is_some_and(|k| k != "image") {
        e("image", "image is not valid on a try: step".into());
    }
    if kind == Ensemble && s.to.is_some() {
        e("to", "to: is not valid on a step with verdicts: (the ensemble routes by its verdicts)".into());
    }
    out
}
