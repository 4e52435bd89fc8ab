//! Initialisation, versions, error strings and cuGetProcAddress.

use super::{cstr, out};
use crate::Res;
use crate::driver::{drv, init};
use crate::proc_table::{Lookup, lookup};
use dilu_abi::cuda::*;
use std::ffi::{c_char, c_int, c_uint, c_void};

export! {
    fn cuInit(flags: c_uint) => init_impl;
    fn cuDriverGetVersion(v: *mut c_int) => driver_version;
    fn cuGetErrorString(e: CUresult, s: *mut *const c_char) => error_string;
    fn cuGetErrorName(e: CUresult, s: *mut *const c_char) => error_name;
    fn cuGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64) => get_proc_v1;
    fn cuGetProcAddress_v2(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => get_proc_v2;
    fn cuGetExportTable(table: *mut *const c_void, id: *const sys::CUuuid) => export_table;
    fn cuLogsRegisterCallback(cb: *mut c_void, data: *mut c_void, handle: *mut *mut c_void) => logs_register;
    fn cuLogsUnregisterCallback(handle: *mut c_void) => logs_unregister;
}

fn init_impl(_: bool, flags: c_uint) -> Res {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match init() {
        CUDA_SUCCESS => Ok(()),
        e => Err(e),
    }
}

/// Driver log callbacks: accepted, never called (simgpu writes no driver
/// log entries).
fn logs_register(_: bool, cb: *mut c_void, _data: *mut c_void, handle: *mut *mut c_void) -> Res {
    if cb.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    out(
        handle,
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) as *mut c_void,
    )
}

fn logs_unregister(_: bool, handle: *mut c_void) -> Res {
    if handle.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

fn driver_version(_: bool, v: *mut c_int) -> Res {
    let version = crate::config::driver_version().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
    out(v, version)
}

/// Serves cudart's private tables ([`crate::export_tables`]); any other
/// UUID gets a NULL table and an error.
fn export_table(_: bool, table: *mut *const c_void, id: *const sys::CUuuid) -> Res {
    let id = super::read(id)?.bytes.map(|b| b as u8);
    match crate::export_tables::lookup(&id) {
        Some(t) => out(table, t),
        None => {
            if crate::log_errors() {
                let hex: String = id.iter().map(|b| format!("{b:02X}")).collect();
                eprintln!("simgpu: cuGetExportTable: no table {hex}");
            }
            if !table.is_null() {
                out(table, std::ptr::null())?;
            }
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

const ERRORS: &[(CUresult, &std::ffi::CStr, &std::ffi::CStr)] = &[
    (CUDA_SUCCESS, c"CUDA_SUCCESS", c"no error"),
    (
        CUDA_ERROR_INVALID_VALUE,
        c"CUDA_ERROR_INVALID_VALUE",
        c"invalid argument",
    ),
    (
        CUDA_ERROR_OUT_OF_MEMORY,
        c"CUDA_ERROR_OUT_OF_MEMORY",
        c"out of memory",
    ),
    (
        CUDA_ERROR_NOT_INITIALIZED,
        c"CUDA_ERROR_NOT_INITIALIZED",
        c"initialization error",
    ),
    (
        CUDA_ERROR_DEINITIALIZED,
        c"CUDA_ERROR_DEINITIALIZED",
        c"driver shutting down",
    ),
    (
        CUDA_ERROR_NO_DEVICE,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (
        CUDA_ERROR_INVALID_DEVICE,
        c"CUDA_ERROR_INVALID_DEVICE",
        c"invalid device ordinal",
    ),
    (
        CUDA_ERROR_INVALID_IMAGE,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        CUDA_ERROR_INVALID_CONTEXT,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        CUDA_ERROR_INVALID_PTX,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        CUDA_ERROR_INVALID_HANDLE,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (
        CUDA_ERROR_NOT_FOUND,
        c"CUDA_ERROR_NOT_FOUND",
        c"named symbol not found",
    ),
    (
        CUDA_ERROR_NOT_READY,
        c"CUDA_ERROR_NOT_READY",
        c"device not ready",
    ),
    (
        CUDA_ERROR_ILLEGAL_ADDRESS,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        CUDA_ERROR_LAUNCH_FAILED,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (
        CUDA_ERROR_NOT_PERMITTED,
        c"CUDA_ERROR_NOT_PERMITTED",
        c"operation not permitted",
    ),
    (
        CUDA_ERROR_NOT_SUPPORTED,
        c"CUDA_ERROR_NOT_SUPPORTED",
        c"operation not supported",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
        c"operation not permitted when stream is capturing",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
        c"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        c"operation failed due to a previous error during capture",
    ),
    (
        CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
        c"CUDA_ERROR_STREAM_CAPTURE_UNMATCHED",
        c"capture was not initiated in this stream",
    ),
    (
        crate::exec::CUDA_ERROR_ILLEGAL_STATE_OR_INVALID,
        c"CUDA_ERROR_ILLEGAL_STATE",
        c"the operation cannot be performed in the present state",
    ),
    (CUDA_ERROR_UNKNOWN, c"CUDA_ERROR_UNKNOWN", c"unknown error"),
];

fn error_entry(e: CUresult, s: *mut *const c_char, name: bool) -> Res {
    match ERRORS.iter().find(|x| x.0 == e) {
        Some((_, n, d)) => out(s, if name { n.as_ptr() } else { d.as_ptr() }),
        None => {
            if !s.is_null() {
                out(s, std::ptr::null())?;
            }
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

fn error_string(_: bool, e: CUresult, s: *mut *const c_char) -> Res {
    error_entry(e, s, false)
}

fn error_name(_: bool, e: CUresult, s: *mut *const c_char) -> Res {
    error_entry(e, s, true)
}

fn get_proc_v1(
    _: bool,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> Res {
    get_proc(symbol, pfn, version, flags, std::ptr::null_mut())
}

fn get_proc_v2(
    _: bool,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Res {
    get_proc(symbol, pfn, version, flags, status)
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Res {
    let set_status = |v: c_int| {
        if !status.is_null() {
            let _ = out(status, v);
        }
    };
    if pfn.is_null() || symbol.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    out(pfn, std::ptr::null_mut())?;
    if flags & !(CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)
        != 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let name = cstr(symbol)?.to_str().unwrap_or("");
    let per_thread = flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0;
    let _ = drv();
    match lookup(name, version, per_thread) {
        Lookup::Found(p) => {
            set_status(CU_GET_PROC_ADDRESS_SUCCESS);
            out(pfn, p as *mut c_void)
        }
        Lookup::NotFound => {
            if crate::log_errors() {
                eprintln!("simgpu: cuGetProcAddress: no {name:?} at version {version}");
            }
            set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
            Err(CUDA_ERROR_NOT_FOUND)
        }
        Lookup::VersionNotSufficient => {
            set_status(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
            Err(CUDA_ERROR_NOT_FOUND)
        }
    }
}
