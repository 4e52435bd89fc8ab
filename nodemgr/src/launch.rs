//! `dilu run`: start a program with the interposer preloaded.
//!
//! On a node with several GPUs, a named tenant (`--tenant` or `DILU_TENANT`)
//! whose user set no `CUDA_VISIBLE_DEVICES` is placed by the node manager:
//! `dilu run` sends it the tenant's spec ([`ToDaemon::Place`]), the daemon
//! picks a GPU with the cluster layer's placement policy and holds it for
//! the tenant, and the program sees only that GPU. With no node manager
//! answering, or one GPU, nothing changes.

use crate::artifacts;
use dilu_abi::node_wire::{FromDaemon, TenantSpec, ToDaemon};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

pub struct LaunchSpec {
    pub sim: bool,
    pub mem: Option<String>,
    pub sm: Option<String>,
    pub tenant: Option<String>,
    /// The tenant's spec for the node manager (ignored without one).
    pub class: Option<dilu_abi::node_wire::WorkClass>,
    pub slo_ms: Option<f64>,
    pub sm_request: Option<f64>,
    pub sm_limit: Option<f64>,
    /// The batch size from a profile (`DILU_BATCH`, unless already set).
    pub batch: Option<u32>,
    /// Co-location role (`DILU_COLO`): primary, filler or online-filler.
    pub colo: Option<String>,
    pub command: Vec<String>,
}

/// Builds the child's environment changes: `LD_PRELOAD` gets the interposer
/// first; with `sim`, `LD_LIBRARY_PATH` gets the simgpu driver directory first.
pub fn environment(spec: &LaunchSpec) -> Result<Vec<(String, OsString)>, String> {
    let interposer = artifacts::find(artifacts::INTERPOSER_FILE)?;
    let mut env = vec![(
        "LD_PRELOAD".to_string(),
        prepend(
            interposer.into_os_string(),
            std::env::var_os("LD_PRELOAD"),
            ":",
        ),
    )];
    // The interposer validates these at start and stops with one clear line.
    if let Some(sm) = &spec.sm {
        env.push(("DILU_SM_LIMIT".to_string(), sm.into()));
    }
    if let Some(mem) = &spec.mem {
        env.push(("DILU_MEM_LIMIT".to_string(), mem.into()));
    }
    if let Some(tenant) = &spec.tenant {
        env.push(("DILU_TENANT".to_string(), tenant.into()));
    }
    // The spec the interposer registers with the node manager
    // (`TenantSpec::from_env`); a plain size also becomes its memory budget.
    if let Some(class) = spec.class {
        let name = dilu_abi::node_wire::class_name(class);
        env.push(("DILU_SPEC_CLASS".to_string(), name.into()));
    }
    for (name, value) in [
        ("DILU_SPEC_SLO_MS", spec.slo_ms),
        ("DILU_SPEC_SM_REQUEST", spec.sm_request),
        ("DILU_SPEC_SM_LIMIT", spec.sm_limit),
    ] {
        if let Some(value) = value {
            env.push((name.to_string(), value.to_string().into()));
        }
    }
    if let Some(role) = &spec.colo {
        env.push(("DILU_COLO".to_string(), role.into()));
        // A primary's SLO is what its latency reports are judged against.
        if let (true, Some(slo)) = (role == "primary", spec.slo_ms) {
            env.push(("DILU_COLO_SLO".to_string(), format!("{slo}ms").into()));
        }
    }
    if let Some(bytes) = spec
        .mem
        .as_deref()
        .and_then(|m| dilu_abi::units::parse_size(m).ok())
    {
        env.push(("DILU_SPEC_MEM".to_string(), bytes.to_string().into()));
    }
    if let Some(batch) = spec.batch
        && std::env::var_os("DILU_BATCH").is_none()
    {
        env.push(("DILU_BATCH".to_string(), batch.to_string().into()));
    }
    if spec.sim {
        let simgpu = artifacts::find(artifacts::SIMGPU_FILE)?;
        let dir = artifacts::simgpu_driver_dir(&simgpu)?;
        env.push((
            "LD_LIBRARY_PATH".to_string(),
            prepend(
                dir.into_os_string(),
                std::env::var_os("LD_LIBRARY_PATH"),
                ":",
            ),
        ));
    }
    Ok(env)
}

fn prepend(first: OsString, rest: Option<OsString>, separator: &str) -> OsString {
    let mut value = first;
    if let Some(rest) = rest.filter(|r| !r.is_empty()) {
        value.push(separator);
        value.push(rest);
    }
    value
}

/// Replaces this process with the command (so signals and the exit status
/// are the program's own). Returns only on failure.
pub fn run(spec: &LaunchSpec) -> Result<ExitCode, String> {
    let (program, args) = spec
        .command
        .split_first()
        .ok_or("nothing to run: give a command after `--`")?;
    let mut command = Command::new(program);
    command.args(args);
    let mut env = environment(spec)?;
    if let Some(gpu) = placed_gpu(&env)? {
        // NVML numbers GPUs in PCI bus order; CUDA does too with this order.
        env.push(("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".into()));
        env.push(("CUDA_VISIBLE_DEVICES".to_string(), gpu.to_string().into()));
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let error = command.exec();
    Err(format!("cannot start {program}: {error}"))
}

/// The GPU the node manager chose for this tenant, when it has a choice to
/// make (see the module docs); `env` is what the child gets beside this
/// process's environment. A refusal stops the launch (the daemon would
/// refuse the tenant's registration too).
fn placed_gpu(env: &[(String, OsString)]) -> Result<Option<u32>, String> {
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return Ok(None);
    }
    // The child's view: what this launch sets, else what it inherits.
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
            .or_else(|| std::env::var(name).ok())
    };
    let Some(tenant) = lookup("DILU_TENANT").filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let spec = TenantSpec::from_vars(lookup)?;
    let socket = dilu_abi::node_client::socket_path();
    if !socket.exists() {
        return Ok(None);
    }
    let request = ToDaemon::Place {
        tenant: tenant.clone(),
        spec,
    };
    match crate::ops::ask(&socket, &request) {
        // No daemon behind the socket: the tenant runs standalone.
        Err(_) => Ok(None),
        Ok(FromDaemon::Placed { gpu, .. }) => Ok(gpu),
        Ok(FromDaemon::Refused { reason } | FromDaemon::Error { reason }) => Err(format!(
            "the node manager has no GPU for tenant {tenant}: {reason}"
        )),
        Ok(other) => Err(format!(
            "unexpected answer from the node manager: {other:?}"
        )),
    }
}
