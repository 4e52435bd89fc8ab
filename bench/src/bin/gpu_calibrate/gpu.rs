//! The device side of the probes: their PTX, the context they run in, and
//! small driver helpers (launch, synchronise, device words).

use cudarc::driver::{result, sys};
use std::ffi::{CString, c_void};

/// Kernels: `noop`; `span(u64* out, u64 ns)` spins every thread for `ns` of
/// `%globaltimer` and folds each block's start (min) and end (max) into
/// out[0..2]; `slicer(u64* out, u32 cap, u64 run_ns, u64 threshold_ns)`
/// spins every block for `run_ns`, and block 0 records each jump of the
/// timer over `threshold_ns` (the block was not running) as a pair in
/// out[2..], with out[0] = its start and out[1] = the number of jumps;
/// the FMA kernel that does real work is the workloads' own
/// (`dilu_harness::ptx`, `busy`).
pub const PTX: &str = r#"
.version 7.0
.target sm_50
.address_size 64

.visible .entry noop()
{
    ret;
}

.visible .entry span(.param .u64 span_out, .param .u64 span_ns)
{
    .reg .pred %p<3>;
    .reg .b32 %r<2>;
    .reg .b64 %rd<8>;
    ld.param.u64 %rd1, [span_out];
    ld.param.u64 %rd2, [span_ns];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u64 %rd3, %globaltimer;
    add.u64 %rd4, %rd3, %rd2;
SPAN_LOOP:
    mov.u64 %rd5, %globaltimer;
    setp.lt.u64 %p1, %rd5, %rd4;
    @%p1 bra SPAN_LOOP;
    mov.u32 %r1, %tid.x;
    setp.ne.u32 %p2, %r1, 0;
    @%p2 bra SPAN_DONE;
    atom.global.min.u64 %rd6, [%rd1], %rd3;
    atom.global.max.u64 %rd7, [%rd1+8], %rd5;
SPAN_DONE:
    ret;
}

.visible .entry slicer(.param .u64 sl_out, .param .u32 sl_cap, .param .u64 sl_run, .param .u64 sl_threshold)
{
    .reg .pred %p<5>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [sl_out];
    cvta.to.global.u64 %rd1, %rd1;
    ld.param.u32 %r1, [sl_cap];
    ld.param.u64 %rd2, [sl_run];
    ld.param.u64 %rd3, [sl_threshold];
    mov.u64 %rd4, %globaltimer;
    add.u64 %rd5, %rd4, %rd2;
    mov.u64 %rd6, %rd4;
    mov.u32 %r2, 0;
    mov.u32 %r3, %ctaid.x;
    setp.ne.u32 %p4, %r3, 0;
SL_LOOP:
    mov.u64 %rd7, %globaltimer;
    sub.u64 %rd8, %rd7, %rd6;
    setp.le.u64 %p1, %rd8, %rd3;
    @%p1 bra SL_NEXT;
    @%p4 bra SL_NEXT;
    setp.ge.u32 %p2, %r2, %r1;
    @%p2 bra SL_COUNT;
    mul.wide.u32 %rd9, %r2, 16;
    add.u64 %rd10, %rd1, %rd9;
    st.global.u64 [%rd10+16], %rd6;
    st.global.u64 [%rd10+24], %rd7;
SL_COUNT:
    add.u32 %r2, %r2, 1;
SL_NEXT:
    mov.u64 %rd6, %rd7;
    setp.lt.u64 %p3, %rd7, %rd5;
    @%p3 bra SL_LOOP;
    @%p4 bra SL_DONE;
    st.global.u64 [%rd1], %rd4;
    cvt.u64.u32 %rd11, %r2;
    st.global.u64 [%rd1+8], %rd11;
SL_DONE:
    ret;
}
"#;

/// Grid of the FMA kernel: ten waves of 132 blocks (100 µs on simgpu's
/// default cost model, and the shape of the SM-time benchmark's kernels).
pub const BUSY_BLOCKS: u32 = 1320;
pub const BUSY_THREADS: u32 = dilu_harness::ptx::BLOCK_THREADS;
/// Gaps a slicer kernel can record (each kernel runs 200 ms; a 1 ms slice
/// gives about 100).
pub const SLICER_CAP: u32 = 8192;
pub const SLICER_RUN_NS: u64 = 200_000_000;
/// A `%globaltimer` jump larger than this means the block was not running.
pub const SLICER_THRESHOLD_NS: u64 = 3_000;

pub type Fallible<T> = Result<T, String>;

pub fn driver_error(what: &'static str) -> impl Fn(result::DriverError) -> String {
    move |error| format!("{what}: {error:?}")
}

pub struct Gpu {
    pub name: String,
    pub sms: u32,
    pub stream: sys::CUstream,
    pub noop: sys::CUfunction,
    pub span: sys::CUfunction,
    pub slicer: sys::CUfunction,
    pub busy: sys::CUfunction,
}

pub fn open_gpu() -> Fallible<Gpu> {
    result::init().map_err(driver_error("cuInit"))?;
    let device = result::device::get(0).map_err(driver_error("cuDeviceGet"))?;
    let name = result::device::get_name(device).map_err(driver_error("cuDeviceGetName"))?;
    let ptx = CString::new(PTX).expect("no NUL in the PTX");
    let workload_ptx = CString::new(dilu_harness::ptx::PTX).expect("no NUL in the PTX");
    let function = |module, name: &str| {
        // SAFETY: a module loaded below and a NUL-free entry name of it.
        unsafe { result::module::get_function(module, CString::new(name).expect("no NUL")) }
            .map_err(|e| format!("cuModuleGetFunction({name}): {e:?}"))
    };
    // SAFETY: (block) cuda.h contracts: a device from cuDeviceGet, its
    // primary context made current before any other call, a NUL-terminated
    // PTX image.
    let (module, workload_module, sms) = unsafe {
        let context = result::primary_ctx::retain(device)
            .map_err(driver_error("cuDevicePrimaryCtxRetain"))?;
        result::ctx::set_current(context).map_err(driver_error("cuCtxSetCurrent"))?;
        let sms = result::device::get_attribute(
            device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )
        .map_err(driver_error("cuDeviceGetAttribute"))?;
        let module = result::module::load_data(ptx.as_ptr().cast())
            .map_err(driver_error("cuModuleLoadData"))?;
        let workload_module = result::module::load_data(workload_ptx.as_ptr().cast())
            .map_err(driver_error("cuModuleLoadData"))?;
        (module, workload_module, sms)
    };
    let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
        .map_err(driver_error("cuStreamCreate"))?;
    Ok(Gpu {
        name,
        sms: sms.max(1) as u32,
        stream,
        noop: function(module, "noop")?,
        span: function(module, "span")?,
        slicer: function(module, "slicer")?,
        busy: function(workload_module, dilu_harness::ptx::BUSY_KERNEL)?,
    })
}

/// Launches `function` with the given parameters (pointers to their values).
pub fn launch(
    function: sys::CUfunction,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> Fallible<()> {
    // SAFETY: every caller passes pointers to values of the types the PTX
    // entry declares, in its order, alive for the call.
    unsafe { result::launch_kernel(function, (grid, 1, 1), (block, 1, 1), 0, stream, params) }
        .map_err(driver_error("cuLaunchKernel"))
}

pub fn sync(stream: sys::CUstream) -> Fallible<()> {
    // SAFETY: a stream created by this program and not destroyed.
    unsafe { result::stream::synchronize(stream) }.map_err(driver_error("cuStreamSynchronize"))
}

/// Device memory of `words` u64s, filled with `fill`.
pub fn device_words(words: &[u64]) -> Fallible<sys::CUdeviceptr> {
    // SAFETY: allocates exactly the bytes copied into it.
    unsafe {
        let pointer = result::malloc_sync(words.len() * 8).map_err(driver_error("cuMemAlloc"))?;
        result::memcpy_htod_sync(pointer, words).map_err(driver_error("cuMemcpyHtoD"))?;
        Ok(pointer)
    }
}

pub fn read_words(pointer: sys::CUdeviceptr, count: usize) -> Fallible<Vec<u64>> {
    let mut words = vec![0u64; count];
    // SAFETY: `pointer` holds at least `count` u64s (its allocation).
    unsafe { result::memcpy_dtoh_sync(&mut words, pointer) }
        .map_err(driver_error("cuMemcpyDtoH"))?;
    Ok(words)
}

pub fn free(pointer: sys::CUdeviceptr) {
    // SAFETY: a pointer from cuMemAlloc, freed once.
    let _ = unsafe { result::free_sync(pointer) };
}
