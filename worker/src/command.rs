//! Runs a step's command once: on the host (`sh -c`, or its program
//! directly when it is plain words) or in a container, its output read line
//! by line into the sink and kept up to a cap, stopped by its timeout or a
//! cancel. Judging the result is the caller's ([`crate::exec`]).

use std::borrow::Cow;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use steppe_runtime::assignment::{Assignment, AssignmentResult};
use steppe_runtime::outcome::StepError;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe::Receiver;
use tokio::process::Command;
use tokio::sync::watch;

use crate::sink::{LineSink, Stream};

/// Captured output per stream is capped; the rest is counted, not kept.
const CAPTURE_CAP: usize = 16 << 20;

/// Runs the assignment's command once: `Ok` with its result (timeouts and
/// aborts already classified), `Err` when it could not start.
pub(crate) async fn run_command(a: &Assignment, dir: &Path, sink: &Arc<dyn LineSink>, cancel: &watch::Receiver<bool>) -> Result<AssignmentResult, Box<AssignmentResult>> {
    let fail = |e: StepError| Box::new(AssignmentResult::of(a, Err(e)));
    let command = match &a.template {
        Some(data) => steppe_language::template::render(&a.command, data).map_err(|e| fail(StepError::errored(format!("{}: {e}", a.step))))?,
        None => a.command.clone(),
    };
    if let Some(image) = &a.image {
        return run_in_image(a, image, &command, dir, sink, cancel).await;
    }
    let mut cancel = cancel.clone();
    // Plain words start their program directly (simple_command.rs); what
    // cannot be started so goes to the shell, which says why in its words.
    let direct = crate::simple_command::words(&command).and_then(|w| Some((crate::simple_command::program_path(w[0], dir)?, w)));
    let pipes = OutputPipes::new().map_err(|e| fail(StepError::errored(format!("{}: cannot make its output pipes: {}", a.step, start_error(&e)))))?;
    let spawned = match direct {
        Some((program, words)) => pipes.start(a, &program, &words[1..], dir).ok(),
        None => None,
    };
    let mut child = match spawned {
        Some(c) => c,
        None => match pipes.start(a, Path::new(crate::host_env::shell()), &["-c", &command], dir) {
            Ok(c) => c,
            Err(e) => return Err(fail(StepError::errored(format!("{}: cannot start sh: {}", a.step, start_error(&e))))),
        },
    };
    // Killed whole however this ends, this future dropped included.
    let group = child.id().and_then(crate::process_group::Group::of_pid);
    // Both streams are read in this task, beside the wait (no task of their
    // own per step); a reader that panics (a bug) is caught and told.
    let reader = |s: Receiver, stream: Stream| {
        let (run_id, step, sink, echo) = (a.run_id.clone(), a.step.clone(), sink.clone(), a.stream);
        async move { std::panic::AssertUnwindSafe(read_stream(BufReader::new(s), run_id, step, stream, sink, echo)).catch_unwind().await.map_err(|p| steppe_language::load::panic_text(p.as_ref())) }
    };
    let (out_pipe, err_pipe, held) = pipes.readers().map_err(|e| fail(StepError::errored(format!("{}: cannot read its output: {e}", a.step))))?;
    let mut out_read = std::pin::pin!(reader(out_pipe, Stream::Stdout));
    let mut err_read = std::pin::pin!(reader(err_pipe, Stream::Stderr));
    let (mut stdout, mut stderr): (Option<Result<String, String>>, Option<Result<String, String>>) = (None, None);
    let mut stop: Option<StepError> = None;
    let status;
    {
        let mut stopping = std::pin::pin!(stopped(a, &mut cancel));
        status = loop {
            tokio::select! {
                s = child.wait() => break s.ok(),
                e = &mut stopping => {
                    stop = Some(e);
                    break None;
                }
                o = &mut out_read, if stdout.is_none() => stdout = Some(o),
                e = &mut err_read, if stderr.is_none() => stderr = Some(e),
            }
        };
    }
    if stop.is_some() {
        if let Some(g) = &group {
            g.kill();
        }
        let _ = child.wait().await;
    }
    // Reaped: its pipes may end now.
    drop(held);
    // What the command left running in the background goes with it (and
    // lets go of the output pipes it held).
    drop(group);
    // The rest of its output, for at most 2 s (a process that left the
    // group may hold a pipe open); what arrived by then is kept.
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        if stdout.is_none() {
            stdout = Some((&mut out_read).await);
        }
        if stderr.is_none() {
            stderr = Some((&mut err_read).await);
        }
    })
    .await;
    let (stdout, stderr) = (stdout.unwrap_or_else(|| Ok(String::new())), stderr.unwrap_or_else(|| Ok(String::new())));
    let exit_code = status.and_then(|s| s.code().or_else(|| s.signal_code()));
    let unread = stdout.as_ref().err().or(stderr.as_ref().err()).cloned();
    let mut res = AssignmentResult { exit_code, stdout: stdout.unwrap_or_default(), stderr: stderr.unwrap_or_default(), ..AssignmentResult::of(a, Ok(())) };
    if let Some(e) = stop {
        res.result = Err(e);
    } else if let Some(what) = unread {
        res.result = Err(StepError::errored(format!("{}: reading its output failed ({what})", a.step)));
    }
    Ok(res)
}


/// Why a command could not start, with what to do when it is this
/// process's limit of open files (each running command holds five).
fn start_error(e: &std::io::Error) -> String {
    if e.raw_os_error() == Some(libc::EMFILE) {
        return format!("{e}: this process's limit of open files is reached (each running command holds five); raise it (`ulimit -n`) or run fewer steps at once (max_in_flight, --workers, --slots)");
    }
    e.to_string()
}

/// `program ARGS` in `dir` with the host environment's allowlist and the
/// step's own names, in a process group of its own (its output: [`OutputPipes`]).
fn host_command(a: &Assignment, program: &Path, args: &[&str], dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(dir).env_clear();
    cmd.envs(step_env(a));
    cmd.stdin(Stdio::null()).process_group(0).kill_on_drop(true);
    cmd
}

/// As [`host_command`], for [`crate::spawn`].
#[cfg(target_os = "linux")]
fn host_start(a: &Assignment, program: &Path, args: &[&str], dir: &Path) -> std::io::Result<crate::spawn::Start> {
    let env = step_env(a);
    crate::spawn::Start::new(program, args.iter().map(std::ffi::OsStr::new), env.iter().map(|(k, v)| (*k, v.as_ref())), dir)
}

/// A host command's whole environment: the host allowlist's variables this
/// process has (read once, borrowed), then the step's own names that it
/// has, each name once.
fn step_env(a: &Assignment) -> Vec<(&std::ffi::OsStr, Cow<'static, std::ffi::OsStr>)> {
    let mut env: Vec<(&std::ffi::OsStr, Cow<'static, std::ffi::OsStr>)> = crate::host_env::values().iter().map(|(k, v)| (std::ffi::OsStr::new(*k), Cow::Borrowed(v.as_os_str()))).collect();
    for name in &a.env {
        if !env.iter().any(|(k, _)| *k == name.as_str()) {
            if let Some(v) = std::env::var_os(name) {
                env.push((std::ffi::OsStr::new(name), Cow::Owned(v)));
            }
        }
    }
    env
}

/// A started command: by steppe's own spawner where the kernel allows
/// ([`crate::spawn`]), else tokio's.
enum Running {
    #[cfg(target_os = "linux")]
    Own(crate::spawn::Child),
    Tokio(tokio::process::Child),
}

impl Running {
    fn id(&self) -> Option<u32> {
        match self {
            #[cfg(target_os = "linux")]
            Running::Own(c) => Some(c.id()),
            Running::Tokio(c) => c.id(),
        }
    }

    async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        match self {
            #[cfg(target_os = "linux")]
            Running::Own(c) => c.wait().await,
            Running::Tokio(c) => c.wait().await,
        }
    }
}

/// A command's stdout and stderr pipes, of which this process holds a
/// writing end too until the command is reaped. A process closes its
/// descriptors a moment before the kernel tells of its exit, so pipes
/// that end with it would wake the step twice (the pipes, then the exit);
/// held, they end when the step lets go of them, already awake.
struct OutputPipes {
    out: (std::io::PipeReader, std::io::PipeWriter),
    err: (std::io::PipeReader, std::io::PipeWriter),
}

impl OutputPipes {
    fn new() -> std::io::Result<OutputPipes> {
        Ok(OutputPipes { out: std::io::pipe()?, err: std::io::pipe()? })
    }

    /// Starts `program ARGS` in `dir` (as [`host_command`]) writing into the pipes.
    fn start(&self, a: &Assignment, program: &Path, args: &[&str], dir: &Path) -> std::io::Result<Running> {
        #[cfg(target_os = "linux")]
        if let Some(null) = null_input().filter(|_| program.is_absolute() && crate::spawn::available()) {
            use std::os::fd::AsRawFd;
            let start = host_start(a, program, args, dir)?;
            // Where it fails (nothing ran then), tokio's says why, or starts it where this could not.
            if let Ok(c) = crate::spawn::spawn(&start, [null.as_raw_fd(), self.out.1.as_raw_fd(), self.err.1.as_raw_fd()]) {
                return Ok(Running::Own(c));
            }
        }
        let mut cmd = host_command(a, program, args, dir);
        cmd.stdout(self.out.1.try_clone()?).stderr(self.err.1.try_clone()?);
        cmd.spawn().map(Running::Tokio)
    }

    /// The reading ends, for this runtime, and the writing ends to let go
    /// of once the command is reaped.
    fn readers(self) -> std::io::Result<(Receiver, Receiver, (std::io::PipeWriter, std::io::PipeWriter))> {
        let reader = |r: std::io::PipeReader| Receiver::from_owned_fd(r.into());
        Ok((reader(self.out.0)?, reader(self.err.0)?, (self.out.1, self.err.1)))
    }
}

/// One `/dev/null` this process keeps open, for every command's input
/// (None while it cannot be opened, as when the process is out of
/// descriptors: asked again next time, tokio's `Command` meanwhile).
#[cfg(target_os = "linux")]
fn null_input() -> Option<&'static std::fs::File> {
    static NULL: std::sync::OnceLock<std::fs::File> = std::sync::OnceLock::new();
    if let Some(f) = NULL.get() {
        return Some(f);
    }
    let f = std::fs::File::open("/dev/null").ok()?;
    Some(NULL.get_or_init(|| f))
}

/// What stops a running command before it ends: its timeout, or a cancel.
async fn stopped(a: &Assignment, cancel: &mut watch::Receiver<bool>) -> StepError {
    tokio::select! {
        _ = crate::stop::deadline(a.timeout) => StepError::timed_out(format!("{}: timed out after {}", a.step, steppe_language::duration::show(a.timeout.unwrap_or_default()))),
        _ = crate::stop::cancelled(cancel) => StepError::aborted(format!("{}: aborted", a.step)),
    }
}

/// As [`run_command`], in a container of `image` on the Docker engine.
async fn run_in_image(a: &Assignment, image: &str, command: &str, dir: &Path, sink: &Arc<dyn LineSink>, cancel: &watch::Receiver<bool>) -> Result<AssignmentResult, Box<AssignmentResult>> {
    let running = crate::container::start(a, image, command, dir, sink).await.map_err(|e| Box::new(AssignmentResult::of(a, Err(e))))?;
    let mut cancel = cancel.clone();
    let (out, err) = running.streams();
    let out_task = tokio::spawn(read_stream(BufReader::new(out), a.run_id.clone(), a.step.clone(), Stream::Stdout, sink.clone(), a.stream));
    let err_task = tokio::spawn(read_stream(BufReader::new(err), a.run_id.clone(), a.step.clone(), Stream::Stderr, sink.clone(), a.stream));
    let mut stop: Option<StepError> = None;
    let exit_code = tokio::select! {
        c = running.wait() => c,
        e = stopped(a, &mut cancel) => {
            stop = Some(e);
            None
        }
    };
    if stop.is_some() {
        running.kill().await;
    }
    let collect = |t: tokio::task::JoinHandle<String>| async move { tokio::time::timeout(Duration::from_secs(2), t).await.ok().and_then(Result::ok).unwrap_or_default() };
    let (stdout, stderr) = (collect(out_task).await, collect(err_task).await);
    let mut res = AssignmentResult { exit_code, stdout, stderr, ..AssignmentResult::of(a, Ok(())) };
    if let Some(e) = stop {
        res.result = Err(e);
    }
    Ok(res)
}


trait SignalCode {
    fn signal_code(&self) -> Option<i32>;
}

impl SignalCode for std::process::ExitStatus {
    fn signal_code(&self) -> Option<i32> {
        use std::os::unix::process::ExitStatusExt;
        self.signal().map(|s| 128 + s)
    }
}

/// Reads a command's stream line by line: each line goes to the sink (the
/// recorder, and the live view when `echo`), and the first [`CAPTURE_CAP`]
/// bytes are kept for the result. A line longer than
/// [`steppe_runtime::wire::LINE_MAX`] arrives in pieces of that size: memory stays
/// bounded whatever the command writes.
async fn read_stream<R: tokio::io::AsyncRead + Unpin>(
    mut r: BufReader<R>,
    run_id: String,
    step: String,
    stream: Stream,
    sink: Arc<dyn LineSink>,
    echo: bool,
) -> String {
    let mut captured = String::new();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let (done, used) = match r.fill_buf().await {
            Ok([]) | Err(_) => (true, 0),
            Ok(chunk) => {
                let room = steppe_runtime::wire::LINE_MAX - buf.len();
                match chunk.iter().take(room).position(|b| *b == b'\n') {
                    Some(i) => {
                        buf.extend_from_slice(&chunk[..=i]);
                        (false, i + 1)
                    }
                    None => {
                        let n = chunk.len().min(room);
                        buf.extend_from_slice(&chunk[..n]);
                        (false, n)
                    }
                }
            }
        };
        r.consume(used);
        let complete = buf.last() == Some(&b'\n') || buf.len() >= steppe_runtime::wire::LINE_MAX || (done && !buf.is_empty());
        if complete {
            let line = String::from_utf8_lossy(&buf);
            if echo {
                sink.line(&run_id, &step, stream, line.trim_end_matches('\n'));
            }
            if captured.len() < CAPTURE_CAP {
                captured.push_str(&line);
            }
            buf.clear();
        }
        if done {
            return captured;
        }
    }
}
