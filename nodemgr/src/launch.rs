//! `dilu run`: start a program with the interposer preloaded.
//!
//! Everything the user gave is checked here, before the program starts, by
//! the rules the interposer and the node manager apply
//! ([`dilu_abi::tenant_flags`], [`TenantSpec::validate`]).
//!
//! Where a node manager answers on its socket, the program always runs as
//! one of its tenants: the one `--tenant` (or `DILU_TENANT`) names, else
//! `<program>-<pid>` (said on stderr), so that the daemon counts it and
//! shares the device with it. Where its socket is there but nothing answers
//! (the daemon is restarting) or nothing answers in time (it stalls), the
//! same holds: the program starts on its own limits and registers when the
//! daemon answers. Flags that only the node
//! manager reads, given where there is no socket, are said to do nothing.
//!
//! On a node with several GPUs, a tenant whose user set no
//! `CUDA_VISIBLE_DEVICES` is placed by the node manager: `dilu run` sends it
//! the tenant's spec and how many GPUs it asks (`--gpus N`, default 1;
//! [`ToDaemon::Place`]), the daemon picks them with the cluster layer's
//! placement policy and holds them for the tenant, and the program sees
//! only those GPUs, in PCI bus order. With one GPU and `--gpus 1` nothing
//! changes.

use crate::artifacts;
use crate::cpu_priority;
use crate::error::{self, Error};
use dilu_abi::node_wire::{self, FromDaemon, SmShare, TenantSpec, ToDaemon};
use dilu_abi::tenant_flags;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

pub struct LaunchSpec {
    pub sim: bool,
    pub mem: Option<String>,
    pub sm: Option<String>,
    pub tenant: Option<String>,
    /// The node manager's socket (default `DILU_NODEMGR_SOCKET`, else
    /// `/run/dilu/nodemgr.sock`).
    pub socket: Option<PathBuf>,
    /// The tenant's spec for the node manager (ignored without one).
    pub class: Option<dilu_abi::node_wire::WorkClass>,
    pub slo_ms: Option<f64>,
    pub sm_request: Option<SmShare>,
    pub sm_limit: Option<SmShare>,
    /// The batch size from a profile (`DILU_BATCH`, unless already set).
    pub batch: Option<u32>,
    /// Co-location role (`DILU_COLO`): primary, filler or online-filler.
    pub colo: Option<String>,
    /// How many GPUs the tenant asks the node manager for (`--gpus`; its
    /// spec holds on each). 1 unless given.
    pub gpus: u32,
    /// The program's nice value (`--cpu-nice`); by default a filler's is
    /// lowered ([`cpu_priority`]).
    pub cpu_nice: Option<i32>,
    pub command: Vec<String>,
}

/// Builds the child's environment changes: `LD_PRELOAD` gets the interposer
/// first; with `sim`, `LD_LIBRARY_PATH` gets the simgpu driver directory first.
pub fn environment(spec: &LaunchSpec) -> error::Result<Vec<(String, OsString)>> {
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
    // A co-location primary's SLO is the spec's.
    let given = node_wire::SpecVar {
        class: spec.class,
        slo_ms: spec.slo_ms,
        sm_request: spec.sm_request,
        sm_limit: spec.sm_limit,
        mem: spec
            .mem
            .as_deref()
            .and_then(|m| m.parse::<dilu_abi::units::Bytes>().ok()),
    };
    if let Some((name, value)) = given.env() {
        env.push((name, value.into()));
    }
    if let Some(role) = &spec.colo {
        env.push(("DILU_COLO".to_string(), role.into()));
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

/// Checks every value the user gave by the rules the interposer and the
/// node manager apply, so a mistake stops here with one line, not after
/// the program loaded its framework.
fn validate(spec: &LaunchSpec) -> Result<(), String> {
    if let Some(name) = &spec.tenant {
        tenant_flags::check_tenant_name(name).map_err(|e| format!("--tenant: {e}"))?;
    }
    if spec.gpus == 0 {
        return Err("--gpus 0 is invalid: a tenant runs on 1 GPU or more".into());
    }
    if spec.gpus > 1 && std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return Err(format!(
            "--gpus {} asks the node manager to choose GPUs, but CUDA_VISIBLE_DEVICES \
             already names them: give one or the other",
            spec.gpus
        ));
    }
    if let Some(mem) = &spec.mem
        && tenant_flags::parse_mem_limits(mem).is_none()
    {
        return Err(format!(
            "--mem {mem:?} is invalid: expected {}",
            tenant_flags::MEM_LIMIT_FORMS
        ));
    }
    if let Some(sm) = &spec.sm
        && tenant_flags::parse_sm_limits(sm).is_none()
    {
        return Err(format!(
            "--sm {sm:?} is invalid: expected {}",
            tenant_flags::SM_LIMIT_FORMS
        ));
    }
    Ok(())
}

/// Whether a node manager answers on `socket`: `Ok(false)` where there is
/// no socket, `Err` (what to tell the user) where one is there but nothing
/// answers.
fn node_manager_answers(socket: &Path) -> Result<bool, String> {
    if !socket.exists() {
        return Ok(false);
    }
    match dilu_abi::seqpacket::connect(socket, Some(Duration::from_secs(2))) {
        Ok(_) => Ok(true),
        Err(e) => Err(format!(
            "the node manager's socket {} does not answer ({e})",
            socket.display()
        )),
    }
}

/// The tenant a program started without `--tenant` runs as under the node
/// manager: its program's file name and its pid (the pid `dilu run` execs
/// into), in the characters tenant names take.
pub fn default_tenant(program: &str, pid: u32) -> String {
    let base = Path::new(program)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut name: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    name = name.trim_start_matches('.').to_string();
    if name.is_empty() {
        name = "program".into();
    }
    let suffix = format!("-{pid}");
    name.truncate(64 - suffix.len());
    name + &suffix
}

/// Flags that only a node manager reads, by name, where given (a
/// co-location primary's class comes with its role, and its SLO is its
/// tolerance's bound without a node manager too).
fn node_manager_flags(spec: &LaunchSpec) -> Vec<&'static str> {
    let primary = spec.colo.as_deref() == Some("primary");
    [
        ("--class", spec.class.is_some() && !primary),
        ("--slo-ms", spec.slo_ms.is_some() && !primary),
        ("--sm-request", spec.sm_request.is_some()),
        ("--sm-limit", spec.sm_limit.is_some()),
        ("--gpus", spec.gpus > 1),
    ]
    .into_iter()
    .filter_map(|(flag, given)| given.then_some(flag))
    .collect()
}

/// Says where no CUDA driver can be loaded (the program would fail with
/// only its own dlopen error).
fn warn_without_driver() {
    let name = std::env::var("DILU_REAL_LIBCUDA").unwrap_or_else(|_| "libcuda.so.1".into());
    let Ok(c_name) = std::ffi::CString::new(name.clone()) else {
        return;
    };
    // SAFETY: dlopen with a NUL-terminated name; the handle, if any, is
    // closed at once. Loading a driver runs no CUDA call (no cuInit), and
    // this process is replaced by the program right after.
    let found = unsafe {
        let handle = libc::dlopen(c_name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if !handle.is_null() {
            libc::dlclose(handle);
        }
        !handle.is_null()
    };
    if !found {
        eprintln!(
            "dilu: no CUDA driver found ({name} does not load): install NVIDIA's driver, \
             or add --sim to run on the simulated GPU"
        );
    }
}

/// Replaces this process with the command (so signals and the exit status
/// are the program's own). Returns only on failure.
pub fn run(spec: &LaunchSpec) -> error::Result<ExitCode> {
    let (program, args) = spec
        .command
        .split_first()
        .ok_or_else(|| Error::Invalid("nothing to run: give a command after `--`".into()))?;
    validate(spec).map_err(Error::Invalid)?;
    let mut command = Command::new(program);
    command.args(args);
    let mut env = environment(spec)?;
    let socket = spec
        .socket
        .clone()
        .unwrap_or_else(dilu_abi::node_client::socket_path);
    if spec.socket.is_some() {
        env.push((node_wire::SOCKET_ENV.to_string(), socket.clone().into()));
    }
    // `expected`: a socket is there, so the tenant registers (now, or when
    // the daemon answers again).
    let (managed, expected) = match node_manager_answers(&socket) {
        Ok(managed) => (managed, managed),
        Err(why) => {
            eprintln!(
                "dilu: {why}; the program starts on its own limits and registers when the \
                 node manager answers"
            );
            (false, true)
        }
    };
    let named =
        spec.tenant.is_some() || std::env::var_os("DILU_TENANT").is_some_and(|t| !t.is_empty());
    let default_name = (expected && !named).then(|| default_tenant(program, std::process::id()));
    if let Some(tenant) = &default_name {
        env.push(("DILU_TENANT".to_string(), tenant.into()));
    }
    let unread = node_manager_flags(spec);
    if !expected && !unread.is_empty() {
        eprintln!(
            "dilu: {} take effect only under a node manager, and none answers at {}: \
             the program runs without them (--sm and --mem limit it without one)",
            unread.join(", "),
            socket.display()
        );
    }
    if expected {
        // The spec the interposer will register with, checked now.
        let child_view = child_lookup(&env);
        TenantSpec::from_vars(child_view).map_err(Error::Invalid)?;
    }
    if managed {
        if let Some(tenant) = &default_name {
            eprintln!(
                "dilu: running as tenant {tenant} of the node manager (--tenant names one; \
                 `dilu status` shows it)"
            );
        }
        let gpus = placed_gpus(&env, &socket, spec.gpus)?;
        if !gpus.is_empty() {
            // NVML numbers GPUs in PCI bus order; CUDA does too with this
            // order, so the program's device k is the k-th GPU listed.
            let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
            env.push(("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".into()));
            env.push(("CUDA_VISIBLE_DEVICES".to_string(), list.join(",").into()));
        }
    }
    if !spec.sim {
        warn_without_driver();
    }
    let role = spec
        .colo
        .clone()
        .or_else(|| std::env::var("DILU_COLO").ok());
    cpu_priority::apply(spec.cpu_nice, role.as_deref());
    for (key, value) in env {
        command.env(key, value);
    }
    let error = command.exec();
    Err(Error::System(format!("cannot start {program}: {error}")))
}

/// A variable as the child will see it: what this launch sets, else what
/// it inherits.
fn child_lookup(env: &[(String, OsString)]) -> impl Fn(&str) -> Option<String> + '_ {
    move |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.to_string_lossy().into_owned())
            .or_else(|| std::env::var(name).ok())
    }
}

/// The GPUs (`count` of them) the node manager chose for this tenant,
/// ascending, when it has a choice to make (see the module docs); `env` is
/// what the child gets beside this process's environment. A refusal stops
/// the launch (the daemon would refuse the tenant's registration too).
fn placed_gpus(env: &[(String, OsString)], socket: &Path, count: u32) -> error::Result<Vec<u32>> {
    if std::env::var_os("CUDA_VISIBLE_DEVICES").is_some() {
        return Ok(Vec::new());
    }
    let lookup = child_lookup(env);
    let Some(tenant) = lookup("DILU_TENANT").filter(|t| !t.is_empty()) else {
        return Ok(Vec::new());
    };
    let spec = TenantSpec::from_vars(lookup).map_err(Error::Invalid)?;
    let request = ToDaemon::Place {
        tenant: tenant.clone(),
        spec,
        gpus: count,
    };
    match crate::ops::ask(socket, &request) {
        // The daemon answered the connection a moment ago: it stalls, or
        // went away since. The tenant still registers (when it answers)
        // and is controlled where its processes run.
        Err(why) => {
            eprintln!(
                "dilu: the node manager did not say where tenant {tenant} runs ({why}); the \
                 program starts on the GPUs CUDA shows it and is controlled on those it uses \
                 once the node manager answers"
            );
            Ok(Vec::new())
        }
        Ok(FromDaemon::Placed { gpus, .. }) => Ok(gpus),
        Ok(FromDaemon::Refused { reason } | FromDaemon::Error { reason }) => Err(Error::Refused(
            format!("the node manager has no GPU for tenant {tenant}: {reason}"),
        )),
        Ok(other) => Err(Error::NodeManager(format!(
            "unexpected answer from the node manager: {other:?}"
        ))),
    }
}
