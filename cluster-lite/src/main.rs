//! `dilu-cluster`: command-line entry point; each subcommand lives in its own
//! module under `commands/`.

mod commands;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "dilu-cluster",
    version,
    about = "dilu cluster layer: complementary GPU placement, horizontal scaling, Kubernetes scheduler extender, simulator",
    after_help = "Policies: dilu (ours, resourcing-complementary), dilu-paper, infless-r, infless-l, exclusive"
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
}

fn main() {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Simulate(args) => commands::simulate::run(args),
    };
    if let Err(message) = outcome {
        eprintln!("dilu-cluster: {message}");
        std::process::exit(1);
    }
}
