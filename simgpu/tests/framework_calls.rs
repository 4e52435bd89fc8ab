//! Driver calls PyTorch and vLLM make beyond allocations and launches,
//! checked on libsimgpu.so as a program sees them: pointer attributes
//! (`torch.Tensor.is_pinned`, `pin_memory`), host registration and mapped
//! device pointers, a captured graph's nodes (torch at capture end), the
//! thread's capture mode, Hopper tensor maps (FlashAttention 3), and the
//! unified-memory hints (`cuMemAdvise`, `cuMemPrefetchAsync`: TGS advises
//! every allocation it turns into managed memory, PyTorch prefetches).

mod common;

use common::*;
use std::ffi::{c_int, c_uint, c_void};

const INVALID_VALUE: u32 = 1;
const INVALID_DEVICE: u32 = 101;
const INVALID_HANDLE: u32 = 400;
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
        "managed_hints" => role_managed_hints(),
        "managed_hints_per_thread" => role_managed_hints_per_thread(),
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

/// `CUmemLocation` by value, as cuda.h declares it.
#[repr(C)]
#[derive(Clone, Copy)]
struct Location {
    kind: c_int,
    id: c_int,
}

/// `CUmem_advise`, `CUmemLocationType` and `CU_DEVICE_CPU` from cuda.h.
const SET_READ_MOSTLY: c_int = 1;
const UNSET_READ_MOSTLY: c_int = 2;
const SET_PREFERRED_LOCATION: c_int = 3;
const UNSET_PREFERRED_LOCATION: c_int = 4;
const SET_ACCESSED_BY: c_int = 5;
const UNSET_ACCESSED_BY: c_int = 6;
const ADVICES: [c_int; 6] = [
    SET_READ_MOSTLY,
    UNSET_READ_MOSTLY,
    SET_PREFERRED_LOCATION,
    UNSET_PREFERRED_LOCATION,
    SET_ACCESSED_BY,
    UNSET_ACCESSED_BY,
];
const DEVICE_CPU: c_int = -1;
const LOCATION_INVALID: c_int = 0;
const LOCATION_DEVICE: c_int = 1;
const LOCATION_HOST: c_int = 2;
const LOCATION_HOST_NUMA_CURRENT: c_int = 4;
const DEVICE0: Location = Location {
    kind: LOCATION_DEVICE,
    id: 0,
};
const HOST: Location = Location {
    kind: LOCATION_HOST,
    id: 12345, // ignored for the host
};

type AllocManaged = unsafe extern "C" fn(*mut Dptr, usize, c_uint) -> u32;
type Advise = unsafe extern "C" fn(Dptr, usize, c_int, c_int) -> u32;
type AdviseV2 = unsafe extern "C" fn(Dptr, usize, c_int, Location) -> u32;
type Prefetch = unsafe extern "C" fn(Dptr, usize, c_int, H) -> u32;
type PrefetchV2 = unsafe extern "C" fn(Dptr, usize, Location, c_uint, H) -> u32;

fn alloc_managed(n: usize) -> Dptr {
    let alloc: AllocManaged = Lib::open().f("cuMemAllocManaged");
    let mut p: Dptr = 0;
    // SAFETY: valid out-pointer; CU_MEM_ATTACH_GLOBAL.
    assert_eq!(unsafe { alloc(&mut p, n, 1) }, 0);
    p
}

fn read_back(a: &Api, p: Dptr, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    // SAFETY: n writable bytes; p is n bytes of device memory.
    assert_eq!(unsafe { (a.dtoh)(v.as_mut_ptr().cast(), p, n) }, 0);
    v
}

fn role_managed_hints() {
    let a = Api::setup();
    let lib = Lib::open();
    let advise: Advise = lib.f("cuMemAdvise");
    let advise_v2: AdviseV2 = lib.f("cuMemAdvise_v2");
    let prefetch: Prefetch = lib.f("cuMemPrefetchAsync");
    let prefetch_v2: PrefetchV2 = lib.f("cuMemPrefetchAsync_v2");
    let memset_async: unsafe extern "C" fn(Dptr, u8, usize, H) -> u32 = lib.f("cuMemsetD8Async");
    let n = 1 << 20;
    let m = alloc_managed(n);
    let data: Vec<u8> = (0..n).map(|i| (i * 13 % 251) as u8).collect();
    // SAFETY: n readable bytes into n bytes of managed memory.
    assert_eq!(unsafe { (a.htod)(m, data.as_ptr().cast(), n) }, 0);
    let mut s: H = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { (a.stream_create)(&mut s, 1) }, 0);
    let pageable = vec![0u8; 4096];
    let plain = a.alloc(n).unwrap();

    // SAFETY: every pointer passed is a plain value the driver validates
    // (no call here writes through one); handles are live or deliberately
    // bogus.
    unsafe {
        // Every advice on managed memory, for the device, and where the
        // advice names a processor, for the CPU; any sub-range will do.
        for advice in ADVICES {
            assert_eq!(advise(m, n, advice, 0), 0, "advice {advice}");
            assert_eq!(advise(m + 4096, 4096, advice, DEVICE_CPU), 0);
            assert_eq!(advise_v2(m, n, advice, DEVICE0), 0, "v2 advice {advice}");
            assert_eq!(advise_v2(m + 100, 10, advice, HOST), 0);
        }
        // The device is ignored where cuda.h says so, checked elsewhere.
        for advice in [SET_READ_MOSTLY, UNSET_READ_MOSTLY, UNSET_PREFERRED_LOCATION] {
            assert_eq!(
                advise(m, n, advice, 7),
                0,
                "advice {advice} ignores the device"
            );
            let nowhere = Location {
                kind: LOCATION_INVALID,
                id: 7,
            };
            assert_eq!(advise_v2(m, n, advice, nowhere), 0);
        }
        for advice in [SET_PREFERRED_LOCATION, SET_ACCESSED_BY, UNSET_ACCESSED_BY] {
            assert_eq!(advise(m, n, advice, 1), INVALID_DEVICE, "one device only");
            assert_eq!(advise(m, n, advice, -2), INVALID_DEVICE);
            let device1 = Location {
                kind: LOCATION_DEVICE,
                id: 1,
            };
            assert_eq!(advise_v2(m, n, advice, device1), INVALID_DEVICE);
        }
        // A preferred location may be the thread's nearest host NUMA node;
        // accessed-by takes a device or the host, nothing else.
        let nearest = Location {
            kind: LOCATION_HOST_NUMA_CURRENT,
            id: 0,
        };
        assert_eq!(advise_v2(m, n, SET_PREFERRED_LOCATION, nearest), 0);
        assert_eq!(advise_v2(m, n, SET_ACCESSED_BY, nearest), INVALID_VALUE);
        let bogus = Location { kind: 99, id: 0 };
        assert_eq!(
            advise_v2(m, n, SET_PREFERRED_LOCATION, bogus),
            INVALID_VALUE
        );

        // Advice values outside CUmem_advise.
        for advice in [0, 7, -1] {
            assert_eq!(advise(m, n, advice, 0), INVALID_VALUE, "advice {advice}");
            assert_eq!(advise_v2(m, n, advice, DEVICE0), INVALID_VALUE);
        }
        // Zero bytes, a range past the allocation, memory that is not managed.
        assert_eq!(advise(m, 0, SET_READ_MOSTLY, 0), INVALID_VALUE);
        assert_eq!(advise(m, n + 1, SET_READ_MOSTLY, 0), INVALID_VALUE);
        assert_eq!(
            advise(m + n as Dptr - 16, 32, SET_READ_MOSTLY, 0),
            INVALID_VALUE
        );
        assert_eq!(advise(m - 256, 512, SET_READ_MOSTLY, 0), INVALID_VALUE);
        assert_eq!(advise(plain, 4096, SET_READ_MOSTLY, 0), INVALID_VALUE);
        assert_eq!(
            advise_v2(plain, 4096, SET_READ_MOSTLY, DEVICE0),
            INVALID_VALUE
        );
        let host = pageable.as_ptr() as Dptr;
        assert_eq!(
            advise(host, 4096, SET_PREFERRED_LOCATION, DEVICE_CPU),
            INVALID_VALUE
        );

        // Prefetches to the device and to the host, on a stream and on the
        // NULL stream, behind an async memset on the same stream.
        assert_eq!(memset_async(m + 8, 0x5a, 8, s), 0);
        assert_eq!(prefetch(m, n, 0, s), 0);
        assert_eq!(prefetch(m, n, DEVICE_CPU, s), 0);
        assert_eq!(prefetch(m + 4096, 4096, 0, std::ptr::null_mut()), 0);
        assert_eq!(prefetch_v2(m, n, DEVICE0, 0, s), 0);
        assert_eq!(prefetch_v2(m, n, HOST, 0, s), 0);
        assert_eq!(prefetch_v2(m, n, nearest, 0, std::ptr::null_mut()), 0);
        // What cuda.h refuses.
        assert_eq!(prefetch(m, n, 1, s), INVALID_DEVICE);
        assert_eq!(prefetch(m, n, -2, s), INVALID_DEVICE);
        let device1 = Location {
            kind: LOCATION_DEVICE,
            id: 1,
        };
        assert_eq!(prefetch_v2(m, n, device1, 0, s), INVALID_DEVICE);
        assert_eq!(
            prefetch_v2(m, n, DEVICE0, 1, s),
            INVALID_VALUE,
            "flags must be 0"
        );
        assert_eq!(prefetch_v2(m, n, bogus, 0, s), INVALID_VALUE);
        assert_eq!(prefetch(m, 0, 0, s), INVALID_VALUE);
        assert_eq!(prefetch(m + n as Dptr - 16, 32, 0, s), INVALID_VALUE);
        assert_eq!(prefetch(plain, 4096, 0, s), INVALID_VALUE);
        assert_eq!(prefetch_v2(plain, 4096, DEVICE0, 0, s), INVALID_VALUE);
        assert_eq!(prefetch(host, 4096, DEVICE_CPU, s), INVALID_VALUE);
        // A stream handle that is none, as every stream call answers it.
        let bad: H = 0xdead_0000usize as H;
        assert_eq!(prefetch(m, n, 0, bad), INVALID_HANDLE);
        assert_eq!(prefetch_v2(m, n, DEVICE0, 0, bad), INVALID_HANDLE);
        assert_eq!((a.stream_sync)(s), 0);
    }
    // Hints move no data: what was written (and the memset before the
    // prefetches) reads back unchanged.
    let mut expect = data.clone();
    expect[8..16].fill(0x5a);
    assert!(read_back(&a, m, n) == expect, "data unchanged by the hints");

    // A freed managed allocation is no longer managed, nor is device memory
    // allocated after it (at the same address or not).
    // SAFETY: pointers from cuMemAllocManaged / cuMemAlloc, freed once.
    unsafe {
        assert_eq!((a.mem_free)(plain), 0);
        assert_eq!((a.mem_free)(m), 0);
        assert_eq!(advise(m, n, SET_READ_MOSTLY, 0), INVALID_VALUE);
        let again = a.alloc(n).unwrap();
        assert_eq!(advise(again, n, SET_READ_MOSTLY, 0), INVALID_VALUE);
        assert_eq!(prefetch(again, n, 0, s), INVALID_VALUE);
        assert_eq!((a.mem_free)(again), 0);
    }
    println!("OK");
}

/// cudart 12.9 asks for `cuMemAdvise` and `cuMemPrefetchAsync` at 8000 and
/// 12020, the prefetch with flags 0 and 2: each answer is the ABI variant
/// (the `_ptsz` one with flags 2), and each works.
fn role_managed_hints_per_thread() {
    let a = Api::setup();
    let lib = Lib::open();
    type Gpa = unsafe extern "C" fn(*const i8, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;
    let gpa: Gpa = lib.f("cuGetProcAddress_v2");
    let get = |name: &std::ffi::CStr, version: c_int, flags: u64| -> usize {
        let mut p: *mut c_void = std::ptr::null_mut();
        let mut status: c_int = -1;
        // SAFETY: valid string and out-pointers.
        let rc = unsafe { gpa(name.as_ptr(), &mut p, version, flags, &mut status) };
        assert_eq!((rc, status), (0, 0), "{name:?}@{version} flags {flags}");
        p as usize
    };
    for (version, abi) in [(8000, "cuMemAdvise"), (12020, "cuMemAdvise_v2")] {
        assert_eq!(get(c"cuMemAdvise", version, 0), lib.addr(abi));
        assert_eq!(
            get(c"cuMemAdvise", version, 2),
            lib.addr(abi),
            "no _ptsz twin"
        );
    }
    for (version, abi, pt) in [
        (8000, "cuMemPrefetchAsync", "cuMemPrefetchAsync_ptsz"),
        (12020, "cuMemPrefetchAsync_v2", "cuMemPrefetchAsync_v2_ptsz"),
    ] {
        assert_eq!(get(c"cuMemPrefetchAsync", version, 0), lib.addr(abi));
        assert_eq!(get(c"cuMemPrefetchAsync", version, 1), lib.addr(abi));
        assert_eq!(get(c"cuMemPrefetchAsync", version, 2), lib.addr(pt));
    }
    let n = 1 << 16;
    let m = alloc_managed(n);
    let data: Vec<u8> = (0..n).map(|i| (i % 241) as u8).collect();
    let bad: H = 0xdead_0000usize as H;
    // SAFETY: the looked-up pointers are the exported functions of these
    // signatures; m is n bytes of managed memory.
    unsafe {
        assert_eq!((a.htod)(m, data.as_ptr().cast(), n), 0);
        let advise: Advise = std::mem::transmute(get(c"cuMemAdvise", 8000, 0));
        let advise_v2: AdviseV2 = std::mem::transmute(get(c"cuMemAdvise", 12020, 0));
        let prefetch: Prefetch = std::mem::transmute(get(c"cuMemPrefetchAsync", 8000, 2));
        let prefetch_v2: PrefetchV2 = std::mem::transmute(get(c"cuMemPrefetchAsync", 12020, 2));
        assert_eq!(advise(m, n, SET_ACCESSED_BY, 0), 0);
        assert_eq!(advise_v2(m, n, SET_PREFERRED_LOCATION, DEVICE0), 0);
        // NULL is the calling thread's per-thread default stream here.
        assert_eq!(prefetch(m, n, 0, std::ptr::null_mut()), 0);
        assert_eq!(prefetch(m, n, DEVICE_CPU, std::ptr::null_mut()), 0);
        assert_eq!(prefetch_v2(m, n, DEVICE0, 0, std::ptr::null_mut()), 0);
        assert_eq!(prefetch_v2(m, n, HOST, 0, std::ptr::null_mut()), 0);
        assert_eq!(prefetch(m, n, 0, bad), INVALID_HANDLE);
        assert_eq!(prefetch_v2(m, n, DEVICE0, 0, bad), INVALID_HANDLE);
        assert_eq!(prefetch(m, n + 1, 0, std::ptr::null_mut()), INVALID_VALUE);
        assert_eq!(
            prefetch_v2(m, n, DEVICE0, 1, std::ptr::null_mut()),
            INVALID_VALUE
        );
        assert_eq!((a.ctx_sync)(), 0);
    }
    assert!(read_back(&a, m, n) == data, "data unchanged by the hints");
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

#[test]
fn managed_memory_hints_validate_like_the_driver_and_change_no_data() {
    run("managed_hints");
}

#[test]
fn managed_memory_hints_resolve_per_thread_variants_through_get_proc_address() {
    run("managed_hints_per_thread");
}
