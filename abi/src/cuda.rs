//! CUDA driver ABI vocabulary.
//!
//! Handle and struct types come from `cudarc::driver::sys` (generated from
//! NVIDIA's `cuda.h`). `CUresult` is carried as a plain `u32` across our FFI
//! edges: a driver may return codes newer than the bindings know, and a Rust
//! enum holding an unknown discriminant is undefined behaviour.

pub use cudarc::driver::sys;

/// Raw driver status code, as returned across the C ABI.
pub type CUresult = u32;

macro_rules! results {
    ($($name:ident),* $(,)?) => {
        $(pub const $name: CUresult = sys::cudaError_enum::$name as CUresult;)*
    };
}

results!(
    CUDA_SUCCESS,
    CUDA_ERROR_INVALID_VALUE,
    CUDA_ERROR_OUT_OF_MEMORY,
    CUDA_ERROR_NOT_INITIALIZED,
    CUDA_ERROR_DEINITIALIZED,
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_INVALID_DEVICE,
    CUDA_ERROR_INVALID_IMAGE,
    CUDA_ERROR_INVALID_CONTEXT,
    CUDA_ERROR_INVALID_HANDLE,
    CUDA_ERROR_MAP_FAILED,
    CUDA_ERROR_NOT_FOUND,
    CUDA_ERROR_NOT_READY,
    CUDA_ERROR_ILLEGAL_ADDRESS,
    CUDA_ERROR_LAUNCH_FAILED,
    CUDA_ERROR_NOT_SUPPORTED,
    CUDA_ERROR_NOT_PERMITTED,
    CUDA_ERROR_INVALID_PTX,
    CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED,
    CUDA_ERROR_UNKNOWN,
);

/// `cuGetProcAddress` flags (`CUdriverProcAddress_flags`).
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult` values written to `symbolStatus`.
pub const CU_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// Special stream handles from `cuda.h`.
pub const CU_STREAM_LEGACY: usize = 0x1;
pub const CU_STREAM_PER_THREAD: usize = 0x2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn result_codes_match_cuda_h() {
        // Values fixed by cuda.h; a wrong binding here would mislead every client.
        assert_eq!(CUDA_SUCCESS, 0);
        assert_eq!(CUDA_ERROR_OUT_OF_MEMORY, 2);
        assert_eq!(CUDA_ERROR_NOT_FOUND, 500);
        assert_eq!(CUDA_ERROR_NOT_SUPPORTED, 801);
    }
}
