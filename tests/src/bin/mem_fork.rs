//! `mem-fork`: a CUDA process of a tenant forks workers while its own
//! threads are busy allocating, freeing and being refused, the way a
//! training process forks data-loader workers. Checks that no child
//! deadlocks and that the tenant's ledger stays exact: each child is a new
//! member holding only what it charged itself, its exit (normal, `_exit` or
//! SIGKILL) gives that back exactly once, and the parent's usage never moves.
//!
//! Children, like children of a real CUDA program, cannot use the driver
//! (simgpu refuses every call in a forked child, as NVIDIA's driver does):
//! each one calls `cuMemGetInfo` and `cuMemAlloc` through the interposer
//! (which joins the ledger and charges the child's context), reads the
//! tenant ledger, and reports one JSON line through a pipe.
//!
//! Needs `DILU_TENANT` (to find the ledger) and a memory budget. Prints one
//! JSON summary; exit status 0 when it could run (the test judges the
//! numbers).

use dilu_abi::cuda::{self, CUresult, sys};
use dilu_layout::ledger::TenantLedger;
use dilu_layout::shm::Region;
use dilu_tests::driver::{Driver, flag_value};
use std::ffi::c_int;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: mem-fork [--children N] [--hold BYTES]";

type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;
type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
type SetCurrent = unsafe extern "C" fn(sys::CUcontext) -> CUresult;

/// How a child ends.
#[derive(Clone, Copy)]
enum Exit {
    /// `exit(0)`: atexit handlers run (the interposer leaves the ledger).
    Normal,
    /// `_exit(0)`: no handlers (a member must reclaim the slot).
    Immediate,
    /// Killed by the parent with SIGKILL after reporting.
    Killed,
}

impl Exit {
    fn of(index: usize) -> Exit {
        [Exit::Normal, Exit::Immediate, Exit::Killed][index % 3]
    }

    fn name(self) -> &'static str {
        match self {
            Exit::Normal => "exit",
            Exit::Immediate => "_exit",
            Exit::Killed => "sigkill",
        }
    }
}

struct Api {
    alloc: MemAlloc,
    free: MemFree,
    info: MemGetInfo,
    set_current: SetCurrent,
    context: usize,
}

fn open_driver() -> Result<Api, String> {
    let driver = Driver::open()?;
    let context = driver.primary_context()?;
    Ok(Api {
        alloc: driver.function("cuMemAlloc_v2")?,
        free: driver.function("cuMemFree_v2")?,
        info: driver.function("cuMemGetInfo_v2")?,
        set_current: driver.function("cuCtxSetCurrent")?,
        context: context as usize,
    })
}

fn open_ledger() -> Result<Region<TenantLedger>, String> {
    let tenant = std::env::var("DILU_TENANT").map_err(|_| "DILU_TENANT is not set")?;
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = dilu_layout::tenant_region_path(uid, &tenant, "ledger");
    Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {})
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes all of `text` to `fd` with plain `write(2)` (no Rust stdio lock,
/// which a parent thread might have held at the fork).
fn write_fd(fd: c_int, text: &str) {
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: writing from a live buffer of the given length.
        let n = unsafe { libc::write(fd, rest.as_ptr().cast(), rest.len()) };
        if n <= 0 {
            return;
        }
        rest = &rest[n as usize..];
    }
}

/// The child's whole life. Never returns.
fn child(
    index: usize,
    exit: Exit,
    driver: &Api,
    ledger: &Region<TenantLedger>,
    inherited: u64,
    report: c_int,
) -> ! {
    let pid = std::process::id() as i32;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: live out-parameters.
    let info = unsafe { (driver.info)(&mut free, &mut total) };
    let mut pointer = 0u64;
    // SAFETY: live out-parameter.
    let alloc = unsafe { (driver.alloc)(&mut pointer, 1 << 20) };
    // A pointer the parent allocated: the child must not refund its charge.
    // SAFETY: freeing a device pointer; the driver decides whether it may.
    let free_inherited = unsafe { (driver.free)(inherited) };
    let line = format!(
        "{{\"index\":{index},\"pid\":{pid},\"exit\":\"{}\",\"info\":{info},\"alloc\":{alloc},\"free_inherited\":{free_inherited},\"own\":{},\"tenant_used\":{},\"members\":{}}}\n",
        exit.name(),
        ledger.member_used(pid, 0),
        ledger.used(0),
        ledger.members().len(),
    );
    write_fd(report, &line);
    match exit {
        Exit::Normal => std::process::exit(0),
        // SAFETY: _exit has no preconditions.
        Exit::Immediate => unsafe { libc::_exit(0) },
        Exit::Killed => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
    }
}

/// Waits for `pid` up to `limit`; kills it if it outlives that. Returns
/// whether it ended by itself (false: it hung).
fn reap(pid: i32, limit: Duration) -> bool {
    let started = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waiting for our own child.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid || done < 0 {
            return true;
        }
        if started.elapsed() > limit {
            // SAFETY: killing and reaping our own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Reads whole lines from `fd` until `count` lines arrived or `limit`
/// passed.
fn read_lines(fd: c_int, count: usize, limit: Duration) -> Vec<String> {
    let started = Instant::now();
    let mut text = String::new();
    let mut buffer = [0u8; 4096];
    while text.matches('\n').count() < count && started.elapsed() < limit {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one live pollfd.
        if unsafe { libc::poll(&mut poll, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reading into a live buffer.
        let n = unsafe { libc::read(fd, buffer.as_mut_ptr().cast(), buffer.len()) };
        if n <= 0 {
            break;
        }
        text.push_str(&String::from_utf8_lossy(&buffer[..n as usize]));
    }
    text.lines().map(str::to_owned).collect()
}

fn run(children: usize, hold: usize) -> Result<String, String> {
    let driver = open_driver()?;
    let mut held = 0u64;
    // SAFETY: live out-parameter.
    if unsafe { (driver.alloc)(&mut held, hold) } != cuda::CUDA_SUCCESS {
        return Err(format!("cannot allocate {hold} bytes"));
    }
    let ledger = open_ledger()?;
    let me = std::process::id() as i32;
    // The parent's own usage: its context plus what it holds.
    let base = ledger.used(0);
    let budget = ledger.budget(0);

    let stop = AtomicBool::new(false);
    let busy_calls = AtomicU64::new(0);
    let busy_errors = AtomicU64::new(0);
    let mut report = [0 as c_int; 2];
    // SAFETY: creating a pipe into a live array of two fds.
    if unsafe { libc::pipe(report.as_mut_ptr()) } != 0 {
        return Err("pipe failed".into());
    }
    let (mut hung, mut lowest) = (0usize, u64::MAX);
    let mut lines = Vec::new();
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (driver, stop) = (&driver, &stop);
            let (calls, errors) = (&busy_calls, &busy_errors);
            scope.spawn(move || {
                // SAFETY: the context came from the driver above.
                unsafe { (driver.set_current)(driver.context as sys::CUcontext) };
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    round += 1;
                    let mut pointer = 0u64;
                    if t % 2 == 0 {
                        // Within budget: allocate and free (charge table,
                        // ledger and driver all busy).
                        let size = 4096 + ((round * 7919 + t * 104_729) % (1 << 20)) as usize;
                        // SAFETY: live out-parameter; freeing what we got.
                        unsafe {
                            if (driver.alloc)(&mut pointer, size) == cuda::CUDA_SUCCESS {
                                if (driver.free)(pointer) != cuda::CUDA_SUCCESS {
                                    errors.fetch_add(1, Ordering::Relaxed);
                                }
                            } else {
                                errors.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    } else {
                        // Over budget: refused inside the interposer (with a
                        // rescan for dead members) before the driver runs.
                        // SAFETY: live out-parameter.
                        let result = unsafe { (driver.alloc)(&mut pointer, budget as usize) };
                        if result != cuda::CUDA_ERROR_OUT_OF_MEMORY {
                            errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Let every busy thread get going before the first fork.
        while busy_calls.load(Ordering::Relaxed) < 100 {
            std::thread::yield_now();
        }
        let mut pids = Vec::new();
        for index in 0..children {
            let exit = Exit::of(index);
            // SAFETY: fork; the child only runs `child`, which never returns.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                child(index, exit, &driver, &ledger, held, report[1]);
            }
            if pid > 0 {
                pids.push((pid, exit));
            }
            lowest = lowest.min(ledger.used(0));
        }
        lines = read_lines(report[0], pids.len(), Duration::from_secs(60));
        for &(pid, exit) in &pids {
            if let Exit::Killed = exit {
                // SAFETY: killing our own child (it has reported, or hung).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            hung += usize::from(!reap(pid, Duration::from_secs(60)));
            lowest = lowest.min(ledger.used(0));
        }
        stop.store(true, Ordering::Relaxed);
    });
    // SAFETY: closing our pipe fds.
    unsafe {
        libc::close(report[0]);
        libc::close(report[1]);
    }
    // Members that ended without leaving are reclaimed by our watcher
    // (every 100 ms); allow for a loaded machine.
    let settle = Instant::now();
    while (ledger.used(0) != base || ledger.members().len() != 1)
        && settle.elapsed() < Duration::from_secs(20)
    {
        lowest = lowest.min(ledger.used(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let settled_used = ledger.used(0);
    let settled_members = ledger.members();
    let own_after = ledger.member_used(me, 0);
    // SAFETY: freeing what we allocated.
    let freed = unsafe { (driver.free)(held) };
    let after_free = ledger.used(0);
    Ok(format!(
        "{{\"base\":{base},\"hold\":{hold},\"lowest_used\":{lowest},\"settled_used\":{settled_used},\"settled_members\":{},\"parent_own\":{own_after},\"freed\":{freed},\"after_free\":{after_free},\"hung\":{hung},\"busy_calls\":{},\"busy_errors\":{},\"children\":[{}]}}",
        settled_members.len(),
        busy_calls.load(Ordering::Relaxed),
        busy_errors.load(Ordering::Relaxed),
        lines.join(","),
    ))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(children), Some(hold)) = (
        flag_value(&args, "--children", 9),
        flag_value(&args, "--hold", 8 << 20),
    ) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match run(children as usize, hold as usize) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("mem-fork: {message}");
            ExitCode::FAILURE
        }
    }
}
