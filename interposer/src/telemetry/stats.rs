//! Call counters for tests and diagnostics (`DILU_CALL_REPORT`).
//!
//! Free when disabled: one relaxed load of a static bool decided at load time.
//! When enabled: one relaxed `fetch_add` more. At exit one JSON line is
//! appended to the report file:
//!
//! ```json
//! {"pid":123,"calls":{"cuMemAlloc_v2":1,...},"lookups":{"flags0":n,"flags1":n,"flags2":n,"other":n,"wrapped":n},"dlsym_wrapped":n}
//! ```
//!
//! `calls` lists every hooked ABI name (zero counts included); `lookups`
//! counts `cuGetProcAddress`/`_v2` calls per `flags` value and how many
//! answers were replaced by a dilu wrapper; `dlsym_wrapped` counts `dlsym`
//! answers replaced by a dilu wrapper.

use std::fmt::Write as _;
use std::io::Write as _;
use std::panic::catch_unwind;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::table::{HOOK_COUNT, NAMES};

static ENABLED: AtomicBool = AtomicBool::new(false);
static CALLS: [AtomicU64; HOOK_COUNT] = [const { AtomicU64::new(0) }; HOOK_COUNT];
/// flags 0, 1, 2, other, wrapped.
static LOOKUPS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static DLSYM_WRAPPED: AtomicU64 = AtomicU64::new(0);
static REPORT_PATH: OnceLock<PathBuf> = OnceLock::new();

#[inline(always)]
pub fn count_call(id: usize) {
    if ENABLED.load(Relaxed) {
        CALLS[id].fetch_add(1, Relaxed);
    }
}

pub fn count_lookup(flags: u64, wrapped: bool) {
    if ENABLED.load(Relaxed) {
        let i = match flags {
            0 => 0,
            1 => 1,
            2 => 2,
            _ => 3,
        };
        LOOKUPS[i].fetch_add(1, Relaxed);
        if wrapped {
            LOOKUPS[4].fetch_add(1, Relaxed);
        }
    }
}

pub fn count_dlsym_wrapped() {
    if ENABLED.load(Relaxed) {
        DLSYM_WRAPPED.fetch_add(1, Relaxed);
    }
}

/// Turns counting on and registers the exit-time report. Called once, from
/// the library constructor.
pub fn enable(path: PathBuf) {
    if REPORT_PATH.set(path).is_ok() {
        ENABLED.store(true, Relaxed);
        // SAFETY: `write_report` is a plain `extern "C" fn()` that lives as
        // long as the process (this library is preloaded, never unloaded).
        let rc = unsafe { libc::atexit(write_report) };
        if rc != 0 {
            eprintln!("dilu-interposer: atexit failed; DILU_CALL_REPORT will not be written");
        }
    }
}

extern "C" fn write_report() {
    // A panic must not unwind into libc's exit path.
    let _ = catch_unwind(|| {
        let Some(path) = REPORT_PATH.get() else {
            return;
        };
        let line = render(std::process::id());
        // One write of one line on an O_APPEND file, so concurrent processes
        // appending to the same report do not interleave.
        let res = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .and_then(|mut f| f.write_all(line.as_bytes()));
        if let Err(e) = res {
            eprintln!(
                "dilu-interposer: cannot write DILU_CALL_REPORT={}: {e}",
                path.display()
            );
        }
    });
}

/// The report line (with trailing newline) for the current counters.
fn render(pid: u32) -> String {
    let mut s = String::with_capacity(64 + HOOK_COUNT * 40);
    let _ = write!(s, "{{\"pid\":{pid},\"calls\":{{");
    for (i, name) in NAMES.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        // ABI names are C identifiers: no JSON escaping needed.
        let _ = write!(
            s,
            "\"{}\":{}",
            name.to_str().unwrap_or("?"),
            CALLS[i].load(Relaxed)
        );
    }
    let l = |i: usize| LOOKUPS[i].load(Relaxed);
    let _ = writeln!(
        s,
        "}},\"lookups\":{{\"flags0\":{},\"flags1\":{},\"flags2\":{},\"other\":{},\"wrapped\":{}}},\"dlsym_wrapped\":{}}}",
        l(0),
        l(1),
        l(2),
        l(3),
        l(4),
        DLSYM_WRAPPED.load(Relaxed)
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_line_shape() {
        let line = render(42);
        assert!(line.starts_with("{\"pid\":42,\"calls\":{\"cuMemAlloc_v2\":"));
        assert!(line.contains("\"cuLaunchKernel_ptsz\":"));
        assert!(line.contains(",\"lookups\":{\"flags0\":"));
        assert!(line.ends_with("}\n"));
        assert_eq!(line.matches('{').count(), line.matches('}').count());
    }
}
