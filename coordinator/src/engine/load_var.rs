//! `load_var:` a file of an earlier step's output read into a `((var))` of the run.

use std::sync::Arc;

use steppe_language::model::Step;
use steppe_runtime::outcome::StepError;

use super::run::*;

impl JobRun {
    pub(super) async fn load_var(self: &Arc<Self>, s: &Step) -> Done {
        let name = s.load_var.clone().unwrap_or_default();
        let file = s.file.clone().unwrap_or_default();
        let first = file.split('/').next().unwrap_or_default().to_string();
        let Some(r) = self.artifact(&first) else {
            return self.finish_err(&name, StepError::errored(format!("load_var {name}: input \"{first}\" was not produced")));
        };
        let tmp = self.temp("loadvar");
        let store = self.engine.store.clone();
        let rest: String = file.split_once('/').map(|(_, r)| r).unwrap_or_default().to_string();
        let (dest, inside) = (tmp.0.clone(), rest.clone());
        // The artifact came from a step: a symlink in it must not lead to this host's files.
        let read = move || {
            store.materialize(&r, &dest)?;
            steppe_language::confine::read_text(&dest, &inside, Some(&dest), "the artifact", LOAD_VAR_CAP).map_err(|e| std::io::Error::other(format!("\"{inside}\" {e}")))
        };
        let text = tokio::task::spawn_blocking(read).await.unwrap_or_else(|e| Err(std::io::Error::other(e.to_string())));
        drop(tmp);
        match text {
            Ok(t) => {
                if let Ok(mut v) = self.vars.lock() {
                    v.entry(name.clone()).or_insert_with(|| t.trim().to_string());
                }
                Done::ok(vec![name])
            }
            Err(e) => self.finish_err(&name, StepError::errored(format!("load_var {name}: reading {file}: {e}"))),
        }
    }
}
