//! Kernel parameter layouts, as simgpu reads them from images (PTX `.entry`
//! declarations, a cubin's `EIATTR_KPARAM_INFO` records) and serves them:
//! `cuFuncGetParamInfo`/`cuFuncGetParamCount`, `cuKernelGetParamInfo`, and
//! the FUNCTION_INFO export table's slots 0x21 (count) and 0x22 (offset and
//! size) that XSched's cuXtra calls on every kernel it queues.

mod common;

use common::*;
use dilu_tests::cubin::cubin_with_params;
use std::ffi::{CString, c_char, c_int, c_uint, c_void};

const INVALID_VALUE: u32 = 1;
const INVALID_HANDLE: u32 = 400;
const NOT_SUPPORTED: u32 = 801;

const FUNCTION_INFO: &str = "6E163FBE-B958-444D-835C-E182AFF1991E";

/// One kernel for every way PTX declares a parameter, one without
/// parameters, and one whose list simgpu cannot read (an array length that
/// is no number).
const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry mixed(
    .param .u8 mixed_p0,
    .param .u64 mixed_p1,
    .param .align 8 .b8 mixed_p2[12],
    .param .f16 mixed_p3, /* a half */
    .param .u32 mixed_p4,
    // a pointer's .align is its pointee's, not the parameter's
    .param .u64 .ptr.global.align 16 mixed_p5,
    .param .align 16 .b8 mixed_p6[32],
    .param .s16 mixed_p7
)
{
    ret;
}

.visible .entry none()
{
    ret;
}

.visible .entry unreadable(
    .param .u32 unreadable_p0,
    .param .b8 unreadable_p1[N]
)
{
    ret;
}
"#;

/// (offset, size) of `mixed`'s parameters: each at the next multiple of its
/// alignment.
const MIXED: [(usize, usize); 8] = [
    (0, 1),
    (8, 8),
    (16, 12),
    (28, 2),
    (32, 4),
    (40, 8),
    (48, 32),
    (80, 2),
];

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("SIMGPU_TEST_ROLE") else {
        return;
    };
    match role.as_str() {
        "params" => role_params(),
        other => panic!("unknown role {other}"),
    }
}

type Count = unsafe extern "C" fn(H, *mut usize) -> u32;
type Info = unsafe extern "C" fn(H, usize, *mut [u8; 0x28]) -> u32;

/// Slot 0x22's answer for parameter `i` of `f`: (status, size, offset,
/// shared-memory word, the record's last 8 bytes), from a record whose
/// every byte but the size word starts as 0xAA.
fn info(slot: Info, f: H, i: usize) -> (u32, u64, u64, u64, u64) {
    let mut record = [0xAAu8; 0x28];
    record[..4].copy_from_slice(&0x28u32.to_le_bytes());
    // SAFETY: a 0x28-byte record, as cuXtra passes.
    let rc = unsafe { slot(f, i, &mut record) };
    let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap());
    (rc, word(0x08), word(0x10), word(0x18), word(0x20))
}

fn role_params() {
    let l = Lib::open();
    let init: unsafe extern "C" fn(c_uint) -> u32 = l.f("cuInit");
    let retain: unsafe extern "C" fn(*mut H, c_int) -> u32 = l.f("cuDevicePrimaryCtxRetain");
    let set_current: unsafe extern "C" fn(H) -> u32 = l.f("cuCtxSetCurrent");
    let load: unsafe extern "C" fn(*mut H, *const c_void) -> u32 = l.f("cuModuleLoadData");
    let get_function: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32 =
        l.f("cuModuleGetFunction");
    let kernel_function: unsafe extern "C" fn(*mut H, H) -> u32 = l.f("cuKernelGetFunction");
    let func_info: unsafe extern "C" fn(H, usize, *mut usize, *mut usize) -> u32 =
        l.f("cuFuncGetParamInfo");
    let func_count: unsafe extern "C" fn(H, *mut usize) -> u32 = l.f("cuFuncGetParamCount");
    let kernel_info: unsafe extern "C" fn(H, usize, *mut usize, *mut usize) -> u32 =
        l.f("cuKernelGetParamInfo");
    type LoadLibrary = unsafe extern "C" fn(
        *mut H,
        *const c_void,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
        *mut c_int,
        *mut *mut c_void,
        c_uint,
    ) -> u32;
    let load_library: LoadLibrary = l.f("cuLibraryLoadData");
    let get_kernel: unsafe extern "C" fn(*mut H, H, *const c_char) -> u32 =
        l.f("cuLibraryGetKernel");
    let get_table: unsafe extern "C" fn(*mut *const usize, *const [u8; 16]) -> u32 =
        l.f("cuGetExportTable");
    let nul: H = std::ptr::null_mut();
    let name = |s: &str| CString::new(s).unwrap();
    let ptx = name(PTX);

    // SAFETY: driver calls with valid arguments and out-pointers; the table
    // is read within the size its slot 0 gives, and its slots 0x21 and 0x22
    // have the signatures cuXtra calls them with.
    unsafe {
        assert_eq!(init(0), 0);
        let mut ctx = nul;
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set_current(ctx), 0);

        let mut table: *const usize = std::ptr::null();
        assert_eq!(get_table(&mut table, &common::uuid(FUNCTION_INFO)), 0);
        let size = table.read();
        assert!(size >= 0x23 * 8, "FUNCTION_INFO is {size} bytes");
        for i in 1..size / 8 {
            assert_ne!(table.add(i).read(), 0, "slot {i} is NULL");
        }
        let count: Count = std::mem::transmute::<usize, Count>(table.add(0x21).read());
        let slot_info: Info = std::mem::transmute::<usize, Info>(table.add(0x22).read());

        let mut m = nul;
        assert_eq!(load(&mut m, ptx.as_ptr().cast()), 0);
        let function = |n: &str| {
            let mut f = nul;
            assert_eq!(get_function(&mut f, m, name(n).as_ptr()), 0, "{n}");
            f
        };
        let (mixed, none, unreadable) =
            (function("mixed"), function("none"), function("unreadable"));

        // cuXtra first turns a CUkernel into its CUfunction; a CUfunction
        // it passes as is must come back unchanged.
        let mut same = nul;
        assert_eq!(kernel_function(&mut same, mixed), 0);
        assert_eq!(same, mixed);

        let mut n = 0usize;
        assert_eq!(count(mixed, &mut n), 0);
        assert_eq!(n, MIXED.len());
        for (i, &(offset, size)) in MIXED.iter().enumerate() {
            let (rc, s, o, shared, tail) = info(slot_info, mixed, i);
            assert_eq!(rc, 0, "parameter {i}");
            assert_eq!((o as usize, s as usize), (offset, size), "parameter {i}");
            assert_eq!(shared, 0, "parameters live in the constant bank");
            assert_eq!(
                tail, 0xAAAA_AAAA_AAAA_AAAA,
                "bytes past the record's fields"
            );
            let (mut fo, mut fs) = (0usize, 0usize);
            assert_eq!(func_info(mixed, i, &mut fo, &mut fs), 0);
            assert_eq!((fo, fs), (offset, size));
        }
        assert_eq!(func_count(mixed, &mut n), 0);
        assert_eq!(n, MIXED.len());
        assert_eq!(info(slot_info, mixed, MIXED.len()).0, INVALID_VALUE);
        let mut o = 0usize;
        assert_eq!(
            func_info(mixed, 0, std::ptr::null_mut(), &mut o),
            INVALID_VALUE,
            "the offset is required"
        );
        assert_eq!(func_info(mixed, 3, &mut o, std::ptr::null_mut()), 0);
        assert_eq!(o, 28, "the size is optional");

        assert_eq!(count(none, &mut n), 0);
        assert_eq!(n, 0);
        assert_eq!(info(slot_info, none, 0).0, INVALID_VALUE);

        // A list simgpu cannot read: it says so rather than guess.
        assert_eq!(count(unreadable, &mut n), NOT_SUPPORTED);
        assert_eq!(info(slot_info, unreadable, 0).0, NOT_SUPPORTED);

        // A handle that is no function.
        let bogus = 0xdead_beef_usize as H;
        assert_eq!(count(bogus, &mut n), INVALID_HANDLE);
        assert_eq!(info(slot_info, bogus, 0).0, INVALID_HANDLE);
        assert_eq!(func_count(bogus, &mut n), INVALID_HANDLE);
        assert_eq!(count(mixed, std::ptr::null_mut()), INVALID_VALUE);

        // A cubin: the layout comes from `.nv.info.<kernel>`; a kernel
        // without that section has no known layout.
        let image = cubin_with_params(
            90,
            &[
                ("three", Some(&[(0, 8), (8, 4), (16, 16)][..])),
                ("empty", Some(&[][..])),
                ("bare", None),
            ],
            &[],
        );
        let mut lib = nul;
        let rc = load_library(
            &mut lib,
            image.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
        assert_eq!(rc, 0);
        let kernel = |n: &str| {
            let mut k = nul;
            assert_eq!(get_kernel(&mut k, lib, name(n).as_ptr()), 0, "{n}");
            k
        };
        let three = kernel("three");
        for (i, want) in [(0, 8), (8, 4), (16, 16)].into_iter().enumerate() {
            let (mut o, mut s) = (0usize, 0usize);
            assert_eq!(kernel_info(three, i, &mut o, &mut s), 0);
            assert_eq!((o, s), want, "parameter {i}");
        }
        let (mut o, mut s) = (0usize, 0usize);
        assert_eq!(kernel_info(three, 3, &mut o, &mut s), INVALID_VALUE);
        let mut f = nul;
        assert_eq!(kernel_function(&mut f, three), 0);
        assert_eq!(count(f, &mut n), 0);
        assert_eq!(n, 3);
        assert_eq!(info(slot_info, f, 2).1, 16);
        assert_eq!(count(kernel("empty"), &mut n), 0);
        assert_eq!(n, 0);
        assert_eq!(count(kernel("bare"), &mut n), NOT_SUPPORTED);
    }
    println!("PARAMS=ok");
}

#[test]
fn parameter_layouts_come_from_the_image() {
    let inst = Instance::new("params");
    let out = run_child("params", &[("SIMGPU_INSTANCE", &inst.0)]);
    assert_eq!(value(&out, "PARAMS"), "ok");
}
