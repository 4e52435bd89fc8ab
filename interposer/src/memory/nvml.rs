//! NVML memory queries in the tenant's process report its budget, as
//! `cuMemGetInfo` does: PyTorch (`torch.cuda.mem_get_info` falls back to it,
//! `torch.cuda.list_gpu_processes`, the caching allocator's OOM report),
//! vLLM's profiling and `pynvml` users ask NVML how big the GPU is.
//!
//! # How calls are reached
//! Programs reach NVML by linking `libnvidia-ml.so.1` (the preloaded
//! library's exports below win, as for the driver) or by
//! `dlopen("libnvidia-ml.so.1")` + `dlsym` (PyTorch, pynvml via ctypes),
//! which the interposer's `dlsym` override answers with the same exports.
//! The real functions are resolved with the real `dlsym` on a handle of
//! `libnvidia-ml.so.1`, opened lazily on the first call (glibc returns the
//! library the program already loaded).
//!
//! # The table
//! NVML is a second library with its own status type, so its hooks are a
//! separate declarative table ([`nvml_table!`]) rather than rows of the
//! driver's: each row generates the exported wrapper (panics contained as
//! for driver hooks), a slot for the real function, and the `dlsym` answer.
//!
//! # Which device
//! NVML numbers every GPU of the machine and ignores `CUDA_VISIBLE_DEVICES`;
//! budgets are per CUDA device as the program sees it. An NVML device is
//! matched to the CUDA device with the same PCI domain, bus and device
//! numbers (`nvmlDeviceGetPciInfo` against `cuDeviceGetAttribute` with
//! `CU_DEVICE_ATTRIBUTE_PCI_{DOMAIN,BUS,DEVICE}_ID`). A GPU the program
//! cannot see through CUDA, or one whose CUDA device has no budget, is
//! reported unchanged, as is every answer when no budget is configured.
//! Before the program has initialised CUDA (vLLM asks NVML, then forks its
//! engine), the driver is not asked (initialising it would make CUDA
//! unusable in the program's children): the CUDA device is then the NVML
//! GPU's place among those `CUDA_VISIBLE_DEVICES` selects
//! ([`crate::driver::nvml::cuda_visible_nvml_devices`]).
//!
//! # What is reported
//! `total` = min(budget, real total); `free` = min(budget − tenant's usage,
//! real free), never below 0; `used` = `total − free`. `nvmlMemory_v2_t`'s
//! `reserved` (memory the driver sets aside) is reported as 0: inside a
//! budget it is part of nothing the tenant can use, so total = reserved +
//! free + used still holds. The usage is the tenant ledger's, across all its
//! processes; an NVML query charges nothing itself.

use core::cell::Cell;
use std::sync::OnceLock;

use dilu_abi::cuda::sys::CUdevice;

use crate::driver::devices;
use crate::driver::nvml::{
    NVML_ERROR_FUNCTION_NOT_FOUND, NVML_SUCCESS, NvmlDevice, NvmlMemory, NvmlMemoryV2, NvmlReturn,
    cuda_pci_location, cuda_visible_nvml_devices, nvml_pci_location, real_nvml,
};
use crate::memory::budget::{self, MemoryBudget};
use crate::table::Row;

/// Generates, for each row `handler => fn nvmlName(args);`: the exported
/// wrapper (the real function from [`real_nvml`], whose nvml.h signature
/// the wrapper must have, body under [`crate::table::ffi::entry_named`]) and
/// a `ROWS` entry for the `dlsym` answer. A handler has the shape
/// `fn(next: impl FnOnce(args...) -> NvmlReturn, args...) -> NvmlReturn`.
macro_rules! nvml_table {
    ( $( $handler:path => fn $name:ident ( $( $arg:ident : $ty:ty ),* $(,)? ); )* ) => {
        #[allow(non_camel_case_types)]
        #[derive(Clone, Copy)]
        #[repr(usize)]
        enum NvmlId { $( $name, )* }

        const COUNT: usize = [$( stringify!($name), )*].len();

        /// C name and wrapper of every row, indexed by `NvmlId`.
        static ROWS: [Row; COUNT] = [
            $( Row {
                name: crate::table::cstr(concat!(stringify!($name), "\0")),
                wrapper: $name as *const (),
                per_thread: false,
            }, )*
        ];

        $(
            #[doc = concat!(
                "Exported interposer for NVML's `", stringify!($name), "`.\n\n",
                "# Safety\n\nC ABI entry point; the caller's obligations are those of the ",
                "NVML function of the same name in `nvml.h`."
            )]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn $name( $( $arg : $ty ),* ) -> NvmlReturn {
                const ID: usize = NvmlId::$name as usize;
                let Some(real) = real_nvml().$name() else {
                    return NVML_ERROR_FUNCTION_NOT_FOUND;
                };
                // Compiles only if this wrapper has the real function's type
                // (an array's elements share one type).
                let _same_signature = [real, $name];
                let done = Cell::new(None);
                let next = | $( $arg : $ty ),* | -> NvmlReturn {
                    // SAFETY: forwards the caller's arguments to the real
                    // function of the same ABI.
                    let r = unsafe { real( $( $arg ),* ) };
                    done.set(Some(r));
                    r
                };
                match crate::table::ffi::entry_named(
                    ROWS[ID].name,
                    &done,
                    || $handler(next, $( $arg ),* ),
                ) {
                    Ok(result) => result,
                    // SAFETY: as above; only reached when the handler
                    // panicked before calling the real function.
                    Err(_) => crate::table::ffi::fall_through(|| unsafe { real( $( $arg ),* ) }),
                }
            }
        )*
    };
}

nvml_table! {
    memory_info => fn nvmlDeviceGetMemoryInfo(device: NvmlDevice, memory: *mut NvmlMemory);
    memory_info => fn nvmlDeviceGetMemoryInfo_v2(device: NvmlDevice, memory: *mut NvmlMemoryV2);
}

/// Our wrapper for an NVML name, for the `dlsym` override.
pub fn wrapper_for_name(name: &[u8]) -> Option<usize> {
    ROWS.iter()
        .find(|row| row.name.to_bytes() == name)
        .map(Row::wrapper_addr)
}

/// PCI (domain, bus, device) of every CUDA device, by ordinal, from the
/// driver; asked only once the program has initialised it.
fn cuda_pci_locations(budget: &MemoryBudget) -> &'static [(u32, u32, u32)] {
    static LOCATIONS: OnceLock<Vec<(u32, u32, u32)>> = OnceLock::new();
    LOCATIONS.get_or_init(|| {
        (0..budget.device_count() as CUdevice)
            .map_while(cuda_pci_location)
            .collect()
    })
}

/// The CUDA ordinal of NVML `device`, never initialising the driver (see
/// [`crate::driver::devices`]): by PCI location against the driver's devices
/// once the program has initialised it, before that by its place among the
/// GPUs CUDA will see, as NVML lists them.
fn cuda_ordinal(budget: &MemoryBudget, device: NvmlDevice) -> Option<usize> {
    let location = nvml_pci_location(device)?;
    if devices::initialised_device_count().is_some() {
        return cuda_pci_locations(budget)
            .iter()
            .position(|&l| l == location);
    }
    cuda_visible_nvml_devices()?
        .into_iter()
        .position(|d| nvml_pci_location(d) == Some(location))
}

/// What a budgeted device reports instead of (real total, real free):
/// `None` when NVML `device` is not a CUDA device with a budget.
fn budget_view(device: NvmlDevice, total: u64, free: u64) -> Option<(u64, u64)> {
    let b = budget::get()?;
    let cuda = cuda_ordinal(b, device)?;
    crate::memory::graph_memory::reconcile_all();
    b.view(cuda, total, free)
}

/// An NVML memory answer (`nvmlMemory_t` or `nvmlMemory_v2_t`).
trait MemoryAnswer {
    /// (total, free) as NVML reported them.
    fn reported(&self) -> (u64, u64);
    /// Replaces the answer with a budget's view.
    fn rewrite(&mut self, total: u64, free: u64);
}

impl MemoryAnswer for NvmlMemory {
    fn reported(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn rewrite(&mut self, total: u64, free: u64) {
        (self.total, self.free, self.used) = (total, free, total - free);
    }
}

impl MemoryAnswer for NvmlMemoryV2 {
    fn reported(&self) -> (u64, u64) {
        (self.total, self.free)
    }
    fn rewrite(&mut self, total: u64, free: u64) {
        (self.total, self.reserved, self.free, self.used) = (total, 0, free, total - free);
    }
}

/// `nvmlDeviceGetMemoryInfo` and `_v2`: NVML answers, then a budgeted
/// device's answer is rewritten.
fn memory_info<M: MemoryAnswer>(
    next: impl FnOnce(NvmlDevice, *mut M) -> NvmlReturn,
    device: NvmlDevice,
    memory: *mut M,
) -> NvmlReturn {
    let result = next(device, memory);
    if result != NVML_SUCCESS || memory.is_null() {
        return result;
    }
    // SAFETY: non-null, and NVML just filled it.
    let m = unsafe { &mut *memory };
    let (total, free) = m.reported();
    if let Some((total, free)) = budget_view(device, total, free) {
        m.rewrite(total, free);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_match_nvml_h() {
        // nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24.
        assert_eq!(core::mem::size_of::<NvmlMemoryV2>(), 40);
        assert_eq!(core::mem::offset_of!(NvmlMemoryV2, total), 8);
        assert_eq!(core::mem::offset_of!(NvmlMemoryV2, used), 32);
        assert_eq!(core::mem::size_of::<NvmlMemory>(), 24);
    }

    #[test]
    fn the_dlsym_answer_is_the_exported_wrapper() {
        assert_eq!(
            wrapper_for_name(b"nvmlDeviceGetMemoryInfo_v2"),
            Some(nvmlDeviceGetMemoryInfo_v2 as *const () as usize)
        );
        assert_eq!(wrapper_for_name(b"nvmlDeviceGetCount_v2"), None);
    }
}
