//! A thread that hands out steps asks the kernel for short time slices.
//!
//! Linux's EEVDF scheduler (6.12 on) lets a task ask for a slice shorter
//! than the default (`sched_setattr`'s `sched_runtime` for an ordinary
//! task; no privilege needed). A task of a shorter slice has an earlier
//! deadline, so when it wakes it runs at once instead of waiting for the
//! task on its CPU to use up its slice. The runtime's threads work in short
//! bursts between their steps' commands (a child reaped, the next one
//! spawned): with the default slice, a thread woken to reap one command
//! waited behind the other command on its CPU while the CPU the reaped one
//! left stood idle. The commands themselves keep the default: the setting
//! is reset in every child (`SCHED_FLAG_RESET_ON_FORK`), so a thread of
//! negative nice, whose children that reset would lower to nice 0, does
//! not ask. Older kernels ignore the slice; an error changes nothing.

/// The slice asked for: the kernel's shortest (0.1 ms).
const SLICE_NS: u64 = 100_000;

/// `struct sched_attr` as `sched_setattr(2)` takes it (its first version).
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

const SCHED_FLAG_RESET_ON_FORK: u64 = 0x01;

/// Asks for short slices for the calling thread, at its nice value, when
/// it is an ordinary (`SCHED_OTHER`) thread of nice 0 or more; anything
/// else is left as it is. Whether the kernel took it.
pub fn ask() -> bool {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getscheduler and getpriority read this thread's settings.
        let policy = unsafe { libc::sched_getscheduler(0) };
        if policy != libc::SCHED_OTHER {
            return false;
        }
        // SAFETY: as above (Linux's getpriority(PRIO_PROCESS, 0) is the
        // calling thread's; its error, -1, is below 0 too).
        let nice = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        // A thread above the ordinary priority (a negative nice) is left
        // alone: resetting on fork would start its commands at nice 0, not
        // at the priority they inherit today.
        if nice < 0 {
            return false;
        }
        let attr = SchedAttr {
            size: std::mem::size_of::<SchedAttr>() as u32,
            policy: libc::SCHED_OTHER as u32,
            flags: SCHED_FLAG_RESET_ON_FORK,
            nice,
            runtime: SLICE_NS,
            ..Default::default()
        };
        // SAFETY: the attribute is a valid sched_attr of its stated size for this thread (0).
        unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const SchedAttr, 0) == 0 }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The thread that asked has the short slice (where the kernel keeps
    /// one: `se.slice` in its sched file), and a child it starts does not.
    #[test]
    fn a_thread_that_asks_gets_the_short_slice_and_its_children_do_not() {
        let (asked, own, child) = std::thread::spawn(|| {
            let asked = super::ask();
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            let own = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).unwrap_or_default();
            let child = std::process::Command::new("cat").arg("/proc/self/sched").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            (asked, own, child)
        })
        .join()
        .expect("the thread");
        let slice = |s: &str| s.lines().find(|l| l.starts_with("se.slice")).and_then(|l| l.split(':').nth(1)).and_then(|v| v.trim().parse::<u64>().ok());
        match (asked, slice(&own)) {
            (true, Some(s)) => {
                assert_eq!(s, super::SLICE_NS, "{own}");
                let c = slice(&child).expect("the child's sched file has a slice too");
                assert!(c > super::SLICE_NS, "the child keeps the default slice, not ours: {c}");
            }
            (false, Some(_)) => panic!("a kernel that shows slices refused to set one"),
            // A kernel before EEVDF's slices: nothing to see.
            (_, None) => eprintln!("no se.slice in this kernel's sched file; skipped"),
        }
    }

    /// A thread of a negative nice (where this process may set one) is
    /// left alone: its commands must inherit that priority, which the
    /// reset on fork would drop.
    #[test]
    fn a_thread_above_the_ordinary_priority_is_left_alone() {
        let (raised, asked, child_nice) = std::thread::spawn(|| {
            // SAFETY: setpriority on this thread (PRIO_PROCESS of 0 is the calling thread on Linux).
            let raised = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -1) } == 0;
            let asked = super::ask();
            let child = std::process::Command::new("sh").args(["-c", "cut -d' ' -f19 /proc/self/stat"]).output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default();
            (raised, asked, child)
        })
        .join()
        .expect("the thread");
        if !raised {
            eprintln!("this process may not raise a thread's priority (no CAP_SYS_NICE): skipped");
            return;
        }
        assert!(!asked, "a thread of nice -1 does not ask");
        assert_eq!(child_nice, "-1", "its command keeps the priority it inherits");
    }
}
