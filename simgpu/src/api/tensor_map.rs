//! `cuTensorMapEncodeTiled`: the TMA descriptor Hopper kernels (FlashAttention
//! 3, CUTLASS) are given. The parameters are checked as cuda.h states the
//! driver checks them; the 128-byte map is opaque to the program and read by
//! no simulated kernel (simgpu runs no device code), so it holds the
//! parameters in simgpu's own layout, for tests and debugging.

use super::read;
use crate::Res;
use crate::driver::drv;
use dilu_abi::cuda::*;
use std::ffi::{c_int, c_void};

export! {
    fn cuTensorMapEncodeTiled(
        map: *mut [u64; 16], data_type: c_int, rank: u32, address: *mut c_void,
        dims: *const u64, strides: *const u64, box_dims: *const u32, element_strides: *const u32,
        interleave: c_int, swizzle: c_int, l2_promotion: c_int, oob_fill: c_int
    ) => encode_tiled;
}

/// `CU_TENSOR_MAP_INTERLEAVE_32B`.
const INTERLEAVE_32B: c_int = 2;
/// The packed 4- and 6-bit types (`CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B`
/// onward), whose extra rules simgpu does not check.
const FIRST_PACKED_TYPE: c_int = 13;

/// Bytes per element of a `CUtensorMapDataType` (cuda.h's list), `None`
/// for a value outside it; packed types count as 1 byte (not checked).
fn element_bytes(data_type: c_int) -> Option<u64> {
    Some(match data_type {
        0 => 1,
        1 | 6 | 9 => 2,
        2 | 3 | 7 | 10..=12 => 4,
        4 | 5 | 8 => 8,
        13..=15 => 1,
        _ => return None,
    })
}

/// Reads `n` values of an array argument.
fn array<T: Copy>(p: *const T, n: usize) -> Res<Vec<T>> {
    (0..n)
        // SAFETY: `read` checks null; the caller passes `n` values.
        .map(|i| read(unsafe { p.add(i) }))
        .collect()
}

#[allow(clippy::too_many_arguments)]
fn encode_tiled(
    _: bool,
    map: *mut [u64; 16],
    data_type: c_int,
    rank: u32,
    address: *mut c_void,
    dims: *const u64,
    strides: *const u64,
    box_dims: *const u32,
    element_strides: *const u32,
    interleave: c_int,
    swizzle: c_int,
    l2_promotion: c_int,
    oob_fill: c_int,
) -> Res {
    drv()?;
    let invalid = Err(CUDA_ERROR_INVALID_VALUE);
    let Some(element) = element_bytes(data_type) else {
        return invalid;
    };
    let interleaved = interleave != 0;
    let address_align = if interleave == INTERLEAVE_32B { 32 } else { 16 };
    if map.is_null()
        || !(map as usize).is_multiple_of(64)
        || !(1..=5).contains(&rank)
        || (interleaved && rank < 3)
        || !(0..=2).contains(&interleave)
        || !(0..=6).contains(&swizzle)
        || !(0..=3).contains(&l2_promotion)
        || !(0..=1).contains(&oob_fill)
        || address.is_null()
        || !(address as usize).is_multiple_of(address_align)
    {
        return invalid;
    }
    let rank = rank as usize;
    let dims = array(dims, rank)?;
    let strides = if rank > 1 {
        array(strides, rank - 1)?
    } else {
        Vec::new()
    };
    let box_dims = array(box_dims, rank)?;
    let element_strides = array(element_strides, rank)?;
    let stride_align = if interleave == INTERLEAVE_32B { 32 } else { 16 };
    if dims.iter().any(|&d| d == 0 || d > 1 << 32)
        || strides
            .iter()
            .any(|&s| !s.is_multiple_of(stride_align) || s >= 1 << 40)
        || box_dims.iter().any(|&b| b == 0 || b > 256)
        || element_strides.iter().any(|&e| e == 0 || e > 8)
        || (!interleaved
            && data_type < FIRST_PACKED_TYPE
            && !(box_dims[0] as u64 * element).is_multiple_of(16))
    {
        return invalid;
    }
    let mut words = [0u64; 16];
    words[0] = address as u64;
    words[1..=rank].copy_from_slice(&dims);
    words[6..6 + strides.len()].copy_from_slice(&strides);
    for (i, (&b, &e)) in box_dims.iter().zip(&element_strides).enumerate() {
        words[10 + i] = (b as u64) | (e as u64) << 16;
    }
    words[15] = data_type as u64
        | (rank as u64) << 8
        | (interleave as u64) << 16
        | (swizzle as u64) << 24
        | (l2_promotion as u64) << 32
        | (oob_fill as u64) << 40;
    // SAFETY: `map` is non-null and 64-byte aligned (checked), and the
    // caller passes a CUtensorMap (16 u64).
    unsafe { map.write(words) };
    Ok(())
}
