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
//! | `DILU_CONTEXT_MEMORY` | memory charged per process and device for the CUDA context itself; default 256MiB |
//! | `DILU_SM_ABLATE` | benchmarks only, not a tuning knob: a comma-separated list of SM-time mechanisms to turn off, and a bucket depth (see [`Ablate`]) |
//!
//! A variable that is set but unusable stops the process with one line naming
//! it and the accepted forms (fail closed). A variable dilu no longer reads
//! ([`REMOVED`]) is never ignored silently either: when set, one line says
//! so and what replaces it, and the process goes on (a leftover setting in a
//! deployment should not stop the workload).

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
    /// SM-time mechanisms turned off for a benchmark (`DILU_SM_ABLATE`);
    /// all on by default.
    pub ablate: Ablate,
}

/// `DILU_SM_ABLATE`: what the ablation benchmark (`scripts/bench.sh
/// ablation`) and the launch-cost benchmarks change, never a tuning knob. A
/// comma-separated list of words, each a mechanism turned off, plus
/// `depth=DURATION`:
///
/// | word | turns off |
/// |---|---|
/// | `runs` | runs of work: a throttled tenant's launches are paced one by one (see [`crate::config::sm::DEFAULT_BURST_NS`]) |
/// | `feedback` | usage feedback ([`crate::sm_time::usage_feedback`]) |
/// | `apart` | samples apart ([`crate::sm_time::sampler`]) |
/// | `quiet` | quiet holds ([`crate::sm_time::quiet_samples`]) |
/// | `turns` | fair turns and idle skips ([`crate::sm_time::fair_turns`]) |
/// | `leases` | launch leases: every launch goes to the bucket ([`crate::sm_time::launch_lease`]) |
/// | `depth=DURATION` | (not a mechanism) the token bucket's depth, 100us to 1s, instead of 5ms: `depth=1s` lets no launch wait, for benchmarks that time the launch path |
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Ablate {
    pub runs: bool,
    pub feedback: bool,
    pub apart: bool,
    pub quiet: bool,
    pub turns: bool,
    pub leases: bool,
    pub depth_ns: Option<u64>,
}

pub const ABLATE_FORMS: &str = "a comma-separated list of runs, feedback, apart, quiet, turns, \
     leases and depth=DURATION (100us to 1s), such as `leases,quiet` or `depth=1s`";

impl Ablate {
    /// Parses `DILU_SM_ABLATE`'s value; `Err` for any word not in
    /// [`ABLATE_FORMS`] (never ignored).
    pub fn parse(text: &str) -> Result<Ablate, ()> {
        let mut ablate = Ablate::default();
        for word in text.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let flag = match word {
                "runs" => &mut ablate.runs,
                "feedback" => &mut ablate.feedback,
                "apart" => &mut ablate.apart,
                "quiet" => &mut ablate.quiet,
                "turns" => &mut ablate.turns,
                "leases" => &mut ablate.leases,
                _ => {
                    let depth = word
                        .strip_prefix("depth=")
                        .and_then(|v| units::parse_duration_ns(v).ok())
                        .filter(|ns| (100_000..=1_000_000_000).contains(ns))
                        .ok_or(())?;
                    ablate.depth_ns = Some(depth);
                    continue;
                }
            };
            *flag = true;
        }
        Ok(ablate)
    }
}

fn ablate_from_env() -> Ablate {
    let Some(value) = std::env::var_os("DILU_SM_ABLATE") else {
        return Ablate::default();
    };
    value
        .to_str()
        .and_then(|text| Ablate::parse(text).ok())
        .unwrap_or_else(|| fail("DILU_SM_ABLATE", &value, ABLATE_FORMS))
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
    for line in removed_variable_lines(|name| std::env::var_os(name).is_some()) {
        eprintln!("{line}");
    }
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
        ablate: ablate_from_env(),
    }
}

/// Variables dilu read once and reads no more, each with what replaces it.
pub const REMOVED: &[(&str, &str)] = &[
    (
        "DILU_USAGE_FEEDBACK",
        "for benchmarks DILU_SM_ABLATE=feedback turns usage feedback off; otherwise it is always on",
    ),
    (
        "DILU_SM_QUIET",
        "for benchmarks DILU_SM_ABLATE=quiet turns quiet holds off; otherwise they are always on",
    ),
    (
        "DILU_SM_TURNS",
        "for benchmarks DILU_SM_ABLATE=turns turns fair turns off; otherwise they are always on",
    ),
    (
        "DILU_SM_SAMPLE_APART",
        "for benchmarks DILU_SM_ABLATE=apart turns samples apart off; otherwise they are always on",
    ),
    (
        "DILU_SM_BURST",
        "for benchmarks DILU_SM_ABLATE=runs paces launch by launch; otherwise the default (2ms runs) is fixed",
    ),
    (
        "DILU_SM_DEPTH",
        "for benchmarks DILU_SM_ABLATE=depth=<duration> sets the bucket's depth; otherwise the default (5ms) is fixed",
    ),
    (
        "DILU_SPEC_CLASS",
        "the spec is one variable: DILU_SPEC=class=<latency|batch>,...",
    ),
    (
        "DILU_SPEC_SLO_MS",
        "the spec is one variable: DILU_SPEC=slo_ms=<ms>,...",
    ),
    (
        "DILU_SPEC_SM_REQUEST",
        "the spec is one variable: DILU_SPEC=sm_request=<percent>,...",
    ),
    (
        "DILU_SPEC_SM_LIMIT",
        "the spec is one variable: DILU_SPEC=sm_limit=<percent>,...",
    ),
    (
        "DILU_SPEC_MEM",
        "the spec is one variable: DILU_SPEC=mem=<bytes>,...",
    ),
    (
        "DILU_COLO_SLO",
        "a co-location primary's SLO is its spec's: DILU_SPEC=slo_ms=<ms> (dilu run --slo-ms)",
    ),
];

/// One line for each [`REMOVED`] variable that `is_set`: it is no longer
/// read, and what replaces it.
pub fn removed_variable_lines(is_set: impl Fn(&str) -> bool) -> Vec<String> {
    REMOVED
        .iter()
        .filter(|(name, _)| is_set(name))
        .map(|(name, instead)| {
            format!(
                "dilu-interposer: {name} is set but no longer read (it has no effect); {instead}"
            )
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ablate_words_turn_mechanisms_off() {
        assert_eq!(Ablate::parse(""), Ok(Ablate::default()));
        let all = Ablate::parse("runs, feedback,apart,quiet,turns,leases,depth=1s").unwrap();
        assert!(all.runs && all.feedback && all.apart && all.quiet && all.turns && all.leases);
        assert_eq!(all.depth_ns, Some(1_000_000_000));
        let one = Ablate::parse("quiet").unwrap();
        assert!(one.quiet && !one.turns && !one.leases && !one.runs);
        assert_eq!(one.depth_ns, None);
    }

    #[test]
    fn each_removed_variable_set_gets_one_line_naming_its_replacement() {
        assert!(removed_variable_lines(|_| false).is_empty());
        let set = [
            "DILU_SM_DEPTH",
            "DILU_SPEC_MEM",
            "DILU_COLO_SLO",
            "DILU_TENANT",
        ];
        let lines = removed_variable_lines(|name| set.contains(&name));
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[0].contains("DILU_SM_DEPTH is set but no longer read"));
        assert!(lines[0].contains("DILU_SM_ABLATE=depth="));
        assert!(lines[1].contains("DILU_SPEC_MEM") && lines[1].contains("DILU_SPEC=mem="));
        assert!(lines[2].contains("DILU_COLO_SLO") && lines[2].contains("DILU_SPEC=slo_ms="));
        // Every removed variable says what replaces it, and none is still
        // read: the replacement named is one the interposer reads.
        let all = removed_variable_lines(|_| true);
        assert_eq!(all.len(), REMOVED.len());
        for (line, (name, _)) in all.iter().zip(REMOVED) {
            assert!(line.contains(name), "{line}");
            assert!(
                line.contains("DILU_SM_ABLATE=") || line.contains("DILU_SPEC="),
                "{line}"
            );
        }
        for (word, name) in [
            ("feedback", "DILU_USAGE_FEEDBACK"),
            ("quiet", "DILU_SM_QUIET"),
            ("turns", "DILU_SM_TURNS"),
            ("apart", "DILU_SM_SAMPLE_APART"),
            ("runs", "DILU_SM_BURST"),
        ] {
            let line = &removed_variable_lines(|n| n == name)[0];
            assert!(line.contains(&format!("DILU_SM_ABLATE={word}")), "{line}");
            assert!(Ablate::parse(word).is_ok(), "{word}");
        }
    }

    #[test]
    fn an_unknown_ablate_word_is_an_error() {
        for bad in [
            "gate",
            "leases,sample",
            "on",
            "depth=1ns",
            "depth=2s",
            "depth",
            "Quiet",
        ] {
            assert_eq!(Ablate::parse(bad), Err(()), "{bad}");
        }
        for word in [
            "runs", "feedback", "apart", "quiet", "turns", "leases", "depth=",
        ] {
            assert!(ABLATE_FORMS.contains(word), "{word}");
        }
    }
}
