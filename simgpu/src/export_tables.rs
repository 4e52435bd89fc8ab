//! The private tables `cuGetExportTable` serves to NVIDIA's runtime
//! (cudart and the static copies inside cuBLAS and friends). Without them
//! cudart cannot initialise on a driver.
//!
//! Each table is an array of pointers; unless noted, slot 0 holds the
//! table's size in bytes. UUIDs, slots and signatures were reverse-engineered
//! by ZLUDA (vosen/ZLUDA, `dark_api`) and checked against cudart 12.9 and
//! 13.2 (`tests/tests/cudart.rs` runs both on simgpu). Every slot holds a
//! function: the ones whose meaning is unknown return
//! `CUDA_ERROR_NOT_SUPPORTED` (and are logged with `SIMGPU_LOG_ERRORS=1`), so
//! no caller ever jumps to NULL. One table is not cudart's: FUNCTION_INFO,
//! which XSched's cuXtra asks for (read from cuXtra's prebuilt library).

use crate::api::device::{pci_bus, uuid_bytes};
use crate::api::module::load_image;
use crate::driver::{CTXS, Ctx, LocalDtor, LocalValue, current, drv};
use crate::integrity::{CheckInput, DeviceIdentity, answer};
use crate::{Res, guard};
use dilu_abi::cuda::*;
use std::cell::UnsafeCell;
use std::ffi::c_void;
use std::sync::Arc;

type Slot = *const c_void;

/// A table as cudart reads it: an array of pointer-sized slots.
#[repr(C)]
struct Table<const N: usize>([Slot; N]);

// SAFETY: the tables are immutable arrays of function pointers and sizes.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn addr(&'static self) -> *const c_void {
        self.0.as_ptr().cast()
    }
}

/// Slot 0 of a sized table: its length in bytes.
const fn size_of_table(slots: usize) -> Slot {
    std::ptr::without_provenance(slots * std::mem::size_of::<Slot>())
}

/// The served tables, by the index an unknown slot's function carries.
const TABLE_NAMES: [&str; 9] = [
    "CUDART_INTERFACE",
    "TOOLS_RUNTIME_HOOKS",
    "TOOLS_TLS",
    "CONTEXT_LOCAL_STORAGE",
    "CONTEXT_CHECKS",
    "INTEGRITY_CHECK",
    "TOOLS_CONTEXT",
    "UNKNOWN_1734DC26",
    "FUNCTION_INFO",
];
const CUDART: usize = 0;
const HOOKS: usize = 1;
const TLS: usize = 2;
const STORAGE: usize = 3;
const CHECKS: usize = 4;
const INTEGRITY: usize = 5;
const TOOLS_CTX: usize = 6;
const UNKNOWN_1734: usize = 7;
const FUNCTION_INFO: usize = 8;

/// Fills a slot whose meaning is unknown: refuses, naming table and slot in
/// the log (`SIMGPU_LOG_ERRORS=1`).
extern "C" fn unknown<const TABLE: usize, const SLOT: usize>() -> CUresult {
    if crate::log_errors() {
        eprintln!(
            "simgpu: export table {}[{SLOT}] -> {CUDA_ERROR_NOT_SUPPORTED}",
            TABLE_NAMES[TABLE]
        );
    }
    CUDA_ERROR_NOT_SUPPORTED
}

/// A table whose every listed slot is [`unknown`]; the known slots are
/// written over it.
macro_rules! every_slot_unknown {
    ($table:expr; $($slot:literal)*) => {
        [$(unknown::<$table, $slot> as Slot),*]
    };
}

// --- CUDART_INTERFACE {6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9} ---

/// [1] Loads a module from a `__fatBinC_Wrapper_t`.
extern "C" fn cudart_load_wrapper(m: *mut sys::CUmodule, wrapper: *const c_void) -> CUresult {
    guard("export table CUDART_INTERFACE[1]", || {
        load_image(m, wrapper)
    })
}

/// [2] The primary context of a device (not retained).
extern "C" fn cudart_primary_ctx(ctx: *mut sys::CUcontext, dev: sys::CUdevice) -> CUresult {
    guard("export table CUDART_INTERFACE[2]", || {
        let d = drv()?;
        let i = d.check_dev(dev)?;
        crate::api::out(ctx, d.primary[i].handle() as sys::CUcontext)
    })
}

/// [6] As [1], with three more arguments (seen NULL/0).
extern "C" fn cudart_load_wrapper_ext(
    m: *mut sys::CUmodule,
    wrapper: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    guard("export table CUDART_INTERFACE[6]", || {
        load_image(m, wrapper)
    })
}

/// [7] Called by cudart with one word; nothing to do.
extern "C" fn cudart_notify(_arg: usize) {}

/// [8] Loads a module from a bare fatbin container.
extern "C" fn cudart_load_fatbin(
    fatbin: *const c_void,
    m: *mut sys::CUmodule,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    guard("export table CUDART_INTERFACE[8]", || load_image(m, fatbin))
}

/// [12] Loads the JIT compilers: simgpu needs none.
extern "C" fn cudart_load_compilers() -> CUresult {
    CUDA_SUCCESS
}

static CUDART_INTERFACE: Table<13> = Table({
    let mut t = every_slot_unknown!(CUDART; 0 1 2 3 4 5 6 7 8 9 10 11 12);
    t[0] = size_of_table(13);
    t[1] = cudart_load_wrapper as Slot;
    t[2] = cudart_primary_ctx as Slot;
    t[6] = cudart_load_wrapper_ext as Slot;
    t[7] = cudart_notify as Slot;
    t[8] = cudart_load_fatbin as Slot;
    t[12] = cudart_load_compilers as Slot;
    t
});

// --- TOOLS_RUNTIME_HOOKS {A094798C-2E74-2E74-93F2-0800200C0A66} ---

/// Zeroed words handed out by the hook table; cudart reads and writes them.
struct HookBuffer<const N: usize>(UnsafeCell<[u32; N]>);

// SAFETY: simgpu never touches the buffers; only the caller does.
unsafe impl<const N: usize> Sync for HookBuffer<N> {}

static HOOK_BUFFER_A: HookBuffer<1024> = HookBuffer(UnsafeCell::new([0; 1024]));
static HOOK_BUFFER_B: HookBuffer<14> = HookBuffer(UnsafeCell::new([0; 14]));

fn hand_out<const N: usize>(b: &'static HookBuffer<N>, p: *mut *mut c_void, len: *mut usize) {
    if !p.is_null() && !len.is_null() {
        // SAFETY: non-null out-pointers from the caller.
        unsafe {
            p.write(b.0.get().cast());
            len.write(N);
        }
    }
}

extern "C" fn hooks_buffer_a(p: *mut *mut c_void, len: *mut usize) {
    hand_out(&HOOK_BUFFER_A, p, len);
}

extern "C" fn hooks_buffer_b(p: *mut *mut c_void, len: *mut usize) {
    hand_out(&HOOK_BUFFER_B, p, len);
}

static TOOLS_RUNTIME_HOOKS: Table<7> = Table({
    let mut t = every_slot_unknown!(HOOKS; 0 1 2 3 4 5 6);
    t[0] = size_of_table(7);
    t[2] = hooks_buffer_a as Slot;
    t[6] = hooks_buffer_b as Slot;
    t
});

// --- TOOLS_TLS {42D85A81-23F6-CB47-8298-F6E78A3AECDC} ---

/// [2] The calling thread's current context (cuBLASLt keys its per-context
/// state by it; named `get_thread_context` in public driver-table dumps).
extern "C" fn tls_thread_context(ctx: *mut sys::CUcontext) -> CUresult {
    guard("export table TOOLS_TLS[2]", || {
        let c = current()?;
        crate::api::out(ctx, c.handle() as sys::CUcontext)
    })
}

static TOOLS_TLS: Table<4> = Table({
    let mut t = every_slot_unknown!(TLS; 0 1 2 3);
    t[0] = size_of_table(4);
    t[2] = tls_thread_context as Slot;
    t
});

// --- CONTEXT_LOCAL_STORAGE {C693336E-1121-DF11-A8C3-68F355D89593} ---
// No size word: slot 0 is the first function.

/// The context a storage call names (NULL: the current one).
fn storage_ctx(ctx: sys::CUcontext) -> Res<Arc<Ctx>> {
    if ctx.is_null() {
        return current();
    }
    drv()?;
    CTXS.get(ctx as usize).ok_or(CUDA_ERROR_INVALID_CONTEXT)
}

/// [0] put(ctx, key, value, destructor): replaces any value under `key`.
extern "C" fn storage_put(
    ctx: sys::CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: Option<LocalDtor>,
) -> CUresult {
    guard("export table CONTEXT_LOCAL_STORAGE[0]", || {
        let c = storage_ctx(ctx)?;
        let mut local = c.local.lock().unwrap_or_else(|e| e.into_inner());
        local.retain(|v| v.key != key as usize);
        local.push(LocalValue {
            key: key as usize,
            value: value as usize,
            dtor,
        });
        Ok(())
    })
}

/// [1] delete(ctx, key): no destructor runs.
extern "C" fn storage_delete(ctx: sys::CUcontext, key: *mut c_void) -> CUresult {
    guard("export table CONTEXT_LOCAL_STORAGE[1]", || {
        let c = storage_ctx(ctx)?;
        let mut local = c.local.lock().unwrap_or_else(|e| e.into_inner());
        let before = local.len();
        local.retain(|v| v.key != key as usize);
        if local.len() == before {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        Ok(())
    })
}

/// [2] get(out, ctx, key): absent keys are INVALID_HANDLE.
extern "C" fn storage_get(
    value: *mut *mut c_void,
    ctx: sys::CUcontext,
    key: *mut c_void,
) -> CUresult {
    guard("export table CONTEXT_LOCAL_STORAGE[2]", || {
        let c = storage_ctx(ctx)?;
        let local = c.local.lock().unwrap_or_else(|e| e.into_inner());
        let v = local
            .iter()
            .find(|v| v.key == key as usize)
            .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
        crate::api::out(value, v.value as *mut c_void)
    })
}

static CONTEXT_LOCAL_STORAGE: Table<4> = Table({
    let mut t = every_slot_unknown!(STORAGE; 0 1 2 3);
    t[0] = storage_put as Slot;
    t[1] = storage_delete as Slot;
    t[2] = storage_get as Slot;
    t
});

// --- CONTEXT_CHECKS {263E8860-7CD2-6143-92F6-BBD5006DFA7E} ---

/// [2] Reports no special state of a context.
extern "C" fn checks_context(
    _ctx: sys::CUcontext,
    flags: *mut u32,
    _extra: *mut *const c_void,
) -> CUresult {
    guard("export table CONTEXT_CHECKS[2]", || {
        crate::api::out(flags, 0)
    })
}

/// [3] Reports 0.
extern "C" fn checks_zero() -> u32 {
    0
}

static CONTEXT_CHECKS: Table<4> = Table({
    let mut t = every_slot_unknown!(CHECKS; 0 1 2 3);
    t[0] = size_of_table(4);
    t[2] = checks_context as Slot;
    t[3] = checks_zero as Slot;
    t
});

// --- INTEGRITY_CHECK {D4082055-BDE6-704B-8D34-BA123C66E1F2} ---

/// [1] check(caller_version, unix_seconds, out u64[2]).
extern "C" fn integrity_check(version: u32, unix_seconds: u64, result: *mut [u64; 2]) -> CUresult {
    guard("export table INTEGRITY_CHECK[1]", || {
        let d = drv()?;
        let driver_version =
            crate::config::driver_version().map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        let devices: Vec<DeviceIdentity> = (0..d.ndev())
            .map(|i| DeviceIdentity {
                uuid: uuid_bytes(d, i),
                pci_domain: 0,
                pci_bus: pci_bus(d, i),
                pci_device: 0,
            })
            .collect();
        let input = CheckInput {
            driver_version: driver_version as u32,
            caller_version: version,
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: CUDART_INTERFACE.addr() as usize,
            integrity_table: INTEGRITY_CHECK.addr() as usize,
            check_fn: INTEGRITY_CHECK.0[1] as usize,
            unix_seconds,
        };
        crate::api::out(result, answer(&input, &devices))
    })
}

static INTEGRITY_CHECK: Table<3> = Table({
    let mut t = every_slot_unknown!(INTEGRITY; 0 1 2);
    t[0] = size_of_table(3);
    t[1] = integrity_check as Slot;
    t
});

// --- TOOLS_CONTEXT {21318C60-9714-3248-8CA6-41FF7324C8F2} ---
// The driver's context interface for tools (`CU_ETID_ToolsContext` in
// NVIDIA's tools libraries). cuBLASLt 13 asks for it when its heuristics
// look up their per-context state; without it every heuristic query fails
// ("Failed to query heuristics", CUBLAS_STATUS_NOT_SUPPORTED). 95 slots
// with the size word, as a 595-series driver serves it; only slot 4 is
// known to be called.

/// [4] number(ctx, out u64): the context's unique number (`cuCtxGetId`).
extern "C" fn tools_context_number(ctx: sys::CUcontext, number: *mut u64) -> CUresult {
    guard("export table TOOLS_CONTEXT[4]", || {
        crate::api::out(number, storage_ctx(ctx)?.id)
    })
}

static TOOLS_CONTEXT: Table<95> = Table({
    let mut t = every_slot_unknown!(TOOLS_CTX;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19
        20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39
        40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
        60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79
        80 81 82 83 84 85 86 87 88 89 90 91 92 93 94);
    t[0] = size_of_table(95);
    t[4] = tools_context_number as Slot;
    t
});

// --- {1734DC26-800D-4745-8726-C0F1E7DD8BCA}, meaning unknown ---
// cuBLASLt 13 asks for it in its half-precision heuristics, ignores the
// answer's status and calls slot 4 `(out *mut c_void, out *mut c_void)`
// through the pointer it got: a NULL table crashes it. A refusal there is
// handled (it falls back), so every slot refuses. Its real size is not
// known; 16 slots cover every call seen.

static UNKNOWN_1734DC26: Table<16> = Table({
    let mut t = every_slot_unknown!(UNKNOWN_1734; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    t[0] = size_of_table(16);
    t
});

// --- FUNCTION_INFO {6E163FBE-B958-444D-835C-E182AFF1991E} ---
// Queries on functions that cuXtra (XpuOS/cuxtra, the library XSched uses)
// makes: its `cuXtraGetParamCount` calls slot 0x21 and `cuXtraGetParamInfo`
// slot 0x22, after checking that slot 0 (the size in bytes) covers the slot
// (read from its prebuilt x86-64 library). XSched's CUDA shim calls both on
// every kernel launch it queues, to copy the arguments. cuXtra's other
// calls into this table reach up to slot 0x2e, so the table has 47 slots
// (the real one's size is not known); they refuse.

/// Slot 0x22's record: a `u32` record size the caller fills in (0x28),
/// then the parameter's size, its offset and a word cuXtra reads as "in
/// shared memory" (0: parameters live in the constant bank), each a `u64`.
const PARAM_INFO_SIZE_AT: usize = 0x08;
const PARAM_INFO_OFFSET_AT: usize = 0x10;
const PARAM_INFO_SHARED_AT: usize = 0x18;

/// [0x21] count(function, out size_t): how many parameters a kernel takes.
extern "C" fn function_param_count(f: sys::CUfunction, count: *mut usize) -> CUresult {
    guard("export table FUNCTION_INFO[0x21]", || {
        crate::api::out(count, crate::api::module::func_params(f)?.len())
    })
}

/// [0x22] info(function, index, record): where parameter `index` lies.
extern "C" fn function_param_info(f: sys::CUfunction, index: usize, info: *mut u8) -> CUresult {
    guard("export table FUNCTION_INFO[0x22]", || {
        let p = crate::api::module::func_param(f, index)?;
        if info.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: the record starts with its size as a u32 (non-null, checked).
        let len = unsafe { info.cast::<u32>().read_unaligned() } as usize;
        if len < PARAM_INFO_SHARED_AT {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for (at, value) in [
            (PARAM_INFO_SIZE_AT, p.size),
            (PARAM_INFO_OFFSET_AT, p.offset),
            (PARAM_INFO_SHARED_AT, 0),
        ] {
            if at + 8 <= len {
                // SAFETY: within the `len` bytes the caller says the record has.
                unsafe { info.add(at).cast::<u64>().write_unaligned(value as u64) };
            }
        }
        Ok(())
    })
}

static FUNCTION_INFO_TABLE: Table<47> = Table({
    let mut t = every_slot_unknown!(FUNCTION_INFO;
        0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19
        20 21 22 23 24 25 26 27 28 29 30 31 32 33 34 35 36 37 38 39
        40 41 42 43 44 45 46);
    t[0] = size_of_table(47);
    t[0x21] = function_param_count as Slot;
    t[0x22] = function_param_info as Slot;
    t
});

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        b'A'..=b'F' => c - b'A' + 10,
        _ => panic!("not a hex digit"),
    }
}

/// Parses "XXXXXXXX-XXXX-XXXX-XXXX-XXXXXXXXXXXX" into the 16 bytes in the
/// order they are written.
const fn uuid(text: &str) -> [u8; 16] {
    let s = text.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut n) = (0, 0);
    while i < s.len() {
        if s[i] == b'-' {
            i += 1;
            continue;
        }
        out[n] = hex(s[i]) << 4 | hex(s[i + 1]);
        n += 1;
        i += 2;
    }
    out
}

/// The table for a UUID, if simgpu serves it.
pub(crate) fn lookup(id: &[u8; 16]) -> Option<*const c_void> {
    type Served = ([u8; 16], fn() -> *const c_void);
    const TABLES: [Served; 9] = [
        (uuid("6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9"), || {
            CUDART_INTERFACE.addr()
        }),
        (uuid("A094798C-2E74-2E74-93F2-0800200C0A66"), || {
            TOOLS_RUNTIME_HOOKS.addr()
        }),
        (uuid("42D85A81-23F6-CB47-8298-F6E78A3AECDC"), || {
            TOOLS_TLS.addr()
        }),
        (uuid("C693336E-1121-DF11-A8C3-68F355D89593"), || {
            CONTEXT_LOCAL_STORAGE.addr()
        }),
        (uuid("263E8860-7CD2-6143-92F6-BBD5006DFA7E"), || {
            CONTEXT_CHECKS.addr()
        }),
        (uuid("D4082055-BDE6-704B-8D34-BA123C66E1F2"), || {
            INTEGRITY_CHECK.addr()
        }),
        (uuid("21318C60-9714-3248-8CA6-41FF7324C8F2"), || {
            TOOLS_CONTEXT.addr()
        }),
        (uuid("1734DC26-800D-4745-8726-C0F1E7DD8BCA"), || {
            UNKNOWN_1734DC26.addr()
        }),
        (uuid("6E163FBE-B958-444D-835C-E182AFF1991E"), || {
            FUNCTION_INFO_TABLE.addr()
        }),
    ];
    TABLES.iter().find(|(u, _)| u == id).map(|(_, t)| t())
}

/// Every slot of every served table, for tests: (slot count, pointer).
#[cfg(test)]
fn all_slots() -> Vec<Vec<Slot>> {
    vec![
        CUDART_INTERFACE.0.to_vec(),
        TOOLS_RUNTIME_HOOKS.0.to_vec(),
        TOOLS_TLS.0.to_vec(),
        CONTEXT_LOCAL_STORAGE.0.to_vec(),
        CONTEXT_CHECKS.0.to_vec(),
        INTEGRITY_CHECK.0.to_vec(),
        TOOLS_CONTEXT.0.to_vec(),
        UNKNOWN_1734DC26.0.to_vec(),
        FUNCTION_INFO_TABLE.0.to_vec(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_slot_is_null_and_sizes_match() {
        for table in all_slots() {
            assert!(table.iter().all(|s| !s.is_null()));
        }
        assert_eq!(CUDART_INTERFACE.0[0] as usize, 13 * 8);
        assert_eq!(TOOLS_TLS.0[0] as usize, 4 * 8);
        // cuXtra reads slot 0x22 only when the size covers it.
        assert!(FUNCTION_INFO_TABLE.0[0] as usize >= 0x23 * 8);
    }

    #[test]
    fn uuids_parse_in_written_order() {
        let u = uuid("6BD5FB6C-5BF4-E74A-8987-D93912FD9DF9");
        assert_eq!(u[..4], [0x6B, 0xD5, 0xFB, 0x6C]);
        assert_eq!(u[15], 0xF9);
        assert!(lookup(&u).is_some());
        assert!(lookup(&uuid("F8CFF951-2146-8B4E-B9E2-FB469E7C0DD9")).is_none());
    }
}
