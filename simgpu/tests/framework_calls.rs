//! Driver calls PyTorch and vLLM make beyond allocations and launches,
//! checked on libsimgpu.so as a program sees them: pointer attributes
//! (`torch.Tensor.is_pinned`, `pin_memory`), host registration and mapped
//! device pointers, a captured graph's nodes (torch at capture end), the
//! thread's capture mode, and Hopper tensor maps (FlashAttention 3).

mod common;

use common::*;
use std::ffi::{c_int, c_uint, c_void};

const INVALID_VALUE: u32 = 1;
const HOST_MEMORY_ALREADY_REGISTERED: u32 = 712;
const HOST_MEMORY_NOT_REGISTERED: u32 = 713;

/// `CUpointer_attribute` and `CUmemorytype` values from cuda.h.
const CONTEXT: c_int = 1;
const MEMORY_TYPE: c_int = 2;
const DEVICE_POINTER: c_int = 3;
const DEVICE_ORDINAL: c_int = 9;
const RANGE_START_ADDR: c_int = 11;
const RANGE_SIZE: c_int = 12;
const MEMORYTYPE_HOST: c_uint = 1;
const MEMORYTYPE_DEVICE: c_uint = 2;

#[test]
fn child_entry() {
    let Ok(role) = std::env::var("SIMGPU_TEST_ROLE") else {
        return;
    };
    match role.as_str() {
        "pointers" => role_pointers(),
        "host_register" => role_host_register(),
        "graph_nodes" => role_graph_nodes(),
        "tensor_map" => role_tensor_map(),
        other => panic!("unknown role {other}"),
    }
}

type GetAttribute = unsafe extern "C" fn(*mut c_void, c_int, Dptr) -> u32;
type GetAttributes = unsafe extern "C" fn(c_uint, *const c_int, *mut *mut c_void, Dptr) -> u32;
type AllocHost = unsafe extern "C" fn(*mut *mut c_void, usize) -> u32;

fn memory_type(p: Dptr) -> Result<c_uint, u32> {
    let get: GetAttribute = Lib::open().f("cuPointerGetAttribute");
    let mut t: c_uint = 99;
    // SAFETY: MEMORY_TYPE writes an unsigned int.
    match unsafe { get((&raw mut t).cast(), MEMORY_TYPE, p) } {
        0 => Ok(t),
        e => Err(e),
    }
}

fn role_pointers() {
    let a = Api::setup();
    let lib = Lib::open();
    let get: GetAttribute = lib.f("cuPointerGetAttribute");
    let get_all: GetAttributes = lib.f("cuPointerGetAttributes");
    let alloc_host: AllocHost = lib.f("cuMemAllocHost_v2");
    let device = a.alloc(1 << 20).unwrap();
    let mut pinned: *mut c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { alloc_host(&mut pinned, 4096) }, 0);
    let pageable = vec![0u8; 4096];

    // Device memory: its type, device, and the allocation holding it.
    assert_eq!(memory_type(device + 100), Ok(MEMORYTYPE_DEVICE));
    let (mut start, mut size, mut ordinal) = (0u64, 0usize, -1 as c_int);
    let mut ctx: H = std::ptr::null_mut();
    let mut current: H = std::ptr::null_mut();
    let get_current: unsafe extern "C" fn(*mut H) -> u32 = lib.f("cuCtxGetCurrent");
    // SAFETY: each out-pointer has its attribute's type.
    unsafe {
        assert_eq!(
            get((&raw mut start).cast(), RANGE_START_ADDR, device + 100),
            0
        );
        assert_eq!(get((&raw mut size).cast(), RANGE_SIZE, device + 100), 0);
        assert_eq!(
            get((&raw mut ordinal).cast(), DEVICE_ORDINAL, device + 100),
            0
        );
        assert_eq!(get((&raw mut ctx).cast(), CONTEXT, device), 0);
        assert_eq!(get_current(&mut current), 0);
    }
    assert_eq!((start, size, ordinal), (device, 1 << 20, 0));
    assert_eq!(
        ctx, current,
        "allocated in the primary context made current"
    );

    // Page-locked host memory is HOST, reached from the device at its address.
    assert_eq!(memory_type(pinned as Dptr), Ok(MEMORYTYPE_HOST));
    let mut dptr: Dptr = 0;
    // SAFETY: DEVICE_POINTER writes a CUdeviceptr.
    let rc = unsafe { get((&raw mut dptr).cast(), DEVICE_POINTER, pinned as Dptr + 8) };
    assert_eq!(rc, 0);
    assert_eq!(dptr, pinned as Dptr + 8);

    // Pageable memory is no CUDA pointer: an error for one attribute, empty
    // answers and success for several (how cudart reports "unregistered").
    assert_eq!(memory_type(pageable.as_ptr() as Dptr), Err(INVALID_VALUE));
    let attributes = [MEMORY_TYPE, DEVICE_POINTER, DEVICE_ORDINAL];
    let (mut t, mut d, mut o) = (7 as c_uint, 7 as Dptr, 7 as c_int);
    let mut slots: [*mut c_void; 3] = [
        (&raw mut t).cast(),
        (&raw mut d).cast(),
        (&raw mut o).cast(),
    ];
    // SAFETY: three attributes, three slots of their types.
    let rc = unsafe {
        get_all(
            3,
            attributes.as_ptr(),
            slots.as_mut_ptr(),
            pageable.as_ptr() as Dptr,
        )
    };
    assert_eq!((rc, t, d, o), (0, 0, 0, 0));
    // The same call on pinned memory answers every attribute.
    // SAFETY: as above.
    let rc = unsafe { get_all(3, attributes.as_ptr(), slots.as_mut_ptr(), pinned as Dptr) };
    assert_eq!((rc, t, d, o), (0, MEMORYTYPE_HOST, pinned as Dptr, 0));

    // A freed allocation is no longer a CUDA pointer.
    // SAFETY: a pointer from cuMemAlloc, freed once.
    assert_eq!(unsafe { (a.mem_free)(device) }, 0);
    assert_eq!(memory_type(device + 100), Err(INVALID_VALUE));
    println!("OK");
}

fn role_host_register() {
    let _a = Api::setup();
    let lib = Lib::open();
    let register: unsafe extern "C" fn(*mut c_void, usize, c_uint) -> u32 =
        lib.f("cuMemHostRegister_v2");
    let unregister: unsafe extern "C" fn(*mut c_void) -> u32 = lib.f("cuMemHostUnregister");
    let device_pointer: unsafe extern "C" fn(*mut Dptr, *mut c_void, c_uint) -> u32 =
        lib.f("cuMemHostGetDevicePointer_v2");
    let mut buffer = vec![0u8; 1 << 16];
    let p = buffer.as_mut_ptr().cast::<c_void>();
    let mut d: Dptr = 0;
    // SAFETY: `buffer` outlives every use; out-pointers are valid.
    unsafe {
        // Pageable until registered.
        assert_eq!(device_pointer(&mut d, p, 0), INVALID_VALUE);
        assert_eq!(memory_type(p as Dptr), Err(INVALID_VALUE));
        assert_eq!(register(p, buffer.len(), 0x02), 0); // DEVICEMAP
        assert_eq!(memory_type(p as Dptr + 100), Ok(MEMORYTYPE_HOST));
        assert_eq!(device_pointer(&mut d, p.add(100), 0), 0);
        assert_eq!(d, p as Dptr + 100);
        assert_eq!(
            device_pointer(&mut d, p, 1),
            INVALID_VALUE,
            "flags must be 0"
        );
        // Overlapping ranges cannot be registered twice.
        assert_eq!(
            register(p.add(4096), 4096, 0),
            HOST_MEMORY_ALREADY_REGISTERED
        );
        assert_eq!(register(p, 4096, 0x100), INVALID_VALUE, "unknown flag");
        // Unregistering takes the base address; the memory stays the program's.
        assert_eq!(unregister(p.add(4096)), HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(unregister(p), 0);
        assert_eq!(unregister(p), HOST_MEMORY_NOT_REGISTERED);
        assert_eq!(memory_type(p as Dptr), Err(INVALID_VALUE));
    }
    buffer[0] = 1; // still ours to write
    println!("OK");
}

fn role_graph_nodes() {
    let a = Api::setup();
    let lib = Lib::open();
    let get_nodes: unsafe extern "C" fn(H, *mut H, *mut usize) -> u32 = lib.f("cuGraphGetNodes");
    let exchange: unsafe extern "C" fn(*mut c_int) -> u32 =
        lib.f("cuThreadExchangeStreamCaptureMode");
    let f = a.function(PTX, "k");
    let mut stream: H = std::ptr::null_mut();
    let mut graph: H = std::ptr::null_mut();
    let mut mode: c_int = 2; // RELAXED, as torch sets it around captures
    // SAFETY: valid handles and out-pointers.
    unsafe {
        assert_eq!((a.stream_create)(&mut stream, 1), 0);
        assert_eq!(exchange(&mut mode), 0);
        assert_eq!(mode, 0, "the thread's mode was GLOBAL");
        assert_eq!((a.begin_capture)(stream, 0), 0);
        for _ in 0..3 {
            assert_eq!(a.launch_grid(f, [1, 1, 1], stream), 0);
        }
        assert_eq!((a.end_capture)(stream, &mut graph), 0);
        let mut back: c_int = 0;
        assert_eq!(exchange(&mut back), 0);
        assert_eq!(back, 2, "the mode set before is returned");
        let mut bad: c_int = 3;
        assert_eq!(exchange(&mut bad), INVALID_VALUE);

        let mut count = 0usize;
        assert_eq!(get_nodes(graph, std::ptr::null_mut(), &mut count), 0);
        assert_eq!(count, 3, "one node per captured launch");
        let mut nodes: [H; 5] = [1 as H; 5];
        let mut room = nodes.len();
        assert_eq!(get_nodes(graph, nodes.as_mut_ptr(), &mut room), 0);
        assert_eq!(room, 3);
        assert!(nodes[..3].iter().all(|n| !n.is_null()));
        assert!(
            nodes[3..].iter().all(|n| n.is_null()),
            "the rest set to NULL"
        );
        let mut two = 2usize;
        assert_eq!(get_nodes(graph, nodes.as_mut_ptr(), &mut two), 0);
        assert_eq!(two, 2, "no more than asked for");
    }
    println!("OK");
}

type EncodeTiled = unsafe extern "C" fn(
    *mut [u64; 16],
    c_int,
    u32,
    *mut c_void,
    *const u64,
    *const u64,
    *const u32,
    *const u32,
    c_int,
    c_int,
    c_int,
    c_int,
) -> u32;

#[repr(C, align(64))]
struct TensorMap([u64; 16]);

fn role_tensor_map() {
    let a = Api::setup();
    let encode: EncodeTiled = Lib::open().f("cuTensorMapEncodeTiled");
    let base = a.alloc(1 << 20).unwrap();
    // A 2-D bf16 tensor of 64 x 512, rows 1 KiB apart, 64 x 64 boxes, 128B swizzle.
    let dims = [512u64, 64];
    let strides = [1024u64];
    let boxes = [64u32, 64];
    let steps = [1u32, 1];
    let mut map = TensorMap([0; 16]);
    let call = |map: &mut TensorMap, address: u64, strides: &[u64; 1], boxes: &[u32; 2]| {
        // SAFETY: arrays of the rank's length; a 64-byte-aligned map.
        unsafe {
            encode(
                &mut map.0,
                9,
                2,
                address as *mut c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                steps.as_ptr(),
                0,
                3,
                2,
                0,
            )
        }
    };
    assert_eq!(call(&mut map, base, &strides, &boxes), 0);
    assert_eq!(map.0[0], base, "the map describes the tensor's memory");
    assert_eq!(&map.0[1..3], &dims);
    // The driver's rules, from cuda.h.
    assert_eq!(
        call(&mut map, base + 8, &strides, &boxes),
        INVALID_VALUE,
        "16-byte aligned address"
    );
    assert_eq!(
        call(&mut map, base, &[1000], &boxes),
        INVALID_VALUE,
        "strides a multiple of 16"
    );
    assert_eq!(
        call(&mut map, base, &strides, &[300, 64]),
        INVALID_VALUE,
        "box at most 256"
    );
    assert_eq!(
        call(&mut map, base, &strides, &[4, 64]),
        INVALID_VALUE,
        "box row a multiple of 16 bytes"
    );
    println!("OK");
}

fn run(role: &str) {
    let inst = Instance::new(role);
    let out = run_child(
        role,
        &[("SIMGPU_INSTANCE", &inst.0), ("SIMGPU_MEMORY", "1GiB")],
    );
    assert!(out.contains("OK"), "{out}");
}

#[test]
fn pointer_attributes_tell_device_pinned_and_pageable_memory_apart() {
    run("pointers");
}

#[test]
fn registered_host_memory_is_pinned_until_unregistered() {
    run("host_register");
}

#[test]
fn a_captured_graph_lists_its_nodes_and_the_capture_mode_is_per_thread() {
    run("graph_nodes");
}

#[test]
fn tensor_maps_are_encoded_and_checked_as_cuda_h_states() {
    run("tensor_map");
}
