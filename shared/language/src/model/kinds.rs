//! What kind of step a step is, what it nests and which hooks it carries.

use super::*;

/// What kind of step a [`Step`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StepKind {
    Get,
    Task,
    Put,
    Agent,
    Try,
    Do,
    InParallel,
    Race,
    Ensemble,
    LoadVar,
    Approval,
}

impl StepKind {
    /// Every kind, in the order the format documents them.
    pub const ALL: [StepKind; 11] = [
        StepKind::Get,
        StepKind::Task,
        StepKind::Put,
        StepKind::Agent,
        StepKind::Try,
        StepKind::Do,
        StepKind::InParallel,
        StepKind::Race,
        StepKind::Ensemble,
        StepKind::LoadVar,
        StepKind::Approval,
    ];

    pub fn key(self) -> &'static str {
        match self {
            StepKind::Get => "get",
            StepKind::Task => "task",
            StepKind::Put => "put",
            StepKind::Agent => "agent",
            StepKind::Try => "try",
            StepKind::Do => "do",
            StepKind::InParallel => "in_parallel",
            StepKind::Race => "race",
            StepKind::Ensemble => "ensemble",
            StepKind::LoadVar => "load_var",
            StepKind::Approval => "approval",
        }
    }

    pub fn is_container(self) -> bool {
        matches!(
            self,
            StepKind::Do | StepKind::InParallel | StepKind::Race | StepKind::Ensemble
        )
    }
}

impl Step {
    /// Every kind key set on the step, in declaration order of the format.
    pub fn kinds(&self) -> Vec<StepKind> {
        let mut k = Vec::new();
        let checks = [
            (self.get.is_some(), StepKind::Get),
            (self.task.is_some(), StepKind::Task),
            (self.put.is_some(), StepKind::Put),
            (self.agent.is_some(), StepKind::Agent),
            (self.try_.is_some(), StepKind::Try),
            (self.do_.is_some(), StepKind::Do),
            (self.in_parallel.is_some(), StepKind::InParallel),
            (self.race.is_some(), StepKind::Race),
            (self.ensemble.is_some(), StepKind::Ensemble),
            (self.load_var.is_some(), StepKind::LoadVar),
            (self.approval.is_some(), StepKind::Approval),
        ];
        for (set, kind) in checks {
            if set {
                k.push(kind);
            }
        }
        k
    }

    /// The step's kind when exactly one kind key is set.
    pub fn kind(&self) -> Option<StepKind> {
        match self.kinds().as_slice() {
            [k] => Some(*k),
            _ => None,
        }
    }

    /// The name the step is known by in routing: the value of its kind key
    /// (a `try:` wrapper goes by the step it wraps).
    pub fn name(&self) -> Option<&str> {
        self.get
            .as_deref()
            .or(self.task.as_deref())
            .or(self.put.as_deref())
            .or(self.agent.as_deref())
            .or(self.load_var.as_deref())
            .or_else(|| self.try_.as_deref().and_then(Step::name))
    }

    /// The hooks that are set, with their keys.
    pub fn hooks(&self) -> Vec<(&'static str, &Step)> {
        hooks_of(
            &self.on_success,
            &self.on_failure,
            &self.on_error,
            &self.on_abort,
            &self.ensure,
        )
    }

    /// Nested plan steps (not hooks) with their key-path suffixes.
    pub fn children(&self) -> Vec<(String, &Step)> {
        let mut out = Vec::new();
        if let Some(t) = &self.try_ {
            out.push(("try".to_string(), t.as_ref()));
        }
        if let Some(d) = &self.do_ {
            out.extend(d.iter().enumerate().map(|(i, s)| (format!("do[{i}]"), s)));
        }
        if let Some(p) = &self.in_parallel {
            out.extend(p.steps.iter().enumerate().map(|(i, s)| (p.step_path(i), s)));
        }
        if let Some(r) = &self.race {
            out.extend(r.steps.iter().enumerate().map(|(i, s)| (r.step_path(i), s)));
        }
        if let Some(e) = &self.ensemble {
            out.extend(
                e.agents
                    .iter()
                    .enumerate()
                    .map(|(i, s)| (format!("ensemble.agents[{i}]"), s)),
            );
        }
        out
    }

    /// Declared outputs (empty when none).
    pub fn output_names(&self) -> &[String] {
        self.outputs.as_deref().unwrap_or(&[])
    }

    /// Declared inputs as names (`inputs: all` gives none).
    pub fn input_names(&self) -> &[String] {
        match &self.inputs {
            Some(Inputs::Names(v)) => v,
            _ => &[],
        }
    }
}

pub(crate) fn hooks_of<'a>(
    on_success: &'a Option<Box<Step>>,
    on_failure: &'a Option<Box<Step>>,
    on_error: &'a Option<Box<Step>>,
    on_abort: &'a Option<Box<Step>>,
    ensure: &'a Option<Box<Step>>,
) -> Vec<(&'static str, &'a Step)> {
    let mut out = Vec::new();
    for (k, h) in [
        ("on_success", on_success),
        ("on_failure", on_failure),
        ("on_error", on_error),
        ("on_abort", on_abort),
        ("ensure", ensure),
    ] {
        if let Some(h) = h {
            out.push((k, h.as_ref()));
        }
    }
    out
}

impl Job {
    pub fn hooks(&self) -> Vec<(&'static str, &Step)> {
        hooks_of(
            &self.on_success,
            &self.on_failure,
            &self.on_error,
            &self.on_abort,
            &self.ensure,
        )
    }
}
