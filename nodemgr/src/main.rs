//! `dilu`: the command-line front end of dilu.
//!
//! It owns user-facing commands: launching CUDA programs under the
//! interposer (`dilu run`) and the demo. It never links the interposer's
//! cdylib code; it only points `LD_PRELOAD` at it.

mod artifacts;
mod demo;
mod launch;

use clap::{Args, Parser, Subcommand};
use std::process::ExitCode;

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
    /// Example: dilu run --sim -- python train.py
    Run(RunArgs),
    /// Show two CUDA programs sharing one simulated GPU under dilu.
    Demo(DemoArgs),
}

#[derive(Args)]
pub struct DemoArgs {
    /// How long the programs run, in seconds.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    seconds: u64,
    /// Print only a JSON summary.
    #[arg(long)]
    json: bool,
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
    /// (sets DILU_SM_LIMIT).
    #[arg(long, value_name = "PERCENT")]
    sm: Option<String>,
    /// Tenant name: processes with the same name share one budget (sets DILU_TENANT).
    #[arg(long, value_name = "NAME")]
    tenant: Option<String>,
    /// The program to run and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => launch::run(&launch::LaunchSpec {
            sim: args.sim,
            mem: args.mem,
            sm: args.sm,
            tenant: args.tenant,
            command: args.command,
        }),
        Command::Demo(args) => demo::run(&demo::DemoSpec {
            seconds: args.seconds,
            json: args.json,
        }),
    };
    match result {
        Ok(code) => code,
        Err(message) => {
            eprintln!("dilu: {message}");
            ExitCode::from(2)
        }
    }
}
