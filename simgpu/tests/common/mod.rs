//! Test harness: builds and dlopens libsimgpu.so, runs scenarios in child
//! processes (each process reads the SIMGPU_* configuration once, at cuInit).
#![allow(dead_code)]

use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// Path of target/<profile>/libsimgpu.so, built once per test process.
pub fn lib_path() -> PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        if let Ok(p) = std::env::var("SIMGPU_TEST_LIB") {
            return PathBuf::from(p);
        }
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let release = profile_dir.ends_with("release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", "simgpu", "--lib"]);
        if release {
            cmd.arg("--release");
        }
        let st = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run cargo build");
        assert!(st.success(), "cargo build -p simgpu failed");
        let p = profile_dir.join("libsimgpu.so");
        assert!(p.exists(), "{} missing", p.display());
        p
    })
    .clone()
}

pub struct Lib {
    pub handle: *mut c_void,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Sync for Lib {}
// SAFETY: as above.
unsafe impl Send for Lib {}

impl Lib {
    pub fn open() -> &'static Lib {
        static L: OnceLock<Lib> = OnceLock::new();
        L.get_or_init(|| {
            let p = CString::new(lib_path().to_str().unwrap()).unwrap();
            // SAFETY: dlopen with a valid path string.
            let handle = unsafe { libc::dlopen(p.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!handle.is_null(), "dlopen {}", lib_path().display());
            Lib { handle }
        })
    }

    pub fn addr(&self, name: &str) -> usize {
        let c = CString::new(name).unwrap();
        // SAFETY: valid handle and symbol string.
        unsafe { libc::dlsym(self.handle, c.as_ptr()) as usize }
    }

    /// A typed pointer to an exported symbol. `F` must be the C signature.
    pub fn f<F: Copy>(&self, name: &str) -> F {
        let a = self.addr(name);
        assert_ne!(a, 0, "symbol {name} not exported");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is a function pointer type of the symbol's C signature.
        unsafe { std::mem::transmute_copy(&a) }
    }
}

pub type Dptr = u64;
pub type H = *mut c_void;

/// The driver entry points the scenarios use, looked up with dlsym.
pub struct Api {
    pub init: unsafe extern "C" fn(c_uint) -> u32,
    pub device_get_count: unsafe extern "C" fn(*mut c_int) -> u32,
    pub primary_retain: unsafe extern "C" fn(*mut H, c_int) -> u32,
    pub ctx_set_current: unsafe extern "C" fn(H) -> u32,
    pub ctx_sync: unsafe extern "C" fn() -> u32,
    pub mem_alloc: unsafe extern "C" fn(*mut Dptr, usize) -> u32,
    pub mem_free: unsafe extern "C" fn(Dptr) -> u32,
    pub mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> u32,
    pub htod: unsafe extern "C" fn(Dptr, *const c_void, usize) -> u32,
    pub dtoh: unsafe extern "C" fn(*mut c_void, Dptr, usize) -> u32,
    pub dtod: unsafe extern "C" fn(Dptr, Dptr, usize) -> u32,
    pub memset_d8: unsafe extern "C" fn(Dptr, u8, usize) -> u32,
    pub memset_d32: unsafe extern "C" fn(Dptr, c_uint, usize) -> u32,
    pub stream_create: unsafe extern "C" fn(*mut H, c_uint) -> u32,
    pub stream_sync: unsafe extern "C" fn(H) -> u32,
    pub module_load_data: unsafe extern "C" fn(*mut H, *const c_void) -> u32,
    pub module_get_function: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32,
    #[allow(clippy::type_complexity)]
    pub launch: unsafe extern "C" fn(
        H,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        H,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> u32,
    pub event_create: unsafe extern "C" fn(*mut H, c_uint) -> u32,
    pub event_record: unsafe extern "C" fn(H, H) -> u32,
    pub event_sync: unsafe extern "C" fn(H) -> u32,
    pub event_elapsed: unsafe extern "C" fn(*mut f32, H, H) -> u32,
    pub begin_capture: unsafe extern "C" fn(H, c_int) -> u32,
    pub end_capture: unsafe extern "C" fn(H, *mut H) -> u32,
    pub graph_instantiate: unsafe extern "C" fn(*mut H, H, u64) -> u32,
    pub graph_launch: unsafe extern "C" fn(H, H) -> u32,
}

impl Api {
    pub fn load() -> Api {
        let l = Lib::open();
        Api {
            init: l.f("cuInit"),
            device_get_count: l.f("cuDeviceGetCount"),
            primary_retain: l.f("cuDevicePrimaryCtxRetain"),
            ctx_set_current: l.f("cuCtxSetCurrent"),
            ctx_sync: l.f("cuCtxSynchronize"),
            mem_alloc: l.f("cuMemAlloc_v2"),
            mem_free: l.f("cuMemFree_v2"),
            mem_get_info: l.f("cuMemGetInfo_v2"),
            htod: l.f("cuMemcpyHtoD_v2"),
            dtoh: l.f("cuMemcpyDtoH_v2"),
            dtod: l.f("cuMemcpyDtoD_v2"),
            memset_d8: l.f("cuMemsetD8_v2"),
            memset_d32: l.f("cuMemsetD32_v2"),
            stream_create: l.f("cuStreamCreate"),
            stream_sync: l.f("cuStreamSynchronize"),
            module_load_data: l.f("cuModuleLoadData"),
            module_get_function: l.f("cuModuleGetFunction"),
            launch: l.f("cuLaunchKernel"),
            event_create: l.f("cuEventCreate"),
            event_record: l.f("cuEventRecord"),
            event_sync: l.f("cuEventSynchronize"),
            event_elapsed: l.f("cuEventElapsedTime_v2"),
            begin_capture: l.f("cuStreamBeginCapture_v2"),
            end_capture: l.f("cuStreamEndCapture"),
            graph_instantiate: l.f("cuGraphInstantiateWithFlags"),
            graph_launch: l.f("cuGraphLaunch"),
        }
    }

    /// cuInit + primary context of device 0 made current.
    pub fn setup() -> Api {
        let a = Api::load();
        // SAFETY: plain driver calls with valid out-pointers.
        unsafe {
            assert_eq!((a.init)(0), 0);
            let mut ctx: H = std::ptr::null_mut();
            assert_eq!((a.primary_retain)(&mut ctx, 0), 0);
            assert_eq!((a.ctx_set_current)(ctx), 0);
        }
        a
    }

    pub fn mem_info(&self) -> (usize, usize) {
        let (mut f, mut t) = (0, 0);
        // SAFETY: valid out-pointers.
        assert_eq!(unsafe { (self.mem_get_info)(&mut f, &mut t) }, 0);
        (f, t)
    }

    pub fn alloc(&self, n: usize) -> Result<Dptr, u32> {
        let mut p = 0;
        // SAFETY: valid out-pointer.
        match unsafe { (self.mem_alloc)(&mut p, n) } {
            0 => Ok(p),
            e => Err(e),
        }
    }

    /// Loads PTX text and returns the function `name`.
    pub fn function(&self, ptx: &str, name: &str) -> H {
        let src = CString::new(ptx).unwrap();
        let n = CString::new(name).unwrap();
        let (mut m, mut f): (H, H) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid strings and out-pointers.
        unsafe {
            assert_eq!((self.module_load_data)(&mut m, src.as_ptr().cast()), 0);
            assert_eq!((self.module_get_function)(&mut f, m, n.as_ptr()), 0);
        }
        f
    }

    pub fn launch_grid(&self, f: H, grid: [u32; 3], stream: H) -> u32 {
        // SAFETY: valid handles; no kernel parameters.
        unsafe {
            (self.launch)(
                f,
                grid[0],
                grid[1],
                grid[2],
                128,
                1,
                1,
                0,
                stream,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    }
}

pub const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry gemm(.param .u64 a) { ret; }
.visible .entry relu(.param .u64 a) { ret; }
.visible .entry k(.param .u64 a) { ret; }
"#;

/// A unique instance name; removes its /dev/shm file when dropped.
pub struct Instance(pub String);

impl Instance {
    pub fn new(tag: &str) -> Instance {
        Instance(format!("test-{}-{}", tag, std::process::id()))
    }
    pub fn shm_path(&self) -> String {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        format!("/dev/shm/simgpu-{uid}-{}", self.0)
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.shm_path());
    }
}

/// A child process of this test binary playing `role` (see `child_entry`).
pub fn child(role: &str, env: &[(&str, &str)]) -> Command {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(exe);
    c.args(["child_entry", "--exact", "--nocapture", "--test-threads=1"])
        .env("SIMGPU_TEST_ROLE", role)
        .env("SIMGPU_TEST_LIB", lib_path())
        .env_remove("SIMGPU_TRACE")
        .env_remove("SIMGPU_KERNEL_COST")
        .env_remove("SIMGPU_NULL")
        .env_remove("SIMGPU_CALL_COST")
        .env_remove("SIMGPU_JITTER")
        .env_remove("SIMGPU_DRIFT")
        .env_remove("SIMGPU_PREEMPT")
        .env_remove("SIMGPU_TIMESLICE")
        .env_remove("SIMGPU_SWITCH_COST")
        .env_remove("SIMGPU_KERNEL_GAP")
        .env_remove("SIMGPU_SHARING")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs a child to completion; panics with its output if it failed.
pub fn run_child(role: &str, env: &[(&str, &str)]) -> String {
    let o = child(role, env).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        o.status.success(),
        "child {role} failed\nstdout:\n{out}\nstderr:\n{err}"
    );
    out
}

/// Value printed by a child as `KEY=value`.
pub fn value(out: &str, key: &str) -> String {
    let pat = format!("{key}=");
    out.lines()
        .find_map(|l| {
            let i = l.find(&pat)?;
            (i == 0 || l.as_bytes()[i - 1] == b' ').then(|| l[i + pat.len()..].trim().to_string())
        })
        .unwrap_or_else(|| panic!("{key} missing in\n{out}"))
}

/// One kernel line of a SIMGPU_TRACE file.
#[derive(Debug, Clone)]
pub struct Rec {
    pub pid: u64,
    pub stream: u64,
    pub start: u64,
    pub end: u64,
    pub name: String,
    pub blocks: u64,
    pub graph: bool,
    pub kernel: u64,
    pub last: bool,
}

pub fn read_trace(path: &str) -> Vec<Rec> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("bad line {l:?}: {e}"));
            Rec {
                pid: v["pid"].as_u64().unwrap(),
                stream: v["stream"].as_u64().unwrap(),
                start: v["start_ns"].as_u64().unwrap(),
                end: v["end_ns"].as_u64().unwrap(),
                name: v["name"].as_str().unwrap().to_string(),
                blocks: v["blocks"].as_u64().unwrap(),
                graph: v["graph"].as_bool().unwrap(),
                kernel: v["kernel"].as_u64().unwrap(),
                last: v["last"].as_bool().unwrap(),
            }
        })
        .collect()
}

/// The bytes of an export-table UUID written as NVIDIA's tables are named
/// (`6BD5FB6C-5BF4-...`), in plain order.
pub fn uuid(text: &str) -> [u8; 16] {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}
