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
//! handle (see `driver`), never through our own exports.
//!
//! # Layout, top to bottom
//! - `entry`: the exported wrappers (`entry/exports.rs`, generated from the
//!   table's rows), the hook bodies of launches, captures and
//!   synchronisation (`entry/handlers.rs`), `dlsym` and `cuGetProcAddress`
//!   answers (`entry/procaddr.rs`).
//! - `telemetry/`: sync-to-sync intervals, reported latencies, call counters.
//! - `memory/`: memory budgets on every allocation path.
//! - `sm_time/`: the token bucket on every launch, leases, sampling, usage
//!   feedback, co-location.
//! - `fork.rs`: the `pthread_atfork` handlers, running the parts `memory/`
//!   and `sm_time/` register when they start.
//! - `node.rs`: registration with the node manager.
//! - `driver/`: the real driver (filling the typed table of its functions)
//!   and the real NVML.
//! - `table/`: the one declarative list of hooked functions (`rows.rs`), their
//!   ids and C names, the C types of the driver functions hooked or called
//!   and the typed table of their real addresses (generated from NVIDIA's
//!   headers), the call context, panic containment.
//! - `config/`: the environment, read once.
//!
//! A module uses only its own group and the groups below it.
//!
//! # Configuration
//! Environment variables, read once at load: see `config`.

// Groups, top to bottom: a module uses only its own group and the groups
// below it (see ARCHITECTURE.md; `scripts/interposer-groups.sh` checks it).
mod config;
mod driver;
mod entry;
mod fork;
mod memory;
mod node;
mod sm_time;
mod table;
mod telemetry;

pub use dilu_abi::cuda::CUresult;

/// Runs when the library is loaded: reads configuration, starts logging and
/// counting if asked, takes the memory budget's and SM-time state's parts in
/// fork safety when they are configured, and decides which hooks have
/// nothing to do in this process. Does not touch the driver (that happens lazily).
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
            telemetry::stats::enable(path.clone());
        }
        memory::at_fork::register_when_budgeted();
        sm_time::at_fork::register_when_configured();
        entry::pass_through::decide();
        tracing::debug!(pid = std::process::id(), "dilu interposer loaded");
    });
    if res.is_err() {
        eprintln!("dilu-interposer: panic during initialisation; continuing as pass-through");
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static DILU_INIT: extern "C" fn() = dilu_init;
