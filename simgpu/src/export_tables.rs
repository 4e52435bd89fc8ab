//! The private tables `cuGetExportTable` serves to NVIDIA's runtime
//! (cudart and the static copies inside cuBLAS and friends). Without them
//! cudart cannot initialise on a driver.
//!
//! Each table is an array of pointers; unless noted, slot 0 holds the
//! table's size in bytes. UUIDs, slots and signatures were reverse-engineered
//! by ZLUDA (vosen/ZLUDA, `dark_api`) and checked against cudart 12.9 and
//! 13.2 (`shared/research/real-cudart-on-simgpu.md`). Every slot holds a
//! function: the ones whose meaning is unknown return
//! `CUDA_ERROR_NOT_SUPPORTED` (and are logged with `SIMGPU_LOG_ERRORS=1`), so
//! no caller ever jumps to NULL.

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

/// Fills a slot whose meaning is unknown: refuses, naming itself in the log.
macro_rules! unknown_slot {
    ($name:ident, $label:literal) => {
        extern "C" fn $name() -> CUresult {
            guard($label, || Err(CUDA_ERROR_NOT_SUPPORTED))
        }
    };
}

unknown_slot!(cudart_3, "export table CUDART_INTERFACE[3]");
unknown_slot!(cudart_4, "export table CUDART_INTERFACE[4]");
unknown_slot!(cudart_5, "export table CUDART_INTERFACE[5]");
unknown_slot!(cudart_9, "export table CUDART_INTERFACE[9]");
unknown_slot!(cudart_10, "export table CUDART_INTERFACE[10]");
unknown_slot!(cudart_11, "export table CUDART_INTERFACE[11]");
unknown_slot!(hooks_1, "export table TOOLS_RUNTIME_HOOKS[1]");
unknown_slot!(hooks_3, "export table TOOLS_RUNTIME_HOOKS[3]");
unknown_slot!(hooks_4, "export table TOOLS_RUNTIME_HOOKS[4]");
unknown_slot!(hooks_5, "export table TOOLS_RUNTIME_HOOKS[5]");
unknown_slot!(tls_1, "export table TOOLS_TLS[1]");
unknown_slot!(tls_2, "export table TOOLS_TLS[2]");
unknown_slot!(tls_3, "export table TOOLS_TLS[3]");
unknown_slot!(storage_3, "export table CONTEXT_LOCAL_STORAGE[3]");
unknown_slot!(checks_1, "export table CONTEXT_CHECKS[1]");
unknown_slot!(integrity_2, "export table INTEGRITY_CHECK[2]");

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

static CUDART_INTERFACE: Table<13> = Table([
    size_of_table(13),
    cudart_load_wrapper as Slot,
    cudart_primary_ctx as Slot,
    cudart_3 as Slot,
    cudart_4 as Slot,
    cudart_5 as Slot,
    cudart_load_wrapper_ext as Slot,
    cudart_notify as Slot,
    cudart_load_fatbin as Slot,
    cudart_9 as Slot,
    cudart_10 as Slot,
    cudart_11 as Slot,
    cudart_load_compilers as Slot,
]);

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

static TOOLS_RUNTIME_HOOKS: Table<7> = Table([
    size_of_table(7),
    hooks_1 as Slot,
    hooks_buffer_a as Slot,
    hooks_3 as Slot,
    hooks_4 as Slot,
    hooks_5 as Slot,
    hooks_buffer_b as Slot,
]);

// --- TOOLS_TLS {42D85A81-23F6-CB47-8298-F6E78A3AECDC} ---

static TOOLS_TLS: Table<4> = Table([
    size_of_table(4),
    tls_1 as Slot,
    tls_2 as Slot,
    tls_3 as Slot,
]);

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

static CONTEXT_LOCAL_STORAGE: Table<4> = Table([
    storage_put as Slot,
    storage_delete as Slot,
    storage_get as Slot,
    storage_3 as Slot,
]);

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

static CONTEXT_CHECKS: Table<4> = Table([
    size_of_table(4),
    checks_1 as Slot,
    checks_context as Slot,
    checks_zero as Slot,
]);

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

static INTEGRITY_CHECK: Table<3> = Table([
    size_of_table(3),
    integrity_check as Slot,
    integrity_2 as Slot,
]);

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
    const TABLES: [Served; 6] = [
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
