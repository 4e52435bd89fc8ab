//! What NVIDIA's runtime needs from a driver, checked directly on
//! libsimgpu.so: the private export tables (context-local storage and its
//! destructors, the integrity check, no NULL slot), libraries and kernels
//! that exist without a context, every kind of image entry, and the
//! reported driver version. (tests/tests/cudart.rs runs the real cudart.)

mod common;

use common::*;
use dilu_tests::cubin::{Compression, Entry, cubin, fatbin};
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

const INVALID_IMAGE: u32 = 200;
const INVALID_CONTEXT: u32 = 201;
const INVALID_HANDLE: u32 = 400;
const NOT_FOUND: u32 = 500;

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("SIMGPU_TEST_ROLE") else {
        return;
    };
    match role.as_str() {
        "tables" => role_tables(),
        "libraries" => role_libraries(),
        "version" => role_version(),
        "tools" => role_tools(),
        other => panic!("unknown role {other}"),
    }
}

type GetTable = unsafe extern "C" fn(*mut *const usize, *const [u8; 16]) -> u32;

fn table(id: &str) -> Result<*const usize, u32> {
    let get: GetTable = Lib::open().f("cuGetExportTable");
    let mut t: *const usize = std::ptr::dangling::<usize>();
    // SAFETY: valid out-pointer and 16-byte UUID.
    let rc = unsafe { get(&mut t, &common::uuid(id)) };
    if rc == 0 { Ok(t) } else { Err(rc) }
}

/// Slot `i` of a table as a function of type `F`.
fn slot<F: Copy>(t: *const usize, i: usize) -> F {
    // SAFETY: `t` is a served table with more than `i` slots.
    let p = unsafe { t.add(i).read() };
    assert_ne!(p, 0, "slot {i} is NULL");
    // SAFETY: F is the slot's C signature.
    unsafe { std::mem::transmute_copy(&p) }
}

const CUDART: &str = "6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9";
const STORAGE: &str = "C693336E-1121-DF11-A8C3-68F355D89593";
const INTEGRITY: &str = "D4082055-BDE6-704B-8D34-BA123C66E1F2";

const TOOLS_TLS: &str = "42D85A81-23F6-CB47-8298-F6E78A3AECDC";
const TOOLS_CONTEXT: &str = "21318C60-9714-3248-8CA6-41FF7324C8F2";
const UNKNOWN_1734DC26: &str = "1734DC26-800D-4745-8726-C0F1E7DD8BCA";

static DESTROYED: AtomicUsize = AtomicUsize::new(0);

extern "C" fn on_destroy(_ctx: H, _key: usize, value: usize) {
    DESTROYED.fetch_add(value, Ordering::SeqCst);
}

type Put = unsafe extern "C" fn(H, usize, usize, Option<extern "C" fn(H, usize, usize)>) -> u32;
type Get = unsafe extern "C" fn(*mut usize, H, usize) -> u32;
type Del = unsafe extern "C" fn(H, usize) -> u32;

fn role_tables() {
    let l = Lib::open();
    let init: unsafe extern "C" fn(c_uint) -> u32 = l.f("cuInit");
    // SAFETY: plain driver calls with valid arguments.
    assert_eq!(unsafe { init(0) }, 0);

    // Every served table: sized tables have no NULL slot up to their size.
    for (id, sized) in [
        (CUDART, true),
        ("A094798C-2E74-2E74-93F2-0800200C0A66", true),
        (TOOLS_TLS, true),
        (TOOLS_CONTEXT, true),
        (UNKNOWN_1734DC26, true),
        ("263E8860-7CD2-6143-92F6-BBD5006DFA7E", true),
        (INTEGRITY, true),
        (STORAGE, false),
    ] {
        let t = table(id).unwrap_or_else(|e| panic!("{id}: {e}"));
        // SAFETY: slot 0 of a sized table is its size in bytes.
        let slots = if sized { (unsafe { t.read() }) / 8 } else { 4 };
        assert!(slots >= 3, "{id}: {slots} slots");
        for i in 0..slots {
            // SAFETY: within the table.
            assert_ne!(unsafe { t.add(i).read() }, 0, "{id} slot {i} is NULL");
        }
    }
    // An unknown table: an error and a NULL pointer, never success.
    let get: GetTable = l.f("cuGetExportTable");
    let mut t: *const usize = std::ptr::dangling::<usize>();
    // SAFETY: valid out-pointer and UUID.
    let rc = unsafe {
        get(
            &mut t,
            &common::uuid("F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9"),
        )
    };
    assert_ne!(rc, 0);
    assert!(t.is_null());

    // Context-local storage on the primary context.
    let storage = table(STORAGE).unwrap();
    let (put, del, get): (Put, Del, Get) = (slot(storage, 0), slot(storage, 1), slot(storage, 2));
    let retain: unsafe extern "C" fn(*mut H, c_int) -> u32 = l.f("cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(H) -> u32 = l.f("cuCtxSetCurrent");
    let reset: unsafe extern "C" fn(c_int) -> u32 = l.f("cuDevicePrimaryCtxReset_v2");
    let create: unsafe extern "C" fn(*mut H, c_uint, c_int) -> u32 = l.f("cuCtxCreate_v2");
    let destroy: unsafe extern "C" fn(H) -> u32 = l.f("cuCtxDestroy_v2");
    let mut primary: H = std::ptr::null_mut();
    let mut v = 0usize;
    // SAFETY: driver calls with valid out-pointers and handles.
    unsafe {
        assert_eq!(
            get(&mut v, std::ptr::null_mut(), 7),
            INVALID_CONTEXT,
            "no context yet"
        );
        assert_eq!(retain(&mut primary, 0), 0);
        assert_eq!(set_current(primary), 0);
        assert_eq!(put(std::ptr::null_mut(), 7, 70, None), 0);
        assert_eq!(get(&mut v, primary, 7), 0);
        assert_eq!(v, 70);
        assert_eq!(put(primary, 7, 71, Some(on_destroy)), 0);
        assert_eq!(get(&mut v, std::ptr::null_mut(), 7), 0);
        assert_eq!(v, 71, "put replaces");
        assert_eq!(put(primary, 8, 100, Some(on_destroy)), 0);
        assert_eq!(del(primary, 8), 0, "delete runs no destructor");
        assert_eq!(get(&mut v, primary, 8), INVALID_HANDLE);
        assert_eq!(DESTROYED.load(Ordering::SeqCst), 0);
        assert_eq!(reset(0), 0);
        assert_eq!(
            DESTROYED.load(Ordering::SeqCst),
            71,
            "reset runs the destructor"
        );
        assert_eq!(
            get(&mut v, primary, 7),
            INVALID_HANDLE,
            "reset empties the storage"
        );

        let mut ctx: H = std::ptr::null_mut();
        assert_eq!(create(&mut ctx, 0, 0), 0);
        assert_eq!(put(ctx, 9, 1000, Some(on_destroy)), 0);
        assert_eq!(destroy(ctx), 0);
        assert_eq!(
            DESTROYED.load(Ordering::SeqCst),
            1071,
            "destroy runs the destructor"
        );
        assert_eq!(set_current(primary), 0);
    }

    // CUDART_INTERFACE slot 2: the device's primary context.
    let cudart = table(CUDART).unwrap();
    let primary_of: unsafe extern "C" fn(*mut H, c_int) -> u32 = slot(cudart, 2);
    let mut p: H = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { primary_of(&mut p, 0) }, 0);
    assert_eq!(p, primary);

    // The integrity check: fixed words for old callers, a keyed hash of its
    // inputs otherwise.
    let check: unsafe extern "C" fn(u32, u64, *mut [u64; 2]) -> u32 =
        slot(table(INTEGRITY).unwrap(), 1);
    let answer = |version: u32, seconds: u64| {
        let mut out = [0u64; 2];
        // SAFETY: valid out-pointer.
        assert_eq!(unsafe { check(version, seconds, &mut out) }, 0);
        out
    };
    assert_eq!(answer(12090, 5), [0x3341181C03CB675C, 0x8ED383AA1F4CD1E8]);
    assert_eq!(answer(12092, 5), answer(12092, 5));
    assert_ne!(answer(12092, 5), answer(12092, 6));
    assert_ne!(answer(12092, 5), answer(12093, 5));
    println!("TABLES=ok");
}

/// What cuBLASLt 13's heuristics ask of the tools tables: the thread's
/// context (TOOLS_TLS[2]), then that context's number (TOOLS_CONTEXT[4]),
/// which keys its per-context state; and slot 4 of table 1734DC26, whose
/// refusal it handles (a NULL table crashed it).
fn role_tools() {
    let l = Lib::open();
    let init: unsafe extern "C" fn(c_uint) -> u32 = l.f("cuInit");
    let create: unsafe extern "C" fn(*mut H, c_uint, c_int) -> u32 = l.f("cuCtxCreate_v2");
    let set_current: unsafe extern "C" fn(H) -> u32 = l.f("cuCtxSetCurrent");
    let ctx_id: unsafe extern "C" fn(H, *mut u64) -> u32 = l.f("cuCtxGetId");
    let thread_context: unsafe extern "C" fn(*mut H) -> u32 = slot(table(TOOLS_TLS).unwrap(), 2);
    let tools = table(TOOLS_CONTEXT).unwrap();
    // SAFETY: slot 0 is the size in bytes.
    assert_eq!(unsafe { tools.read() }, 95 * 8, "TOOLS_CONTEXT's size word");
    let number: unsafe extern "C" fn(H, *mut u64) -> u32 = slot(tools, 4);
    let unknown_4: unsafe extern "C" fn(*mut usize, *mut usize) -> u32 =
        slot(table(UNKNOWN_1734DC26).unwrap(), 4);
    let (mut a, mut b, mut seen): (H, H, H) = Default::default();
    let (mut na, mut nb, mut id) = (0u64, 0u64, 0u64);
    // SAFETY: driver calls with valid out-pointers and handles.
    unsafe {
        assert_eq!(init(0), 0);
        assert_eq!(thread_context(&mut seen), INVALID_CONTEXT, "no context yet");
        assert_eq!(create(&mut a, 0, 0), 0);
        assert_eq!(create(&mut b, 0, 0), 0);
        assert_eq!(thread_context(&mut seen), 0);
        assert_eq!(seen, b, "the context made current last");
        assert_eq!(number(seen, &mut nb), 0);
        assert_eq!(number(a, &mut na), 0);
        assert_ne!(na, nb, "each context has its own number");
        assert_eq!(ctx_id(a, &mut id), 0);
        assert_eq!(id, na, "the number is cuCtxGetId's");
        assert_eq!(set_current(a), 0);
        assert_eq!(thread_context(&mut seen), 0);
        assert_eq!(seen, a);
        assert_eq!(number(std::ptr::null_mut(), &mut id), 0);
        assert_eq!(id, na, "NULL names the current context");
        let (mut p, mut q) = (0usize, 0usize);
        assert_ne!(unknown_4(&mut p, &mut q), 0);
    }
    println!("TOOLS=ok");
}

/// A fatbin as nvcc builds it for two targets: kernels `a` and `b` and
/// global `g` in an LZ4 ELF entry for sm_90, the same kernels as zstd PTX
/// (not read: a 9.0 device uses the SASS), and one corrupt sm_90 entry.
fn image() -> Vec<u8> {
    let g: Vec<u8> = (1..=32).collect();
    let elf = cubin(90, &["a", "b"], &[("g", &g)]);
    let mut bad = fatbin(&[Entry::Elf(vec![0xee; 100], Compression::Zstd)]);
    // Keep the entry, drop the container header, and garble the zstd data.
    bad.drain(..16);
    for b in &mut bad[64..] {
        *b = 0xee;
    }
    let mut image = fatbin(&[
        Entry::Elf(elf, Compression::Lz4),
        Entry::Ptx(
            ".version 8.0\n.entry a() { ret; }\n.entry b() { ret; }\n.entry ptx_only() { ret; }"
                .into(),
            Compression::Zstd,
        ),
    ]);
    // Append the corrupt entry inside the container and fix its size.
    let files = u64::from_le_bytes(image[8..16].try_into().unwrap()) + bad.len() as u64;
    image[8..16].copy_from_slice(&files.to_le_bytes());
    image.extend_from_slice(&bad);
    image
}

type Launch = unsafe extern "C" fn(
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
) -> u32;

fn role_libraries() {
    let l = Lib::open();
    let init: unsafe extern "C" fn(c_uint) -> u32 = l.f("cuInit");
    type LoadData = unsafe extern "C" fn(
        *mut H,
        *const c_void,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
    ) -> u32;
    let load: LoadData = l.f("cuLibraryLoadData");
    let unload: unsafe extern "C" fn(H) -> u32 = l.f("cuLibraryUnload");
    let count: unsafe extern "C" fn(*mut c_uint, H) -> u32 = l.f("cuLibraryGetKernelCount");
    let enumerate: unsafe extern "C" fn(*mut H, c_uint, H) -> u32 =
        l.f("cuLibraryEnumerateKernels");
    let get_kernel: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32 =
        l.f("cuLibraryGetKernel");
    let kernel_name: unsafe extern "C" fn(*mut *const c_char, H) -> u32 = l.f("cuKernelGetName");
    let kernel_lib: unsafe extern "C" fn(*mut H, H) -> u32 = l.f("cuKernelGetLibrary");
    let kernel_fn: unsafe extern "C" fn(*mut H, H) -> u32 = l.f("cuKernelGetFunction");
    let kernel_attr: unsafe extern "C" fn(*mut c_int, c_int, H, c_int) -> u32 =
        l.f("cuKernelGetAttribute");
    let get_global: unsafe extern "C" fn(*mut Dptr, *mut usize, H, *const c_char) -> u32 =
        l.f("cuLibraryGetGlobal");
    let get_module: unsafe extern "C" fn(*mut H, H) -> u32 = l.f("cuLibraryGetModule");
    let module_global: unsafe extern "C" fn(*mut Dptr, *mut usize, H, *const c_char) -> u32 =
        l.f("cuModuleGetGlobal_v2");
    let loading_mode: unsafe extern "C" fn(*mut c_int) -> u32 = l.f("cuModuleGetLoadingMode");
    let retain: unsafe extern "C" fn(*mut H, c_int) -> u32 = l.f("cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(H) -> u32 = l.f("cuCtxSetCurrent");
    let dtoh: unsafe extern "C" fn(*mut c_void, Dptr, usize) -> u32 = l.f("cuMemcpyDtoH_v2");
    let launch: Launch = l.f("cuLaunchKernel");
    let sync: unsafe extern "C" fn() -> u32 = l.f("cuCtxSynchronize");
    let occupancy: unsafe extern "C" fn(*mut c_int, H, c_int, usize) -> u32 =
        l.f("cuOccupancyMaxActiveBlocksPerMultiprocessor");
    type BlockSize = unsafe extern "C" fn(
        *mut c_int,
        *mut c_int,
        H,
        Option<unsafe extern "C" fn(c_int) -> usize>,
        usize,
        c_int,
    ) -> u32;
    let block_size: BlockSize = l.f("cuOccupancyMaxPotentialBlockSize");
    let nul = std::ptr::null_mut();
    let name = |s: &str| CString::new(s).unwrap();
    let image = image();
    // SAFETY: driver calls with valid arguments and out-pointers; the image
    // outlives the library.
    unsafe {
        assert_eq!(init(0), 0);
        // Loaded with no context current, as cudart 12.9 does at start.
        let mut lib: H = nul;
        let rc = load(
            &mut lib,
            image.as_ptr().cast(),
            nul.cast(),
            nul.cast(),
            0,
            nul.cast(),
            nul.cast(),
            0,
        );
        assert_eq!(
            rc, 0,
            "a library loads without a context, corrupt entry and all"
        );
        let mut n = 0;
        assert_eq!(count(&mut n, lib), 0);
        assert_eq!(n, 2, "a and b from the sm_90 ELF entry; PTX not read");
        let mut all = [nul; 2];
        assert_eq!(enumerate(all.as_mut_ptr(), 2, lib), 0);
        let mut k: H = nul;
        assert_eq!(get_kernel(&mut k, lib, name("b").as_ptr()), 0);
        assert!(all.contains(&k));
        assert_eq!(
            get_kernel(&mut k, lib, name("ptx_only").as_ptr()),
            NOT_FOUND
        );
        assert_eq!(get_kernel(&mut k, lib, name("a").as_ptr()), 0);
        let mut kname: *const c_char = std::ptr::null();
        assert_eq!(kernel_name(&mut kname, k), 0);
        assert_eq!(std::ffi::CStr::from_ptr(kname).to_str().unwrap(), "a");
        let mut owner: H = nul;
        assert_eq!(kernel_lib(&mut owner, k), 0);
        assert_eq!(owner, lib);
        let mut threads = 0;
        assert_eq!(kernel_attr(&mut threads, 0, k, 0), 0);
        assert_eq!(threads, 1024);
        let mut f: H = nul;
        assert_eq!(
            kernel_fn(&mut f, k),
            INVALID_CONTEXT,
            "a function needs a context"
        );

        let mut ctx: H = nul;
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);
        assert_eq!(kernel_fn(&mut f, k), 0);
        assert_eq!(
            launch(f, 4, 1, 1, 128, 1, 1, 0, nul, nul.cast(), nul.cast()),
            0
        );
        assert_eq!(
            launch(k, 4, 1, 1, 128, 1, 1, 0, nul, nul.cast(), nul.cast()),
            0,
            "a CUkernel launches"
        );
        assert_eq!(sync(), 0);

        // The global holds the image's initial bytes, the same through the
        // library and its module.
        let (mut p, mut size) = (0, 0);
        assert_eq!(get_global(&mut p, &mut size, lib, name("g").as_ptr()), 0);
        assert_eq!(size, 32);
        let mut back = [0u8; 32];
        assert_eq!(dtoh(back.as_mut_ptr().cast(), p, 32), 0);
        assert_eq!(back.to_vec(), (1..=32).collect::<Vec<u8>>());
        let mut m: H = nul;
        assert_eq!(get_module(&mut m, lib), 0);
        let (mut p2, mut size2) = (0, 0);
        assert_eq!(module_global(&mut p2, &mut size2, m, name("g").as_ptr()), 0);
        assert_eq!((p2, size2), (p, size));

        let mut mode = 0;
        assert_eq!(loading_mode(&mut mode), 0);
        assert_eq!(mode, 2, "LAZY, like a current driver");

        let mut blocks = 0;
        assert_eq!(occupancy(&mut blocks, f, 256, 0), 0);
        assert_eq!(blocks, 8, "2048 threads per SM / 256");
        let (mut grid, mut block) = (0, 0);
        assert_eq!(block_size(&mut grid, &mut block, f, None, 0, 0), 0);
        assert!((32..=1024).contains(&block) && grid > 0, "{grid} {block}");

        // Bytes that are no image at all are refused.
        let junk = [0x42u8; 64];
        let rc = load(
            &mut lib,
            junk.as_ptr().cast(),
            nul.cast(),
            nul.cast(),
            0,
            nul.cast(),
            nul.cast(),
            0,
        );
        assert_eq!(rc, INVALID_IMAGE);
        assert_eq!(unload(owner), 0);
        assert_eq!(
            get_kernel(&mut k, owner, name("a").as_ptr()),
            INVALID_HANDLE
        );
    }
    println!("LIBRARIES=ok");
}

fn role_version() {
    let l = Lib::open();
    let version: unsafe extern "C" fn(*mut c_int) -> u32 = l.f("cuDriverGetVersion");
    let init: unsafe extern "C" fn(c_uint) -> u32 = l.f("cuInit");
    let mut v = 0;
    // SAFETY: valid out-pointer.
    let rc = unsafe { version(&mut v) };
    // SAFETY: plain call.
    let init_rc = unsafe { init(0) };
    println!("RC={rc}\nVERSION={v}\nINIT={init_rc}");
}

#[test]
fn export_tables_serve_cudart() {
    let inst = Instance::new("tables");
    let out = run_child("tables", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert_eq!(value(&out, "TABLES"), "ok");
}

#[test]
fn tools_tables_answer_as_cublaslt_asks() {
    let inst = Instance::new("tools");
    let out = run_child("tools", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert_eq!(value(&out, "TOOLS"), "ok");
}

#[test]
fn libraries_exist_without_a_context() {
    let inst = Instance::new("libraries");
    let out = run_child("libraries", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert_eq!(value(&out, "LIBRARIES"), "ok");
}

#[test]
fn driver_version_is_cuda13_unless_lowered() {
    let inst = Instance::new("version");
    let out = run_child("version", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert_eq!(value(&out, "VERSION"), "13020");
    let out = run_child(
        "version",
        &[
            ("SIMGPU_INSTANCE", &inst.0),
            ("SIMGPU_DRIVER_VERSION", "12090"),
        ],
    );
    assert_eq!(value(&out, "VERSION"), "12090");
    let bad = child(
        "version",
        &[
            ("SIMGPU_INSTANCE", &inst.0),
            ("SIMGPU_DRIVER_VERSION", "13.2"),
        ],
    )
    .output()
    .unwrap();
    let out = String::from_utf8_lossy(&bad.stdout);
    assert_ne!(value(&out, "RC"), "0");
    assert_ne!(value(&out, "INIT"), "0", "cuInit refuses a bad setting");
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("SIMGPU_DRIVER_VERSION=\"13.2\" is invalid"),
        "{err}"
    );
}
