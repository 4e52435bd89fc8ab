//! `dilu`: the command-line front end of dilu.
//!
//! It owns user-facing commands: launching CUDA programs under the
//! interposer (`dilu run`), the node manager daemon (`dilu nodemgr`) and its
//! operator tools (`dilu status`, `dilu top`, `dilu set`), and the demo. It
//! never links the interposer's cdylib code; it only points `LD_PRELOAD` at it.

mod demo;

use clap::{Args, Parser, Subcommand};
use dilu_abi::node_wire::{self, SmShare, SpecUpdate};
use dilu_nodemgr::error::{Error, Result};
use dilu_nodemgr::{config, daemon, launch, ops, profile_run, profile_spec};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "dilu",
    version,
    about = "GPU sharing for deep-learning processes: hard memory budgets and SM-time budgets per tenant",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a CUDA program with the dilu interposer preloaded.
    ///
    /// Without a node manager, --mem and --sm limit the program (and the
    /// processes it starts). Where a node manager answers on its socket,
    /// the program is one of its tenants: the one --tenant names, else
    /// `<program>-<pid>`; it then gets the node manager's budgets (--sm
    /// becomes its SM request and limit, --mem its memory budget), and a
    /// tenant without an SM request is best effort: it runs on the time
    /// the guaranteed tenants leave idle.
    ///
    /// On a node with several GPUs and a node manager, a named tenant
    /// (--tenant or DILU_TENANT) started without CUDA_VISIBLE_DEVICES runs on
    /// the GPU the node manager chooses for its spec, with the placement
    /// policy the cluster layer uses (config key `placement`, default dilu):
    /// the program sees only that GPU (CUDA_VISIBLE_DEVICES, PCI bus order)
    /// and `dilu status` lists where each tenant went. If no GPU has room
    /// the program is not started. With one GPU, no node manager or
    /// CUDA_VISIBLE_DEVICES already set, the program sees what it would
    /// have seen.
    ///
    /// Example: dilu run --sim --tenant infer --class latency --slo-ms 50 --sm-request 20 --sm-limit 80 -- python serve.py
    Run(RunArgs),
    /// Show a latency tenant and a batch tenant sharing one simulated GPU
    /// under the node manager, with three controllers compared.
    Demo(DemoArgs),
    /// The node manager daemon (normally run by systemd as root).
    Nodemgr(NodemgrArgs),
    /// Print the node manager's tenants as a table.
    Status(StatusArgs),
    /// Show the status table, refreshed live (plain snapshots when not on a terminal).
    Top(TopArgs),
    /// Change a tenant's spec while it runs.
    ///
    /// Example: dilu set infer --sm-limit 60
    Set(SetArgs),
    /// Find a function's batch size, SM request and SM limit by measuring a
    /// few configurations: of the program itself (one bounded trial each,
    /// batch size in DILU_BATCH), or of a measured table (--table).
    ///
    /// Example: dilu profile --sim --class latency --slo-ms 20 -- python serve.py
    Profile(ProfileArgs),
}

#[derive(Args)]
pub struct ProfileArgs {
    /// latency: the most throughput per SM % meeting --slo-ms per batch;
    /// batch: the least share within 2% of full throughput.
    #[arg(long, default_value = "latency", value_parser = ["latency", "batch"])]
    class: String,
    /// The SLO on one batch (request), in milliseconds (latency class).
    #[arg(long, value_name = "MS")]
    slo_ms: Option<f64>,
    /// Batch class: the batch size to profile at (default: --max-batch).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    batch: Option<u32>,
    /// The search: dilu, dilu-paper (Dilu's published HGSS / binary search)
    /// or exhaustive (every configuration).
    #[arg(long, default_value = "dilu")]
    method: String,
    /// Search a measured table (batch,sm,latency_s,throughput CSV) instead
    /// of running a program.
    #[arg(long, value_name = "FILE.csv")]
    table: Option<PathBuf>,
    /// Run the program on the simulated GPU (simgpu).
    #[arg(long)]
    sim: bool,
    /// How long each trial runs (the first quarter is warm-up). A program
    /// keeps running across trials of one batch size, its share changed
    /// live; a new one's trial starts at its first request.
    #[arg(long, default_value_t = 3.0, value_name = "SECONDS")]
    trial_seconds: f64,
    /// How long a newly started program has to reach its first request
    /// (a reported latency or a synchronisation), e.g. to load its framework.
    #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
    startup_seconds: f64,
    /// Largest batch size tried (powers of two from 1).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=65536))]
    max_batch: u32,
    /// SM shares tried: this step up to 100%.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100))]
    sm_step: u32,
    /// When running a program, a trial meets the SLO only with this much to
    /// spare (percent), so a longer run at the profile still meets it.
    #[arg(long, default_value_t = 10.0, value_name = "PERCENT")]
    headroom: f64,
    /// Where to write the profile (TOML; `dilu run --profile` and the node
    /// manager's `[tenants.NAME] profile` read it).
    #[arg(long, short, default_value = "dilu-profile.toml", value_name = "FILE")]
    output: PathBuf,
    /// Print the profile as one JSON object.
    #[arg(long)]
    json: bool,
    /// The program to profile and its arguments (after `--`).
    #[arg(trailing_var_arg = true)]
    command: Vec<String>,
}

#[derive(Args)]
pub struct DemoArgs {
    /// How long each controller's run lasts, in seconds (20: about 360
    /// requests, enough for a p99 that is not just the slowest request).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Print only a JSON summary.
    #[arg(long)]
    json: bool,
    /// Run only these controllers (comma-separated; default all three);
    /// `alone` runs the inference tenant without the training tenant.
    #[arg(long, value_delimiter = ',')]
    controllers: Vec<String>,
    /// Keep every request latency of the inference tenant in
    /// `DIR/<controller>.txt` (ms, one per line), e.g. for a CDF
    /// (`scripts/bench.sh demo` plots them).
    #[arg(long, value_name = "DIR")]
    latencies_dir: Option<PathBuf>,
}

#[derive(Args)]
pub struct RunArgs {
    /// Run on the simulated GPU (simgpu) instead of the real NVIDIA driver.
    #[arg(long)]
    sim: bool,
    /// Memory budget: 8GiB, 50% of each device, or per device 0:8GiB,1:4GiB
    /// (sets DILU_MEM_LIMIT).
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
    /// SM-time share: 30 (% of every device's time) or per device 0:30,1:50
    /// (sets DILU_SM_LIMIT). Under a node manager one share for every
    /// device, which becomes the tenant's SM request and limit
    /// (--sm-request and --sm-limit win).
    #[arg(long, value_name = "PERCENT")]
    sm: Option<String>,
    /// Tenant name: processes with the same name share one budget (sets
    /// DILU_TENANT). Under a node manager the default is `<program>-<pid>`.
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// The node manager's socket (default $DILU_NODEMGR_SOCKET or /run/dilu/nodemgr.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// GPUs the node manager places the tenant on (its cluster placement
    /// policy; CUDA_VISIBLE_DEVICES lists them in PCI bus order). The SM
    /// request, limit and memory budget hold on each GPU, each enforced on
    /// launches to that device.
    #[arg(long, value_name = "N", default_value_t = 1)]
    gpus: u32,
    /// Host CPU priority (nice value, 0-19) the program runs at. Default:
    /// 19 for --colo filler, 10 for --colo online-filler (a filler's host
    /// threads would otherwise take the cores the primary's launches
    /// need), else the one dilu was started with.
    #[arg(long, value_name = "NICE", value_parser = clap::value_parser!(i32).range(0..=19))]
    cpu_nice: Option<i32>,
    #[command(flatten)]
    spec: SpecArgs,
    /// The program to run and its arguments (after `--`; a flag before the
    /// program that dilu does not know is an error, not the program).
    #[arg(required = true, trailing_var_arg = true)]
    command: Vec<String>,
}

/// A tenant's spec for the node manager.
#[derive(Args)]
struct SpecArgs {
    /// Tenant class: latency or batch; `primary` is a latency tenant that
    /// is its GPU's co-location primary (same as `--colo primary`).
    #[arg(long, value_name = "CLASS")]
    class: Option<String>,
    /// Co-location role on a shared GPU (sets DILU_COLO): `primary` (its
    /// kernels go first), `filler` or `online-filler` (launch only into the
    /// primary's gaps; online fillers before offline ones).
    #[arg(long, value_name = "ROLE", value_parser = ["primary", "filler", "online-filler"])]
    colo: Option<String>,
    /// Latency SLO in milliseconds (latency tenants; a co-location primary
    /// tolerates one filler kernel of delay up to half of it, less as its
    /// own latency nears it; DILU_COLO_TOLERANCE sets another bound).
    /// A co-location primary without one is kept as if alone: its p99
    /// within about 10% of its p99 alone, fillers in what that leaves.
    #[arg(long, value_name = "MS")]
    slo_ms: Option<f64>,
    /// Guaranteed SM-time share, percent (for a co-location filler also
    /// the share it keeps when its kernels fit none of the primary's gaps,
    /// which the primary pays for by their overrun; DILU_COLO_GUARANTEE
    /// sets another).
    #[arg(long, value_name = "PCT")]
    sm_request: Option<SmShare>,
    /// Most SM-time share the tenant may use when others idle, percent.
    #[arg(long, value_name = "PCT")]
    sm_limit: Option<SmShare>,
    /// A profile written by `dilu profile`: its class, SLO, SM request and
    /// limit become the spec (the flags above win), its batch size DILU_BATCH.
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
}

#[derive(Args)]
#[command(after_help = concat!(
    "Flags win over the configuration file, which wins over the defaults. ",
    "A non-root user runs its own with --socket and --run-dir under a directory it owns ",
    "(e.g. --socket $XDG_RUNTIME_DIR/dilu.sock --run-dir $XDG_RUNTIME_DIR/dilu), ",
    "and points tenants and tools at it with DILU_NODEMGR_SOCKET or --socket."
))]
struct NodemgrArgs {
    /// Configuration file (TOML; a missing default file is fine).
    #[arg(long, default_value = config::DEFAULT_CONFIG)]
    config: PathBuf,
    /// Log for a person at a terminal (timestamps, a start-up banner)
    /// instead of for journald.
    ///
    /// Without it (service mode, what the systemd unit uses) every log line
    /// starts with its syslog priority (<3> error, <4> warning, <6> info,
    /// <7> debug) for journald, without timestamps. The daemon never forks
    /// in either mode (systemd Type=notify supervises it). DILU_LOG filters
    /// the log (default info).
    #[arg(long)]
    foreground: bool,
    /// Unix socket tenants and tools connect to [default: $DILU_NODEMGR_SOCKET, else /run/dilu/nodemgr.sock].
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Directory for the persisted state (re-adoption after a restart) [default: /run/dilu].
    #[arg(long, value_name = "DIR")]
    run_dir: Option<PathBuf>,
    /// Prometheus endpoint address (host:port; empty turns it off) [default: 127.0.0.1:9400].
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Control period in milliseconds [default: 5].
    #[arg(long, value_name = "MS")]
    period_ms: Option<f64>,
    /// Control law [default: dilu]: dilu (elastic, protects latency
    /// tenants' SLOs; co-location primaries lend their guarantee while their
    /// latency has slack), dilu-colo (lends every latency tenant's
    /// guarantee), dilu-rckm (the law of Dilu's published code) or static
    /// (fixed requests; tenants without one share the rest).
    #[arg(long, value_name = "NAME")]
    controller: Option<String>,
    /// Device memory for admission when NVML is absent (e.g. 80GiB) [default: NVML's, else no memory admission].
    #[arg(long, value_name = "SIZE")]
    gpu_memory: Option<String>,
    /// Manage the simulated GPU (simgpu) that `dilu run --sim` tenants use:
    /// the daemon reads simgpu's simulated NVML (found where `dilu run
    /// --sim` finds simgpu) for device figures, memory admission and the
    /// memory audit. SIMGPU_INSTANCE and SIMGPU_DEVICES pick the simulated
    /// node, as for tenants.
    #[arg(long)]
    sim: bool,
}

#[derive(Args)]
struct SocketArg {
    /// The node manager's socket (default $DILU_NODEMGR_SOCKET or /run/dilu/nodemgr.sock).
    #[arg(long)]
    socket: Option<PathBuf>,
}

impl SocketArg {
    fn path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(dilu_abi::node_client::socket_path)
    }
}

#[derive(Args)]
struct StatusArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Print the status as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct TopArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// Refresh interval in seconds.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Stop after this many refreshes (default: until interrupted).
    ///
    /// When standard output is not a terminal, the tables are printed one
    /// after another (separated by a blank line, no screen clearing), so
    /// `dilu top --count 3 > log` records three snapshots.
    #[arg(long, visible_alias = "iterations", value_name = "N")]
    count: Option<u64>,
}

#[derive(Args)]
struct SetArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// The tenant to change.
    tenant: String,
    #[command(flatten)]
    spec: SpecArgs,
    /// Memory budget per device (8GiB, 8192MiB, ...).
    #[arg(long, value_name = "SIZE")]
    mem: Option<String>,
}

fn parse_class(text: Option<&str>) -> Result<Option<node_wire::WorkClass>> {
    text.map(|c| {
        node_wire::parse_class(c)
            .ok_or_else(|| Error::Invalid(format!("--class {c:?}: expected latency or batch")))
    })
    .transpose()
}

fn run(args: RunArgs) -> Result<ExitCode> {
    // A co-location primary is a latency tenant, whichever flag says so.
    let primary = args.spec.class.as_deref() == Some("primary")
        || (args.spec.class.is_none() && args.spec.colo.as_deref() == Some("primary"));
    let class = if primary {
        Some(node_wire::WorkClass::Latency)
    } else {
        parse_class(args.spec.class.as_deref())?
    };
    let colo = args
        .spec
        .colo
        .clone()
        .or(primary.then(|| "primary".to_string()));
    let profiled = args
        .spec
        .profile
        .as_deref()
        .map(profile_spec::load_spec)
        .transpose()?;
    let profiled_spec = profiled.as_ref().map(|(spec, _)| spec);
    launch::run(&launch::LaunchSpec {
        sim: args.sim,
        mem: args.mem,
        sm: args.sm,
        tenant: args.tenant,
        socket: args.socket,
        class: class.or(profiled.as_ref().map(|(spec, _)| spec.class)),
        slo_ms: args.spec.slo_ms.or(profiled_spec.and_then(|s| s.slo_ms)),
        sm_request: args.spec.sm_request.or(profiled_spec.map(|s| s.sm_request)),
        sm_limit: args.spec.sm_limit.or(profiled_spec.map(|s| s.sm_limit)),
        batch: profiled.map(|(_, batch)| batch),
        colo,
        gpus: args.gpus,
        cpu_nice: args.cpu_nice,
        command: args.command,
    })
}

fn profile(args: ProfileArgs) -> Result<ExitCode> {
    if !(0.0..90.0).contains(&args.headroom) {
        return Err(Error::Invalid(format!(
            "--headroom {} must be a percentage from 0 to 90",
            args.headroom
        )));
    }
    profile_run::run(&profile_run::ProfileSpec {
        class: if args.class == "batch" {
            dilu_profile::profile::Class::Batch
        } else {
            dilu_profile::profile::Class::Latency
        },
        slo_ms: args.slo_ms,
        batch: args.batch,
        method: dilu_profile::search::Method::parse(&args.method).map_err(Error::Invalid)?,
        table: args.table,
        command: args.command,
        sim: args.sim,
        trial_seconds: args.trial_seconds,
        startup_seconds: args.startup_seconds,
        max_batch: args.max_batch,
        sm_step: args.sm_step,
        headroom: args.headroom / 100.0,
        output: args.output,
        json: args.json,
    })
}

fn nodemgr(args: NodemgrArgs) -> Result<ExitCode> {
    dilu_nodemgr::logging::init(args.foreground);
    let overrides = config::Overrides {
        // The variable tenants and tools read names the daemon's socket too
        // (below the flag, above the file).
        socket: args.socket.or_else(|| {
            std::env::var_os(node_wire::SOCKET_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        }),
        run_dir: args.run_dir,
        metrics: args.metrics,
        period_ms: args.period_ms,
        controller: args.controller,
        gpu_memory: args.gpu_memory,
    };
    let explicit = args.config.as_path() != std::path::Path::new(config::DEFAULT_CONFIG);
    let config = config::Config::load(&args.config, explicit, &overrides)?;
    if args.sim {
        use_simulated_nvml()?;
    }
    daemon::run(config, args.foreground)?;
    Ok(ExitCode::SUCCESS)
}

/// Points the daemon's NVML at simgpu's simulated one, or says why not.
fn use_simulated_nvml() -> Result<()> {
    let simgpu = dilu_nodemgr::artifacts::find(dilu_nodemgr::artifacts::SIMGPU_FILE)
        .map_err(|e| e.context("--sim"))?;
    let library = simgpu.with_file_name(dilu_nodemgr::artifacts::SIMGPU_NVML_FILE);
    if !library.is_file() {
        return Err(Error::System(format!(
            "--sim: simgpu's simulated NVML is not beside {} (build it with `cargo build -p simgpu-nvml`)",
            simgpu.display()
        )));
    }
    dilu_nodemgr::nvml::use_library(&library)?;
    if !dilu_nodemgr::nvml::available() {
        return Err(Error::System(format!(
            "--sim: the simulated NVML {} did not load (see the log above)",
            library.display()
        )));
    }
    tracing::info!(nvml = %library.display(), "managing the simulated GPU");
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::Demo(args) => demo::run(&demo::DemoSpec {
            seconds: args.seconds,
            json: args.json,
            controllers: args.controllers,
            latencies_dir: args.latencies_dir,
        })
        .map_err(Error::System),
        Command::Nodemgr(args) => nodemgr(args),
        Command::Profile(args) => profile(args),
        Command::Status(args) => {
            ops::status(&args.socket.path(), args.json).map(|()| ExitCode::SUCCESS)
        }
        Command::Top(args) => Duration::try_from_secs_f64(args.interval)
            .map_err(|_| Error::Invalid("--interval must be a positive number of seconds".into()))
            .and_then(|interval| ops::top(&args.socket.path(), interval, args.count))
            .map(|()| ExitCode::SUCCESS),
        Command::Set(args) => (|| {
            if args.spec.colo.is_some() || args.spec.profile.is_some() {
                return Err(Error::Invalid(
                    "--colo and --profile are given to `dilu run` when a tenant starts; \
                     `dilu set` changes --class, --slo-ms, --sm-request, --sm-limit and --mem"
                        .to_string(),
                ));
            }
            let update = SpecUpdate {
                class: parse_class(args.spec.class.as_deref())?,
                slo_ms: args.spec.slo_ms,
                sm_request: args.spec.sm_request,
                sm_limit: args.spec.sm_limit,
                mem: args
                    .mem
                    .as_deref()
                    .map(str::parse::<dilu_abi::units::Bytes>)
                    .transpose()
                    .map_err(|e| Error::Invalid(format!("--mem: {e}")))?,
            };
            let spec = ops::set(&args.socket.path(), &args.tenant, update)?;
            println!(
                "{}: {} request {} limit {}{}",
                args.tenant,
                node_wire::class_name(spec.class),
                spec.sm_request,
                spec.sm_limit,
                spec.slo_ms
                    .map(|s| format!(" SLO {s} ms"))
                    .unwrap_or_default()
            );
            Ok(ExitCode::SUCCESS)
        })(),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("dilu: {message}");
            ExitCode::from(2)
        }
    }
}
