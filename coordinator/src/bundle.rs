//! A submission's files: what `steppe submit` sends (the pipeline, the files
//! it reads, and what the user includes on purpose, never the rest of the
//! directory) and where the coordinator unpacks them.

use std::path::{Component, Path, PathBuf};

use steppe_proto::v1::BundleFile;
use steppe_language::Loaded;

/// The gRPC message limit a submission must fit in.
pub const SUBMISSION_MAX: usize = 4 << 20;

/// The most files one submission may carry.
pub const BUNDLE_FILES_MAX: usize = 10_000;

/// The checked-in list of extra files to send, beside the pipeline.
pub const INCLUDE_FILE: &str = ".steppe-include";

/// What `steppe submit` sends, and how it came together.
pub struct Bundle {
    pub files: Vec<BundleFile>,
    /// Files the loader read besides the pipeline.
    pub read: usize,
    /// Files added by `--include` or `.steppe-include`.
    pub included: usize,
}

impl Bundle {
    pub fn bytes(&self) -> usize {
        self.files.iter().map(|f| f.content.len()).sum()
    }

    /// `ci.yml, 2 files it reads and 1 included file: 3.4 KiB`.
    pub fn summary(&self) -> String {
        let name = self.files.first().map(|f| f.path.as_str()).unwrap_or("the pipeline");
        format!(
            "{name}, {} file(s) it reads and {} included file(s): {}",
            self.read,
            self.included,
            human_bytes(self.bytes())
        )
    }
}

pub fn human_bytes(n: usize) -> String {
    match n {
        n if n < 1024 => format!("{n} B"),
        n if n < 1 << 20 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{:.1} MiB", n as f64 / (1 << 20) as f64),
    }
}

fn file(full: &Path, rel: &str) -> anyhow::Result<BundleFile> {
    use std::os::unix::fs::PermissionsExt;
    let content = steppe_language::confine::read_capped(full, steppe_language::confine::FILE_CAP).map_err(|e| anyhow::anyhow!("{}: it {e}", full.display()))?;
    let executable = std::fs::metadata(full).is_ok_and(|m| m.permissions().mode() & 0o111 != 0);
    Ok(BundleFile { path: rel.to_string(), content, executable })
}

/// The pipeline, every file its load read, and the files matching
/// `patterns` (from `--include`) or the lines of [`INCLUDE_FILE`].
pub fn collect(path: &Path, loaded: &Loaded, patterns: &[String]) -> anyhow::Result<Bundle> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut files = vec![file(path, &name)?];
    // The stepfiles `stepgate:` servers serve are read when a step starts, on the coordinator.
    let stepfiles = loaded.pipeline.mcp_servers.iter().flat_map(|m| m.stepgate.iter().flat_map(|g| g.stepfiles.iter()));
    for rel in loaded.read_files.iter().chain(stepfiles) {
        if !files.iter().any(|f| &f.path == rel) {
            files.push(file(&loaded.dir.join(rel), rel)?);
        }
    }
    let read = files.len() - 1;
    let mut patterns = patterns.to_vec();
    let listed = loaded.dir.join(INCLUDE_FILE);
    if let Ok(text) = std::fs::read_to_string(&listed) {
        patterns.extend(text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string));
    }
    let included = included_files(&loaded.dir, &patterns)?;
    let mut have: std::collections::HashSet<String> = files.iter().map(|f| f.path.clone()).collect();
    let mut count = 0;
    for rel in included {
        if have.insert(rel.clone()) {
            files.push(file(&loaded.dir.join(&rel), &rel)?);
            count += 1;
        }
    }
    if files.len() > BUNDLE_FILES_MAX {
        anyhow::bail!("{} files would go with {name}; a submission carries at most {BUNDLE_FILES_MAX} (narrow --include or {INCLUDE_FILE})", files.len());
    }
    Ok(Bundle { files, read, included: count })
}

/// Files under `dir` matching any pattern (a glob relative to `dir`; a
/// directory stands for everything under it). Symlinks are not followed and
/// `.steppe/` (run state) is never sent.
fn included_files(dir: &Path, patterns: &[String]) -> anyhow::Result<Vec<String>> {
    if patterns.is_empty() {
        return Ok(Vec::new());
    }
    let mut set = globset::GlobSetBuilder::new();
    for p in patterns {
        let p = p.trim_end_matches('/');
        if p.is_empty() || Path::new(p).is_absolute() || Path::new(p).components().any(|c| c == Component::ParentDir) {
            anyhow::bail!("include pattern {p:?} must be relative to the pipeline's directory, without ..");
        }
        for g in [p.to_string(), format!("{p}/**")] {
            set.add(globset::GlobBuilder::new(&g).literal_separator(true).build().map_err(|e| anyhow::anyhow!("include pattern {p:?}: {e}"))?);
        }
    }
    let set = set.build()?;
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    let mut seen = 0usize;
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(dir.join(&rel)) else { continue };
        for e in entries.flatten() {
            seen += 1;
            if seen > 200_000 {
                anyhow::bail!("{} holds too many entries to search for --include patterns; name the files more narrowly", dir.display());
            }
            let r = rel.join(e.file_name());
            let Ok(meta) = std::fs::symlink_metadata(e.path()) else { continue };
            if meta.is_dir() {
                if r != Path::new(".steppe") {
                    stack.push(r);
                }
            } else if meta.is_file() && set.is_match(&r) {
                out.push(r.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Unpacks a bundle under `root`, nested deep enough that paths climbing
/// above the pipeline's directory (`../scripts/x.sh`) stay inside `root`.
/// Returns the pipeline's path and its directory relative to `root`.
pub fn unpack(root: &Path, id: &str, pipeline: &str, files: &[BundleFile]) -> Result<(PathBuf, String), String> {
    if !matches!(Path::new(pipeline).components().collect::<Vec<_>>().as_slice(), [Component::Normal(_)]) {
        return Err(format!("pipeline name {pipeline:?} must be a file name"));
    }
    if files.len() > BUNDLE_FILES_MAX {
        return Err(format!("the submission carries {} files; at most {BUNDLE_FILES_MAX}", files.len()));
    }
    let mut depth = 0usize;
    for f in files {
        let climb = steppe_language::confine::check_relative(&f.path, "the pipeline's directory").map_err(|e| format!("bundle path {:?} {e}", f.path))?;
        depth = depth.max(climb);
    }
    let mut dir = root.to_path_buf();
    let mut rel = Vec::new();
    for i in 0..depth {
        dir.push(format!("d{i}"));
        rel.push(format!("d{i}"));
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let marker = root.join(MARKER);
    for f in files {
        let full = steppe_language::confine::normalize(&dir.join(&f.path));
        if !full.starts_with(root) || full == root {
            return Err(format!("bundle path {:?} leads outside the submission", f.path));
        }
        if full == marker {
            return Err(format!("bundle path {:?} is the coordinator's own", f.path));
        }
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("bundle path {:?}: {e}", f.path))?;
        }
        std::fs::write(&full, &f.content).map_err(|e| format!("bundle path {:?}: {e}", f.path))?;
        if f.executable {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(0o755)).map_err(|e| format!("bundle path {:?}: {e}", f.path))?;
        }
    }
    // Makes the snapshot of these files (resource checks run in it) this
    // submission's own: another with the same files does not share it.
    std::fs::write(&marker, id).map_err(|e| format!("{}: {e}", root.display()))?;
    Ok((dir.join(pipeline), rel.join("/")))
}

/// The file that makes a submission's snapshot its own.
const MARKER: &str = ".steppe-submission";

#[cfg(test)]
mod tests {
    use super::*;

    fn f(path: &str) -> BundleFile {
        BundleFile { path: path.into(), content: b"x".to_vec(), executable: false }
    }

    #[test]
    fn climbing_paths_stay_inside_the_root_and_escapes_are_refused() {
        let root = std::env::temp_dir().join(format!("steppe-unpack-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (p, dir) = unpack(&root, "s1", "ci.yml", &[f("ci.yml"), f("../shared/x.sh")]).unwrap();
        assert_eq!(dir, "d0");
        assert_eq!(p, root.join("d0/ci.yml"));
        assert!(root.join("shared/x.sh").is_file());
        for bad in ["/etc/passwd", &("../".repeat(17) + "etc/x"), "a/\0b"] {
            assert!(unpack(&root, "s1", "ci.yml", &[f("ci.yml"), f(bad)]).is_err(), "{bad:?}");
        }
        assert!(unpack(&root, "s1", "ci.yml", &[f("ci.yml"), f("../.steppe-submission")]).is_err(), "the marker is not the submitter's");
        for bad in ["../ci.yml", "a/b.yml", "", "."] {
            assert!(unpack(&root, "s1", bad, &[f("ci.yml")]).is_err(), "pipeline name {bad:?}");
        }
    }

    #[test]
    fn only_what_the_patterns_name_is_included() {
        let d = std::env::temp_dir().join(format!("steppe-include-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for p in ["scripts/a.sh", "scripts/deep/b.sh", "data/x.json", "token", ".steppe/ci.yml.db", "notes.md"] {
            std::fs::create_dir_all(d.join(p).parent().unwrap()).unwrap();
            std::fs::write(d.join(p), "x").unwrap();
        }
        assert!(included_files(&d, &[]).unwrap().is_empty(), "nothing beyond the files read, by default");
        assert_eq!(included_files(&d, &["scripts".into()]).unwrap(), vec!["scripts/a.sh", "scripts/deep/b.sh"]);
        assert_eq!(included_files(&d, &["data/*.json".into(), "*.md".into()]).unwrap(), vec!["data/x.json", "notes.md"]);
        assert_eq!(included_files(&d, &["**".into()]).unwrap().len(), 5, "never .steppe/");
        assert!(included_files(&d, &["../x".into()]).is_err());
    }
}
