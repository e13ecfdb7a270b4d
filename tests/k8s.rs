//! The Kubernetes manifests in deploy/k8s: every overlay renders with
//! `kubectl kustomize`; holds the coordinator's and the workers' Deployments,
//! the coordinator's Service and the workers' PodDisruptionBudget (aws and
//! gcp: a KEDA ScaledObject with that cloud's trigger, its target per replica
//! the worker's --slots); and passes `kubernetes-validate --strict`, which
//! may leave only KEDA's kinds unchecked (it has no schema for them).

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::repo;

/// `name` from $STEPPE_VENV/bin when it is there, otherwise from PATH.
fn tool(name: &str) -> PathBuf {
    if let Some(venv) = std::env::var_os("STEPPE_VENV") {
        let p = Path::new(&venv).join("bin").join(name);
        if p.is_file() {
            return p;
        }
    }
    PathBuf::from(name)
}

fn missing(tool: &Path, e: std::io::Error) -> String {
    format!("running {}: {e}; the Kubernetes manifest test needs it ($STEPPE_VENV/bin or PATH): scripts/test installs it", tool.display())
}

fn render(dir: &Path) -> String {
    let kubectl = tool("kubectl");
    let out = Command::new(&kubectl).arg("kustomize").arg(dir).output().unwrap_or_else(|e| panic!("{}", missing(&kubectl, e)));
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("kustomize writes UTF-8")
}

/// The rendered document of this kind and metadata.name (kustomize writes
/// top-level keys unindented and metadata's two spaces in).
fn doc<'a>(docs: &[&'a str], kind: &str, name: &str) -> Option<&'a str> {
    let (kind, name) = (format!("kind: {kind}"), format!("  name: {name}"));
    docs.iter().copied().find(|d| d.lines().any(|l| l == kind) && d.lines().any(|l| l == name))
}

/// The value after `key` on the first line that has it, quotes dropped.
fn value<'a>(doc: &'a str, key: &str) -> Option<&'a str> {
    doc.lines().find_map(|l| l.split_once(key)).map(|(_, v)| v.trim().trim_matches('"'))
}

/// `kubernetes-validate --strict` on the rendered YAML (`-`: stdin). It has
/// no flag to skip custom resources: a kind it has no schema for is a `WARN
/// … Couldn't find schema` line and exit 0. So warnings are allowed for
/// keda.sh kinds only: a core kind with a mistyped apiVersion must not pass
/// unchecked (hence no --no-warn).
fn validate(overlay: &str, yaml: &str) {
    let validator = tool("kubernetes-validate");
    let mut child = Command::new(&validator)
        .args(["--strict", "--quiet", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}", missing(&validator, e)));
    child.stdin.take().unwrap().write_all(yaml.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{overlay}: kubernetes-validate failed:\n{report}{}", String::from_utf8_lossy(&out.stderr));
    for line in report.lines().filter(|l| l.starts_with("WARN")) {
        assert!(line.contains("api version keda.sh/"), "{overlay}: left unvalidated: {line}");
    }
}

fn check(overlay: &str, yaml: &str) {
    let docs: Vec<&str> = yaml.split("\n---\n").collect();
    let need = |kind: &str, name: &str| doc(&docs, kind, name).unwrap_or_else(|| panic!("{overlay}: no {kind} {name} in\n{yaml}"));
    need("Deployment", "steppe-coordinator");
    need("Service", "steppe-coordinator");
    need("PodDisruptionBudget", "steppe-worker");
    let worker = need("Deployment", "steppe-worker");
    assert!(worker.contains("terminationGracePeriodSeconds: 3600"), "{overlay}: workers drain for up to an hour");
    let scaled = yaml.lines().filter(|l| *l == "kind: ScaledObject").count();
    let trigger = match overlay {
        "aws" => Some(("aws-sqs-queue", "queueLength:")),
        "gcp" => Some(("gcp-pubsub", "value:")),
        _ => None,
    };
    let Some((trigger, target)) = trigger else {
        assert_eq!(scaled, 0, "{overlay}: no autoscaling here");
        return;
    };
    assert_eq!(scaled, 1, "{overlay}: one ScaledObject");
    let so = need("ScaledObject", "steppe-worker");
    assert_eq!(value(so, "type:"), Some(trigger), "{overlay}: the ScaledObject's trigger");
    assert_eq!(value(so, "minReplicaCount:"), Some("0"), "{overlay}: workers scale to zero");
    assert!(!worker.lines().any(|l| l == "  replicas:" || l.starts_with("  replicas: ")), "{overlay}: KEDA owns the worker count");
    let slots = value(worker, "--slots=").expect("the worker's --slots");
    assert_eq!(value(so, target), Some(slots), "{overlay}: KEDA's target per replica is the worker's --slots");
}

#[test]
fn every_overlay_renders_and_validates() {
    let root = repo("deploy/k8s/overlays");
    let mut overlays: Vec<PathBuf> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).collect();
    overlays.sort();
    let names: Vec<String> = overlays.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    for expected in ["aws", "gcp", "redis"] {
        assert!(names.iter().any(|n| n == expected), "deploy/k8s/overlays/{expected} is missing");
    }
    for (dir, name) in overlays.iter().zip(&names) {
        let yaml = render(dir);
        check(name, &yaml);
        validate(name, &yaml);
    }
}
