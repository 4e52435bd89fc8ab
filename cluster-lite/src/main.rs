//! `dilu-cluster`: command-line entry point; each subcommand lives in its own
//! module under `commands/`.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dilu-cluster",
    version,
    about = "dilu cluster layer: complementary GPU placement as a Kubernetes scheduler extender, and a simulator that compares placement policies",
    after_help = "Policies: dilu (ours, resourcing-complementary), dilu-paper, fgd, infless-r, infless-l, exclusive"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a workload trace under placement policies and report GPU-hours,
    /// fragmentation, SLO risk and placement latency.
    Simulate(commands::simulate::SimulateArgs),
    /// Kubernetes mode: serve the kube-scheduler extender protocol over HTTP.
    Extender(commands::extender::ExtenderArgs),
    /// Kubernetes mode: scale Deployments annotated dilu.io/autoscale="true"
    /// from the node managers' signals (the rule `scripts/bench.sh scaling`
    /// simulates as `dilu`).
    Autoscaler(commands::autoscaler::AutoscalerArgs),
}

/// The variable that filters the log (`info` by default), as for `dilu`.
const LOG_FILTER_ENV: &str = "DILU_LOG";

/// Log lines of the extender (its requests, binds, frees) go to stderr,
/// timestamped.
fn install_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env(LOG_FILTER_ENV)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

fn main() {
    let cli = Cli::parse();
    install_logging();
    let outcome = match cli.command {
        Command::Simulate(args) => commands::simulate::run(args),
        Command::Extender(args) => commands::extender::run(args),
        Command::Autoscaler(args) => commands::autoscaler::run(args),
    };
    if let Err(message) = outcome {
        eprintln!("dilu-cluster: {message}");
        std::process::exit(1);
    }
}
