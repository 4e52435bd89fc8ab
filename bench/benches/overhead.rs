//! What the interposer adds per driver call, measured side by side in one
//! process: the same call made directly on the driver and through the
//! interposer's exported wrapper, alternating batches, on simgpu's null mode
//! (calls that cost almost nothing, so the interposer's own cost shows).
//!
//! The interposer runs with a memory budget configured, so allocation and
//! query calls take their budgeted paths (ledger reservation, charge table).
//! Needs release builds of simgpu and the interposer: run `scripts/bench.sh`.

use dilu_bench::median;
use std::ffi::{CString, c_int, c_uint, c_void};
use std::path::PathBuf;
use std::time::Instant;

type CUresult = u32;

fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("parent").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    dir
}

struct Library(*mut c_void);

impl Library {
    fn open(path: &std::path::Path) -> Library {
        let name = CString::new(path.to_str().expect("utf-8 path")).expect("no NUL");
        // SAFETY: dlopen of a library path; RTLD_LOCAL keeps the interposer's
        // exported dlsym from replacing the process's.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(
            !handle.is_null(),
            "cannot load {} (build it: scripts/bench.sh does)",
            path.display()
        );
        Library(handle)
    }

    fn get<F: Copy>(&self, name: &str) -> F {
        let symbol = CString::new(name).expect("no NUL");
        // SAFETY: live handle, NUL-terminated name.
        let address = unsafe { libc::dlsym(self.0, symbol.as_ptr()) } as usize;
        assert!(address != 0, "missing {name}");
        assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<usize>());
        // SAFETY: F is the cuda.h signature of `name`.
        unsafe { std::mem::transmute_copy::<usize, F>(&address) }
    }
}

/// Nanoseconds per call of `op`, as the median over alternating batches.
fn per_call(batches: usize, batch: usize, mut op: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..batches)
        .map(|_| {
            let started = Instant::now();
            for _ in 0..batch {
                op();
            }
            started.elapsed().as_nanos() as f64 / batch as f64
        })
        .collect();
    median(&mut samples)
}

struct Row {
    name: &'static str,
    direct: f64,
    dilu: f64,
}

fn side_by_side(name: &'static str, mut direct: impl FnMut(), mut dilu: impl FnMut()) -> Row {
    // Warm both paths, then interleave rounds so drift hits both equally.
    per_call(3, 1000, &mut direct);
    per_call(3, 1000, &mut dilu);
    let (mut d, mut i) = (Vec::new(), Vec::new());
    for _ in 0..15 {
        d.push(per_call(5, 2000, &mut direct));
        i.push(per_call(5, 2000, &mut dilu));
    }
    Row {
        name,
        direct: median(&mut d),
        dilu: median(&mut i),
    }
}

type LaunchKernel = unsafe extern "C" fn(
    *mut c_void,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    *mut c_void,
    *mut *mut c_void,
    *mut *mut c_void,
) -> CUresult;

/// One 1×1 launch of the parameterless `noop` kernel on the null stream.
fn launch_noop(launch: LaunchKernel, function: usize) {
    // SAFETY: a valid function handle from cuModuleGetFunction, the null
    // stream and no parameters, as `noop` takes none.
    unsafe {
        launch(
            function as *mut c_void,
            1,
            1,
            1,
            1,
            1,
            1,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
}

fn threaded_launches(launch: LaunchKernel, function: usize, threads: usize) -> f64 {
    let barrier = std::sync::Barrier::new(threads);
    let results: Vec<f64> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    barrier.wait();
                    per_call(9, 5000, || {
                        launch_noop(launch, function);
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let mut results = results;
    median(&mut results)
}

fn main() {
    let dir = profile_dir();
    let simgpu_path = dir.join("libsimgpu.so");
    let interposer_path = dir.join("libdilu_interposer.so");
    // SAFETY: single-threaded at this point; the libraries read these once.
    unsafe {
        std::env::set_var("SIMGPU_NULL", "1");
        std::env::set_var("SIMGPU_INSTANCE", format!("bench-{}", std::process::id()));
        std::env::set_var("DILU_REAL_LIBCUDA", &simgpu_path);
        std::env::set_var("DILU_MEM_LIMIT", "64GiB");
        std::env::set_var("DILU_CONTEXT_MEMORY", "0");
    }
    let driver = Library::open(&simgpu_path);
    let dilu = Library::open(&interposer_path);

    type Init = unsafe extern "C" fn(c_uint) -> CUresult;
    type Retain = unsafe extern "C" fn(*mut *mut c_void, c_int) -> CUresult;
    type SetCurrent = unsafe extern "C" fn(*mut c_void) -> CUresult;
    type LoadData = unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> CUresult;
    type GetFunction = unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const i8) -> CUresult;
    type MemAlloc = unsafe extern "C" fn(*mut u64, usize) -> CUresult;
    type MemFree = unsafe extern "C" fn(u64) -> CUresult;
    type MemGetInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> CUresult;
    type GetProcAddress =
        unsafe extern "C" fn(*const i8, *mut *mut c_void, c_int, u64, *mut c_int) -> CUresult;

    let mut function: *mut c_void = std::ptr::null_mut();
    // SAFETY (block): cuda.h contracts with live out-parameters.
    unsafe {
        let mut context = std::ptr::null_mut();
        let mut module = std::ptr::null_mut();
        assert_eq!(driver.get::<Init>("cuInit")(0), 0);
        assert_eq!(
            driver.get::<Retain>("cuDevicePrimaryCtxRetain")(&mut context, 0),
            0
        );
        assert_eq!(driver.get::<SetCurrent>("cuCtxSetCurrent")(context), 0);
        let ptx = CString::new(
            ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop()\n{\n ret;\n}\n",
        )
        .unwrap();
        assert_eq!(
            driver.get::<LoadData>("cuModuleLoadData")(&mut module, ptx.as_ptr().cast()),
            0
        );
        let name = CString::new("noop").unwrap();
        assert_eq!(
            driver.get::<GetFunction>("cuModuleGetFunction")(&mut function, module, name.as_ptr()),
            0
        );
    }
    let function = function as usize;
    let mut rows = Vec::new();

    for (label, library) in [("direct", &driver), ("dilu", &dilu)] {
        let _ = label;
        let alloc: MemAlloc = library.get("cuMemAlloc_v2");
        let free: MemFree = library.get("cuMemFree_v2");
        let mut p = 0u64;
        // SAFETY: warm-up allocation through each path.
        unsafe {
            assert_eq!(alloc(&mut p, 4096), 0);
            assert_eq!(free(p), 0);
        }
    }

    let pair = |library: &Library| {
        let alloc: MemAlloc = library.get("cuMemAlloc_v2");
        let free: MemFree = library.get("cuMemFree_v2");
        move || {
            let mut p = 0u64;
            // SAFETY: allocate and free 4 KiB through one path.
            unsafe {
                alloc(&mut p, 4096);
                free(p);
            }
        }
    };
    rows.push(side_by_side(
        "cuMemAlloc_v2 + cuMemFree_v2 (4 KiB, budgeted)",
        pair(&driver),
        pair(&dilu),
    ));

    let info = |library: &Library| {
        let get_info: MemGetInfo = library.get("cuMemGetInfo_v2");
        move || {
            let (mut free, mut total) = (0usize, 0usize);
            // SAFETY: live out-parameters.
            unsafe { get_info(&mut free, &mut total) };
        }
    };
    rows.push(side_by_side(
        "cuMemGetInfo_v2 (budgeted)",
        info(&driver),
        info(&dilu),
    ));

    let launch = |library: &Library| {
        let launch: LaunchKernel = library.get("cuLaunchKernel");
        move || {
            launch_noop(launch, function);
        }
    };
    rows.push(side_by_side(
        "cuLaunchKernel, 1 thread",
        launch(&driver),
        launch(&dilu),
    ));

    let lookup = |library: &Library| {
        let gpa: GetProcAddress = library.get("cuGetProcAddress_v2");
        let name = CString::new("cuMemAlloc").unwrap();
        move || {
            let mut pointer = std::ptr::null_mut();
            let mut status = 0;
            // SAFETY: cuGetProcAddress_v2 contract with live out-parameters.
            unsafe { gpa(name.as_ptr(), &mut pointer, 12090, 0, &mut status) };
        }
    };
    rows.push(side_by_side(
        "cuGetProcAddress_v2(\"cuMemAlloc\")",
        lookup(&driver),
        lookup(&dilu),
    ));

    let threads = 8;
    let (mut direct8, mut dilu8) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        direct8.push(threaded_launches(
            driver.get("cuLaunchKernel"),
            function,
            threads,
        ));
        dilu8.push(threaded_launches(
            dilu.get("cuLaunchKernel"),
            function,
            threads,
        ));
    }
    rows.push(Row {
        name: "cuLaunchKernel, 8 threads (per thread)",
        direct: median(&mut direct8),
        dilu: median(&mut dilu8),
    });

    println!("interposer overhead on simgpu's null driver (median ns per call, side by side)");
    println!("| call | direct ns | through dilu ns | added ns | ratio |");
    println!("|---|---:|---:|---:|---:|");
    for row in &rows {
        println!(
            "| {} | {:.1} | {:.1} | {:+.1} | {:.2} |",
            row.name,
            row.direct,
            row.dilu,
            row.dilu - row.direct,
            row.dilu / row.direct
        );
    }
}
