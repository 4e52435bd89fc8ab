//! The simulated NVML (`simgpu/nvml`, `libnvidia-ml.so.1`) against the
//! driver's shared device state: identity consistent with the driver,
//! memory and running processes of other processes, utilisation sampled from
//! their kernels, and `pynvml` (a client no one here wrote) reading it all.
//! Each scenario that reads NVML runs in a child process (NVML reads its
//! configuration once).

mod common;

use common::*;
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

const MIB: u64 = 1 << 20;

/// target/<profile>/libsimgpu_nvml.so, built once per test process.
fn nvml_path() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = lib_path().parent().unwrap().to_path_buf();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "simgpu-nvml", "--lib"]);
        if dir.ends_with("release") {
            cmd.arg("--release");
        }
        let st = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .unwrap();
        assert!(st.success(), "cargo build -p simgpu-nvml failed");
        dir.join("libsimgpu_nvml.so")
    })
    .clone()
}

type Dev = *mut c_void;

/// The NVML entry points the scenarios use, resolved with dlsym.
struct Nvml {
    handle: *mut c_void,
}

impl Nvml {
    fn open() -> Nvml {
        let p = CString::new(nvml_path().to_str().unwrap()).unwrap();
        // SAFETY: dlopen with a valid path.
        let handle = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(!handle.is_null(), "dlopen simulated NVML");
        Nvml { handle }
    }
    fn f<F: Copy>(&self, name: &str) -> F {
        let c = CString::new(name).unwrap();
        // SAFETY: valid handle and symbol name.
        let a = unsafe { libc::dlsym(self.handle, c.as_ptr()) } as usize;
        assert_ne!(a, 0, "{name} not exported");
        // SAFETY: F is the C signature of the symbol (a function pointer).
        unsafe { std::mem::transmute_copy(&a) }
    }
    fn call0(&self, name: &str) -> u32 {
        // SAFETY: a function of no arguments returning nvmlReturn_t.
        unsafe { self.f::<unsafe extern "C" fn() -> u32>(name)() }
    }
    fn dev(&self, i: u32) -> Dev {
        let mut d: Dev = std::ptr::null_mut();
        let f: unsafe extern "C" fn(c_uint, *mut Dev) -> u32 =
            self.f("nvmlDeviceGetHandleByIndex_v2");
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(i, &mut d) }, 0);
        d
    }
    fn text(&self, name: &str, d: Dev) -> String {
        let f: unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> u32 = self.f(name);
        let mut buf = [0 as c_char; 96];
        // SAFETY: 96-byte buffer.
        assert_eq!(unsafe { f(d, buf.as_mut_ptr(), 96) }, 0, "{name}");
        // SAFETY: NUL-terminated by the callee.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into()
    }
}

#[repr(C)]
#[derive(Default)]
struct Memory {
    total: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: u64,
    reserved: u64,
    free: u64,
    used: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcV1 {
    pid: c_uint,
    used: u64,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct ProcV2 {
    pid: c_uint,
    used: u64,
    gi: c_uint,
    ci: c_uint,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Sample {
    pid: c_uint,
    ts: u64,
    sm: c_uint,
    mem: c_uint,
    enc: c_uint,
    dec: c_uint,
}

#[repr(C)]
struct PciInfo {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("SIMGPU_TEST_ROLE") else {
        return;
    };
    match role.as_str() {
        "ids" => role_ids(),
        "query" => role_query(),
        "hold" => role_hold(),
        "busy" => role_busy(),
        "errors" => role_errors(),
        other => panic!("unknown role {other}"),
    }
}

/// NVML's devices are the driver's: same count, UUID bytes, PCI bus ids,
/// and each found again by its UUID and bus id.
fn role_ids() {
    let a = Api::load();
    // SAFETY: plain driver call.
    assert_eq!(unsafe { (a.init)(0) }, 0);
    let l = Lib::open();
    let uuid: unsafe extern "C" fn(*mut [u8; 16], c_int) -> u32 = l.f("cuDeviceGetUuid_v2");
    let bus: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> u32 = l.f("cuDeviceGetPCIBusId");
    let mut count = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (a.device_get_count)(&mut count) }, 0);
    let n = Nvml::open();
    assert_eq!(n.call0("nvmlInit_v2"), 0);
    let mut ncount: c_uint = 0;
    let f: unsafe extern "C" fn(*mut c_uint) -> u32 = n.f("nvmlDeviceGetCount_v2");
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut ncount) }, 0);
    assert_eq!(ncount as c_int, count, "device count");
    for i in 0..count {
        let mut u = [0u8; 16];
        let mut b = [0 as c_char; 32];
        // SAFETY: valid out-pointers of the documented sizes.
        unsafe {
            assert_eq!(uuid(&mut u, i), 0);
            assert_eq!(bus(b.as_mut_ptr(), 32, i), 0);
        }
        let hex: String = u.iter().map(|x| format!("{x:02x}")).collect();
        let want = format!(
            "GPU-{}-{}-{}-{}-{}",
            &hex[..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..]
        );
        let d = n.dev(i as u32);
        assert_eq!(n.text("nvmlDeviceGetUUID", d), want, "uuid of {i}");
        assert!(n.text("nvmlDeviceGetName", d).starts_with("NVIDIA H100"));
        // SAFETY: PciInfo is plain C data; all-zero is valid.
        let mut pci: PciInfo = unsafe { std::mem::zeroed() };
        let f: unsafe extern "C" fn(Dev, *mut PciInfo) -> u32 = n.f("nvmlDeviceGetPciInfo_v3");
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { f(d, &mut pci) }, 0);
        // SAFETY: NUL-terminated by the callees.
        let (cuda_bus, legacy, long) = unsafe {
            (
                CStr::from_ptr(b.as_ptr()).to_string_lossy().to_string(),
                CStr::from_ptr(pci.bus_id_legacy.as_ptr())
                    .to_string_lossy()
                    .to_string(),
                CStr::from_ptr(pci.bus_id.as_ptr())
                    .to_string_lossy()
                    .to_string(),
            )
        };
        assert!(
            legacy.eq_ignore_ascii_case(&cuda_bus),
            "{legacy} vs {cuda_bus}"
        );
        assert!(
            long.eq_ignore_ascii_case(&format!("0000{cuda_bus}")),
            "{long}"
        );
        let cuda_bus_no: u32 = u32::from_str_radix(&cuda_bus[5..7], 16).unwrap();
        assert_eq!(pci.bus, cuda_bus_no);
        assert_eq!(pci.pci_device_id & 0xffff, 0x10de);
        for (name, key) in [
            ("nvmlDeviceGetHandleByUUID", want.clone()),
            ("nvmlDeviceGetHandleByPciBusId_v2", long.clone()),
            ("nvmlDeviceGetHandleByPciBusId_v2", cuda_bus.clone()),
        ] {
            let f: unsafe extern "C" fn(*const c_char, *mut Dev) -> u32 = n.f(name);
            let k = CString::new(key).unwrap();
            let mut h: Dev = std::ptr::null_mut();
            // SAFETY: valid string and out-pointer.
            assert_eq!(unsafe { f(k.as_ptr(), &mut h) }, 0, "{name}");
            assert_eq!(h, d, "{name} finds device {i}");
        }
    }
    println!("OK count={count}");
}

#[test]
fn nvml_devices_match_the_driver() {
    let inst = Instance::new("nvml-ids");
    let out = run_child_nvml(
        "ids",
        &[("SIMGPU_INSTANCE", &inst.0), ("SIMGPU_DEVICES", "3")],
    );
    assert!(out.contains("OK count=3"), "{out}");
}

/// A process's last use of an instance removes its file, also where the
/// process opened it through the driver and NVML both (each with a lock of
/// its own): such files piled up in /dev/shm by the hundred, one per
/// `dilu run --sim`, since the interposer reads NVML.
#[test]
fn the_last_process_out_removes_the_instance_file() {
    for (role, tag) in [("ids", "nvml-leave-both"), ("errors", "nvml-leave-nvml")] {
        let inst = Instance::new(tag);
        let out = run_child_nvml(role, &[("SIMGPU_INSTANCE", &inst.0)]);
        assert!(out.contains("OK"), "{out}");
        assert!(
            !std::path::Path::new(&inst.shm_path()).exists(),
            "{role}: {} left behind",
            inst.shm_path()
        );
    }
}

fn run_child_nvml(role: &str, env: &[(&str, &str)]) -> String {
    nvml_path();
    run_child(role, env)
}

/// Prints what NVML reports about device 0: memory (v1, v2), running
/// processes (v1 and v3 layouts), utilisation and process samples.
fn role_query() {
    let n = Nvml::open();
    assert_eq!(n.call0("nvmlInit_v2"), 0);
    if let Ok(ms) = std::env::var("SIMGPU_TEST_SLEEP_MS") {
        std::thread::sleep(std::time::Duration::from_millis(ms.parse().unwrap()));
    }
    let d = n.dev(0);
    let mut m = Memory::default();
    let f: unsafe extern "C" fn(Dev, *mut Memory) -> u32 = n.f("nvmlDeviceGetMemoryInfo");
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(d, &mut m) }, 0);
    println!("TOTAL={}\nUSED={}\nFREE={}", m.total, m.used, m.free);
    let mut m2 = MemoryV2 {
        version: std::mem::size_of::<MemoryV2>() as c_uint | 2 << 24,
        ..Default::default()
    };
    let f: unsafe extern "C" fn(Dev, *mut MemoryV2) -> u32 = n.f("nvmlDeviceGetMemoryInfo_v2");
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(d, &mut m2) }, 0);
    println!("V2_USED={}\nV2_TOTAL={}", m2.used, m2.total);
    // Ask for the size first, as HAMi-core and pynvml do.
    let f: unsafe extern "C" fn(Dev, *mut c_uint, *mut ProcV1) -> u32 =
        n.f("nvmlDeviceGetComputeRunningProcesses");
    let mut count: c_uint = 0;
    // SAFETY: null array with count 0 asks for the size.
    let r = unsafe { f(d, &mut count, std::ptr::null_mut()) };
    println!("SIZE_QUERY={r} NEEDED={count}");
    let mut v1 = vec![ProcV1::default(); count as usize];
    // SAFETY: array of `count` entries.
    assert_eq!(unsafe { f(d, &mut count, v1.as_mut_ptr()) }, 0);
    let procs: Vec<String> = v1.iter().map(|p| format!("{}:{}", p.pid, p.used)).collect();
    println!("PROCS_V1={}", procs.join(","));
    let f: unsafe extern "C" fn(Dev, *mut c_uint, *mut ProcV2) -> u32 =
        n.f("nvmlDeviceGetComputeRunningProcesses_v3");
    let mut v3 = [ProcV2::default(); 16];
    let mut count: c_uint = 16;
    // SAFETY: array of 16 entries.
    assert_eq!(unsafe { f(d, &mut count, v3.as_mut_ptr()) }, 0);
    let procs: Vec<String> = v3[..count as usize]
        .iter()
        .map(|p| format!("{}:{}", p.pid, p.used))
        .collect();
    println!("PROCS_V3={}", procs.join(","));
    let f: unsafe extern "C" fn(Dev, *mut [c_uint; 2]) -> u32 =
        n.f("nvmlDeviceGetUtilizationRates");
    let mut u = [0; 2];
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(d, &mut u) }, 0);
    println!("UTIL={}", u[0]);
    let f: unsafe extern "C" fn(Dev, *mut Sample, *mut c_uint, u64) -> u32 =
        n.f("nvmlDeviceGetProcessUtilization");
    let mut samples = [Sample::default(); 16];
    let mut count: c_uint = 16;
    // Samples of the last second, as HAMi-core's limiter asks.
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    // SAFETY: array of 16 entries.
    let r = unsafe { f(d, samples.as_mut_ptr(), &mut count, now_us - 1_000_000) };
    let s: Vec<String> = if r == 0 {
        samples[..count as usize]
            .iter()
            .map(|s| format!("{}:{}", s.pid, s.sm))
            .collect()
    } else {
        Vec::new()
    };
    println!("SAMPLES_RC={r}\nSAMPLES={}", s.join(","));
    if r == 0 {
        // Asked again at once from the newest time stamp: the driver's
        // sampler has no newer sample until its next period boundary.
        let newest = samples[..count as usize]
            .iter()
            .map(|s| s.ts)
            .max()
            .unwrap_or(0);
        let mut again = [Sample::default(); 16];
        let mut again_count: c_uint = 16;
        // SAFETY: array of 16 entries.
        let again_rc = unsafe { f(d, again.as_mut_ptr(), &mut again_count, newest) };
        let again_newest = again[..again_count.min(16) as usize]
            .iter()
            .map(|s| s.ts)
            .max()
            .filter(|_| again_rc == 0)
            .unwrap_or(0);
        println!("STAMP={newest}\nAGAIN_RC={again_rc}\nAGAIN_STAMP={again_newest}");
    }
    assert_eq!(n.call0("nvmlShutdown"), 0);
}

/// Holds SIMGPU_TEST_BYTES of device memory until stdin closes.
fn role_hold() {
    let a = Api::setup();
    let bytes: usize = std::env::var("SIMGPU_TEST_BYTES").unwrap().parse().unwrap();
    a.alloc(bytes).unwrap();
    println!("READY");
    std::io::stdout().flush().unwrap();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Launches 2 ms kernels back to back until stdin closes.
fn role_busy() {
    let a = Api::setup();
    let f = a.function(PTX, "k");
    let mut s: H = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { assert_eq!((a.stream_create)(&mut s, 1), 0) };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        flag.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    println!("READY");
    std::io::stdout().flush().unwrap();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        for _ in 0..5 {
            assert_eq!(a.launch_grid(f, [1, 1, 1], s), 0);
        }
        // SAFETY: valid stream.
        unsafe { assert_eq!((a.stream_sync)(s), 0) };
    }
}

/// Status codes clients rely on.
fn role_errors() {
    let n = Nvml::open();
    let f: unsafe extern "C" fn(*mut c_uint) -> u32 = n.f("nvmlDeviceGetCount_v2");
    let mut c = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { f(&mut c) }, 1, "UNINITIALIZED before nvmlInit");
    assert_eq!(n.call0("nvmlInit"), 0);
    let d = n.dev(0);
    let mut m2 = MemoryV2::default();
    let g: unsafe extern "C" fn(Dev, *mut MemoryV2) -> u32 = n.f("nvmlDeviceGetMemoryInfo_v2");
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { g(d, &mut m2) }, 25, "version 0 is a mismatch");
    let t: unsafe extern "C" fn(Dev, c_uint, *mut c_uint) -> u32 = n.f("nvmlDeviceGetTemperature");
    // SAFETY: the stub writes nothing.
    assert_eq!(unsafe { t(d, 0, &mut c) }, 3, "NOT_SUPPORTED");
    let h: unsafe extern "C" fn(c_uint, *mut Dev) -> u32 = n.f("nvmlDeviceGetHandleByIndex_v2");
    let mut dd: Dev = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { h(1, &mut dd) }, 2, "index past the count");
    let s: unsafe extern "C" fn(Dev, *mut c_char, c_uint) -> u32 = n.f("nvmlDeviceGetUUID");
    let mut small = [0 as c_char; 8];
    // SAFETY: 8-byte buffer.
    let short = unsafe { s(d, small.as_mut_ptr(), 8) };
    assert_eq!(short, 7, "INSUFFICIENT_SIZE");
    assert_eq!(n.call0("nvmlShutdown"), 0);
    // SAFETY: valid out-pointer.
    let after_shutdown = unsafe { f(&mut c) };
    assert_eq!(after_shutdown, 1, "UNINITIALIZED after the last shutdown");
    println!("OK");
}

#[test]
fn nvml_status_codes() {
    let inst = Instance::new("nvml-err");
    let out = run_child_nvml("errors", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert!(out.contains("OK"), "{out}");
}

/// PyTorch (2.15, `c10/cuda/driver_api.cpp`) resolves these NVML symbols
/// when its caching allocator first handles an out-of-memory error and
/// asserts every one exists: one missing turned `torch.cuda.OutOfMemoryError`
/// into an internal assert under `dilu run --sim`.
#[test]
fn nvml_exports_what_pytorch_resolves() {
    let n = Nvml::open();
    for name in [
        "nvmlInit_v2",
        "nvmlDeviceGetHandleByPciBusId_v2",
        "nvmlDeviceGetNvLinkRemoteDeviceType",
        "nvmlDeviceGetNvLinkRemotePciInfo_v2",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlSystemGetCudaDriverVersion_v2",
        "nvmlDeviceGetGpuFabricInfoV",
    ] {
        let _: usize = n.f(name);
    }
}

/// A child that printed READY and waits for its stdin to close.
fn spawn_ready(role: &str, env: &[(&str, &str)]) -> std::process::Child {
    use std::io::BufRead;
    let mut c = child(role, env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut r = std::io::BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(r.read_line(&mut line).unwrap() > 0, "{role} exited early");
        // libtest may print "test child_entry ... " on the same line.
        if line.trim().ends_with("READY") {
            break;
        }
    }
    std::thread::spawn(move || std::io::copy(&mut r, &mut std::io::sink()));
    c
}

fn pairs(list: &str) -> Vec<(u32, u64)> {
    list.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let (a, b) = s.split_once(':').unwrap();
            (a.parse().unwrap(), b.parse().unwrap())
        })
        .collect()
}

#[test]
fn nvml_reports_other_processes_memory() {
    let inst = Instance::new("nvml-mem");
    nvml_path();
    let env = [
        ("SIMGPU_INSTANCE", inst.0.as_str()),
        ("SIMGPU_MEMORY", "2GiB"),
    ];
    let mut a = spawn_ready(
        "hold",
        &[env[0], env[1], ("SIMGPU_TEST_BYTES", "314572800")],
    );
    let mut b = spawn_ready("hold", &[env[0], env[1], ("SIMGPU_TEST_BYTES", "1000")]);
    let out = run_child("query", &env);
    assert_eq!(value(&out, "TOTAL"), (2048 * MIB).to_string());
    let used = 300 * MIB + 1024; // 1000 bytes are charged as 1024
    assert_eq!(value(&out, "USED"), used.to_string(), "{out}");
    assert_eq!(value(&out, "FREE"), (2048 * MIB - used).to_string());
    assert_eq!(value(&out, "V2_USED"), used.to_string());
    assert!(out.contains("SIZE_QUERY=7 NEEDED=2"), "{out}");
    let mut want = vec![(a.id(), 300 * MIB), (b.id(), 1024)];
    want.sort();
    for key in ["PROCS_V1", "PROCS_V3"] {
        let mut got = pairs(&value(&out, key));
        got.sort();
        assert_eq!(got, want, "{key}");
    }
    // A SIGKILLed holder disappears, and its memory with it.
    // SAFETY: killing our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGKILL) };
    a.wait().unwrap();
    let out = run_child("query", &env);
    assert_eq!(value(&out, "USED"), "1024");
    assert_eq!(pairs(&value(&out, "PROCS_V3")), vec![(b.id(), 1024)]);
    drop(b.stdin.take());
    b.wait().unwrap();
}

#[test]
fn nvml_utilisation_follows_the_kernel_timeline() {
    let inst = Instance::new("nvml-util");
    nvml_path();
    let env = [
        ("SIMGPU_INSTANCE", inst.0.as_str()),
        ("SIMGPU_KERNEL_COST", "k=2ms"),
    ];
    // Idle device: nothing ran, no samples (NVML_ERROR_NOT_FOUND).
    let out = run_child("query", &[env[0], ("SIMGPU_TEST_SLEEP_MS", "200")]);
    assert_eq!(value(&out, "UTIL"), "0");
    assert_eq!(value(&out, "SAMPLES_RC"), "6");
    let mut a = spawn_ready("busy", &env);
    let mut b = spawn_ready("busy", &env);
    let out = run_child("query", &[env[0], ("SIMGPU_TEST_SLEEP_MS", "1000")]);
    drop(a.stdin.take());
    drop(b.stdin.take());
    a.wait().unwrap();
    b.wait().unwrap();
    let util: u64 = value(&out, "UTIL").parse().unwrap();
    assert!(
        util >= 40,
        "two processes launching back to back: device {util}% busy\n{out}"
    );
    let samples = pairs(&value(&out, "SAMPLES"));
    let share = |pid: u32| samples.iter().find(|s| s.0 == pid).map_or(0, |s| s.1);
    let (sa, sb) = (share(a.id()), share(b.id()));
    // The processes' samples add up to the device's utilisation, and time
    // slicing shares it: neither gets less than a quarter of it.
    assert!(
        (sa + sb).abs_diff(util) <= 10,
        "samples {samples:?} vs device {util}%"
    );
    assert!(
        sa * 4 >= util && sb * 4 >= util,
        "samples {samples:?} vs device {util}%"
    );
    // Samples come on the driver's 200 ms schedule, time-stamped at its
    // boundaries, not at the caller's query.
    let stamp: u64 = value(&out, "STAMP").parse().unwrap();
    assert_eq!(stamp % 200_000, 0, "{out}");
    match value(&out, "AGAIN_RC").as_str() {
        "6" => {}
        // A boundary passed between the two queries: exactly one period on.
        "0" => assert_eq!(
            value(&out, "AGAIN_STAMP"),
            (stamp + 200_000).to_string(),
            "{out}"
        ),
        other => panic!("second query returned {other}\n{out}"),
    }
}

/// `pynvml` (nvidia-ml-py) through `scripts/smi.py`; skipped with a note
/// when python3 or pynvml is missing.
#[test]
fn pynvml_reads_the_simulated_nvml() {
    let has_pynvml = Command::new("python3")
        .args(["-c", "import pynvml"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !has_pynvml {
        eprintln!("SKIPPED: python3 with pynvml (pip install nvidia-ml-py) not found");
        return;
    }
    let inst = Instance::new("nvml-py");
    let dir = std::env::temp_dir().join(format!("simgpu-nvml-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libnvidia-ml.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(nvml_path(), &link).unwrap();
    let env = [
        ("SIMGPU_INSTANCE", inst.0.as_str()),
        ("SIMGPU_DEVICES", "2"),
        ("SIMGPU_MEMORY", "4GiB"),
        ("SIMGPU_KERNEL_COST", "k=2ms"),
    ];
    let mut holder = spawn_ready(
        "hold",
        &[env[0], env[1], env[2], ("SIMGPU_TEST_BYTES", "1073741824")],
    );
    let mut busy = spawn_ready("busy", &env);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("nvml/scripts/smi.py");
    let o = Command::new("python3")
        .arg(&script)
        .args(["--sleep", "0.5"])
        .env("LD_LIBRARY_PATH", &dir)
        .envs(env)
        .output()
        .unwrap();
    drop(busy.stdin.take());
    drop(holder.stdin.take());
    busy.wait().unwrap();
    holder.wait().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        o.status.success(),
        "{out}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(value(&out, "count"), "2");
    assert_eq!(value(&out, "gpu.0.total"), (4096 * MIB).to_string());
    assert_eq!(value(&out, "gpu.0.used"), (1024 * MIB).to_string());
    assert_eq!(value(&out, "gpu.1.used"), "0");
    assert_eq!(value(&out, "gpu.0.by_uuid"), "0");
    assert_eq!(value(&out, "gpu.1.by_bus_id"), "1");
    assert_eq!(
        value(&out, &format!("gpu.0.proc.{}", holder.id())),
        (1024 * MIB).to_string()
    );
    // The only process running kernels: its samples are the device's
    // utilisation (how busy it got depends on the machine's load).
    let sm: u32 = value(&out, &format!("gpu.0.sm.{}", busy.id()))
        .parse()
        .unwrap();
    let util: u32 = value(&out, "gpu.0.util").parse().unwrap();
    assert!(
        util >= 25,
        "a process launching back to back: device {util}%\n{out}"
    );
    assert!(
        sm.abs_diff(util) <= 10,
        "process {sm}% vs device {util}%\n{out}"
    );
    assert!(
        !out.contains(&format!("gpu.0.sm.{}=", holder.id())),
        "the holder ran nothing"
    );
    assert_eq!(value(&out, "gpu.0.temperature"), "not supported");
}
