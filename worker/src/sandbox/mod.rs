//! The engine-side sandbox policy for agent tool calls (seed 004).
//!
//! Deny by default: a tool must be known to the engine, and every path a tool
//! touches is checked before the call runs. The step's directory is the only
//! write root; read roots may be added; `..` and symlinks cannot lead out.
//! A check that cannot complete (an I/O error while resolving) is a denial,
//! never a pass.

use std::path::{Component, Path, PathBuf};

use steppe_language::builtins::BUILTIN_TOOLS;

mod beneath;
pub use beneath::{list, open_in, subdir, Entry, Open};

/// What a tool call wants to do with a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// A refused tool call, as recorded on the step.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{tool}: {reason}")]
pub struct Denial {
    pub tool: String,
    /// The path as the model wrote it (empty when the denial is not about a path).
    pub path: String,
    pub reason: String,
}

/// The roots one step's tools may touch.
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    /// The write root first, then the read roots; each with its device and
    /// inode when the policy was made.
    roots: Vec<(PathBuf, (u64, u64))>,
}

impl SandboxPolicy {
    /// `write_root` (the step's directory) must exist; roots are canonicalized once.
    pub fn new(write_root: &Path, read_roots: &[PathBuf]) -> std::io::Result<Self> {
        let roots = std::iter::once(write_root)
            .chain(read_roots.iter().map(PathBuf::as_path))
            .map(|r| {
                let r = r.canonicalize()?;
                let id = identity(&r.symlink_metadata()?);
                Ok((r, id))
            })
            .collect::<std::io::Result<_>>()?;
        Ok(SandboxPolicy { roots })
    }

    pub fn write_root(&self) -> &Path {
        &self.roots[0].0
    }

    /// A tool the engine does not know is refused, whatever the grant says.
    pub fn check_tool(&self, tool: &str, custom: &[String]) -> Result<(), Denial> {
        if BUILTIN_TOOLS.contains(&tool) || custom.iter().any(|c| c == tool) {
            return Ok(());
        }
        Err(Denial {
            tool: tool.to_string(),
            path: String::new(),
            reason: format!("unknown tool for the engine: \"{tool}\""),
        })
    }

    /// Resolves `requested` (relative to `cwd`, or absolute) and checks it lies
    /// under a root that allows `access`. Returns the resolved path.
    pub fn check_path(&self, tool: &str, requested: &str, cwd: &Path, access: Access) -> Result<PathBuf, Denial> {
        let deny = |reason: String| Denial {
            tool: tool.to_string(),
            path: requested.to_string(),
            reason,
        };
        if requested.contains('\0') {
            return Err(deny("path contains a NUL byte".into()));
        }
        let joined = if Path::new(requested).is_absolute() { PathBuf::from(requested) } else { cwd.join(requested) };
        let lexical = normalize(&joined).ok_or_else(|| deny(format!("\"{requested}\" climbs above the filesystem root")))?;
        let resolved = resolve_below_roots(&lexical, &self.roots).map_err(|e| deny(format!("could not resolve \"{requested}\": {e}")))?;
        let inside = |root: &Path| resolved.starts_with(root);
        let allowed = match access {
            Access::Write => inside(self.write_root()),
            Access::Read => self.roots.iter().any(|(r, _)| inside(r)),
        };
        if allowed {
            return Ok(resolved);
        }
        let what = match access {
            Access::Write => format!("writes are confined to {}", self.write_root().display()),
            Access::Read => "reads are confined to the step's directory and its read roots".to_string(),
        };
        Err(deny(format!("\"{requested}\" resolves to {}, outside the sandbox: {what}", resolved.display())))
    }
}

impl SandboxPolicy {
    /// Opens a file [`check_path`](Self::check_path) resolved, from the root
    /// it lies under down ([`beneath`]): a regular file only. A FIFO, device
    /// or socket in the step's directory (a shell in its container may make
    /// one: `mkfifo`, or `mknod` as root) is refused before it is opened, as
    /// opening or reading one would block the worker or reach the host's
    /// device; a symlink put anywhere on the path since the check is not
    /// followed. Writing makes the missing directories above the file.
    pub fn open_file(&self, path: &Path, how: Open) -> std::io::Result<std::fs::File> {
        let (root, rel) = self.beneath(path, how != Open::Read)?;
        beneath::open_below(root, rel, how)
    }

    /// The directory `path` ([`check_path`](Self::check_path)'s), opened from
    /// its root down as [`open_file`](Self::open_file) opens a file.
    pub fn open_dir(&self, path: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
        let (root, rel) = self.beneath(path, false)?;
        beneath::descend(root, rel, false)
    }

    /// [`open_file`](Self::open_file) for reading, the whole file.
    pub fn read_file(&self, path: &Path) -> std::io::Result<Vec<u8>> {
        use std::io::Read;
        let mut bytes = Vec::new();
        self.open_file(path, Open::Read)?.read_to_end(&mut bytes)?;
        Ok(bytes)
    }

    /// [`read_file`](Self::read_file) as UTF-8 text.
    pub fn read_text(&self, path: &Path) -> std::io::Result<String> {
        String::from_utf8(self.read_file(path)?).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }

    /// [`open_file`](Self::open_file) for writing `content` over what was
    /// there (made, with its directories, when missing).
    pub fn write_file(&self, path: &Path, content: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        self.open_file(path, Open::Write)?.write_all(content)
    }

    /// The root `path` lies under (the write root, for `writing`), opened
    /// (still the directory the policy was made with), and the rest of
    /// `path` below it.
    fn beneath<'p>(&self, path: &'p Path, writing: bool) -> std::io::Result<(std::os::fd::OwnedFd, &'p Path)> {
        let outside = || {
            let which = if writing { "is not under the sandbox's write root" } else { "is under none of the sandbox's roots" };
            std::io::Error::new(std::io::ErrorKind::PermissionDenied, format!("{} {which}", path.display()))
        };
        let roots = if writing { &self.roots[..1] } else { &self.roots[..] };
        let (root, made) = roots.iter().find(|(r, _)| path.starts_with(r)).ok_or_else(outside)?;
        let rel = path.strip_prefix(root).map_err(|_| outside())?;
        Ok((beneath::open_root(root, *made)?, rel))
    }
}

fn not_a_file(m: &std::fs::Metadata) -> std::io::Error {
    let what = steppe_language::confine::file_kind(m.file_type());
    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{what}, not a file a tool may open"))
}

/// Lexically removes `.` and `..`; `None` when `..` climbs above the root.
fn normalize(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() || out.as_os_str().is_empty() {
                    return None;
                }
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    Some(out)
}

fn identity(m: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    (m.dev(), m.ino())
}

/// As [`resolve_existing_prefix`], looking only at the components of `p`
/// below the first of `roots` it lies under. That root was resolved when
/// the policy was made, and is the same directory still (its device and
/// inode, by a `lstat` that walks every component above it: a root moved,
/// replaced, or reached through a symlink since sends `p` through the
/// whole resolution). Below it, a component that does not exist ends the
/// walk (nothing under it exists either) and one that is a symlink sends
/// the whole path through [`resolve_existing_prefix`]; with neither, `p`
/// is its own resolution. A tool's path costs a `lstat` for the root and
/// one for each component below it, not a `readlink` for each from `/`.
fn resolve_below_roots(p: &Path, roots: &[(PathBuf, (u64, u64))]) -> std::io::Result<PathBuf> {
    let Some((root, made)) = roots.iter().find(|(r, _)| p.starts_with(r)) else { return resolve_existing_prefix(p) };
    if p.components().any(|c| matches!(c, Component::CurDir | Component::ParentDir)) {
        return resolve_existing_prefix(p);
    }
    match root.symlink_metadata() {
        Ok(m) if m.is_dir() && identity(&m) == *made => {}
        _ => return resolve_existing_prefix(p),
    }
    let mut at = root.clone();
    for c in p.components().skip(root.components().count()) {
        at.push(c);
        match at.symlink_metadata() {
            Ok(m) if m.file_type().is_symlink() => return resolve_existing_prefix(p),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
            Err(e) => return Err(e),
        }
    }
    Ok(p.to_path_buf())
}

/// Canonicalizes the longest existing prefix of `p` (following symlinks) and
/// appends the rest, so a file that does not exist yet is judged by where its
/// directory really is.
fn resolve_existing_prefix(p: &Path) -> std::io::Result<PathBuf> {
    let mut existing = p.to_path_buf();
    let mut tail: Vec<std::ffi::OsString> = Vec::new();
    loop {
        match existing.symlink_metadata() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let Some(name) = existing.file_name().map(|n| n.to_os_string()) else { return Err(e) };
                tail.push(name);
                if !existing.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    let mut resolved = existing.canonicalize()?;
    for t in tail.into_iter().rev() {
        resolved.push(t);
    }
    Ok(resolved)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::symlink;

    struct Fixture {
        base: PathBuf,
        step: PathBuf,
        repo: PathBuf,
    }

    fn fixture(name: &str) -> Fixture {
        let base = std::env::temp_dir().join(format!("steppe-sandbox-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let step = base.join("step");
        let repo = base.join("repo");
        std::fs::create_dir_all(step.join("out")).unwrap();
        std::fs::create_dir_all(&repo).unwrap();
        std::fs::write(base.join("secret.txt"), "s").unwrap();
        std::fs::write(repo.join("README"), "r").unwrap();
        Fixture { base, step, repo }
    }

    #[test]
    fn paths_inside_the_step_are_allowed_even_before_they_exist() {
        let f = fixture("inside");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        assert!(p.check_path("write_file", "out/new/dir/file.md", &f.step, Access::Write).is_ok());
        assert!(p.check_path("read_file", "out/../out/x", &f.step, Access::Read).is_ok());
        let abs = f.step.join("out/y").to_string_lossy().into_owned();
        assert!(p.check_path("write_file", &abs, &f.step, Access::Write).is_ok());
    }

    #[test]
    fn dot_dot_escapes_are_denied_and_say_why() {
        let f = fixture("dotdot");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        let d = p.check_path("read_file", "../secret.txt", &f.step, Access::Read).unwrap_err();
        assert_eq!(d.tool, "read_file");
        assert_eq!(d.path, "../secret.txt");
        assert!(d.reason.contains("outside the sandbox"), "{}", d.reason);
        assert!(p.check_path("write_file", "/etc/passwd", &f.step, Access::Write).is_err());
        assert!(p.check_path("read_file", "../../../../../../../../etc/shadow", &f.step, Access::Read).is_err());
    }

    #[test]
    fn symlinks_cannot_lead_out() {
        let f = fixture("symlink");
        symlink(&f.base, f.step.join("escape")).unwrap();
        symlink(f.base.join("secret.txt"), f.step.join("out/link.txt")).unwrap();
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        assert!(p.check_path("read_file", "escape/secret.txt", &f.step, Access::Read).is_err());
        assert!(p.check_path("write_file", "escape/new.txt", &f.step, Access::Write).is_err());
        assert!(p.check_path("read_file", "out/link.txt", &f.step, Access::Read).is_err());
        // A symlink that stays inside is fine.
        symlink(f.step.join("out"), f.step.join("alias")).unwrap();
        assert!(p.check_path("write_file", "alias/z.txt", &f.step, Access::Write).is_ok());
    }

    /// Walking only below the root resolves every path as resolving it
    /// whole from `/` does: through symlinks inside and out, dangling and
    /// looping ones, missing directories, a file taken for a directory.
    #[test]
    fn a_path_resolved_below_its_root_is_resolved_as_from_the_top() {
        let f = fixture("below");
        std::fs::write(f.step.join("f.txt"), "f").unwrap();
        symlink(&f.base, f.step.join("escape")).unwrap();
        symlink(f.step.join("out"), f.step.join("alias")).unwrap();
        symlink(f.step.join("nope"), f.step.join("dangling")).unwrap();
        symlink(&f.step, f.step.join("out/up")).unwrap();
        symlink("loop", f.step.join("loop")).unwrap();
        let root = f.step.canonicalize().unwrap();
        let roots = [(root.clone(), identity(&root.symlink_metadata().unwrap()))];
        let names = ["out", "f.txt", "escape", "alias", "dangling", "nope", "up", "loop", "secret.txt", "step"];
        let mut paths = vec![root.clone()];
        for a in names {
            paths.push(root.join(a));
            for b in names {
                paths.push(root.join(a).join(b));
                for c in names {
                    paths.push(root.join(a).join(b).join(c));
                }
            }
        }
        let (mut quick, mut elsewhere, mut errors) = (0, 0, 0);
        for p in &paths {
            let below = resolve_below_roots(p, &roots);
            let whole = resolve_existing_prefix(p);
            match (&below, &whole) {
                (Ok(a), Ok(b)) => assert_eq!(a, b, "{}", p.display()),
                (Err(_), Err(_)) => {}
                _ => panic!("{}: {below:?} below the root, {whole:?} whole", p.display()),
            }
            match below {
                Ok(r) if r == *p => quick += 1,
                Ok(_) => elsewhere += 1,
                Err(_) => errors += 1,
            }
        }
        assert!(quick > 100 && elsewhere > 100 && errors > 100, "{quick} paths their own resolution, {elsewhere} resolved elsewhere, {errors} unresolvable");
        // A path under no root is resolved whole.
        assert_eq!(resolve_below_roots(&f.base.join("secret.txt"), &roots).unwrap(), f.base.canonicalize().unwrap().join("secret.txt"));
    }

    /// The roots are trusted only while they are the directories the policy
    /// was made with: the step's directory moved away and a symlink to its
    /// parent put in its place, or a read root inside it replaced by one,
    /// lead out and are denied.
    #[test]
    fn a_root_replaced_after_the_policy_was_made_leads_nowhere() {
        let f = fixture("moved");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        std::fs::rename(&f.step, f.base.join("moved")).unwrap();
        symlink(&f.base, &f.step).unwrap();
        let d = p.check_path("read_file", "secret.txt", &f.step, Access::Read).unwrap_err();
        assert!(d.reason.contains("outside the sandbox"), "{}", d.reason);
        assert!(p.check_path("write_file", "new.txt", &f.step, Access::Write).is_err());

        let f = fixture("inner");
        std::fs::create_dir(f.step.join("sub")).unwrap();
        let p = SandboxPolicy::new(&f.step, &[f.step.join("sub")]).unwrap();
        assert!(p.check_path("read_file", "sub/x", &f.step, Access::Read).is_ok());
        std::fs::remove_dir(f.step.join("sub")).unwrap();
        symlink(&f.base, f.step.join("sub")).unwrap();
        let d = p.check_path("read_file", "sub/secret.txt", &f.step, Access::Read).unwrap_err();
        assert!(d.reason.contains("outside the sandbox"), "{}", d.reason);
    }

    /// A FIFO, a device, a directory or a symlink where a file was checked
    /// is refused at once (a FIFO opened as files are would block forever).
    #[test]
    fn only_regular_files_are_opened() {
        let f = fixture("special");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        let fifo = f.step.join("pipe");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let e = p.read_file(&fifo).unwrap_err();
        assert!(e.to_string().contains("a FIFO, not a file"), "{e}");
        assert!(p.write_file(&fifo, b"x").unwrap_err().to_string().contains("a FIFO"));
        assert!(p.read_file(&f.step.join("out")).unwrap_err().to_string().contains("a directory"));
        symlink(f.base.join("secret.txt"), f.step.join("link")).unwrap();
        assert!(p.read_file(&f.step.join("link")).unwrap_err().to_string().contains("a symlink"));
        // A device node, where this test may make one (as root).
        let dev = f.step.join("null");
        let c = std::ffi::CString::new(dev.to_str().unwrap()).unwrap();
        if unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) } == 0 {
            assert!(p.read_file(&dev).unwrap_err().to_string().contains("a device"));
        }
        p.write_file(&f.step.join("plain.txt"), b"hello").unwrap();
        assert_eq!(p.read_file(&f.step.join("plain.txt")).unwrap(), b"hello");
        p.write_file(&f.step.join("plain.txt"), b"hi").unwrap();
        assert_eq!(p.read_file(&f.step.join("plain.txt")).unwrap(), b"hi");
        assert_eq!(p.read_file(&f.step.join("missing")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    }


    /// What the check judged is what is opened: a directory on the path
    /// swapped for a symlink out of the sandbox between the check and the
    /// open (as a shell in the step's container could) is refused, for
    /// reads, writes, new directories and listings alike, and nothing
    /// outside is read, written or made. Fails if any step down follows a
    /// symlink.
    #[test]
    fn a_directory_swapped_for_a_symlink_after_the_check_is_refused() {
        let f = fixture("swap");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        let write = p.check_path("write_file", "out/x.txt", &f.step, Access::Write).unwrap();
        let read = p.check_path("read_file", "out/secret.txt", &f.step, Access::Read).unwrap();
        let deep = p.check_path("write_file", "out/new/deep/f.txt", &f.step, Access::Write).unwrap();
        let listed = p.check_path("list_dir", "out", &f.step, Access::Read).unwrap();
        std::fs::rename(f.step.join("out"), f.step.join("out.moved")).unwrap();
        symlink(&f.base, f.step.join("out")).unwrap();
        let e = p.write_file(&write, b"escaped").unwrap_err();
        assert!(e.to_string().contains("changed after it was checked"), "{e}");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied);
        assert!(!f.base.join("x.txt").exists(), "a file was written outside the sandbox");
        assert!(p.read_file(&read).is_err(), "a file outside the sandbox was read");
        assert!(p.open_file(&write, Open::Append).is_err());
        assert!(p.write_file(&deep, b"escaped").is_err());
        assert!(!f.base.join("new").exists(), "a directory was made outside the sandbox");
        assert!(p.open_dir(&listed).is_err(), "a directory outside the sandbox was listed");
        // The same with the swap one level further down.
        std::fs::remove_file(f.step.join("out")).unwrap();
        std::fs::rename(f.step.join("out.moved"), f.step.join("out")).unwrap();
        std::fs::create_dir(f.step.join("out/inner")).unwrap();
        let inner = p.check_path("write_file", "out/inner/y.txt", &f.step, Access::Write).unwrap();
        std::fs::remove_dir(f.step.join("out/inner")).unwrap();
        symlink(&f.base, f.step.join("out/inner")).unwrap();
        assert!(p.write_file(&inner, b"escaped").is_err());
        assert!(!f.base.join("y.txt").exists(), "a file was written outside the sandbox");
        // Unswapped, all of it works, the missing directories made.
        std::fs::remove_file(f.step.join("out/inner")).unwrap();
        p.write_file(&deep, b"in").unwrap();
        assert_eq!(p.read_file(&deep).unwrap(), b"in");
        p.open_file(&deep, Open::Append).unwrap().write_all(b"+").unwrap();
        assert_eq!(p.read_text(&deep).unwrap(), "in+");
        let names: Vec<_> = list(&p.open_dir(&listed).unwrap(), true).unwrap().into_iter().map(|e| e.name).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("new")]);
    }

    /// A root moved away and another directory (or a symlink) put in its
    /// place since the policy was made opens nothing under it.
    #[test]
    fn nothing_opens_under_a_root_replaced_since_the_policy_was_made() {
        let f = fixture("replaced");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        let file = p.check_path("write_file", "out/z.txt", &f.step, Access::Write).unwrap();
        std::fs::rename(&f.step, f.base.join("step.moved")).unwrap();
        std::fs::create_dir_all(f.step.join("out")).unwrap();
        let e = p.write_file(&file, b"x").unwrap_err();
        assert!(e.to_string().contains("was replaced since the step began"), "{e}");
        std::fs::remove_dir_all(&f.step).unwrap();
        symlink(f.base.join("step.moved"), &f.step).unwrap();
        assert!(p.write_file(&file, b"x").is_err());
        assert!(!f.base.join("step.moved/out/z.txt").exists());
    }

    #[test]
    fn read_roots_widen_reads_never_writes() {
        let f = fixture("readroots");
        let p = SandboxPolicy::new(&f.step, std::slice::from_ref(&f.repo)).unwrap();
        let readme = f.repo.join("README").to_string_lossy().into_owned();
        assert!(p.check_path("read_file", &readme, &f.step, Access::Read).is_ok());
        let d = p.check_path("write_file", &readme, &f.step, Access::Write).unwrap_err();
        assert!(d.reason.contains("writes are confined"), "{}", d.reason);
    }

    /// A file under a read root opens for reading only; the write root is
    /// the one place a write opens, whatever path it is handed.
    #[test]
    fn only_the_write_root_opens_for_writing() {
        let f = fixture("readopen");
        let p = SandboxPolicy::new(&f.step, std::slice::from_ref(&f.repo)).unwrap();
        let readme = p.check_path("read_file", &f.repo.join("README").to_string_lossy(), &f.step, Access::Read).unwrap();
        assert_eq!(p.read_file(&readme).unwrap(), b"r");
        let e = p.write_file(&readme, b"w").unwrap_err();
        assert!(e.to_string().contains("is not under the sandbox's write root"), "{e}");
        assert!(p.open_file(&readme, Open::Append).is_err());
        assert_eq!(std::fs::read(f.repo.join("README")).unwrap(), b"r");
        assert!(p.read_file(&f.base.join("secret.txt")).unwrap_err().to_string().contains("under none of the sandbox's roots"));
    }

    #[test]
    fn unknown_tools_and_malformed_paths_are_denied() {
        let f = fixture("unknown");
        let p = SandboxPolicy::new(&f.step, &[]).unwrap();
        assert!(p.check_tool("read_file", &[]).is_ok());
        assert!(p.check_tool("post_review", &["post_review".into()]).is_ok());
        let d = p.check_tool("Bash", &[]).unwrap_err();
        assert_eq!(d.reason, "unknown tool for the engine: \"Bash\"");
        assert!(p.check_path("read_file", "a\0b", &f.step, Access::Read).is_err());
    }
}
