//! How long the calling thread waited for a CPU: on a host whose CPUs the
//! fillers' processes share with the primary, a request can wait for its
//! thread to run as well as for the device (the kernel's schedstat for the
//! thread: time runnable but not running).

use std::cell::RefCell;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The thread's schedstat file and its run-queue wait at the last reading,
/// for the process that opened it (a child forked by this thread reads its
/// own thread's file, not the parent's).
struct Reading {
    pid: u32,
    file: Option<File>,
    waited_ns: u64,
}

thread_local! {
    static LAST: RefCell<Option<Reading>> = const { RefCell::new(None) };
}

/// The time the calling thread spent runnable but off a CPU since its last
/// call: 0 at its first, and always where the kernel keeps no schedstat.
pub(crate) fn since_last_call() -> u64 {
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        let pid = std::process::id();
        match last.as_mut() {
            Some(reading) if reading.pid == pid => {
                let Some(now) = reading.file.as_ref().and_then(waited_ns) else {
                    return 0;
                };
                let waited = now.saturating_sub(reading.waited_ns);
                reading.waited_ns = now;
                waited
            }
            _ => {
                let file = File::open("/proc/thread-self/schedstat").ok();
                let waited_ns = file.as_ref().and_then(waited_ns).unwrap_or(0);
                *last = Some(Reading {
                    pid,
                    file,
                    waited_ns,
                });
                0
            }
        }
    })
}

/// The run-queue wait in a schedstat file: its second field, in ns
/// ("time on CPU, time waiting on a run queue, timeslices run").
fn waited_ns(file: &File) -> Option<u64> {
    let mut text = [0u8; 96];
    let length = file.read_at(&mut text, 0).ok()?;
    parse_wait(std::str::from_utf8(&text[..length]).ok()?)
}

fn parse_wait(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_kept_off_the_cpus_by_busy_ones_sees_that_wait() {
        assert_eq!(parse_wait("103382326 9886244 405\n"), Some(9_886_244));
        assert_eq!(parse_wait("103382326"), None);
        if File::open("/proc/thread-self/schedstat").is_err() {
            eprintln!("no schedstat on this kernel: nothing to measure");
            return;
        }
        assert_eq!(since_last_call(), 0, "the first call has nothing before it");
        // More busy threads than CPUs for a while: this thread, spinning
        // too, waits its turn on a run queue for some of it.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let spin = || {
            let until = std::time::Instant::now() + std::time::Duration::from_millis(300);
            while std::time::Instant::now() < until {
                std::hint::spin_loop();
            }
        };
        std::thread::scope(|scope| {
            for _ in 0..2 * cpus {
                scope.spawn(spin);
            }
            spin();
        });
        assert!(since_last_call() > 0, "no wait seen beside busy threads");
    }
}
