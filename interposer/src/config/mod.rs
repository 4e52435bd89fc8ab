//! Environment configuration, read once (at load time, from the library
//! constructor) and never on a hot path.
//!
//! | variable | meaning |
//! |---|---|
//! | `DILU_REAL_LIBCUDA` | path (or soname) of the real driver to `dlopen`; default `libcuda.so.1` |
//! | `DILU_CALL_REPORT` | file to which one JSON line of call counters is appended at exit |
//! | `DILU_LOG` | `tracing` `EnvFilter` directive (e.g. `debug`); logging is off when unset |
//! | `DILU_TENANT` | tenant name; processes with the same name (and user) share one budget |
//! | `DILU_MEM_LIMIT` | memory budget: `8GiB`, `50%`, `0:8GiB,1:4GiB` (see [`crate::config::memory`]); HAMi's `CUDA_DEVICE_MEMORY_LIMIT[_i]` are aliases |
//! | `DILU_SM_LIMIT` | SM-time share: `30` (% of every device), `0:30,1:50`; HAMi's `CUDA_DEVICE_SM_LIMIT[_i]` are aliases (see [`crate::config::sm`]) |
//! | `DILU_SM_DEPTH` | token bucket depth (burst allowance after idling); default 5ms |
//! | `DILU_SM_BURST` | GPU time a throttled tenant releases at once (see [`crate::config::sm`]); default 2ms, `0` paces each launch |
//! | `DILU_CONTEXT_MEMORY` | memory charged per process and device for the CUDA context itself; default 256MiB |
//! | `DILU_USAGE_FEEDBACK` | `on` (default) or `off`: settle SM-time charges against NVML's per-process busy time (see [`crate::sm_time::usage_feedback`]) |
//! | `DILU_SM_QUIET` | `on` (default) or `off`: time kernels of 1 ms or more while the device's other dilu processes of this user hold their launches (see [`crate::sm_time::quiet_samples`]; a co-located filler's, while its primary holds them) |
//! | `DILU_SM_TURNS` | `on` (default) or `off`: dilu processes of this user sharing a device take turns by their shares while each waits on it (see [`crate::sm_time::fair_turns`]) |
//! | `DILU_SM_ABLATE` | ablation benchmark only: `leases` turns the launch leases off |
//! | `DILU_SM_SAMPLE_APART` | `on` (default) or `off`: run a timed launch apart from the process's other streams (see [`crate::sm_time::sampler`]) |
//!
//! A variable that is set but unusable stops the process with one line naming
//! it and the accepted forms (fail closed).

// Per concern: memory budgets (`memory`), SM-time shares (`sm`).
pub mod memory;
pub mod sm;

use dilu_abi::tenant_flags::{TENANT_NAME_FORMS, check_tenant_name};
use dilu_abi::units;
use memory::MemoryLimits;
use sm::SmLimits;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;
use std::sync::OnceLock;

pub struct Config {
    pub real_libcuda: Option<CString>,
    pub call_report: Option<PathBuf>,
    pub log: Option<String>,
    pub tenant: Option<String>,
    pub memory: MemoryLimits,
    pub context_memory: u64,
    pub sm: SmLimits,
    pub usage_feedback: bool,
    pub sample_apart: bool,
    pub quiet_samples: bool,
    pub fair_turns: bool,
    /// Mechanisms without a switch of their own, turned off for the
    /// ablation benchmark only (`DILU_SM_ABLATE`).
    pub ablate: Ablate,
}

/// `DILU_SM_ABLATE`: `leases` (every launch goes to the bucket). Read by
/// `scripts/bench.sh ablation`; not a tuning knob.
#[derive(Default, Clone, Copy)]
pub struct Ablate {
    pub leases: bool,
}

const ABLATE_FORMS: &str = "`leases`";

fn ablate_from_env() -> Ablate {
    let mut ablate = Ablate::default();
    let Some(value) = std::env::var_os("DILU_SM_ABLATE") else {
        return ablate;
    };
    let Some(text) = value.to_str() else {
        fail("DILU_SM_ABLATE", &value, ABLATE_FORMS)
    };
    for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        match word {
            "leases" => ablate.leases = true,
            _ => fail("DILU_SM_ABLATE", &value, ABLATE_FORMS),
        }
    }
    ablate
}

/// What a CUDA context occupies on the device before the program allocates
/// anything, charged once per process and device (HAMi-core leaves it out and
/// tenants run hundreds of MB over budget). Real contexts on Hopper take a
/// few hundred MiB; override with `DILU_CONTEXT_MEMORY`.
pub const DEFAULT_CONTEXT_MEMORY: u64 = 256 << 20;

static CONFIG: OnceLock<Config> = OnceLock::new();

/// The process configuration (read on first use).
pub fn get() -> &'static Config {
    CONFIG.get_or_init(read)
}

fn read() -> Config {
    Config {
        real_libcuda: nonempty("DILU_REAL_LIBCUDA", "a path or soname of the real libcuda")
            .map(|v| CString::new(v.into_vec()).expect("env values contain no NUL")),
        call_report: nonempty("DILU_CALL_REPORT", "a file path").map(PathBuf::from),
        log: nonempty(
            "DILU_LOG",
            "a tracing filter such as `debug` or `dilu_interposer=trace`",
        )
        .map(|v| match v.into_string() {
            Ok(s) => s,
            Err(v) => fail("DILU_LOG", &v, "a UTF-8 tracing filter such as `debug`"),
        }),
        tenant: nonempty("DILU_TENANT", TENANT_NAME_FORMS).map(|v| match v.into_string() {
            Ok(name) if check_tenant_name(&name).is_ok() => name,
            Ok(name) => fail("DILU_TENANT", &name.into(), TENANT_NAME_FORMS),
            Err(v) => fail("DILU_TENANT", &v, TENANT_NAME_FORMS),
        }),
        memory: match memory::from_env(|name| std::env::var(name).ok()) {
            Ok(limits) => limits,
            Err(error) => fail(&error.variable, &error.value.into(), &error.expected),
        },
        context_memory: match std::env::var("DILU_CONTEXT_MEMORY") {
            Err(_) => DEFAULT_CONTEXT_MEMORY,
            Ok(value) => units::parse_size(&value)
                .unwrap_or_else(|_| fail("DILU_CONTEXT_MEMORY", &value.into(), units::SIZE_FORMS)),
        },
        sm: match sm::from_env(|name| std::env::var(name).ok()) {
            Ok(limits) => limits,
            Err(error) => fail(&error.variable, &error.value.into(), &error.expected),
        },
        usage_feedback: on_unless_off("DILU_USAGE_FEEDBACK"),
        sample_apart: on_unless_off("DILU_SM_SAMPLE_APART"),
        quiet_samples: on_unless_off("DILU_SM_QUIET"),
        fair_turns: on_unless_off("DILU_SM_TURNS"),
        ablate: ablate_from_env(),
    }
}

/// A switch that is on unless `var` says `off`.
fn on_unless_off(var: &str) -> bool {
    match std::env::var(var).as_deref() {
        Err(_) | Ok("on") => true,
        Ok("off") => false,
        Ok(other) => fail(var, &other.into(), "`on` or `off`"),
    }
}

fn nonempty(var: &str, accepted: &str) -> Option<OsString> {
    let v = std::env::var_os(var)?;
    if v.is_empty() {
        fail(var, &v, accepted);
    }
    Some(v)
}

/// Prints one line naming the variable and the accepted forms, then exits.
pub fn fail(var: &str, value: &OsString, accepted: &str) -> ! {
    eprintln!("dilu-interposer: invalid {var}={value:?}; expected {accepted}");
    std::process::exit(2)
}

/// An environment lookup over fixed pairs, for configuration tests.
#[cfg(test)]
pub fn test_env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: std::collections::HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |key| map.get(key).cloned()
}
