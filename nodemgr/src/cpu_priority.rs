//! A co-location filler's host CPU priority (`dilu run --cpu-nice`).
//!
//! A filler yields the GPU to its primary, but on a node whose cores are
//! busy its host threads (launches, data loading, a Python interpreter)
//! still take CPU time the primary's launches need, and a request waits
//! for the host as it would for the device (beside vLLM on 2 cores, a
//! filler on another GPU, sharing only the cores, slowed the server's
//! requests: `bench/results/llm.md`, the host-only row). So `dilu run`
//! lowers a filler's priority (its nice value) before the program starts;
//! every thread and process it creates inherits it. A primary and a tenant
//! without a role keep the priority they were started with, and a
//! default never raises a priority someone lowered (`nice -n 19 dilu run`).
//! A nice value orders normally scheduled threads only, so a filler
//! started under a real-time policy (`chrt`, as `scripts/bench.sh` runs its
//! co-location benchmarks) is first moved to the normal one: at real-time
//! priority a best-effort program takes the CPU from every normally
//! scheduled thread, and competes as an equal with a primary that runs
//! real-time. (Kept real-time beside a real-time primary on a 2-core host,
//! fillers' host threads held the CPU its requests waited for.) A primary
//! and a tenant without a role keep their policy; `--cpu-nice` given to one
//! under a real-time policy is said to have no effect.

/// The nice value of an offline filler (`--colo filler`): the lowest
/// priority, CPU time only where nothing else wants it.
pub const FILLER_NICE: i32 = 19;

/// The nice value of an online filler (`--colo online-filler`): below a
/// primary (about a tenth of its CPU weight) and above offline fillers.
pub const ONLINE_FILLER_NICE: i32 = 10;

/// The nice value a program started with co-location `role` runs at when
/// `--cpu-nice` is not given; `None` keeps the inherited one.
pub fn default_for(role: Option<&str>) -> Option<i32> {
    match role {
        Some("filler") => Some(FILLER_NICE),
        Some("online-filler") => Some(ONLINE_FILLER_NICE),
        _ => None,
    }
}

/// What to do about this process's nice value, `current`, given the
/// user's `--cpu-nice` (`asked`) or the role's default.
pub fn target(current: i32, asked: Option<i32>, default: Option<i32>) -> Option<i32> {
    match (asked, default) {
        (Some(asked), _) => (asked != current).then_some(asked),
        // A default only lowers priority (raises the nice value).
        (None, Some(default)) => (default > current).then_some(default),
        (None, None) => None,
    }
}

/// This process's nice value.
pub fn current() -> Result<i32, String> {
    // getpriority may return -1 as a value, so errno tells an error apart.
    // SAFETY: __errno_location returns this thread's errno slot, and
    // getpriority reads the calling process's priority; neither takes
    // pointers from us.
    let value = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, 0)
    };
    let errno = std::io::Error::last_os_error();
    if value == -1 && errno.raw_os_error().unwrap_or(0) != 0 {
        return Err(format!("cannot read the CPU priority: {errno}"));
    }
    Ok(value)
}

/// Sets this process's nice value. On Linux it is the calling thread's,
/// which the program exec'd next inherits, with every thread it starts.
pub fn set(nice: i32) -> Result<(), String> {
    // SAFETY: setpriority on the calling process (who 0) with an integer.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Whether this thread runs under a real-time policy (`SCHED_FIFO`,
/// `SCHED_RR`), where nice values do not apply.
pub fn real_time() -> bool {
    // SAFETY: sched_getscheduler on the calling thread (pid 0) takes no
    // pointers.
    let policy = unsafe { libc::sched_getscheduler(0) };
    policy == libc::SCHED_FIFO || policy == libc::SCHED_RR
}

/// Moves this thread (and the program exec'd next, with every thread it
/// starts) from a real-time policy to the normal one. Lowering a policy
/// takes no privilege.
pub fn leave_real_time() -> Result<(), String> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread (pid 0) reads the
    // sched_param it is handed, which lives through the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(())
}

/// Applies `--cpu-nice` (`asked`) or the role's default before the program
/// starts: a filler under a real-time policy leaves it first. Only a failure
/// to honour what the user asked is said; the program runs either way.
pub fn apply(asked: Option<i32>, role: Option<&str>) {
    let filler = default_for(role).is_some();
    if real_time() {
        if !filler {
            if asked.is_some() {
                eprintln!(
                    "dilu: --cpu-nice has no effect: the program runs under a real-time \
                     scheduling policy, which nice values do not order"
                );
            }
            return;
        }
        if let Err(why) = leave_real_time() {
            eprintln!(
                "dilu: the filler stays under its real-time scheduling policy ({why}): its \
                 nice value has no effect"
            );
            return;
        }
    }
    let current = match current() {
        Ok(current) => current,
        Err(why) => {
            if asked.is_some() {
                eprintln!("dilu: --cpu-nice is not applied: {why}");
            }
            return;
        }
    };
    let Some(nice) = target(current, asked, default_for(role)) else {
        return;
    };
    if let Err(why) = set(nice) {
        let flag = if asked.is_some() {
            "--cpu-nice"
        } else {
            "the filler's default CPU priority"
        };
        eprintln!(
            "dilu: {flag} (nice {nice}) is not applied ({why}): the program runs at nice \
             {current}{}",
            if nice < current {
                "; a higher priority than the one started with takes CAP_SYS_NICE"
            } else {
                ""
            }
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fillers_default_to_lower_priority_and_others_keep_theirs() {
        assert_eq!(default_for(Some("filler")), Some(19));
        assert_eq!(default_for(Some("online-filler")), Some(10));
        assert_eq!(default_for(Some("primary")), None);
        assert_eq!(default_for(None), None);
    }

    #[test]
    fn a_filler_under_a_real_time_policy_leaves_it_and_a_primary_keeps_it() {
        // On its own thread: the policy and the nice value are per thread.
        let run = |role: &'static str| {
            std::thread::spawn(move || {
                let param = libc::sched_param { sched_priority: 10 };
                // SAFETY: sched_setscheduler on this thread with a param
                // that lives through the call.
                if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &param) } != 0 {
                    return None;
                }
                assert!(real_time());
                apply(None, Some(role));
                Some((real_time(), current().expect("nice value")))
            })
            .join()
            .expect("the thread")
        };
        let Some(filler) = run("filler") else {
            // Entering a real-time policy takes CAP_SYS_NICE.
            eprintln!("not run: this process may not enter a real-time policy");
            return;
        };
        assert_eq!(filler, (false, FILLER_NICE), "the filler's policy and nice");
        let primary = run("primary").expect("allowed once");
        assert!(primary.0, "the primary left its real-time policy");
    }

    #[test]
    fn a_default_never_raises_a_priority_but_the_flag_sets_what_it_says() {
        // Started at nice 19 (nice -n 19 dilu run): an online filler's
        // default 10 would raise it, so it stays.
        assert_eq!(target(19, None, Some(10)), None);
        assert_eq!(target(0, None, Some(10)), Some(10));
        assert_eq!(target(0, None, None), None);
        // The flag wins, either way, and nothing is done where it holds.
        assert_eq!(target(19, Some(0), Some(19)), Some(0));
        assert_eq!(target(0, Some(5), None), Some(5));
        assert_eq!(target(5, Some(5), Some(19)), None);
    }
}
