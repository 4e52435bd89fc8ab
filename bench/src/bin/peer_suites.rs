//! `peer-suites`: the probes behind the multi-process suites of the
//! side-by-side benchmark (`scripts/peers.sh`). Each mode is run under one
//! GPU-sharing library (dilu via `dilu run`, HAMi-core via `LD_PRELOAD`, or
//! none); it opens `libcuda.so.1` and `libnvidia-ml.so.1` by name, so the
//! environment decides who answers, and children it starts inherit that
//! environment (so they belong to the same tenant). Every mode prints one
//! JSON line per result on stdout.
//!
//! - `paths --path P --limit BYTES`: allocates up to twice the limit in
//!   eighths through one allocation path, and reports how much was granted
//!   before the first refusal, what `cuMemGetInfo` and NVML said while full,
//!   and whether freeing gave it all back. `--path list` names the paths.
//! - `hold --bytes B`: allocates B, prints `ready`, keeps it until stdin
//!   closes (or the process is killed).
//! - `grab --bytes B [--wait-s S]`: allocates B once, retrying for up to S
//!   seconds; reports the first status and how long until it was granted.
//! - `concurrent --procs N --piece P`: N processes of the tenant, released
//!   together, each allocating pieces until refused; reports the sum.
//! - `startup --others K --runs R`: K processes of the tenant hold memory;
//!   R times, a new process is started and timed from spawn to its first
//!   allocation returning.
//! - `view --bytes B`: allocates B and reports `cuMemGetInfo`,
//!   `nvmlDeviceGetMemoryInfo` and `nvmlDeviceGetComputeRunningProcesses`
//!   (v1 and v3 structs) as this process sees them.

use dilu_abi::cuda::{CUresult, sys};
use dilu_bench::driver::{Library, MemAlloc, MemFree, MemGetInfo, init_context, monotonic_ns};
use std::ffi::{c_int, c_uint, c_void};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: peer-suites MODE [options]
  paths --path P|list --limit BYTES   fill one allocation path up to twice the limit
  hold --bytes B                      allocate B, print ready, hold until stdin closes
  grab --bytes B [--wait-s S]         allocate B, retrying up to S seconds
  concurrent --procs N --piece P      N processes allocate P-byte pieces until refused
  startup --others K --runs R         time process start to first allocation, K others holding
  view --bytes B                      what cuMemGetInfo and NVML report while holding B";

/// The allocation paths `paths` drives, in report order. The pre-3.2
/// `cuMemAlloc` (32-bit pointers) is not among them: simgpu, like a 64-bit
/// driver, answers it with `CUDA_ERROR_NOT_SUPPORTED` even with no limiter.
const PATHS: [&str; 9] = [
    "cuMemAlloc_v2",
    "cuMemAllocPitch_v2",
    "cuMemAllocManaged",
    "cuMemAllocAsync",
    "cuMemAllocFromPoolAsync",
    "cuArrayCreate_v2",
    "cuArray3DCreate_v2",
    "cuMipmappedArrayCreate",
    "cuMemCreate+cuMemMap",
];

fn flag<T: std::str::FromStr>(args: &[String], name: &str) -> Result<Option<T>, String> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .map(Some)
            .ok_or_else(|| format!("{name} needs a value")),
    }
}

fn required<T: std::str::FromStr>(args: &[String], name: &str) -> Result<T, String> {
    flag(args, name)?.ok_or_else(|| format!("{name} is required"))
}

fn driver() -> Result<Library, String> {
    let cuda = Library::open(Path::new("libcuda.so.1"))?;
    init_context(&cuda)?;
    Ok(cuda)
}

fn mem_info(cuda: &Library) -> (usize, usize) {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two live out-parameters.
    unsafe { cuda.get::<MemGetInfo>("cuMemGetInfo_v2")(&mut free, &mut total) };
    (free, total)
}

/// NVML's memory record (`nvmlMemory_t`).
#[repr(C)]
#[derive(Default)]
struct NvmlMemory {
    total: u64,
    free: u64,
    used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessV1 {
    pid: c_uint,
    used: u64,
}

/// `nvmlProcessInfo_t` (v2 and v3).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcessV3 {
    pid: c_uint,
    used: u64,
    gpu_instance: c_uint,
    compute_instance: c_uint,
}

struct Nvml {
    lib: Library,
    device: *mut c_void,
}

type NvmlProcesses<P> = unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut P) -> c_uint;

impl Nvml {
    fn open() -> Option<Nvml> {
        let lib = Library::open(Path::new("libnvidia-ml.so.1")).ok()?;
        let init: unsafe extern "C" fn() -> c_uint = lib.get("nvmlInit_v2");
        let by_index: unsafe extern "C" fn(c_uint, *mut *mut c_void) -> c_uint =
            lib.get("nvmlDeviceGetHandleByIndex_v2");
        let mut device = std::ptr::null_mut();
        // SAFETY: NVML calls with a live out-pointer.
        let ok = unsafe { init() == 0 && by_index(0, &mut device) == 0 };
        ok.then_some(Nvml { lib, device })
    }

    /// (total, used), or the NVML status that refused.
    fn memory(&self) -> Result<(u64, u64), c_uint> {
        let memory: unsafe extern "C" fn(*mut c_void, *mut NvmlMemory) -> c_uint =
            self.lib.get("nvmlDeviceGetMemoryInfo");
        let mut m = NvmlMemory::default();
        // SAFETY: a device handle from NVML and a live out-pointer.
        match unsafe { memory(self.device, &mut m) } {
            0 => Ok((m.total, m.used)),
            status => Err(status),
        }
    }

    /// (pid, used bytes) of each running compute process through `symbol`.
    fn processes<P: Default + Copy>(
        &self,
        symbol: &str,
        fields: impl Fn(&P) -> (u32, u64),
    ) -> Result<Vec<(u32, u64)>, c_uint> {
        let call: NvmlProcesses<P> = self.lib.get(symbol);
        let mut records = [P::default(); 256];
        let mut count: c_uint = records.len() as c_uint;
        // SAFETY: the array holds `count` records of the struct `symbol` writes.
        match unsafe { call(self.device, &mut count, records.as_mut_ptr()) } {
            0 => Ok(records[..count as usize].iter().map(fields).collect()),
            status => Err(status),
        }
    }
}

fn json_memory(nvml: &Option<Nvml>) -> String {
    match nvml.as_ref().map(Nvml::memory) {
        Some(Ok((total, used))) => format!("{{\"total\":{total},\"used\":{used}}}"),
        Some(Err(status)) => format!("{{\"status\":{status}}}"),
        None => "null".into(),
    }
}

// ---- paths

type Pitch = unsafe extern "C" fn(*mut u64, *mut usize, usize, usize, c_uint) -> CUresult;
type Managed = unsafe extern "C" fn(*mut u64, usize, c_uint) -> CUresult;
type AllocAsync = unsafe extern "C" fn(*mut u64, usize, sys::CUstream) -> CUresult;
type FreeAsync = unsafe extern "C" fn(u64, sys::CUstream) -> CUresult;
type StreamSync = unsafe extern "C" fn(sys::CUstream) -> CUresult;
type DefaultPool = unsafe extern "C" fn(*mut sys::CUmemoryPool, c_int) -> CUresult;
type FromPool = unsafe extern "C" fn(*mut u64, usize, sys::CUmemoryPool, sys::CUstream) -> CUresult;
type ArrayCreate =
    unsafe extern "C" fn(*mut sys::CUarray, *const sys::CUDA_ARRAY_DESCRIPTOR) -> CUresult;
type Array3DCreate =
    unsafe extern "C" fn(*mut sys::CUarray, *const sys::CUDA_ARRAY3D_DESCRIPTOR) -> CUresult;
type ArrayDestroy = unsafe extern "C" fn(sys::CUarray) -> CUresult;
type MipCreate = unsafe extern "C" fn(
    *mut sys::CUmipmappedArray,
    *const sys::CUDA_ARRAY3D_DESCRIPTOR,
    c_uint,
) -> CUresult;
type MipDestroy = unsafe extern "C" fn(sys::CUmipmappedArray) -> CUresult;
type Create =
    unsafe extern "C" fn(*mut u64, usize, *const sys::CUmemAllocationProp, u64) -> CUresult;
type Release = unsafe extern "C" fn(u64) -> CUresult;
type Reserve = unsafe extern "C" fn(*mut u64, usize, usize, u64, u64) -> CUresult;
type Map = unsafe extern "C" fn(u64, usize, usize, u64, u64) -> CUresult;
type Unmap = unsafe extern "C" fn(u64, usize) -> CUresult;
type AddressFree = unsafe extern "C" fn(u64, usize) -> CUresult;

/// One allocation through a path, undone by its `free`.
enum Held {
    Pointer(u64),
    Async(u64),
    Array(usize),
    Mipmapped(usize),
    Mapped { va: u64, handle: u64 },
}

/// Allocates `piece` bytes through `path`; the held allocation or the status.
fn allocate(cuda: &Library, path: &str, piece: usize) -> Result<Held, CUresult> {
    let null_stream: sys::CUstream = std::ptr::null_mut();
    let float = sys::CUarray_format::CU_AD_FORMAT_FLOAT;
    // 16 bytes per element: FLOAT × 4 channels.
    let elements = piece / 16;
    let status_or = |status: CUresult, held: Held| if status == 0 { Ok(held) } else { Err(status) };
    // SAFETY: (whole block) each call follows its cuda.h contract, with live
    // locals as out-parameters and the current context set by `driver()`.
    unsafe {
        match path {
            "cuMemAlloc_v2" => {
                let mut p = 0u64;
                let s = cuda.get::<MemAlloc>("cuMemAlloc_v2")(&mut p, piece);
                status_or(s, Held::Pointer(p))
            }
            "cuMemAllocPitch_v2" => {
                let (mut p, mut pitch) = (0u64, 0usize);
                let s = cuda.get::<Pitch>("cuMemAllocPitch_v2")(
                    &mut p,
                    &mut pitch,
                    1024,
                    piece / 1024,
                    4,
                );
                status_or(s, Held::Pointer(p))
            }
            "cuMemAllocManaged" => {
                let mut p = 0u64;
                let s = cuda.get::<Managed>("cuMemAllocManaged")(&mut p, piece, 1);
                status_or(s, Held::Pointer(p))
            }
            "cuMemAllocAsync" => {
                let mut p = 0u64;
                let s = cuda.get::<AllocAsync>("cuMemAllocAsync")(&mut p, piece, null_stream);
                cuda.get::<StreamSync>("cuStreamSynchronize")(null_stream);
                status_or(s, Held::Async(p))
            }
            "cuMemAllocFromPoolAsync" => {
                let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
                cuda.get::<DefaultPool>("cuDeviceGetDefaultMemPool")(&mut pool, 0);
                let mut p = 0u64;
                let s = cuda.get::<FromPool>("cuMemAllocFromPoolAsync")(
                    &mut p,
                    piece,
                    pool,
                    null_stream,
                );
                cuda.get::<StreamSync>("cuStreamSynchronize")(null_stream);
                status_or(s, Held::Async(p))
            }
            "cuArrayCreate_v2" => {
                let desc = sys::CUDA_ARRAY_DESCRIPTOR {
                    Width: 512,
                    Height: elements / 512,
                    Format: float,
                    NumChannels: 4,
                };
                let mut array: sys::CUarray = std::ptr::null_mut();
                let s = cuda.get::<ArrayCreate>("cuArrayCreate_v2")(&mut array, &desc);
                status_or(s, Held::Array(array as usize))
            }
            "cuArray3DCreate_v2" => {
                let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
                    Width: 256,
                    Height: 64,
                    Depth: elements / (256 * 64),
                    Format: float,
                    NumChannels: 4,
                    Flags: 0,
                };
                let mut array: sys::CUarray = std::ptr::null_mut();
                let s = cuda.get::<Array3DCreate>("cuArray3DCreate_v2")(&mut array, &desc);
                status_or(s, Held::Array(array as usize))
            }
            "cuMipmappedArrayCreate" => {
                let desc = sys::CUDA_ARRAY3D_DESCRIPTOR {
                    Width: 512,
                    Height: elements / 512,
                    Depth: 0,
                    Format: float,
                    NumChannels: 4,
                    Flags: 0,
                };
                let mut mip: sys::CUmipmappedArray = std::ptr::null_mut();
                let s = cuda.get::<MipCreate>("cuMipmappedArrayCreate")(&mut mip, &desc, 1);
                status_or(s, Held::Mipmapped(mip as usize))
            }
            "cuMemCreate+cuMemMap" => {
                let mut prop: sys::CUmemAllocationProp = std::mem::zeroed();
                prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                prop.location.id = 0;
                let mut handle = 0u64;
                let s = cuda.get::<Create>("cuMemCreate")(&mut handle, piece, &prop, 0);
                if s != 0 {
                    return Err(s);
                }
                let mut va = 0u64;
                let s = cuda.get::<Reserve>("cuMemAddressReserve")(&mut va, piece, 0, 0, 0);
                let s = if s == 0 {
                    cuda.get::<Map>("cuMemMap")(va, piece, 0, handle, 0)
                } else {
                    s
                };
                if s != 0 {
                    cuda.get::<Release>("cuMemRelease")(handle);
                    return Err(s);
                }
                Ok(Held::Mapped { va, handle })
            }
            other => panic!("unknown path {other}"),
        }
    }
}

fn release(cuda: &Library, held: Held, piece: usize) {
    let null_stream: sys::CUstream = std::ptr::null_mut();
    // SAFETY: (whole block) frees what `allocate` returned, once.
    unsafe {
        match held {
            Held::Pointer(p) => {
                cuda.get::<MemFree>("cuMemFree_v2")(p);
            }
            Held::Async(p) => {
                cuda.get::<FreeAsync>("cuMemFreeAsync")(p, null_stream);
                cuda.get::<StreamSync>("cuStreamSynchronize")(null_stream);
            }
            Held::Array(a) => {
                cuda.get::<ArrayDestroy>("cuArrayDestroy")(a as sys::CUarray);
            }
            Held::Mipmapped(m) => {
                cuda.get::<MipDestroy>("cuMipmappedArrayDestroy")(m as sys::CUmipmappedArray);
            }
            Held::Mapped { va, handle } => {
                cuda.get::<Unmap>("cuMemUnmap")(va, piece);
                cuda.get::<AddressFree>("cuMemAddressFree")(va, piece);
                cuda.get::<Release>("cuMemRelease")(handle);
            }
        }
    }
}

fn paths(args: &[String]) -> Result<(), String> {
    let path: String = required(args, "--path")?;
    if path == "list" {
        println!("{}", PATHS.join(" "));
        return Ok(());
    }
    if !PATHS.contains(&path.as_str()) {
        return Err(format!("unknown --path {path} (--path list names them)"));
    }
    let limit: usize = required(args, "--limit")?;
    let piece = limit / 8;
    if piece == 0 || !piece.is_multiple_of(2 << 20) {
        return Err("--limit must be a multiple of 16 MiB".into());
    }
    let cuda = driver()?;
    let nvml = Nvml::open();
    let (free_before, total) = mem_info(&cuda);
    let mut held = Vec::new();
    let mut refused_with = 0;
    while held.len() < 16 {
        match allocate(&cuda, &path, piece) {
            Ok(h) => held.push(h),
            Err(status) => {
                refused_with = status;
                break;
            }
        }
    }
    let granted = held.len() * piece;
    let (free_full, total_full) = mem_info(&cuda);
    let nvml_full = json_memory(&nvml);
    for h in held {
        release(&cuda, h, piece);
    }
    let (free_after, _) = mem_info(&cuda);
    println!(
        "{{\"path\":\"{path}\",\"limit\":{limit},\"piece\":{piece},\"granted\":{granted},\
         \"refused_with\":{refused_with},\"meminfo_total\":{total},\"free_before\":{free_before},\
         \"free_full\":{free_full},\"total_full\":{total_full},\"nvml_full\":{nvml_full},\
         \"free_after\":{free_after}}}"
    );
    Ok(())
}

// ---- hold, grab

fn alloc_v2(cuda: &Library, bytes: usize) -> Result<u64, CUresult> {
    let mut p = 0u64;
    // SAFETY: a live out-parameter.
    match unsafe { cuda.get::<MemAlloc>("cuMemAlloc_v2")(&mut p, bytes) } {
        0 => Ok(p),
        status => Err(status),
    }
}

fn free_v2(cuda: &Library, p: u64) {
    // SAFETY: frees a pointer from alloc_v2, once.
    unsafe { cuda.get::<MemFree>("cuMemFree_v2")(p) };
}

fn wait_for_stdin_close() {
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
}

fn hold(args: &[String]) -> Result<(), String> {
    let bytes: usize = required(args, "--bytes")?;
    let cuda = driver()?;
    let p = alloc_v2(&cuda, bytes).map_err(|s| format!("cuMemAlloc_v2({bytes}) -> {s}"))?;
    println!("ready {}", std::process::id());
    std::io::stdout().flush().ok();
    wait_for_stdin_close();
    free_v2(&cuda, p);
    Ok(())
}

fn grab(args: &[String]) -> Result<(), String> {
    let bytes: usize = required(args, "--bytes")?;
    let wait = Duration::from_secs_f64(flag(args, "--wait-s")?.unwrap_or(0.0));
    let cuda = driver()?;
    let started = Instant::now();
    let mut first = None;
    let granted_after = loop {
        match alloc_v2(&cuda, bytes) {
            Ok(p) => {
                free_v2(&cuda, p);
                break Some(started.elapsed());
            }
            Err(status) => {
                first.get_or_insert(status);
                if started.elapsed() >= wait {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    let after = granted_after.map_or("null".into(), |d| format!("{:.3}", d.as_secs_f64()));
    println!(
        "{{\"bytes\":{bytes},\"first_status\":{},\"granted_after_s\":{after}}}",
        first.unwrap_or(0)
    );
    Ok(())
}

// ---- concurrent

fn spawn_self(mode: &str, args: &[&str]) -> Result<Child, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    Command::new(exe)
        .arg(mode)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {mode}: {e}"))
}

fn read_line(child: &mut Child) -> Result<String, String> {
    let mut line = String::new();
    let stdout = child.stdout.as_mut().ok_or("no stdout")?;
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    Ok(line.trim().to_string())
}

/// One racer: initialise, say `ready`, wait for `go`, allocate pieces until
/// refused, report, hold until stdin closes.
fn racer(args: &[String]) -> Result<(), String> {
    let piece: usize = required(args, "--piece")?;
    let cuda = driver()?;
    println!("ready");
    std::io::stdout().flush().ok();
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let mut held = Vec::new();
    let status = loop {
        match alloc_v2(&cuda, piece) {
            Ok(p) => held.push(p),
            Err(status) => break status,
        }
        if held.len() >= 4096 {
            break 0;
        }
    };
    println!("{} {status}", held.len() * piece);
    std::io::stdout().flush().ok();
    wait_for_stdin_close();
    for p in held {
        free_v2(&cuda, p);
    }
    Ok(())
}

fn concurrent(args: &[String]) -> Result<(), String> {
    let procs: usize = required(args, "--procs")?;
    let piece: usize = required(args, "--piece")?;
    let piece_arg = piece.to_string();
    let mut children = Vec::new();
    for _ in 0..procs {
        children.push(spawn_self("racer", &["--piece", &piece_arg])?);
    }
    let mut started = 0;
    for child in &mut children {
        if read_line(child)? == "ready" {
            started += 1;
        }
    }
    for child in &mut children {
        if let Some(stdin) = child.stdin.as_mut() {
            let _ = stdin.write_all(b"go\n");
            let _ = stdin.flush();
        }
    }
    let mut granted = Vec::new();
    for child in &mut children {
        let line = read_line(child)?;
        granted.push(
            line.split_whitespace()
                .next()
                .and_then(|g| g.parse::<u64>().ok())
                .unwrap_or(0),
        );
    }
    for child in &mut children {
        drop(child.stdin.take());
    }
    for child in &mut children {
        let _ = child.wait();
    }
    let list: Vec<String> = granted.iter().map(u64::to_string).collect();
    println!(
        "{{\"procs\":{procs},\"started\":{started},\"piece\":{piece},\"granted\":[{}],\"total\":{}}}",
        list.join(","),
        granted.iter().sum::<u64>()
    );
    Ok(())
}

// ---- startup

/// A started process: `cuInit`, context, one 1 MiB allocation; prints the
/// `CLOCK_MONOTONIC` time at which that allocation returned.
fn starter() -> Result<(), String> {
    let cuda = driver()?;
    let p = alloc_v2(&cuda, 1 << 20).map_err(|s| format!("cuMemAlloc_v2 -> {s}"))?;
    let now = monotonic_ns();
    free_v2(&cuda, p);
    println!("{now}");
    Ok(())
}

fn startup(args: &[String]) -> Result<(), String> {
    let others: usize = required(args, "--others")?;
    let runs: usize = required(args, "--runs")?;
    let mut holders = Vec::new();
    for _ in 0..others {
        holders.push(spawn_self("hold", &["--bytes", "1048576"])?);
    }
    for holder in &mut holders {
        let line = read_line(holder)?;
        if !line.starts_with("ready") {
            return Err(format!("a holder did not start: {line:?}"));
        }
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut samples = Vec::with_capacity(runs);
    for run in 0..runs + 3 {
        let spawned = monotonic_ns();
        let output = Command::new(&exe)
            .arg("starter")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&output.stdout);
        let done: u64 = text
            .trim()
            .parse()
            .map_err(|_| format!("starter failed: {text:?}"))?;
        // The first three warm the page cache and are not counted.
        if run >= 3 {
            samples.push((done - spawned) as f64 / 1000.0);
        }
    }
    for holder in &mut holders {
        drop(holder.stdin.take());
    }
    for holder in &mut holders {
        let _ = holder.wait();
    }
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "{{\"others\":{others},\"runs\":{runs},\"p50_us\":{:.0},\"p90_us\":{:.0},\"max_us\":{:.0}}}",
        at(0.5),
        at(0.9),
        at(1.0)
    );
    Ok(())
}

// ---- view

fn view(args: &[String]) -> Result<(), String> {
    let bytes: usize = required(args, "--bytes")?;
    let cuda = driver()?;
    let p = alloc_v2(&cuda, bytes).map_err(|s| format!("cuMemAlloc_v2({bytes}) -> {s}"))?;
    let (free, total) = mem_info(&cuda);
    let nvml = Nvml::open();
    let list = |r: Result<Vec<(u32, u64)>, c_uint>| match r {
        Ok(v) => {
            let items: Vec<String> = v.iter().map(|(p, u)| format!("[{p},{u}]")).collect();
            format!("[{}]", items.join(","))
        }
        Err(status) => format!("{{\"status\":{status}}}"),
    };
    let (v1, v3) = match &nvml {
        Some(n) => (
            list(
                n.processes::<ProcessV1>("nvmlDeviceGetComputeRunningProcesses", |p| {
                    (p.pid, p.used)
                }),
            ),
            list(
                n.processes::<ProcessV3>("nvmlDeviceGetComputeRunningProcesses_v3", |p| {
                    (p.pid, p.used)
                }),
            ),
        ),
        None => ("null".into(), "null".into()),
    };
    println!(
        "{{\"pid\":{},\"bytes\":{bytes},\"meminfo_free\":{free},\"meminfo_total\":{total},\
         \"nvml_memory\":{},\"processes_v1\":{v1},\"processes_v3\":{v3}}}",
        std::process::id(),
        json_memory(&nvml)
    );
    free_v2(&cuda, p);
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("paths") => paths(&args),
        Some("hold") => hold(&args),
        Some("grab") => grab(&args),
        Some("concurrent") => concurrent(&args),
        Some("racer") => racer(&args),
        Some("startup") => startup(&args),
        Some("starter") => starter(),
        Some("view") => view(&args),
        Some("-h" | "--help") => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("peer-suites: {message}");
            ExitCode::FAILURE
        }
    }
}
