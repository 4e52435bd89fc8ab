//! Messages on the node manager's Unix socket (`SOCK_SEQPACKET`, one
//! postcard-encoded message per packet, see [`crate::seqpacket`]).
//!
//! Two kinds of peers speak first:
//! - a tenant process (the interposer, through [`crate::node_client`]) sends
//!   [`ToDaemon::Register`] and gets [`FromDaemon::Registered`] with two
//!   descriptors attached: its budgets (SM share and memory budget per
//!   device; read-only, sealed) and its
//!   activity region (SM-time buckets and telemetry; writable). It then keeps the connection open: the
//!   daemon learns that the process died when the socket closes.
//! - an operator tool (`dilu status`, `dilu set`, `dilu top`) sends one
//!   request and reads one answer.
//!
//! The peer's pid and uid are taken from `SO_PEERCRED`, never from the
//! message. New variants go at the end of each enum (postcard encodes the
//! variant index).

pub use crate::cluster_wire::WorkClass;
pub use crate::units::{Bytes, SmShare};
use serde::{Deserialize, Serialize};

/// Carried in [`ToDaemon::Register`]; a daemon refuses other versions.
pub const PROTOCOL_VERSION: u16 = 1;
/// Where tenants and tools find the daemon unless `DILU_NODEMGR_SOCKET` says.
pub const DEFAULT_SOCKET: &str = "/run/dilu/nodemgr.sock";
/// Environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "DILU_NODEMGR_SOCKET";

/// What a tenant asks for. Shares are of one device's time (serialised as
/// percentages: `sm_request_pct`, `sm_limit_pct`); the memory budget is per
/// device (serialised as a byte count, `mem_bytes`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub class: WorkClass,
    /// Target p99 request latency (latency tenants).
    pub slo_ms: Option<f64>,
    /// Guaranteed share.
    #[serde(rename = "sm_request_pct")]
    pub sm_request: SmShare,
    /// Most it may take when others leave the device idle (request or
    /// more).
    #[serde(rename = "sm_limit_pct")]
    pub sm_limit: SmShare,
    #[serde(rename = "mem_bytes")]
    pub mem: Option<Bytes>,
}

impl Default for TenantSpec {
    /// A batch tenant with no guarantee that may use the whole device.
    fn default() -> Self {
        TenantSpec {
            class: WorkClass::Batch,
            slo_ms: None,
            sm_request: SmShare::NONE,
            sm_limit: SmShare::FULL,
            mem: None,
        }
    }
}

impl TenantSpec {
    /// Checks the spec on its own (admission against others is the daemon's).
    pub fn validate(&self) -> Result<(), String> {
        if self.sm_request > self.sm_limit {
            return Err(format!(
                "SM request {} is above the limit {}",
                self.sm_request, self.sm_limit
            ));
        }
        if self.mem == Some(Bytes::ZERO) {
            return Err("a memory budget of 0 bytes leaves no room for the CUDA context".into());
        }
        match (self.class, self.slo_ms) {
            (_, Some(slo)) if !(slo > 0.0 && slo.is_finite()) => {
                Err(format!("SLO must be a positive number of ms, not {slo}"))
            }
            _ => Ok(()),
        }
    }

    /// The spec a tenant process asks for, from the variables `dilu run`
    /// sets: [`SPEC_ENV`] (`DILU_SPEC`, see [`SpecVar`]) and `DILU_SM_LIMIT`
    /// (`dilu run --sm`: one share for every device, which becomes the
    /// request and the limit where the spec gives none; a per-device value
    /// is an error). `Ok(None)` when neither is set (the daemon's
    /// configuration or defaults apply); a bad value is an error naming the
    /// variable and the key.
    pub fn from_env() -> Result<Option<TenantSpec>, String> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`from_env`](Self::from_env) over any source of variables (`dilu
    /// run` reads the environment it is about to give the tenant).
    pub fn from_vars(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<TenantSpec>, String> {
        let given = SpecVar::from_lookup(&lookup)?;
        let fixed = lookup("DILU_SM_LIMIT")
            .filter(|v| !v.is_empty())
            .map(|v| crate::tenant_flags::uniform_sm_limit(&v))
            .transpose()?;
        if given == SpecVar::default() && fixed.is_none() {
            return Ok(None);
        }
        let mut spec = TenantSpec::default();
        if let Some(class) = given.class {
            spec.class = class;
        }
        spec.slo_ms = given.slo_ms;
        if let Some(v) = given.sm_request.or(fixed) {
            spec.sm_request = v;
        }
        if let Some(v) = given.sm_limit.or(fixed) {
            spec.sm_limit = v;
        }
        spec.mem = given.mem;
        spec.validate()?;
        Ok(Some(spec))
    }
}

/// The variable that hands a tenant process its spec (what `dilu run`, the
/// node manager's launches and the device plugin set; see [`SpecVar`]).
pub const SPEC_ENV: &str = "DILU_SPEC";

/// The keys [`SPEC_ENV`] accepts.
pub const SPEC_KEYS: &str = "class, slo_ms, sm_request, sm_limit and mem";

/// What `DILU_SPEC` says: comma-separated `key=value` pairs, each key at
/// most once and every one optional, such as
/// `class=latency,slo_ms=8,sm_request=20,sm_limit=80,mem=8589934592`:
/// `class` (`latency` or `batch`), `slo_ms` (a number of ms), `sm_request`
/// and `sm_limit` (percent), `mem` (bytes per device). An unknown key or a
/// bad value is an error naming it. One parser ([`SpecVar::parse`]) and one
/// writer ([`SpecVar::env`]) for every side.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpecVar {
    pub class: Option<WorkClass>,
    pub slo_ms: Option<f64>,
    pub sm_request: Option<SmShare>,
    pub sm_limit: Option<SmShare>,
    pub mem: Option<Bytes>,
}

impl SpecVar {
    /// Every key of a full spec (what a pod's assignment hands its tenant).
    pub fn of(spec: &TenantSpec) -> SpecVar {
        SpecVar {
            class: Some(spec.class),
            slo_ms: spec.slo_ms,
            sm_request: Some(spec.sm_request),
            sm_limit: Some(spec.sm_limit),
            mem: spec.mem,
        }
    }

    /// Parses a `DILU_SPEC` value; `Err` says what was expected of the part
    /// or key at fault (never ignored).
    pub fn parse(text: &str) -> Result<SpecVar, String> {
        let mut spec = SpecVar::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((key, value)) = part.split_once('=') else {
                return Err(format!("key=value pairs (keys {SPEC_KEYS}), not {part:?}"));
            };
            let (key, value) = (key.trim(), value.trim());
            let invalid = |expected: &str| format!("{key} to be {expected}, not {value:?}");
            let number = || {
                value
                    .trim_end_matches('%')
                    .parse::<f64>()
                    .map_err(|_| invalid("a number"))
            };
            let share = || {
                value
                    .parse::<SmShare>()
                    .map_err(|_| invalid("a percentage from 0 to 100"))
            };
            let twice = match key {
                "class" => spec
                    .class
                    .replace(parse_class(value).ok_or_else(|| invalid("latency or batch"))?)
                    .is_some(),
                "slo_ms" => spec.slo_ms.replace(number()?).is_some(),
                "sm_request" => spec.sm_request.replace(share()?).is_some(),
                "sm_limit" => spec.sm_limit.replace(share()?).is_some(),
                "mem" => spec
                    .mem
                    .replace(Bytes::new(
                        value.parse().map_err(|_| invalid("a byte count"))?,
                    ))
                    .is_some(),
                _ => return Err(format!("keys {SPEC_KEYS}, not {key:?}")),
            };
            if twice {
                return Err(format!("each key once, not {key} twice"));
            }
        }
        Ok(spec)
    }

    /// `DILU_SPEC` through `lookup`, parsed: nothing when unset or empty;
    /// `Err` is one line naming the variable and the key.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<SpecVar, String> {
        match lookup(SPEC_ENV) {
            None => Ok(SpecVar::default()),
            Some(text) => SpecVar::parse(&text)
                .map_err(|e| format!("{SPEC_ENV}={text:?} is invalid: expected {e}")),
        }
    }

    /// The variable that hands a tenant this spec, `None` when it has no
    /// key: the one writer `dilu run` and the device plugin use.
    pub fn env(&self) -> Option<(String, String)> {
        let mut parts = Vec::new();
        if let Some(class) = self.class {
            parts.push(format!("class={}", class_name(class)));
        }
        for (key, value) in [
            ("slo_ms", self.slo_ms),
            ("sm_request", self.sm_request.map(SmShare::as_percent)),
            ("sm_limit", self.sm_limit.map(SmShare::as_percent)),
        ] {
            if let Some(value) = value {
                parts.push(format!("{key}={value}"));
            }
        }
        if let Some(mem) = self.mem {
            parts.push(format!("mem={}", mem.get()));
        }
        (!parts.is_empty()).then(|| (SPEC_ENV.to_string(), parts.join(",")))
    }
}

/// `latency` or `batch`.
pub fn parse_class(text: &str) -> Option<WorkClass> {
    match text.to_ascii_lowercase().as_str() {
        "latency" | "inference" => Some(WorkClass::Latency),
        "batch" | "training" => Some(WorkClass::Batch),
        _ => None,
    }
}

/// `latency` or `batch`.
pub fn class_name(class: WorkClass) -> &'static str {
    match class {
        WorkClass::Latency => "latency",
        WorkClass::Batch => "batch",
    }
}

/// Changes an operator makes to a tenant (`dilu set`); `None` keeps a field.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecUpdate {
    pub class: Option<WorkClass>,
    pub slo_ms: Option<f64>,
    #[serde(rename = "sm_request_pct")]
    pub sm_request: Option<SmShare>,
    #[serde(rename = "sm_limit_pct")]
    pub sm_limit: Option<SmShare>,
    #[serde(rename = "mem_bytes")]
    pub mem: Option<Bytes>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ToDaemon {
    /// A tenant process starts (or, with `reattach`, reconnects after the
    /// daemon restarted, attaching its old budget and activity-region fds).
    Register {
        version: u16,
        tenant: String,
        spec: Option<TenantSpec>,
        reattach: bool,
    },
    /// One [`NodeStatus`].
    Status,
    /// Change a tenant's spec (operators: root or the daemon's user).
    Set { tenant: String, update: SpecUpdate },
    /// `dilu run` on a node with several GPUs, or asking more than one:
    /// choose the `gpus` GPUs (at least 1) the tenant will run on (the
    /// placement policy the cluster layer uses) and hold them for the
    /// tenant; its spec holds on each. Answered with [`FromDaemon::Placed`]
    /// or `Refused`.
    Place {
        tenant: String,
        spec: Option<TenantSpec>,
        gpus: u32,
    },
    /// The whole [`NodeStatus`], however many tenants: answered with one
    /// or more [`FromDaemon::StatusPart`] (see [`crate::status_parts`]).
    StatusParts,
    /// A grant from the cluster (the DRA plugin preparing a ResourceClaim):
    /// `spec` is tenant `tenant`'s from now on, whatever its processes ask
    /// and whatever the configuration says, until [`ToDaemon::Release`];
    /// a running tenant changes at once. `gpus`: the GPUs the cluster
    /// allocated (NVML indices, as [`FromDaemon::Placed`] names them; empty
    /// on a one-GPU node), the tenant's from its first process on.
    /// Operators only (root or the daemon's user). Answered with
    /// [`FromDaemon::Updated`] or `Error`.
    Grant {
        tenant: String,
        spec: TenantSpec,
        gpus: Vec<u32>,
    },
    /// Ends a [`ToDaemon::Grant`] (the claim was unprepared). Answered with
    /// [`FromDaemon::Released`] or `Error`.
    Release { tenant: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum FromDaemon {
    /// Admitted; fds: [budgets: SM share and memory (read-only), activity
    /// region (read-write)].
    Registered {
        tenant: String,
        spec: TenantSpec,
    },
    /// Not admitted, and why (one line, for the program's stderr).
    Refused {
        reason: String,
    },
    Status(Box<NodeStatus>),
    Updated {
        tenant: String,
        spec: TenantSpec,
    },
    Error {
        reason: String,
    },
    /// The GPUs chosen for a tenant, ascending (NVML indices; the same
    /// GPUs are `CUDA_VISIBLE_DEVICES=a,b,..` under
    /// `CUDA_DEVICE_ORDER=PCI_BUS_ID`, device `k` of the program being the
    /// `k`-th). Empty when the node has one GPU: there is nothing to choose.
    Placed {
        tenant: String,
        gpus: Vec<u32>,
    },
    /// One part of a status; `last` on the final one.
    StatusPart {
        status: Box<NodeStatus>,
        last: bool,
    },
    /// A grant ended; `held` says whether there was one.
    Released {
        tenant: String,
        held: bool,
    },
}

/// What the daemon recommends the cluster layer do with a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaleAdvice {
    /// At its limit and still missing its SLO: add an instance elsewhere.
    ScaleOut,
    /// Idle for a long time: an instance can go.
    ScaleIn,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleSignal {
    pub tenant: String,
    /// The GPU the tenant is on (as in [`TenantStatus::gpu`]).
    #[serde(default)]
    pub gpu: Option<u32>,
    pub advice: ScaleAdvice,
    /// How long the condition has held.
    pub for_seconds: f64,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuStatus {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    /// NVML utilisation (0–1), when NVML is present.
    pub utilization: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantStatus {
    pub name: String,
    pub uid: u32,
    pub spec: TenantSpec,
    pub pids: Vec<i32>,
    /// Memory in use and budget on its first device (bytes), from the
    /// tenant's ledger (its other GPUs' are in `more_gpus`).
    pub mem_used_bytes: u64,
    pub mem_budget_bytes: Option<u64>,
    /// Device memory the tenant's processes really hold on its first
    /// device's GPU, from the daemon's audit (NVML; for a tenant not placed by the
    /// node manager, the most they hold on one GPU); None when no audit
    /// has seen it.
    pub mem_audited_bytes: Option<u64>,
    /// The share the controller set now (percent; 100 = whole device).
    pub sm_current_pct: f64,
    /// Device time the tenant used over the last second (percent).
    pub sm_achieved_pct: f64,
    pub busy_seconds_total: f64,
    pub launches_total: u64,
    pub throttled_seconds_total: f64,
    /// Recent p99 request latency (reported, else the sync-interval proxy).
    pub p99_ms: Option<f64>,
    /// Request latencies the program reported with `dilu_report_latency`
    /// since it registered, and their sum (seconds).
    pub latency_reports_total: u64,
    pub latency_seconds_total: f64,
    /// Fraction of the last second in which the tenant had no kernel.
    pub bubble_ratio: f64,
    /// The GPU of its first device, as an NVML index: the one the node
    /// manager placed it on (`dilu run` on a multi-GPU node), or for a
    /// tenant it did not place the one its processes run on (as NVML
    /// confirms); `None`: not known.
    pub gpu: Option<u32>,
    /// Its other GPUs (`dilu run --gpus N`, or those a tenant not placed
    /// uses), in device order, each with its share, use and memory there; the
    /// figures above are those of its first GPU (`gpu`).
    #[serde(default)]
    pub more_gpus: Vec<GpuShare>,
    /// Its launches wait at a share of 0 (a limit of 0, or a device fully
    /// reserved by other tenants' requests).
    pub waiting: bool,
    /// Why it did not fit when it registered: a process that started while
    /// the daemon was away and could not be admitted, registered anyway and
    /// held to the room left (None: admitted normally).
    pub over_admitted: Option<String>,
    /// Its spec is a cluster's grant (a prepared DRA claim): it wins over
    /// what its processes ask, and `dilu set` leaves it alone.
    #[serde(default)]
    pub granted: bool,
}

/// A tenant's share and use of one more of its GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuShare {
    /// NVML index.
    pub gpu: u32,
    /// The share that GPU's controller set (percent; 100 = whole device).
    pub sm_current_pct: f64,
    /// Device time used there over the last second (percent).
    pub sm_achieved_pct: f64,
    /// Memory in use there from the tenant's ledger, and its budget there
    /// (bytes).
    #[serde(default)]
    pub mem_used_bytes: u64,
    #[serde(default)]
    pub mem_budget_bytes: Option<u64>,
    /// What the daemon's audit saw its processes hold there (NVML).
    #[serde(default)]
    pub mem_audited_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub controller: String,
    pub period_ms: f64,
    pub uptime_seconds: f64,
    pub gpus: Vec<GpuStatus>,
    pub tenants: Vec<TenantStatus>,
    pub signals: Vec<ScaleSignal>,
    /// Control periods the daemon has run since it started.
    pub control_periods: u64,
    /// CPU time the control loop spent on the work of those periods
    /// (sampling, every GPU's controller, budgets), in all and the longest
    /// period.
    #[serde(default)]
    pub control_work_seconds_total: f64,
    #[serde(default)]
    pub control_work_max_ms: f64,
    /// Work-conserving co-location, one entry per GPU with a primary among
    /// this daemon's tenants.
    #[serde(default)]
    pub colocation: Vec<ColoStatus>,
}

/// One GPU's co-location, from the gap board its primary and fillers
/// share. The board is written by the tenants (advisory, like telemetry);
/// times are their interposers' kernel-time estimates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ColoStatus {
    /// The board's group (`DILU_COLO_GROUP`).
    pub group: String,
    /// The device index as the tenants' processes number it.
    pub device: u32,
    pub primary_tenant: String,
    pub primary_pid: i32,
    /// Gaps of the primary long enough to fill (at least its hold-off).
    pub gaps_seen: u64,
    pub gap_seconds_total: f64,
    /// Filler kernel time launched into the primary's gaps.
    pub filled_seconds_total: f64,
    /// The primary's own kernel time.
    pub primary_busy_seconds_total: f64,
    /// Filler work still queued when the primary came back from a gap: the
    /// most it can have waited for fillers.
    pub primary_delay_seconds_total: f64,
    /// `primary_delay / primary_busy`: an upper estimate of the slowdown
    /// fillers cost the primary.
    pub primary_slowdown: f64,
    /// The board's prediction for the primary's next gap (0: none yet).
    pub predicted_gap_ms: f64,
    /// Gaps per repeating iteration of the primary, when one is detected
    /// (the prediction is then per phase; 0: none, the shortest recent gap).
    pub gap_period: u32,
    /// Filler launches that had to wait for a gap.
    pub filler_launches_held: u64,
    /// Filler launches paced at their guarantee (their kernels fit no gap).
    pub filler_fallbacks: u64,
    /// The primary has no latency target: it is kept as if alone, and
    /// the fields below say how its tail budget stands.
    #[serde(default)]
    pub kept_as_if_alone: bool,
    /// The filler kernel it accepts without a cost (ms).
    #[serde(default)]
    pub tolerance_ms: f64,
    /// Its requests (or returns from gaps, where it reports none) judged
    /// against its bound (10% over its p99 alone), and those fillers
    /// pushed over it.
    #[serde(default)]
    pub requests_judged_total: u64,
    #[serde(default)]
    pub requests_pushed_over_total: u64,
    /// Requests fillers may still push over (negative: overdrawn).
    #[serde(default)]
    pub delay_budget_requests: f64,
    /// The budget is overdrawn beyond its noise: filler kernels beyond
    /// the tolerance wait until it is earned back.
    #[serde(default)]
    pub risky_filling_paused: bool,
}

/// Encodes a message for the socket.
pub fn encode<T: Serialize>(message: &T) -> Result<Vec<u8>, String> {
    postcard::to_allocvec(message).map_err(|e| format!("cannot encode a message: {e}"))
}

/// Decodes a message read from the socket: exactly one message, so bytes
/// after a valid one are an error too (a packet carries one message).
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, String> {
    let (message, rest) =
        postcard::take_from_bytes(bytes).map_err(|e| format!("malformed message: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "malformed message: {} bytes after the end of a valid message",
            rest.len()
        ));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_specs_are_checked() {
        let message = ToDaemon::Register {
            version: PROTOCOL_VERSION,
            tenant: "infer".into(),
            spec: Some(TenantSpec {
                class: WorkClass::Latency,
                slo_ms: Some(50.0),
                sm_request: SmShare::percent(20.0),
                sm_limit: SmShare::percent(80.0),
                mem: Some(Bytes::gib(8)),
            }),
            reattach: false,
        };
        let bytes = encode(&message).unwrap();
        assert_eq!(decode::<ToDaemon>(&bytes).unwrap(), message);
        assert!(decode::<ToDaemon>(&[0xff, 0xff]).is_err());
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"extra");
        let error = decode::<ToDaemon>(&longer).unwrap_err();
        assert!(error.contains("5 bytes after the end"), "{error}");

        let bad = TenantSpec {
            sm_request: SmShare::percent(90.0),
            sm_limit: SmShare::percent(50.0),
            ..TenantSpec::default()
        };
        assert!(bad.validate().unwrap_err().contains("above the limit"));
        assert_eq!(parse_class("Latency"), Some(WorkClass::Latency));
        assert_eq!(parse_class("gpu"), None);
    }

    fn spec_of(pairs: &[(&str, &str)]) -> Result<Option<TenantSpec>, String> {
        TenantSpec::from_vars(|name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn an_sm_limit_becomes_the_request_and_limit_under_the_node_manager() {
        let spec = spec_of(&[("DILU_SM_LIMIT", "50")]).unwrap().unwrap();
        assert_eq!(
            (spec.sm_request, spec.sm_limit),
            (SmShare::percent(50.0), SmShare::percent(50.0))
        );
        // The spec's own flags win.
        let spec = spec_of(&[("DILU_SM_LIMIT", "50"), ("DILU_SPEC", "sm_limit=80")])
            .unwrap()
            .unwrap();
        assert_eq!(
            (spec.sm_request, spec.sm_limit),
            (SmShare::percent(50.0), SmShare::percent(80.0))
        );
        let error = spec_of(&[("DILU_SM_LIMIT", "0:30,1:50")]).unwrap_err();
        assert!(error.contains("--sm-request"), "{error}");
        assert_eq!(spec_of(&[]), Ok(None));
        let error = spec_of(&[("DILU_SPEC", "mem=0")]).unwrap_err();
        assert!(error.contains("0 bytes"), "{error}");
    }

    #[test]
    fn one_spec_variable_round_trips_and_names_the_key_at_fault() {
        let full = TenantSpec {
            class: WorkClass::Latency,
            slo_ms: Some(8.5),
            sm_request: SmShare::percent(20.0),
            sm_limit: SmShare::percent(80.0),
            mem: Some(Bytes::gib(8)),
        };
        let (name, value) = SpecVar::of(&full).env().unwrap();
        assert_eq!(name, "DILU_SPEC");
        assert_eq!(
            value,
            "class=latency,slo_ms=8.5,sm_request=20,sm_limit=80,mem=8589934592"
        );
        assert_eq!(spec_of(&[("DILU_SPEC", &value)]), Ok(Some(full)));
        assert_eq!(SpecVar::default().env(), None);
        // Every key is optional; the others keep their defaults.
        let spec = spec_of(&[("DILU_SPEC", " class=latency , slo_ms=5 ")])
            .unwrap()
            .unwrap();
        assert_eq!(spec.class, WorkClass::Latency);
        assert_eq!(spec.slo_ms, Some(5.0));
        assert_eq!(
            (spec.sm_request, spec.sm_limit),
            (SmShare::NONE, SmShare::FULL)
        );
        assert_eq!(spec_of(&[("DILU_SPEC", "")]), Ok(None));
        for (bad, named) in [
            ("class=gpu", "class to be latency or batch, not \"gpu\""),
            ("slo_ms=soon", "slo_ms to be a number, not \"soon\""),
            (
                "sm_request=x",
                "sm_request to be a percentage from 0 to 100, not \"x\"",
            ),
            (
                "sm_limit=",
                "sm_limit to be a percentage from 0 to 100, not \"\"",
            ),
            (
                "sm_limit=140",
                "sm_limit to be a percentage from 0 to 100, not \"140\"",
            ),
            ("mem=8GiB", "mem to be a byte count, not \"8GiB\""),
            ("class=batch,colour=red", "not \"colour\""),
            ("latency", "key=value pairs"),
            ("slo_ms=1,slo_ms=2", "not slo_ms twice"),
        ] {
            let error = spec_of(&[("DILU_SPEC", bad)]).unwrap_err();
            assert!(error.starts_with("DILU_SPEC="), "{bad}: {error}");
            assert!(error.contains(named), "{bad}: {error}");
        }
        // The spec's own checks still apply.
        let error = spec_of(&[("DILU_SPEC", "sm_request=90,sm_limit=50")]).unwrap_err();
        assert!(error.contains("above the limit"), "{error}");
    }

    /// A valid registration, as bytes (the seed the fuzzing below mutates).
    fn registration() -> Vec<u8> {
        encode(&ToDaemon::Register {
            version: PROTOCOL_VERSION,
            tenant: "infer".into(),
            spec: Some(TenantSpec::default()),
            reattach: true,
        })
        .unwrap()
    }

    proptest::proptest! {
        /// Whatever bytes a peer sends, decoding returns (no panic, no
        /// hang, no huge allocation) with a message or a one-line error.
        #[test]
        fn any_bytes_decode_to_a_message_or_a_clear_error(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2048)
        ) {
            for result in [
                decode::<ToDaemon>(&bytes).map(|_| ()),
                decode::<FromDaemon>(&bytes).map(|_| ()),
            ] {
                if let Err(error) = result {
                    proptest::prop_assert!(error.starts_with("malformed message"));
                    proptest::prop_assert!(!error.contains('\n'));
                }
            }
        }

        /// Valid messages with bytes flipped or cut short: the same.
        #[test]
        fn damaged_registrations_decode_or_fail_cleanly(
            flips in proptest::collection::vec((0usize..64, proptest::num::u8::ANY), 0..8),
            cut in 0usize..64,
        ) {
            let mut bytes = registration();
            for (at, value) in flips {
                let at = at % bytes.len();
                bytes[at] = value;
            }
            bytes.truncate(cut.max(1).min(bytes.len()));
            if let Ok(ToDaemon::Register { spec: Some(spec), .. }) = decode::<ToDaemon>(&bytes) {
                // Whatever spec came through, validation answers.
                let _ = spec.validate();
            }
        }

        /// Specs sent with any numbers (NaN, infinities, negatives) are
        /// judged, never accepted when the shares are not percentages
        /// (refused as they are decoded) or the SLO is not positive.
        #[test]
        fn any_spec_is_validated(
            request in proptest::num::f64::ANY,
            limit in proptest::num::f64::ANY,
            slo in proptest::option::of(proptest::num::f64::ANY),
        ) {
            /// What a peer can put on the wire in a spec's place.
            #[derive(Serialize)]
            struct SentSpec {
                class: WorkClass,
                slo_ms: Option<f64>,
                sm_request_pct: f64,
                sm_limit_pct: f64,
                mem_bytes: Option<u64>,
            }
            let sent = SentSpec {
                class: WorkClass::Batch,
                slo_ms: slo,
                sm_request_pct: request,
                sm_limit_pct: limit,
                mem_bytes: None,
            };
            let bytes = postcard::to_allocvec(&sent).unwrap();
            let percent = |v: f64| (0.0..=100.0).contains(&v);
            match decode::<TenantSpec>(&bytes) {
                Ok(spec) => {
                    proptest::prop_assert!(percent(request) && percent(limit));
                    if spec.validate().is_ok() {
                        proptest::prop_assert!(spec.sm_request <= spec.sm_limit);
                        proptest::prop_assert!(slo.is_none_or(|s| s > 0.0 && s.is_finite()));
                    }
                }
                Err(_) => proptest::prop_assert!(!(percent(request) && percent(limit))),
            }
        }
    }
}
