//! `dilu-interposer`: the library `LD_PRELOAD`ed into unmodified CUDA
//! programs (PyTorch, vLLM, cudarc programs, anything on cudart).
//!
//! # What it owns
//! The process-local side of dilu: which driver calls are intercepted and
//! what happens in them: memory budgets on every allocation path, SM-time
//! token buckets on every launch (with sampling, leases and usage
//! feedback), co-location gates, telemetry and call counting. It may touch
//! only its own process and what its tenant shares: the driver functions it
//! wraps, its own statics, the tenant's shared-memory regions (ledger,
//! telemetry, gap board) and the read-only budget region the node manager
//! hands over.
//!
//! # How interception works
//! A program reaches the driver in three ways, and all three are covered:
//! 1. **Direct linking** (`-lcuda`): the symbol resolves to our exported
//!    function of the same ABI name, because a preloaded library comes first.
//! 2. **`dlsym` on the libcuda handle** (cudarc, CuPy, NVRTC): we export
//!    `dlsym`; when the real answer is non-null and the name is a hooked ABI
//!    name (or `cuGetProcAddress`/`_v2`), the answer becomes our wrapper.
//! 3. **`cuGetProcAddress`** (cudart: one `dlsym` of `cuGetProcAddress_v2`,
//!    then everything through it, including a re-fetch of `cuGetProcAddress`
//!    itself at versions 11030/12000): our wrappers call the real one and
//!    swap the answer when it equals the real pointer of a hooked function, or
//!    when it is `cuGetProcAddress` itself, so later look-ups still pass
//!    through us. This works for every version and every `flags` value.
//!
//! Real functions are resolved with the real `dlsym` on the real libcuda
//! handle (see [`driver`]), never through our own exports.
//!
//! # The table
//! `hooks.rs` holds the one declarative list of hooked functions; the
//! `hook_table!` macro in `table.rs` generates exports, real-pointer slots,
//! and both look-up directions from it. Hook bodies live in `handlers.rs`.
//!
//! # Configuration
//! Environment variables, read once at load: see [`config`].

mod alloc_table;
mod budget;
mod colocation;
mod config;
mod devices;
mod driver;
mod driver_reserved;
mod ffi;
mod fork;
mod graph_memory;
mod handlers;
pub mod hooks;
mod kernel_estimates;
mod launch_control;
mod launch_lease;
mod memory_config;
mod memory_hooks;
mod memory_v1;
mod node;
mod nvml;
mod procaddr;
mod recent_streams;
mod sampler;
mod sm_config;
mod stats;
mod sync_telemetry;
mod table;
mod tenant_sm;
mod usage_feedback;

pub use dilu_abi::cuda::CUresult;

/// Runs when the library is loaded: reads configuration, starts logging and
/// counting if asked. Does not touch the driver (that happens lazily).
extern "C" fn dilu_init() {
    let res = std::panic::catch_unwind(|| {
        let cfg = config::get();
        if let Some(filter) = &cfg.log {
            match tracing_subscriber::EnvFilter::try_new(filter) {
                Ok(f) => {
                    let _ = tracing_subscriber::fmt()
                        .with_env_filter(f)
                        .with_writer(std::io::stderr)
                        .try_init();
                }
                Err(e) => config::fail(
                    "DILU_LOG",
                    &filter.into(),
                    &format!("a tracing filter such as `debug` ({e})"),
                ),
            }
        }
        if let Some(path) = &cfg.call_report {
            stats::enable(path.clone());
        }
        tracing::debug!(pid = std::process::id(), "dilu interposer loaded");
    });
    if res.is_err() {
        eprintln!("dilu-interposer: panic during initialisation; continuing as pass-through");
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static DILU_INIT: extern "C" fn() = dilu_init;
