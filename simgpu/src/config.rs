//! Configuration read once at `cuInit` from the environment.

use crate::call_costs::CallCosts;
use dilu_abi::units::{DURATION_FORMS, SIZE_FORMS, parse_duration_ns, parse_size};
use std::collections::HashMap;

pub(crate) const MAX_DEVICES: usize = 16;

/// How processes (and one process's streams) share a device
/// (`SIMGPU_SHARING`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    /// One timeline: every kernel reserves its own stretch, no preemption,
    /// no overlap between streams (`serial_timeline`).
    Serial,
    /// Time slices with preemption, concurrent streams, switch cost, gap
    /// and jitter (`engine`).
    TimeSliced,
}

impl Sharing {
    /// The word stored in the instance's shared state.
    pub(crate) fn code(self) -> u64 {
        match self {
            Sharing::Serial => 0,
            Sharing::TimeSliced => 1,
        }
    }

    pub(crate) fn name_of(code: u64) -> &'static str {
        match code {
            0 => "serial",
            1 => "timesliced",
            _ => "unknown",
        }
    }
}

/// Preemption at the end of a time slice (`SIMGPU_PREEMPT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Preempt {
    /// Running kernels stop at once (compute preemption since Pascal).
    Instruction,
    /// Running kernels stop after their current wave of blocks.
    Wave,
    /// Running kernels finish; the slice ends after them.
    None,
}

fn duration(var: &str, default: u64, max: u64) -> Result<u64, String> {
    match get(var) {
        None => Ok(default),
        Some(v) => match parse_duration_ns(&v) {
            Ok(n) if n <= max => Ok(n),
            _ => Err(bad(var, &v, &format!("{DURATION_FORMS}, at most {max} ns"))),
        },
    }
}

fn sigma(var: &str, default: f64) -> Result<f64, String> {
    match get(var) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<f64>() {
            Ok(s) if (0.0..=1.0).contains(&s) => Ok(s),
            _ => Err(bad(
                var,
                &v,
                "a number from 0 to 1 (sigma of the log of the duration)",
            )),
        },
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub devices: usize,
    pub memory: u64,
    pub sms: u64,
    pub wave_ns: u64,
    /// How processes and streams share a device.
    pub sharing: Sharing,
    /// Longest run of one process's kernels while another process waits
    /// (0 = strict FIFO between processes).
    pub timeslice_ns: u64,
    /// What happens to running kernels when a slice ends with another
    /// process waiting.
    pub preempt: Preempt,
    /// Device time lost when the device passes to another process.
    pub switch_ns: u64,
    /// Device gap before a kernel (after its launch or the previous work
    /// of its stream).
    pub gap_ns: u64,
    /// Sigma of the lognormal duration factor of each kernel.
    pub jitter: f64,
    /// Sigma of the slow drift of durations (one second correlation).
    pub drift: f64,
    /// Seed of the jitter (0 = from pid and clock).
    pub seed: u64,
    pub kernel_cost: HashMap<String, u64>,
    pub trace: Option<String>,
    pub instance: String,
    pub null: bool,
    /// Host time each priced driver call takes (`SIMGPU_CALL_COST`).
    pub call_costs: CallCosts,
    /// Hardware work queues of a process (`CUDA_DEVICE_MAX_CONNECTIONS`, as
    /// the real driver reads it): streams share them by stream id, and
    /// kernels of streams on one queue never overlap (1 serialises every
    /// stream of the process).
    pub connections: u64,
    /// Visible device ordinal -> simulated physical device index.
    pub visible: Vec<usize>,
}

/// One line naming the variable, the bad value and the accepted forms.
pub(crate) fn bad(var: &str, value: &str, expected: &str) -> String {
    format!("simgpu: {var}={value:?} is invalid: expected {expected}")
}

/// The CUDA driver version simgpu reports (`SIMGPU_DRIVER_VERSION`,
/// default 13020 = CUDA 13.2, which serves cudart 12 and 13 programs alike;
/// tests may lower it). Read once: `cuDriverGetVersion` works before
/// `cuInit`, and `cuInit` fails with this line when it is invalid.
pub(crate) fn driver_version() -> Result<i32, String> {
    static V: std::sync::OnceLock<Result<i32, String>> = std::sync::OnceLock::new();
    V.get_or_init(|| match get("SIMGPU_DRIVER_VERSION") {
        None => Ok(13020),
        Some(v) => match v.trim().parse::<i32>() {
            Ok(n) if (11000..100_000).contains(&n) => Ok(n),
            _ => Err(bad(
                "SIMGPU_DRIVER_VERSION",
                &v,
                "an integer from 11000 to 99999 such as 12090 (CUDA 12.9)",
            )),
        },
    })
    .clone()
}

fn get(var: &str) -> Option<String> {
    std::env::var(var).ok()
}

fn count(var: &str, default: u64, max: u64) -> Result<u64, String> {
    match get(var) {
        None => Ok(default),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(n) if n >= 1 && n <= max => Ok(n),
            _ => Err(bad(var, &v, &format!("an integer from 1 to {max}"))),
        },
    }
}

impl Config {
    pub(crate) fn from_env() -> Result<Config, String> {
        driver_version()?;
        let devices = count("SIMGPU_DEVICES", 1, MAX_DEVICES as u64)? as usize;
        let memory = match get("SIMGPU_MEMORY") {
            None => 80 << 30,
            Some(v) => match parse_size(&v) {
                Ok(n) if (1 << 20..=1 << 44).contains(&n) => n,
                _ => {
                    return Err(bad(
                        "SIMGPU_MEMORY",
                        &v,
                        &format!("{SIZE_FORMS}, from 1MiB to 16TiB"),
                    ));
                }
            },
        };
        let sms = count("SIMGPU_SMS", 132, 1 << 20)?;
        let wave_ns = match get("SIMGPU_WAVE_NS") {
            None => 10_000,
            Some(v) => {
                parse_duration_ns(&v).map_err(|_| bad("SIMGPU_WAVE_NS", &v, DURATION_FORMS))?
            }
        };
        let sharing = match get("SIMGPU_SHARING").as_deref() {
            Some("serial") => Sharing::Serial,
            None | Some("timesliced") => Sharing::TimeSliced,
            Some(v) => return Err(bad("SIMGPU_SHARING", v, "serial or timesliced")),
        };
        let realistic = sharing == Sharing::TimeSliced;
        let timeslice_ns = match get("SIMGPU_TIMESLICE") {
            // Measured on an H100 with driver 580 (`gpu-calibrate slice`:
            // median uninterrupted run 2.08 ms); the serial model keeps its
            // historical 2 ms.
            None if realistic => 2_080_000,
            None => 2_000_000,
            Some(v) => {
                parse_duration_ns(&v).map_err(|_| bad("SIMGPU_TIMESLICE", &v, DURATION_FORMS))?
            }
        };
        let preempt = match get("SIMGPU_PREEMPT").as_deref() {
            None | Some("instruction") => Preempt::Instruction,
            Some("wave") => Preempt::Wave,
            Some("none") => Preempt::None,
            Some(v) => return Err(bad("SIMGPU_PREEMPT", v, "instruction, wave or none")),
        };
        // Used by the time-sliced model only (serial kernels take exactly
        // their cost, back to back).
        // Defaults measured on an H100 with driver 580 by `gpu-calibrate`
        // in two runs (simgpu/README.md, *Calibration*): 138 µs between one
        // process's last kernel and the other's first at a hand-off,
        // 2.85–3.10 µs between back-to-back full-grid kernels, σ of
        // ln(duration) 0.0085–0.0088 (87 µs kernels) to 0.026–0.031 (21 µs),
        // drift σ 0.0003 to 0.016.
        let switch_ns = duration("SIMGPU_SWITCH_COST", 140_000, 100_000_000)?;
        let gap_ns = duration("SIMGPU_KERNEL_GAP", 3_000, 100_000_000)?;
        let jitter = sigma("SIMGPU_JITTER", 0.01)?;
        let drift = sigma("SIMGPU_DRIFT", 0.001)?;
        let seed = match get("SIMGPU_SEED") {
            None => 0,
            Some(v) => v
                .trim()
                .parse::<u64>()
                .map_err(|_| bad("SIMGPU_SEED", &v, "an unsigned integer"))?,
        };
        let mut kernel_cost = HashMap::new();
        if let Some(v) = get("SIMGPU_KERNEL_COST") {
            let forms = "a comma-separated list of NAME=DURATION such as gemm=2ms,relu=20us";
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let (name, dur) = item
                    .split_once('=')
                    .ok_or_else(|| bad("SIMGPU_KERNEL_COST", &v, forms))?;
                let ns =
                    parse_duration_ns(dur).map_err(|_| bad("SIMGPU_KERNEL_COST", &v, forms))?;
                if name.trim().is_empty() {
                    return Err(bad("SIMGPU_KERNEL_COST", &v, forms));
                }
                kernel_cost.insert(name.trim().to_string(), ns);
            }
        }
        let trace = get("SIMGPU_TRACE").filter(|s| !s.is_empty());
        let instance = get("SIMGPU_INSTANCE").unwrap_or_else(|| "default".into());
        if instance.is_empty()
            || instance.len() > 100
            || !instance
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(bad(
                "SIMGPU_INSTANCE",
                &instance,
                "1 to 100 characters from [A-Za-z0-9._-]",
            ));
        }
        let null = match get("SIMGPU_NULL").as_deref() {
            None | Some("") | Some("0") => false,
            Some("1") => true,
            Some(v) => return Err(bad("SIMGPU_NULL", v, "0 or 1")),
        };
        let connections = count("CUDA_DEVICE_MAX_CONNECTIONS", 8, 32)?;
        let call_costs = match get("SIMGPU_CALL_COST") {
            None => CallCosts::default(),
            Some(v) => CallCosts::parse(&v)
                .map_err(|_| bad("SIMGPU_CALL_COST", &v, &CallCosts::forms()))?,
        };
        let visible = match get("CUDA_VISIBLE_DEVICES") {
            None => (0..devices).collect(),
            Some(v) => {
                // Like the real driver: take devices (by index or UUID) up
                // to the first entry that names none.
                let mut out = Vec::new();
                for part in v.split(',') {
                    match crate::identity::visible_entry(part.trim(), devices, &instance) {
                        Some(i) if !out.contains(&i) => out.push(i),
                        _ => break,
                    }
                }
                out
            }
        };
        Ok(Config {
            devices,
            memory,
            sms,
            wave_ns,
            sharing,
            timeslice_ns,
            preempt,
            switch_ns,
            gap_ns,
            jitter,
            drift,
            seed,
            kernel_cost,
            trace,
            instance,
            null,
            call_costs,
            connections,
            visible,
        })
    }

    /// Simulated duration of a kernel launch.
    pub(crate) fn kernel_ns(&self, name: &str, blocks: u64) -> u64 {
        if let Some(ns) = self.kernel_cost.get(name) {
            return *ns;
        }
        blocks.div_ceil(self.sms) * self.wave_ns
    }
}
