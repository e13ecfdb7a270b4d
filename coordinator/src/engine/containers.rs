//! Container fields resolved over their layers (a step over its `tasks:`
//! entry or its agent): `user` and `network` non-empty-win, `privileged`
//! true-wins, `container_limits` replaced whole when set.

use steppe_language::model::ContainerLimits;
use steppe_runtime::assignment::ContainerSettings;
use steppe_runtime::outcome::StepError;

use super::docker::Docker;

/// One layer's container fields.
#[derive(Clone, Copy, Default)]
pub(super) struct Fields<'a> {
    pub user: Option<&'a String>,
    pub network: Option<&'a String>,
    pub privileged: Option<bool>,
    pub limits: Option<&'a ContainerLimits>,
}

/// The layer a struct with the four fields makes.
macro_rules! fields_of {
    ($x:expr) => {
        super::containers::Fields { user: $x.user.as_ref(), network: $x.network.as_ref(), privileged: $x.privileged, limits: $x.container_limits.as_ref() }
    };
}
pub(super) use fields_of;

/// `own` over `under`.
pub(super) fn settings(own: Fields<'_>, under: Fields<'_>) -> ContainerSettings {
    let non_empty = |v: Option<&String>| v.filter(|x| !x.is_empty()).cloned();
    let limits = own.limits.or(under.limits);
    ContainerSettings {
        user: non_empty(own.user).or_else(|| non_empty(under.user)),
        network: non_empty(own.network).or_else(|| non_empty(under.network)),
        privileged: own.privileged == Some(true) || under.privileged == Some(true),
        cpu_shares: limits.and_then(|l| l.cpu).filter(|c| *c > 0),
        memory_bytes: limits.and_then(|l| l.memory.as_ref()).and_then(|m| m.bytes()).and_then(|b| i64::try_from(b).ok()),
    }
}

impl super::run::JobRun {
    /// A step's resolved image and container settings: a task's over its
    /// `tasks:` entry, an agent step's over its agent, a put's from its
    /// resource type (`{{ .vars }}` of an across cell and `((vars))` applied).
    pub(super) fn resolved_image(&self, s: &steppe_language::model::Step, cell: &super::across::Cell) -> Result<(Option<String>, ContainerSettings), StepError> {
        let (image, settings) = if let Some(name) = &s.agent {
            let def = self.agent_def(name);
            let image = s.image.clone().filter(|i| !i.is_empty()).or_else(|| def.and_then(|d| d.image.clone()));
            (image, settings(fields_of!(s), def.map(|d| fields_of!(d)).unwrap_or_default()))
        } else if let Some(r) = &s.put {
            match self.resource(r) {
                Ok((_, t)) => (t.image.clone(), settings(fields_of!(t), Fields::default())),
                Err(_) => (None, ContainerSettings::default()),
            }
        } else {
            let entry = self.entry(s);
            let image = s.image.clone().filter(|i| !i.is_empty()).or_else(|| entry.and_then(|e| e.image.clone()));
            (image, settings(fields_of!(s), entry.map(|e| fields_of!(e)).unwrap_or_default()))
        };
        let image = image
            .map(|i| self.subst(&i).and_then(|i| super::across::render_cell(&i, cell)))
            .transpose()
            .map_err(|e| StepError::errored(format!("image: {e}")))?;
        Ok((image, settings))
    }
}

impl super::run::JobRun {
    /// The images the job's steps name where the file says them (an image
    /// made of `{{ .vars }}` or a captured `((var))` is known only when its
    /// step runs), with the first step naming each.
    fn named_images(&self) -> Vec<(String, String)> {
        let mut found: Vec<(String, String)> = Vec::new();
        let pipeline = &self.engine.pipeline;
        let mut add = |image: Option<&String>, path: &str| {
            if let Some(i) = image.filter(|i| steppe_language::machine::known_before_run(i)) {
                if !found.iter().any(|(f, _)| f == i) {
                    found.push((i.clone(), path.to_string()));
                }
            }
        };
        let at = pipeline.jobs.iter().position(|j| j.name == self.job.name).map(|i| format!("jobs[{i}]")).unwrap_or_else(|| format!("job {}", self.job.name));
        steppe_language::model::walk::each_step_of(&self.job, &at, &mut |s, path| {
            if let Some(a) = &s.agent {
                let def = pipeline.agents.iter().find(|d| &d.name == a);
                add(s.image.as_ref().or(def.and_then(|d| d.image.as_ref())), path);
                // The agents it delegates to run their tools in their own images.
                for g in def.and_then(|d| d.tools.as_ref()).into_iter().flatten() {
                    if let steppe_language::model::ToolGrant::Spec(spec) = g {
                        let child = spec.agent.as_ref().and_then(|c| pipeline.agents.iter().find(|d| &d.name == c));
                        add(child.and_then(|c| c.image.as_ref()), path);
                    }
                }
            } else if let Some(r) = s.put.as_ref().or(s.get.as_ref()) {
                let resource = s.resource.as_ref().unwrap_or(r);
                let t = pipeline.resources.iter().find(|x| &x.name == resource).and_then(|x| pipeline.resource_types.iter().find(|t| t.name == x.type_));
                add(t.and_then(|t| t.image.as_ref()), path);
            } else if s.task.is_some() {
                add(s.image.as_ref().or_else(|| self.entry(s).and_then(|e| e.image.as_ref())), path);
            }
        });
        found
    }

    /// Before the run starts (no job hooks fire when this fails): a job
    /// whose steps name images needs a Docker engine where its steps run,
    /// and each image on it, pulled if a registry answers (the reference's
    /// docker check and pre-pull). On a cluster, the images are the
    /// workers'; the run says so when no connected worker runs containers.
    pub(super) async fn containers_ready(&self) -> Result<(), StepError> {
        let images = self.named_images();
        if images.is_empty() {
            return Ok(());
        }
        let listed = || images.iter().map(|(i, p)| format!("{i} ({p})")).collect::<Vec<_>>().join(", ");
        match &self.engine.docker {
            Docker::Local => {
                let docker = steppe_worker::container::engine().await.map_err(|e| {
                    StepError::errored(format!("steps of this job run in images ({}), but {e}: start the Docker engine, or run the job on a cluster whose workers reach one", listed()))
                })?;
                for (image, path) in &images {
                    let say = |line: &str| self.engine.out.run_note(&self.run_id, line);
                    steppe_worker::container::images::ensure(&docker, image, &say).await.map_err(|e| StepError::errored(format!("{path}: {e}")))?;
                }
                Ok(())
            }
            Docker::Remote(registry) => {
                let pool = if self.engine.pool.is_empty() { steppe_runtime::queue::DEFAULT_POOL } else { self.engine.pool.as_str() };
                if !registry.list().await.iter().any(|w| w.containers && w.pool == pool) {
                    self.engine.out.run_note(
                        &self.run_id,
                        &format!("note: steps of this job run in images ({}), and no connected worker of pool {pool} reaches a Docker engine: they wait for one (start `steppe worker` on a host with Docker)", listed()),
                    );
                }
                Ok(())
            }
        }
    }
}
