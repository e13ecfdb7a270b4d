//! Starts a host command's process as glibc's `posix_spawn` does (a child
//! that shares this process's memory and holds its parent's thread until it
//! execs) without what `posix_spawn` does on every call that steppe needs
//! done once: a fresh stack mapped and unmapped (the unmapping interrupts
//! every other thread of this process), every signal's handler looked up.
//! The child runs on a stack kept per thread, and its exit is awaited on
//! the pidfd its clone made. Linux only; callers use tokio's `Command` where
//! [`available`] says no or this fails.

use std::ffi::{c_char, c_int, c_void, CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::ExitStatus;

use tokio::io::unix::AsyncFd;

/// The child's stack: its one function and the system calls it makes.
const STACK_BYTES: usize = 64 << 10;

/// What a command starts with: its program (an absolute path), its
/// arguments (the first its own name), its whole environment, its directory.
pub struct Start {
    program: CString,
    argv: Vec<CString>,
    envp: Vec<CString>,
    dir: CString,
}

impl Start {
    /// `program` started as `program ARGS` in `dir` with only `env`.
    pub fn new<'a>(program: &Path, args: impl IntoIterator<Item = &'a OsStr>, env: impl IntoIterator<Item = (&'a OsStr, &'a OsStr)>, dir: &Path) -> io::Result<Start> {
        let c = |b: &[u8]| CString::new(b).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in a command's program, argument, environment or directory"));
        let program = c(program.as_os_str().as_bytes())?;
        let mut argv = vec![program.clone()];
        for a in args {
            argv.push(c(a.as_bytes())?);
        }
        let envp = env
            .into_iter()
            .map(|(k, v)| {
                let mut kv = Vec::with_capacity(k.len() + v.len() + 1);
                kv.extend_from_slice(k.as_bytes());
                kv.push(b'=');
                kv.extend_from_slice(v.as_bytes());
                c(&kv)
            })
            .collect::<io::Result<Vec<CString>>>()?;
        Ok(Start { program, argv, envp, dir: c(dir.as_os_str().as_bytes())? })
    }
}

/// Whether this kernel hands out pidfds (Linux 5.3 and later, where a
/// seccomp filter does not refuse them), asked once.
pub fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    // SAFETY: getpid and pidfd_open take no pointers; the descriptor is closed.
    *AVAILABLE.get_or_init(|| unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, libc::getpid(), 0);
        if fd >= 0 {
            libc::close(fd as c_int);
        }
        fd >= 0
    })
}

/// What the child reads, on its parent's stack (the parent's thread waits
/// until the child has exec'd or exited), and the one thing it writes.
#[repr(C)]
struct ChildArgs {
    program: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
    dir: *const c_char,
    /// Its stdin, stdout and stderr, in that order.
    fds: [RawFd; 3],
    /// Why it could not exec (0: it did).
    errno: c_int,
}

/// The kernel's `struct sigaction` (x86_64 and aarch64 alike), for
/// `rt_sigaction` called directly: glibc's wrapper may take a lock (for
/// SIGABRT) that the child would share with its parent.
#[repr(C)]
struct KernelSigaction {
    handler: usize,
    flags: u64,
    restorer: usize,
    mask: u64,
}

/// Sets this thread's whole signal mask (the kernel's 64 bits, glibc's own
/// two signals included, as its posix_spawn blocks them too); the old one
/// into `old` when given.
///
/// SAFETY: `old`, when not null, points to a u64.
unsafe fn set_mask(mask: u64, old: *mut u64) {
    unsafe { libc::syscall(libc::SYS_rt_sigprocmask, libc::SIG_SETMASK, &raw const mask, old, 8usize) };
}

/// The child, on its own stack with its parent's memory: only system
/// calls, on what [`ChildArgs`] holds (nothing allocates, nothing locks).
extern "C" fn child_main(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the parent's ChildArgs, alive while the parent's thread
    // waits for this exec; every pointer in it is a NUL-ended string or a
    // null-ended array of them, made before the clone.
    unsafe {
        let a = arg.cast::<ChildArgs>();
        let fail = |a: *mut ChildArgs| -> c_int {
            (*a).errno = *libc::__errno_location();
            libc::_exit(127)
        };
        for (target, fd) in (*a).fds.iter().enumerate() {
            let target = target as c_int;
            // A descriptor already in place keeps it, without its close-on-exec flag.
            let r = if *fd == target { libc::fcntl(target, libc::F_SETFD, 0) } else { libc::dup2(*fd, target) };
            if r < 0 {
                return fail(a);
            }
        }
        if libc::setpgid(0, 0) < 0 || libc::chdir((*a).dir) < 0 {
            return fail(a);
        }
        // Every signal was blocked before the clone, but one sent to this
        // child meanwhile (its parent's group, kill -1, a service manager's
        // stop) is pending: this process's handlers go back to the default
        // before it is unblocked, as glibc's posix_spawn does, so that signal
        // does what it would to the program, never runs a handler of ours on
        // our memory. SIGPIPE, which Rust's runtime ignores, too, as std does.
        let dfl = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
        for sig in 1..=64 {
            let mut old = KernelSigaction { handler: libc::SIG_DFL, flags: 0, restorer: 0, mask: 0 };
            if libc::syscall(libc::SYS_rt_sigaction, sig, std::ptr::null::<KernelSigaction>(), &raw mut old, 8usize) != 0 {
                continue;
            }
            if (old.handler != libc::SIG_DFL && old.handler != libc::SIG_IGN) || sig == libc::SIGPIPE {
                libc::syscall(libc::SYS_rt_sigaction, sig, &raw const dfl, std::ptr::null_mut::<KernelSigaction>(), 8usize);
            }
        }
        set_mask(0, std::ptr::null_mut());
        libc::execve((*a).program, (*a).argv, (*a).envp);
        fail(a)
    }
}

thread_local! {
    static STACK: std::cell::Cell<Option<Box<[u8]>>> = const { std::cell::Cell::new(None) };
}

/// Starts `start` with its stdin, stdout and stderr on `fds`, leading a
/// process group of its own; an `Err` only when it could not exec (nothing
/// ran then, nothing is left).
pub fn spawn(start: &Start, fds: [RawFd; 3]) -> io::Result<Child> {
    let argv: Vec<*const c_char> = start.argv.iter().map(|a| a.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let envp: Vec<*const c_char> = start.envp.iter().map(|e| e.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let mut args = ChildArgs { program: start.program.as_ptr(), argv: argv.as_ptr(), envp: envp.as_ptr(), dir: start.dir.as_ptr(), fds, errno: 0 };
    let mut pidfd: c_int = -1;
    let mut stack = STACK.with(|s| s.take()).unwrap_or_else(|| vec![0u8; STACK_BYTES].into_boxed_slice());
    // SAFETY: the stack is this thread's alone while CLONE_VFORK holds the
    // thread (the child is done with it once it has exec'd or exited); the
    // top is 16-byte aligned as the ABI asks; `args` outlives the child's use.
    let (pid, errno) = unsafe {
        let top = (stack.as_mut_ptr().add(stack.len()) as usize & !15) as *mut c_void;
        let mut old: u64 = 0;
        set_mask(!0, &raw mut old);
        // The pidfd comes with the child, made by the same call, or neither is.
        let pid = libc::clone(child_main, top, libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD, (&raw mut args).cast(), &raw mut pidfd);
        let clone_error = io::Error::last_os_error();
        set_mask(old, std::ptr::null_mut());
        if pid < 0 {
            STACK.with(|s| s.set(Some(stack)));
            return Err(clone_error);
        }
        (pid, std::ptr::read_volatile(&raw const args.errno))
    };
    STACK.with(|s| s.set(Some(stack)));
    // SAFETY: the descriptor the clone made (if it made one), owned here alone.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) });
    if errno != 0 {
        reap_blocking(pid);
        return Err(io::Error::from_raw_os_error(errno));
    }
    // It runs: from here on, whatever fails, it is waited for, never started again.
    // SAFETY: the pidfd is closed only with the AsyncFd that holds it.
    let watched = match pidfd.map(|fd| unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }) {
        Some(Ok(fd)) => Watched::Polled(fd),
        other => {
            let fd = match other {
                Some(Err(e)) => Some(e.into_parts().0),
                _ => None,
            };
            let (tx, rx) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = tx.send(reap(pid, 0));
            });
            Watched::Reaper(rx, fd)
        }
    };
    Ok(Child { pid, watched: Some(watched), status: None })
}

/// How a child's exit is learnt: its pidfd polled on this runtime (then
/// reaped here), or (no pidfd, or one the runtime would not take, both
/// rare) a thread of its own that reaps it and sends its status.
enum Watched {
    Polled(AsyncFd<OwnedFd>),
    Reaper(tokio::sync::oneshot::Receiver<io::Result<Option<ExitStatus>>>, Option<OwnedFd>),
}

impl Watched {
    fn pidfd(&self) -> Option<RawFd> {
        match self {
            Watched::Polled(f) => Some(f.as_raw_fd()),
            Watched::Reaper(_, f) => f.as_ref().map(AsRawFd::as_raw_fd),
        }
    }
}

/// A started command's process, killed (through its pidfd: without one,
/// its process group's `Group` kills it) and reaped when dropped unwaited.
pub struct Child {
    pid: i32,
    watched: Option<Watched>,
    status: Option<ExitStatus>,
}

impl Child {
    pub fn id(&self) -> u32 {
        self.pid.unsigned_abs()
    }

    /// Its exit, once it has ended (reaped then).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            if let Some(s) = self.try_wait()? {
                return Ok(s);
            }
            match &mut self.watched {
                Some(Watched::Polled(fd)) => fd.readable().await?.clear_ready(),
                // Awaited by reference: a wait dropped midway loses nothing.
                Some(Watched::Reaper(rx, _)) => {
                    let status = rx.await.map_err(io::Error::other)??;
                    self.watched = None;
                    self.status = status;
                }
                None => return Err(io::Error::other("this process's exit was already taken")),
            }
        }
    }

    fn try_wait(&mut self) -> io::Result<Option<ExitStatus>> {
        if self.status.is_none() {
            self.status = match &mut self.watched {
                Some(Watched::Polled(_)) => reap(self.pid, libc::WNOHANG)?,
                Some(Watched::Reaper(rx, _)) => match rx.try_recv() {
                    Ok(r) => {
                        self.watched = None;
                        r?
                    }
                    Err(_) => None,
                },
                None => None,
            };
        }
        Ok(self.status)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.status.is_some() {
            return;
        }
        if let Some(fd) = self.watched.as_ref().and_then(Watched::pidfd) {
            // SAFETY: no pointers; the pidfd names this child alone, reaped or not.
            unsafe { libc::syscall(libc::SYS_pidfd_send_signal, fd, libc::SIGKILL, std::ptr::null::<libc::siginfo_t>(), 0) };
        }
        if matches!(self.try_wait(), Ok(Some(_))) {
            return;
        }
        // Reaped by a thread, not a task: a runtime shutting down would drop the task.
        if let Some(Watched::Polled(fd)) = self.watched.take() {
            let pid = self.pid;
            std::thread::spawn(move || {
                reap_blocking(pid);
                drop(fd);
            });
        }
    }
}

/// `waitpid` of our own child: its status once ended (`None`: still
/// running, with `WNOHANG`).
fn reap(pid: i32, flags: c_int) -> io::Result<Option<ExitStatus>> {
    loop {
        let mut status: c_int = 0;
        // SAFETY: a pointer to a local.
        let r = unsafe { libc::waitpid(pid, &mut status, flags) };
        if r == pid {
            return Ok(Some(ExitStatus::from_raw(status)));
        }
        if r == 0 {
            return Ok(None);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn reap_blocking(pid: i32) {
    let _ = reap(pid, 0);
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::fd::AsRawFd;

    use super::*;

    /// Started with `fds` from a kept /dev/null and a pipe for both outputs;
    /// its exit and what it wrote.
    async fn run(program: &str, args: &[&str], env: &[(&str, &str)], dir: &Path) -> io::Result<(ExitStatus, String)> {
        let null = std::fs::File::open("/dev/null")?;
        let (mut reader, writer) = std::io::pipe()?;
        let start = Start::new(Path::new(program), args.iter().map(OsStr::new), env.iter().map(|(k, v)| (OsStr::new(*k), OsStr::new(*v))), dir)?;
        let mut child = spawn(&start, [null.as_raw_fd(), writer.as_raw_fd(), writer.as_raw_fd()])?;
        let status = child.wait().await?;
        drop(writer);
        let mut out = String::new();
        reader.read_to_string(&mut out)?;
        Ok((status, out))
    }

    /// Its arguments, only the environment given, its directory, a group
    /// of its own, /dev/null for input, SIGPIPE not ignored (this test
    /// process ignores it, as Rust's runtime does) and no signal blocked:
    /// as std's Command starts a child.
    #[tokio::test]
    async fn a_command_starts_with_what_it_was_given_and_nothing_else() {
        if !available() {
            eprintln!("skipped: this kernel hands out no pidfds (commands start by tokio's Command here)");
            return;
        }
        // An ignored signal stays ignored in the child, as with std (nohup's SIGHUP).
        // SAFETY: no handler is installed, the disposition only set to ignore (and back).
        let before = unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        let dir = std::env::temp_dir().canonicalize().expect("the temporary directory");
        let script = r#"printf '%s|' "$0" "$1" "$ONLY" "${HOME-unset}" "$(pwd)" "$(readlink /proc/$$/fd/0)"; ps=$(cut -d' ' -f5 /proc/$$/stat); [ "$ps" = $$ ] && printf 'leader|'; grep -E '^Sig(Blk|Ign)' /proc/$$/status | tr '\n\t' '| '; exit 7"#;
        let ran = run("/bin/sh", &["-c", script, "zero", "one"], &[("ONLY", "a b=c")], &dir).await;
        // SAFETY: the disposition this process had.
        unsafe { libc::signal(libc::SIGUSR2, before) };
        let (status, out) = ran.expect("started");
        assert_eq!(status.code(), Some(7), "{out}");
        let fields: Vec<&str> = out.split('|').collect();
        assert_eq!(&fields[..7], ["zero", "one", "a b=c", "unset", dir.to_str().unwrap(), "/dev/null", "leader"], "{out}");
        let mask = |name: &str| fields.iter().find_map(|f| f.strip_prefix(name)).map(|m| u64::from_str_radix(m.trim(), 16).expect("a mask")).expect(name);
        assert_eq!(mask("SigBlk:"), 0, "no signal blocked: {out}");
        assert_eq!(mask("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "SIGPIPE at its default: {out}");
        assert_ne!(mask("SigIgn:") & (1 << (libc::SIGUSR2 - 1)), 0, "SIGUSR2 still ignored: {out}");
    }

    /// A program or directory that is not there is the error exec gave,
    /// as std's: the caller falls back to the shell, which says why.
    #[tokio::test]
    async fn what_cannot_start_is_an_error() {
        if !available() {
            return;
        }
        let tmp = std::env::temp_dir();
        let e = run("/nonexistent/program", &[], &[], &tmp).await.err().expect("not started");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = run("/bin/true", &[], &[], Path::new("/nonexistent/dir")).await.err().expect("not started");
        assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}");
        let e = Start::new(Path::new("/bin/true"), [OsStr::new("a\0b")], [], &tmp).err().expect("a NUL refused");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        // The spawner's stack serves the next command after a failure.
        let (status, out) = run("/bin/sh", &["-c", "printf ok"], &[], &tmp).await.expect("started");
        assert!(status.success() && out == "ok", "{status} {out}");
    }

    #[tokio::test]
    async fn a_killed_command_reads_as_killed() {
        if !available() {
            return;
        }
        let (status, _) = run("/bin/sh", &["-c", "kill -KILL $$"], &[], &std::env::temp_dir()).await.expect("started");
        assert_eq!((status.code(), status.signal()), (None, Some(libc::SIGKILL)));
    }

    /// Dropped unwaited: killed, and reaped (no zombie left behind).
    #[tokio::test]
    async fn a_dropped_command_is_killed_and_reaped() {
        if !available() {
            return;
        }
        let start = Start::new(Path::new("/bin/sleep"), [OsStr::new("300")], [], &std::env::temp_dir()).expect("a start");
        let null = std::fs::File::open("/dev/null").expect("/dev/null");
        let child = spawn(&start, [null.as_raw_fd(); 3]).expect("started");
        let stat = format!("/proc/{}/stat", child.id());
        assert!(std::path::Path::new(&stat).exists());
        drop(child);
        let t = std::time::Instant::now();
        while std::path::Path::new(&stat).exists() {
            assert!(t.elapsed() < std::time::Duration::from_secs(10), "still there: {}", std::fs::read_to_string(&stat).unwrap_or_default());
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
}
