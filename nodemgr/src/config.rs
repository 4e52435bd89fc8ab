//! The daemon's configuration: `/etc/dilu/nodemgr.toml`, then flags.
//!
//! ```toml
//! socket = "/run/dilu/nodemgr.sock"   # where tenants and tools connect
//! run_dir = "/run/dilu"               # persisted state (re-adoption)
//! metrics = "127.0.0.1:9400"          # Prometheus /metrics; "" turns it off
//! period_ms = 5                       # control period
//! controller = "dilu"                 # dilu | dilu-colo | dilu-rckm | static
//! gpu_memory = "80GiB"                # device memory for admission when NVML is absent
//! scale_out_after_s = 10              # latency tenant at its limit and over its SLO this long
//! scale_in_after_s = 300              # tenant without a kernel launch this long
//! audit = "log"                       # a tenant over its memory budget (NVML): off | log | signal | kill
//! audit_slack = "64MiB"               # what a tenant may hold beyond its budget before the audit acts
//! placement = "dilu"                  # GPU choice for `dilu run` on a multi-GPU node (the extender's policies)
//! max_connections_per_uid = 512       # open connections one user may hold (tenant processes and tools)
//! max_tenants_per_uid = 128           # tenants one user may have registered
//! open_files_limit = 65536            # raise the daemon's descriptor limit to this (unset: soft to hard)
//!
//! [tenants.infer]                     # specs the operator owns (win over the tenant's own)
//! class = "latency"
//! slo_ms = 50
//! sm_request = 20
//! sm_limit = 80
//! mem = "8GiB"                        # memory budget per device (the daemon's; live with `dilu set --mem`)
//!
//! [tenants.serve]
//! profile = "/etc/dilu/serve.profile.toml"  # written by `dilu profile`; keys beside it win
//! ```

use crate::audit::AuditAction;
use crate::control;
use crate::error::{self, Error};
use dilu_abi::node_wire::{self, Bytes, SmShare, TenantSpec};
use dilu_abi::units;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub const DEFAULT_CONFIG: &str = "/etc/dilu/nodemgr.toml";

#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub run_dir: PathBuf,
    /// Address of the metrics endpoint (None: off).
    pub metrics: Option<String>,
    pub period: Duration,
    pub controller: String,
    /// Device memory used for admission (bytes), when NVML cannot tell.
    pub gpu_memory: Option<u64>,
    pub tenants: BTreeMap<String, TenantSpec>,
    /// A latency tenant at its limit and over its SLO this long: scale out.
    pub scale_out_after: Duration,
    /// A tenant idle this long: scale in.
    pub scale_in_after: Duration,
    /// What the memory audit does to a tenant over its budget.
    pub audit: AuditAction,
    /// Bytes beyond its budget a tenant may hold before the audit acts
    /// (what the driver keeps beside allocations: context, heap, pools).
    pub audit_slack: u64,
    /// The placement policy `dilu run` tenants are placed on GPUs with
    /// (a `dilu-cluster` policy name).
    pub placement: String,
    /// Connections one uid may hold open at once (each tenant process
    /// holds one for its life): one user cannot use up the daemon's
    /// descriptors and threads.
    pub max_connections_per_uid: usize,
    /// Tenants one uid may have registered at once.
    pub max_tenants_per_uid: usize,
    /// The descriptor limit the daemon raises itself to at start (None:
    /// its soft limit to its hard one).
    pub open_files_limit: Option<u64>,
}

/// Default of `max_connections_per_uid`: with `max_tenants_per_uid` (two
/// descriptors per tenant), one user stays under systemd's default
/// descriptor limit of 1024 on its own.
pub const DEFAULT_MAX_CONNECTIONS_PER_UID: usize = 512;
/// Default of `max_tenants_per_uid`.
pub const DEFAULT_MAX_TENANTS_PER_UID: usize = 128;

impl Default for Config {
    fn default() -> Self {
        Config {
            socket: PathBuf::from(node_wire::DEFAULT_SOCKET),
            run_dir: PathBuf::from("/run/dilu"),
            metrics: Some("127.0.0.1:9400".into()),
            period: Duration::from_millis(5),
            controller: "dilu".into(),
            gpu_memory: None,
            tenants: BTreeMap::new(),
            scale_out_after: Duration::from_secs(10),
            scale_in_after: Duration::from_secs(300),
            audit: AuditAction::Log,
            audit_slack: 64 << 20,
            placement: "dilu".into(),
            max_connections_per_uid: DEFAULT_MAX_CONNECTIONS_PER_UID,
            max_tenants_per_uid: DEFAULT_MAX_TENANTS_PER_UID,
            open_files_limit: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    socket: Option<PathBuf>,
    run_dir: Option<PathBuf>,
    metrics: Option<String>,
    period_ms: Option<f64>,
    controller: Option<String>,
    gpu_memory: Option<String>,
    scale_out_after_s: Option<f64>,
    scale_in_after_s: Option<f64>,
    audit: Option<String>,
    audit_slack: Option<String>,
    placement: Option<String>,
    max_connections_per_uid: Option<usize>,
    max_tenants_per_uid: Option<usize>,
    open_files_limit: Option<u64>,
    #[serde(default)]
    tenants: BTreeMap<String, FileTenant>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTenant {
    class: Option<String>,
    slo_ms: Option<f64>,
    sm_request: Option<f64>,
    sm_limit: Option<f64>,
    mem: Option<String>,
    profile: Option<PathBuf>,
}

/// Flags that override the file (`dilu nodemgr --help`).
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub socket: Option<PathBuf>,
    pub run_dir: Option<PathBuf>,
    pub metrics: Option<String>,
    pub period_ms: Option<f64>,
    pub controller: Option<String>,
    pub gpu_memory: Option<String>,
}

fn size(what: &str, text: &str) -> Result<u64, String> {
    units::parse_size(text).map_err(|e| format!("{what}: {e}"))
}

fn seconds(what: &str, value: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(value).map_err(|_| format!("{what} must be a non-negative number"))
}

impl Config {
    /// Reads `path` (a missing file is fine unless `required`), then applies
    /// the flags.
    pub fn load(path: &Path, required: bool, overrides: &Overrides) -> error::Result<Config> {
        let mut config = match std::fs::read_to_string(path) {
            Ok(text) => Config::parse(&text).map_err(|e| e.context(path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => Config::default(),
            Err(e) => return Err(Error::System(format!("{}: {e}", path.display()))),
        };
        config.apply(overrides).map_err(Error::Invalid)?;
        Ok(config)
    }

    /// Parses the TOML text of a configuration file.
    pub fn parse(text: &str) -> error::Result<Config> {
        Config::parse_text(text).map_err(Error::Invalid)
    }

    fn parse_text(text: &str) -> Result<Config, String> {
        let file: FileConfig = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut config = Config::default();
        if let Some(v) = file.socket {
            config.socket = v;
        }
        if let Some(v) = file.run_dir {
            config.run_dir = v;
        }
        if let Some(v) = file.metrics {
            config.metrics = (!v.is_empty()).then_some(v);
        }
        if let Some(v) = file.period_ms {
            config.period = period(v)?;
        }
        if let Some(v) = file.controller {
            config.controller = v;
        }
        if let Some(v) = file.gpu_memory {
            config.gpu_memory = Some(size("gpu_memory", &v)?);
        }
        if let Some(v) = file.scale_out_after_s {
            config.scale_out_after = seconds("scale_out_after_s", v)?;
        }
        if let Some(v) = file.scale_in_after_s {
            config.scale_in_after = seconds("scale_in_after_s", v)?;
        }
        if let Some(v) = file.audit {
            config.audit = AuditAction::parse(&v)?;
        }
        if let Some(v) = file.audit_slack {
            config.audit_slack = size("audit_slack", &v)?;
        }
        if let Some(v) = file.placement {
            if dilu_placement::policy::policy_by_name(&v).is_none() {
                return Err(format!(
                    "placement = {v:?}: expected one of {}",
                    dilu_placement::policy::POLICY_NAMES.join(", ")
                ));
            }
            config.placement = v;
        }
        if let Some(v) = file.max_connections_per_uid {
            config.max_connections_per_uid = at_least_one("max_connections_per_uid", v)?;
        }
        if let Some(v) = file.max_tenants_per_uid {
            config.max_tenants_per_uid = at_least_one("max_tenants_per_uid", v)?;
        }
        config.open_files_limit = file.open_files_limit;
        for (name, t) in file.tenants {
            dilu_abi::tenant_flags::check_tenant_name(&name)
                .map_err(|e| format!("[tenants.{name}]: {e}"))?;
            let mut spec = match &t.profile {
                Some(path) => {
                    crate::profile_spec::load_spec(path)
                        .map_err(|e| format!("tenants.{name}.profile: {e}"))?
                        .0
                }
                None => TenantSpec::default(),
            };
            if let Some(class) = t.class {
                spec.class = node_wire::parse_class(&class).ok_or_else(|| {
                    format!("tenants.{name}.class = {class:?}: expected latency or batch")
                })?;
            }
            spec.slo_ms = t.slo_ms.or(spec.slo_ms);
            let share = |key: &str, percent: Option<f64>, or: SmShare| match percent {
                None => Ok(or),
                Some(percent) => SmShare::from_percent(percent).ok_or_else(|| {
                    format!("tenants.{name}.{key} = {percent}: expected a percentage from 0 to 100")
                }),
            };
            spec.sm_request = share("sm_request", t.sm_request, spec.sm_request)?;
            spec.sm_limit = share("sm_limit", t.sm_limit, spec.sm_limit)?;
            if let Some(mem) = t.mem {
                spec.mem = Some(Bytes::new(size(&format!("tenants.{name}.mem"), &mem)?));
            }
            spec.validate()
                .map_err(|e| format!("tenants.{name}: {e}"))?;
            config.tenants.insert(name, spec);
        }
        control::by_name(&config.controller).map_err(|e| e.to_string())?;
        Ok(config)
    }

    fn apply(&mut self, o: &Overrides) -> Result<(), String> {
        if let Some(v) = &o.socket {
            self.socket = v.clone();
        }
        if let Some(v) = &o.run_dir {
            self.run_dir = v.clone();
        }
        if let Some(v) = &o.metrics {
            self.metrics = (!v.is_empty()).then(|| v.clone());
        }
        if let Some(v) = o.period_ms {
            self.period = period(v)?;
        }
        if let Some(v) = &o.controller {
            control::by_name(v).map_err(|e| e.to_string())?;
            self.controller = v.clone();
        }
        if let Some(v) = &o.gpu_memory {
            self.gpu_memory = Some(size("--gpu-memory", v)?);
        }
        Ok(())
    }
}

fn at_least_one(key: &str, value: usize) -> Result<usize, String> {
    if value == 0 {
        return Err(format!(
            "{key} = 0 would refuse everyone: expected 1 or more"
        ));
    }
    Ok(value)
}

fn period(ms: f64) -> Result<Duration, String> {
    if !(0.5..=1000.0).contains(&ms) {
        return Err(format!("period_ms = {ms}: expected 0.5 to 1000"));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::WorkClass;

    #[test]
    fn a_tenant_spec_can_come_from_a_profile_with_keys_beside_it_winning() {
        let dir = std::env::temp_dir().join(format!("dilu-config-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let profile = dir.join("serve.toml");
        std::fs::write(
            &profile,
            "class = \"latency\"\nslo_ms = 8.0\nbatch = 16\nsm_request = 30\nsm_limit = 50\n\
             throughput_at_request = 100.0\nthroughput_at_limit = 120.0\ntrials = 14\nmethod = \"dilu\"\n",
        )
        .unwrap();
        let text = format!(
            "[tenants.serve]\nprofile = {:?}\nsm_limit = 70\n",
            profile.display().to_string()
        );
        let config = Config::parse(&text).unwrap();
        let serve = &config.tenants["serve"];
        assert_eq!(serve.class, WorkClass::Latency);
        assert_eq!(serve.slo_ms, Some(8.0));
        assert_eq!(
            (serve.sm_request, serve.sm_limit),
            (SmShare::percent(30.0), SmShare::percent(70.0))
        );
        let missing = Config::parse("[tenants.x]\nprofile = \"/nonexistent/p.toml\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            missing.contains("tenants.x.profile") && missing.contains("/nonexistent/p.toml"),
            "{missing}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_and_flags_combine_and_bad_values_are_named() {
        let config = Config::parse(
            r#"
            period_ms = 10
            controller = "dilu-rckm"
            metrics = ""
            [tenants.infer]
            class = "latency"
            slo_ms = 50
            sm_request = 20
            sm_limit = 80
            mem = "8GiB"
            "#,
        )
        .unwrap();
        assert_eq!(config.period, Duration::from_millis(10));
        assert_eq!(config.metrics, None);
        let infer = &config.tenants["infer"];
        assert_eq!(infer.class, WorkClass::Latency);
        assert_eq!(infer.mem, Some(Bytes::gib(8)));

        let mut flagged = config.clone();
        flagged
            .apply(&Overrides {
                controller: Some("static".into()),
                ..Overrides::default()
            })
            .unwrap();
        assert_eq!(flagged.controller, "static");

        let error = Config::parse("[tenants.x]\nsm_request = 90\nsm_limit = 50\n")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("tenants.x") && error.contains("above the limit"),
            "{error}"
        );
        assert!(
            Config::parse("controller = \"pid\"")
                .unwrap_err()
                .to_string()
                .contains("unknown controller")
        );
        assert!(
            Config::parse("colour = 1").is_err(),
            "unknown keys are refused"
        );
        let missing = Config::load(
            Path::new("/nonexistent/dilu.toml"),
            false,
            &Overrides::default(),
        );
        assert_eq!(missing.unwrap().controller, "dilu");
    }

    #[test]
    fn a_missing_required_file_is_the_machines_fault_and_a_bad_value_the_inputs() {
        let required = Config::load(
            Path::new("/nonexistent/dilu.toml"),
            true,
            &Overrides::default(),
        );
        assert!(
            matches!(&required, Err(Error::System(m)) if m.contains("/nonexistent/dilu.toml")),
            "{required:?}"
        );
        let flag = Overrides {
            period_ms: Some(0.0),
            ..Overrides::default()
        };
        let bad = Config::load(Path::new("/nonexistent/dilu.toml"), false, &flag);
        assert!(
            matches!(&bad, Err(Error::Invalid(m)) if m.contains("period_ms")),
            "{bad:?}"
        );
    }

    fn value() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            any::<f64>().prop_map(|v| format!("{v:?}")),
            any::<i64>().prop_map(|v| v.to_string()),
            "[ -~]{0,12}".prop_map(|v| format!("{v:?}")),
            Just("nan".to_string()),
            Just("-inf".to_string()),
            Just("\"18446744073709551616GiB\"".to_string()),
        ]
    }

    fn key() -> impl proptest::strategy::Strategy<Value = &'static str> {
        proptest::sample::select(vec![
            "period_ms",
            "controller",
            "gpu_memory",
            "scale_out_after_s",
            "scale_in_after_s",
            "audit",
            "audit_slack",
            "metrics",
            "[tenants.t]\nsm_request",
            "[tenants.t]\nsm_limit",
            "[tenants.t]\nslo_ms",
            "[tenants.t]\nmem",
            "[tenants.t]\nclass",
        ])
    }

    proptest::proptest! {
        /// Any text: a configuration or one error line, never a panic.
        #[test]
        fn any_text_parses_or_is_refused_with_one_line(text in "\\PC{0,200}") {
            if let Err(error) = Config::parse(&text) {
                proptest::prop_assert!(!error.message().is_empty());
            }
        }

        /// Every key with any value: accepted values are in range, refused
        /// ones are named.
        #[test]
        fn any_value_of_any_key_is_judged(key in key(), value in value()) {
            let text = format!("{key} = {value}\n");
            match Config::parse(&text) {
                Ok(config) => {
                    proptest::prop_assert!(config.period >= Duration::from_micros(500));
                    for spec in config.tenants.values() {
                        proptest::prop_assert!(spec.validate().is_ok());
                    }
                }
                Err(error) => proptest::prop_assert!(!error.message().is_empty()),
            }
        }
    }
}

#[cfg(test)]
#[path = "config_example_tests.rs"]
mod example_tests;
