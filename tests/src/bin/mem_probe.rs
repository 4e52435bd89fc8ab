//! `mem-probe`: a tenant process that allocates on command and tries to
//! raise its own memory budget from the inside, for the node manager's
//! end-to-end tests.
//!
//! Reads one command per line on stdin and answers one line on stdout:
//! - `alloc BYTES` → `alloc CODE` (the `cuMemAlloc_v2` result; the memory is
//!   kept until `free`);
//! - `free` → `free CODE` (frees everything held; the worst result);
//! - `device N` → `device N` (device N's primary context is current from
//!   now on: later allocations are on it), or `error: ...`;
//! - `raise` → one JSON object saying what each attempt to raise the budget
//!   did: writing the tenant's ledger (`DILU_TENANT`), and, on the sealed
//!   budget region the node manager handed the interposer (found in
//!   `/proc/self/fd` and `/proc/self/maps`), `mprotect` to writable, a
//!   writable `mmap` of its descriptor, reopening `/proc/self/fd/N`
//!   read-write then mapping or `pwrite`-ing it, and a plain store (in a
//!   forked child, which must die of SIGSEGV).
//! - `zero` → `zero N`: zeroes the tenant's usage in its own ledger (it
//!   declares every member dead; N slots emptied), as a tenant that lies to
//!   its budget would, so the daemon's audit has something to catch;
//! - `share` → `share HEX` (a CUDA IPC handle of the last allocation, as
//!   128 hex digits) or `share error CODE`;
//! - `open HEX` → `open CODE` (`cuIpcOpenMemHandle` of another process's
//!   handle; the mapping is kept until `close`);
//! - `close` → `close CODE` (closes every opened handle; the worst result);
//! - `fill BYTE` → `fill CODE` (sets every byte of the last allocation);
//! - `peek` → `peek BYTE` (the first byte of the last opened mapping) or
//!   `peek error CODE`;
//! - `info` → `info FREE TOTAL` (`cuMemGetInfo`: what the process is told);
//! - `vmm-create BYTES` → `vmm-create CODE` (`cuMemCreate` on device 0; the
//!   handle is kept until `vmm-release`);
//! - `vmm-offer PATH` → `vmm-offer CODE`: exports the last created handle as
//!   a POSIX file descriptor and hands it, over a socket listening at PATH,
//!   to the first process that connects (as programs pass such descriptors);
//! - `vmm-take PATH` → `vmm-take CODE`: receives a descriptor from PATH and
//!   imports it (`cuMemImportFromShareableHandle`; kept until `vmm-drop`);
//! - `vmm-release` / `vmm-drop` → `… CODE` (`cuMemRelease` of every created
//!   / imported handle; the worst result);
//! - end of input: frees everything and exits 0.

use dilu_abi::cuda::{self, CUresult};
use dilu_layout::ledger::{MAX_DEVICES, TenantLedger, UNLIMITED};
use dilu_layout::shm::Region;
use dilu_tests::driver::Driver;
use std::io::{BufRead, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::process::ExitCode;

type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
type MemFree = unsafe extern "C" fn(u64) -> CUresult;

/// The driver calls of sharing memory between processes.
struct Sharing {
    get: unsafe extern "C" fn(*mut [u8; 64], u64) -> CUresult,
    open: unsafe extern "C" fn(*mut u64, [u8; 64], u32) -> CUresult,
    close: unsafe extern "C" fn(u64) -> CUresult,
    memset: unsafe extern "C" fn(u64, u8, usize) -> CUresult,
    to_host: unsafe extern "C" fn(*mut u8, u64, usize) -> CUresult,
    info: unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult,
}

impl Sharing {
    fn new(driver: &Driver) -> Result<Sharing, String> {
        Ok(Sharing {
            get: driver.function("cuIpcGetMemHandle")?,
            open: driver.function("cuIpcOpenMemHandle_v2")?,
            close: driver.function("cuIpcCloseMemHandle")?,
            memset: driver.function("cuMemsetD8_v2")?,
            to_host: driver.function("cuMemcpyDtoH_v2")?,
            info: driver.function("cuMemGetInfo_v2")?,
        })
    }

    /// Answers the sharing commands (`None`: not one of them).
    fn answer(
        &self,
        words: &[&str],
        held: &[(u64, usize)],
        opened: &mut Vec<u64>,
    ) -> Option<String> {
        let last = held.last().copied();
        Some(match words {
            ["share"] => {
                let mut handle = [0u8; 64];
                // SAFETY: a live 64-byte out-parameter; a pointer we allocated.
                let result = unsafe { (self.get)(&mut handle, last.map_or(0, |(p, _)| p)) };
                if result == cuda::CUDA_SUCCESS {
                    format!(
                        "share {}",
                        handle
                            .iter()
                            .map(|b| format!("{b:02x}"))
                            .collect::<String>()
                    )
                } else {
                    format!("share error {result}")
                }
            }
            ["open", hex] => {
                let mut handle = [0u8; 64];
                let parsed = hex.len() == 128
                    && handle.iter_mut().enumerate().all(|(i, b)| {
                        u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                            .map(|v| *b = v)
                            .is_ok()
                    });
                if !parsed {
                    return Some("error: a handle is 128 hex digits".into());
                }
                let mut pointer = 0u64;
                // SAFETY: live out-parameter; the handle is passed by value.
                let result = unsafe { (self.open)(&mut pointer, handle, 1) };
                if result == cuda::CUDA_SUCCESS {
                    opened.push(pointer);
                }
                format!("open {result}")
            }
            ["close"] => format!(
                "close {}",
                opened
                    .drain(..)
                    // SAFETY: pointers this process opened.
                    .map(|p| unsafe { (self.close)(p) })
                    .find(|&r| r != cuda::CUDA_SUCCESS)
                    .unwrap_or(cuda::CUDA_SUCCESS)
            ),
            ["fill", byte] => match (byte.parse::<u8>(), last) {
                // SAFETY: the whole of an allocation this process holds.
                (Ok(v), Some((p, n))) => format!("fill {}", unsafe { (self.memset)(p, v, n) }),
                _ => "error: fill BYTE needs an allocation".into(),
            },
            ["peek"] => {
                let mut byte = 0u8;
                let result = match opened.last() {
                    // SAFETY: one byte of an opened mapping into a live byte.
                    Some(&p) => unsafe { (self.to_host)(&mut byte, p, 1) },
                    None => cuda::CUDA_ERROR_INVALID_VALUE,
                };
                if result == cuda::CUDA_SUCCESS {
                    format!("peek {byte}")
                } else {
                    format!("peek error {result}")
                }
            }
            ["info"] => {
                let (mut free, mut total) = (0usize, 0usize);
                // SAFETY: live out-parameters.
                let result = unsafe { (self.info)(&mut free, &mut total) };
                if result == cuda::CUDA_SUCCESS {
                    format!("info {free} {total}")
                } else {
                    format!("info error {result}")
                }
            }
            _ => return None,
        })
    }
}

/// The driver calls of shareable VMM handles.
struct VmmSharing {
    create: unsafe extern "C" fn(*mut u64, usize, *const u8, u64) -> CUresult,
    release: unsafe extern "C" fn(u64) -> CUresult,
    export: unsafe extern "C" fn(*mut std::ffi::c_void, u64, u32, u64) -> CUresult,
    import: unsafe extern "C" fn(*mut u64, *mut std::ffi::c_void, u32) -> CUresult,
}

/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`.
const POSIX_FD: u32 = 1;

impl VmmSharing {
    fn new(driver: &Driver) -> Result<VmmSharing, String> {
        Ok(VmmSharing {
            create: driver.function("cuMemCreate")?,
            release: driver.function("cuMemRelease")?,
            export: driver.function("cuMemExportToShareableHandle")?,
            import: driver.function("cuMemImportFromShareableHandle")?,
        })
    }

    fn release_all(&self, handles: &mut Vec<u64>) -> CUresult {
        handles
            .drain(..)
            // SAFETY: handles this process created or imported.
            .map(|h| unsafe { (self.release)(h) })
            .find(|&r| r != cuda::CUDA_SUCCESS)
            .unwrap_or(cuda::CUDA_SUCCESS)
    }

    /// Answers the VMM commands (`None`: not one of them).
    fn answer(
        &self,
        words: &[&str],
        created: &mut Vec<u64>,
        imported: &mut Vec<u64>,
    ) -> Option<String> {
        Some(match words {
            ["vmm-create", bytes] => {
                let Ok(bytes) = bytes.parse::<usize>() else {
                    return Some(format!("error: bad size {bytes:?}"));
                };
                // CUmemAllocationProp: pinned (1), on a device (1), device 0.
                let mut prop = [0u8; 32];
                prop[0] = 1;
                prop[8] = 1;
                let mut handle = 0u64;
                // SAFETY: live out-parameter and property block.
                let result = unsafe { (self.create)(&mut handle, bytes, prop.as_ptr(), 0) };
                if result == cuda::CUDA_SUCCESS {
                    created.push(handle);
                }
                format!("vmm-create {result}")
            }
            ["vmm-offer", path] => {
                let Some(&handle) = created.last() else {
                    return Some("error: vmm-offer needs a created handle".into());
                };
                let mut fd: i32 = -1;
                // SAFETY: the descriptor is written where the pointer points.
                let result = unsafe { (self.export)((&raw mut fd).cast(), handle, POSIX_FD, 0) };
                if result != cuda::CUDA_SUCCESS {
                    return Some(format!("vmm-offer {result}"));
                }
                // SAFETY: the driver handed this descriptor to us.
                let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                let listener = match dilu_abi::seqpacket::listen(std::path::Path::new(path), 0o600)
                {
                    Ok(l) => l,
                    Err(e) => return Some(format!("error: {path}: {e}")),
                };
                std::thread::spawn(move || {
                    if let Ok(peer) = dilu_abi::seqpacket::accept(&listener) {
                        let _ = dilu_abi::seqpacket::send(&peer, b"fd", &[fd.as_raw_fd()]);
                        dilu_abi::seqpacket::wait_closed(&peer);
                    }
                });
                format!("vmm-offer {result}")
            }
            ["vmm-take", path] => {
                let connection = match dilu_abi::seqpacket::connect(
                    std::path::Path::new(path),
                    Some(std::time::Duration::from_secs(30)),
                ) {
                    Ok(c) => c,
                    Err(e) => return Some(format!("error: {path}: {e}")),
                };
                let mut buffer = [0u8; 16];
                let fds = match dilu_abi::seqpacket::recv(&connection, &mut buffer) {
                    Ok((_, fds)) if fds.len() == 1 => fds,
                    Ok(_) => return Some("error: no descriptor came".into()),
                    Err(e) => return Some(format!("error: {e}")),
                };
                let mut handle = 0u64;
                let os_handle = fds[0].as_raw_fd() as usize as *mut std::ffi::c_void;
                // SAFETY: live out-parameter; the descriptor travels in the
                // pointer's bits, as NVIDIA's API has it.
                let result = unsafe { (self.import)(&mut handle, os_handle, POSIX_FD) };
                if result == cuda::CUDA_SUCCESS {
                    imported.push(handle);
                }
                format!("vmm-take {result}")
            }
            ["vmm-release"] => format!("vmm-release {}", self.release_all(created)),
            ["vmm-drop"] => format!("vmm-drop {}", self.release_all(imported)),
            _ => return None,
        })
    }
}

/// The name the node manager gives the budget memfd (`memfd:` + label).
const BUDGET_LABEL: &str = "memfd:dilu-budget-";

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// "refused (errno N)" or "succeeded".
fn outcome(ok: bool) -> String {
    if ok {
        "succeeded".into()
    } else {
        format!("refused (errno {})", errno())
    }
}

/// The descriptor of the budget memfd the interposer holds.
fn budget_fd() -> Option<i32> {
    std::fs::read_dir("/proc/self/fd").ok()?.find_map(|entry| {
        let entry = entry.ok()?;
        let target = std::fs::read_link(entry.path()).ok()?;
        target
            .to_string_lossy()
            .contains(BUDGET_LABEL)
            .then(|| entry.file_name().to_str()?.parse().ok())
            .flatten()
    })
}

/// (start, length) of the interposer's mapping of the budget region.
fn budget_mapping() -> Option<(usize, usize)> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let line = maps.lines().find(|l| l.contains(BUDGET_LABEL))?;
    let (start, end) = line.split_whitespace().next()?.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    Some((start, end - start))
}

fn map_writable(fd: i32, length: usize) -> bool {
    // SAFETY: a fresh mapping request; unmapped at once if it succeeds.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if address == libc::MAP_FAILED {
        return false;
    }
    // SAFETY: the mapping just made.
    unsafe { libc::munmap(address, length) };
    true
}

fn zero() -> String {
    let Ok(tenant) = std::env::var("DILU_TENANT") else {
        return "error: DILU_TENANT is not set".into();
    };
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let path = dilu_layout::tenant_region_path(uid, &tenant, "ledger");
    match Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {}) {
        Ok(ledger) => format!("zero {}", ledger.reclaim_dead(|_, _| false)),
        Err(e) => format!("error: {e}"),
    }
}

fn raise() -> String {
    let mut results: Vec<(&str, String)> = Vec::new();
    // The ledger is the tenant's own file: writing it works, and must not
    // matter under the node manager.
    let ledger = std::env::var("DILU_TENANT").ok().and_then(|tenant| {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let path = dilu_layout::tenant_region_path(uid, &tenant, "ledger");
        Region::<TenantLedger>::open_or_create(&path, 0o600, |_| {}).ok()
    });
    results.push((
        "ledger",
        match ledger {
            Some(ledger) => {
                for device in 0..MAX_DEVICES {
                    ledger.set_budget(device, UNLIMITED);
                }
                "succeeded".into()
            }
            None => "no ledger".into(),
        },
    ));
    match budget_mapping() {
        Some((start, length)) => {
            // SAFETY: mprotect on a mapping of this process; expected to fail.
            let r = unsafe {
                libc::mprotect(
                    start as *mut libc::c_void,
                    length,
                    libc::PROT_READ | libc::PROT_WRITE,
                )
            };
            results.push(("mprotect", outcome(r == 0)));
            // SAFETY: fork; the child only stores into the mapping and exits.
            let child = unsafe { libc::fork() };
            if child == 0 {
                // SAFETY: deliberately storing through a read-only mapping.
                unsafe {
                    std::ptr::write_volatile((start as *mut u64).add(2), u64::MAX);
                    libc::_exit(0);
                }
            }
            let mut status = 0;
            // SAFETY: waiting for our own child.
            unsafe { libc::waitpid(child, &mut status, 0) };
            let faulted = libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV;
            results.push((
                "store",
                if faulted {
                    "refused (SIGSEGV)".into()
                } else {
                    format!("succeeded (status {status:#x})")
                },
            ));
        }
        None => results.push(("mprotect", "no mapping".into())),
    }
    match budget_fd() {
        Some(fd) => {
            results.push(("mmap", outcome(map_writable(fd, 4096))));
            let path = format!("/proc/self/fd/{fd}");
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
            {
                Ok(file) => {
                    results.push(("reopen_mmap", outcome(map_writable(file.as_raw_fd(), 4096))));
                    use std::os::unix::fs::FileExt;
                    let written = file.write_at(&[0xff; 64], 0).is_ok();
                    results.push(("reopen_write", outcome(written)));
                }
                Err(e) => results.push(("reopen_mmap", format!("refused (open: {e})"))),
            }
        }
        None => results.push(("mmap", "no descriptor".into())),
    }
    let fields: Vec<String> = results
        .iter()
        .map(|(k, v)| format!("\"{k}\":\"{v}\""))
        .collect();
    format!("{{{}}}", fields.join(","))
}

fn main() -> ExitCode {
    let opened = Driver::open().and_then(|driver| {
        driver.primary_context()?;
        let alloc: MemAlloc = driver.function("cuMemAlloc_v2")?;
        let free: MemFree = driver.function("cuMemFree_v2")?;
        let sharing = Sharing::new(&driver)?;
        let vmm = VmmSharing::new(&driver)?;
        Ok((driver, alloc, free, sharing, vmm))
    });
    let (driver, alloc, free, sharing, vmm) = match opened {
        Ok(functions) => functions,
        Err(message) => {
            eprintln!("mem-probe: {message}");
            return ExitCode::FAILURE;
        }
    };
    let mut held: Vec<(u64, usize)> = Vec::new();
    let mut opened = Vec::new();
    let (mut created, mut imported) = (Vec::new(), Vec::new());
    let free_all = |held: &mut Vec<(u64, usize)>| {
        held.drain(..)
            // SAFETY: pointers this process allocated.
            .map(|(p, _)| unsafe { free(p) })
            .find(|&r| r != cuda::CUDA_SUCCESS)
            .unwrap_or(cuda::CUDA_SUCCESS)
    };
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        let answer = match words.as_slice() {
            ["alloc", bytes] => match bytes.parse::<usize>() {
                Ok(bytes) => {
                    let mut pointer = 0u64;
                    // SAFETY: live out-parameter.
                    let result = unsafe { alloc(&mut pointer, bytes) };
                    if result == cuda::CUDA_SUCCESS {
                        held.push((pointer, bytes));
                    }
                    format!("alloc {result}")
                }
                Err(_) => format!("error: bad size {bytes:?}"),
            },
            ["free"] => format!("free {}", free_all(&mut held)),
            ["device", n] => match n.parse() {
                Ok(device) => match driver.primary_context_of(device) {
                    Ok(_) => format!("device {device}"),
                    Err(e) => format!("error: {e}"),
                },
                Err(_) => format!("error: bad device {n:?}"),
            },
            ["raise"] => raise(),
            ["zero"] => zero(),
            words => sharing
                .answer(words, &held, &mut opened)
                .or_else(|| vmm.answer(words, &mut created, &mut imported))
                .unwrap_or_else(|| format!("error: unknown command {line:?}")),
        };
        let mut out = stdout.lock();
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
    free_all(&mut held);
    ExitCode::SUCCESS
}
