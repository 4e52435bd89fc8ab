//! `serve`, `node`, `deploy` and `status`: the embedded mode's commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};
use dilu_abi::units::{parse_duration_ns, parse_size};
use dilu_cluster::control::{ControlReply, ControlRequest, FunctionProfile, send};
use dilu_cluster::coordinator::{self, CoordinatorConfig};
use dilu_cluster::node_agent::{self, NodeAgentConfig};

fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_ns(text)
        .map(Duration::from_nanos)
        .map_err(|error| error.to_string())
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Control address that `deploy` and `status` talk to.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub listen: SocketAddr,
    /// Node agent (node manager) address; repeat for each node.
    #[arg(long = "node", required = true)]
    pub nodes: Vec<String>,
    /// Placement policy: dilu, dilu-paper, infless-r, infless-l, exclusive.
    #[arg(long, default_value = "dilu")]
    pub policy: String,
    /// Horizontal scaling rule: responsive (ours) or dilu-paper.
    #[arg(long, default_value = "responsive")]
    pub scaling: String,
    /// Scaling and heartbeat period, e.g. 1s.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub tick: Duration,
    /// Timeout of each exchange with a node.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub io_timeout: Duration,
    /// How long a disconnected node's instances still count as live.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub node_grace: Duration,
}

pub fn serve(args: ServeArgs) -> Result<(), String> {
    let handle = coordinator::start(CoordinatorConfig {
        control_listen: args.listen,
        nodes: args.nodes,
        policy: args.policy,
        scaling: args.scaling,
        tick: args.tick,
        io_timeout: args.io_timeout,
        node_grace: args.node_grace,
    })?;
    eprintln!(
        "dilu-cluster coordinator listening on {}",
        handle.control_addr()
    );
    handle.wait();
    Ok(())
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    /// Address to listen on for the coordinator.
    #[arg(long, default_value = "127.0.0.1:7400")]
    pub listen: SocketAddr,
    /// Number of GPUs this node offers.
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Memory per GPU, e.g. 80GiB.
    #[arg(long, default_value = "80GiB", value_parser = parse_size)]
    pub gpu_memory: u64,
    /// Node name reported to the coordinator (default: the listen address).
    #[arg(long)]
    pub name: Option<String>,
    /// File that keeps the node's instances across restarts.
    #[arg(long)]
    pub state: Option<PathBuf>,
}

pub fn node(args: NodeArgs) -> Result<(), String> {
    let agent = node_agent::start(NodeAgentConfig {
        listen: args.listen,
        node_name: args.name.unwrap_or_else(|| args.listen.to_string()),
        gpus: args.gpus,
        gpu_memory: args.gpu_memory,
        state_file: args.state,
    })
    .map_err(|error| format!("cannot start node agent on {}: {error}", args.listen))?;
    eprintln!(
        "dilu-cluster node agent on {} ({} GPUs); tracks placements, starts no processes",
        agent.addr(),
        args.gpus
    );
    loop {
        std::thread::park();
    }
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ClassArg {
    Latency,
    Batch,
}

#[derive(Debug, Args)]
pub struct DeployArgs {
    /// Function name.
    pub function: String,
    /// Instances to start with (0 removes the function).
    #[arg(long, default_value_t = 1)]
    pub replicas: u32,
    /// Coordinator control address.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub coordinator: String,
    /// A profile written by `dilu profile`: class, SM request and limit, and
    /// requests per second per instance (its throughput at the request over
    /// its batch size); the flags below win over it.
    #[arg(long, value_name = "FILE")]
    pub profile: Option<std::path::PathBuf>,
    /// latency or batch (default latency, or the profile's).
    #[arg(long, value_enum)]
    pub class: Option<ClassArg>,
    /// Guaranteed SM share per GPU, 0–1 (default 0.3, or the profile's).
    #[arg(long)]
    pub sm_request: Option<f64>,
    /// SM share it may burst to (default: the request, or the profile's limit).
    #[arg(long)]
    pub sm_limit: Option<f64>,
    /// GPU memory per GPU, e.g. 10GiB.
    #[arg(long, default_value = "10GiB", value_parser = parse_size)]
    pub memory: u64,
    /// GPUs per instance (gang, on one node).
    #[arg(long, default_value_t = 1)]
    pub gpus: u32,
    /// Requests per second one instance serves within its SLO (default 100,
    /// or the profile's).
    #[arg(long)]
    pub throughput: Option<f64>,
    /// Cold start, e.g. 20s (makes scale-in keep instances longer).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub cold_start: Duration,
    /// The function resumes from its checkpoint when restarted (training
    /// that checkpoints on SIGTERM); under the `dilu` policy a gang may then
    /// be restarted on other GPUs of its node to empty a GPU while load falls.
    #[arg(long)]
    pub restartable: bool,
}

pub fn deploy(args: DeployArgs) -> Result<(), String> {
    let measured = args
        .profile
        .as_deref()
        .map(dilu_profile::profile::Profile::load)
        .transpose()?;
    let class = match (args.class, &measured) {
        (Some(ClassArg::Latency), _) => WorkClass::Latency,
        (Some(ClassArg::Batch), _) => WorkClass::Batch,
        (None, Some(p)) if p.class == dilu_profile::profile::Class::Batch => WorkClass::Batch,
        (None, _) => WorkClass::Latency,
    };
    let sm_request = args
        .sm_request
        .or(measured.as_ref().map(|p| f64::from(p.sm_request) / 100.0))
        .unwrap_or(0.3);
    let sm_limit = args
        .sm_limit
        .or(measured.as_ref().map(|p| f64::from(p.sm_limit) / 100.0))
        .unwrap_or(sm_request);
    let request = ControlRequest::Deploy {
        function: args.function,
        profile: FunctionProfile {
            demand: InstanceDemand {
                class,
                sm_request,
                sm_limit,
                memory_bytes: args.memory,
                gpus: args.gpus,
            },
            throughput_rps: args
                .throughput
                .or(measured.as_ref().map(|p| p.requests_per_second()))
                .unwrap_or(100.0),
            cold_start_s: args.cold_start.as_secs_f64(),
            restartable: args.restartable,
        },
        replicas: args.replicas,
    };
    match send(&args.coordinator, &request, Duration::from_secs(30))? {
        ControlReply::Deployed { function, live } => {
            println!("{function}: {live} instance(s) placed");
            Ok(())
        }
        ControlReply::Error(reason) => Err(reason),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Coordinator control address.
    #[arg(long, default_value = "127.0.0.1:7300")]
    pub coordinator: String,
}

pub fn status(args: StatusArgs) -> Result<(), String> {
    match send(
        &args.coordinator,
        &ControlRequest::Status,
        Duration::from_secs(30),
    )? {
        ControlReply::Status(status) => {
            let text = serde_json::to_string_pretty(&status).map_err(|e| e.to_string())?;
            println!("{text}");
            Ok(())
        }
        ControlReply::Error(reason) => Err(reason),
        other => Err(format!("unexpected reply {other:?}")),
    }
}
