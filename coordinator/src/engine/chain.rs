//! The merkle chain of a job's plan (pipeline-language.md §6): its nodes,
//! one per top-level step, each hash naming the whole plan before it; which
//! steps keep a chain from being skipped; an input set of `every` gets.

use serde_json::Value;
use steppe_language::model::{Step, StepKind, VersionSpec};

/// One input set: each `every` resource and the version it takes.
pub type InputSet = Vec<(String, Value)>;

/// One top-level step on a chain.
#[derive(Debug, Clone)]
pub struct Node {
    /// The step's name as runs print it.
    pub step: String,
    pub hash: String,
    /// The version a get chose.
    pub version: Option<Value>,
}

/// One path through a job's plan: the whole plan, or (past an `every` get)
/// one input set's.
#[derive(Debug, Clone, Default)]
pub struct Chain {
    pub nodes: Vec<Node>,
    /// The first step that keeps the chain from being skipped, and why.
    pub uncacheable: Option<(String, &'static str)>,
    /// A run of the job succeeded through this chain before.
    pub succeeded: bool,
    /// The input set of the `every` gets: each resource and its version.
    pub set: Option<InputSet>,
    /// Where in the plan that `every` get is: the nodes before it are
    /// every input set's.
    pub every_at: usize,
    /// A get that could not choose a version (its run fails there).
    pub unresolved: Option<String>,
}

impl Chain {
    /// The hash of its last node, which names all of it.
    pub fn leaf(&self) -> Option<&str> {
        self.nodes.last().map(|n| n.hash.as_str())
    }

    /// How many of its nodes every input set shares.
    pub fn shared(&self) -> usize {
        if self.set.is_some() { self.every_at } else { self.nodes.len() }
    }

    pub fn skippable(&self) -> bool {
        self.succeeded && self.uncacheable.is_none() && self.unresolved.is_none()
    }

    /// What it would record after a successful run: its leaf, if it may be skipped later.
    pub fn cacheable_leaf(&self) -> Option<&str> {
        self.leaf().filter(|_| self.uncacheable.is_none() && self.unresolved.is_none())
    }
}

/// A get of `every` version fans the plan out (not under `--pin`, which
/// collapses it to one version).
pub(super) fn is_every(s: &Step, pinned: bool) -> bool {
    s.get.is_some() && matches!(s.version, Some(VersionSpec::Every)) && !pinned
}

/// Why a step keeps its chain from ever being skipped, if it does.
pub fn uncacheable(s: &Step, fix_inherited: bool) -> Option<&'static str> {
    if s.across.is_some() {
        return Some("across: runs a matrix");
    }
    if s.when.is_some() {
        return Some("when: decides at run time");
    }
    if s.to.is_some() || s.verdicts.is_some() {
        return Some("it routes the plan");
    }
    if s.context.as_ref().is_some_and(|c| c.from.is_some()) {
        return Some("context.from: reads decisions made at run time");
    }
    Some(match s.kind()? {
        StepKind::Put => "put has side effects",
        StepKind::Agent => "an agent's answer is not repeatable",
        StepKind::Try => "try: tolerates a failure",
        StepKind::LoadVar => "load_var: reads a value at run time",
        StepKind::Approval => "approval: waits for a person",
        StepKind::Do => "a do: block",
        StepKind::InParallel => "an in_parallel: block",
        StepKind::Race => "a race: block",
        StepKind::Ensemble => "an ensemble",
        StepKind::Task if s.fix.is_some() || fix_inherited => "fix: may run an agent",
        StepKind::Task | StepKind::Get => return None,
    })
}
