//! `soak`: runs the node manager's soak (see `dilu_tests::soak`) and writes
//! its report.
//!
//! usage: soak [--seconds N] [--tenants N] [--seed N] [--report FILE]
//! (defaults: 300 s, 6 tenants, seed 1, the report on stdout). Exits 1 when
//! an invariant broke.
//!
//! `soak --hostile KIND --socket PATH --prefix P --seed N` is one hostile
//! client's visit, which the soak runs as another user where it can: it
//! prints what the visit came to, then holds its connections for their time.

use dilu_tests::soak::{self, SoakConfig};
use std::process::ExitCode;
use std::time::Duration;

fn main() -> ExitCode {
    if std::env::args().nth(1).as_deref() == Some("--hostile") {
        return hostile_client();
    }
    let mut config = SoakConfig {
        duration: Duration::from_secs(300),
        tenants: 6,
        ..SoakConfig::default()
    };
    let mut report_path = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || {
            args.next().unwrap_or_else(|| {
                eprintln!("soak: {flag} needs a value");
                std::process::exit(2)
            })
        };
        let number = |text: String| -> u64 {
            text.parse().unwrap_or_else(|_| {
                eprintln!("soak: {text:?} is not a whole number");
                std::process::exit(2)
            })
        };
        match flag.as_str() {
            "--seconds" => config.duration = Duration::from_secs(number(value())),
            "--tenants" => config.tenants = number(value()).max(1) as usize,
            "--seed" => config.seed = number(value()),
            "--report" => report_path = Some(value()),
            "-h" | "--help" => {
                println!("usage: soak [--seconds N] [--tenants N] [--seed N] [--report FILE]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("soak: unknown argument {other:?} (see --help)");
                return ExitCode::from(2);
            }
        }
    }
    eprintln!(
        "soak: {} s, {} tenants, seed {}",
        config.duration.as_secs(),
        config.tenants,
        config.seed
    );
    let report = soak::run(config.clone(), |line| eprintln!("{line}"));
    let command = format!(
        "scripts/bench.sh soak -- --seconds {} --tenants {} --seed {}",
        config.duration.as_secs(),
        config.tenants,
        config.seed
    );
    let text = soak::markdown(&config, &report, &command);
    match &report_path {
        Some(path) => {
            if let Err(e) = std::fs::write(path, &text) {
                eprintln!("soak: cannot write {path}: {e}");
                return ExitCode::from(2);
            }
            eprintln!("soak: report in {path}");
        }
        None => print!("{text}"),
    }
    if report.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        for v in &report.violations {
            eprintln!("soak: broken: {v}");
        }
        ExitCode::FAILURE
    }
}

/// `--hostile KIND --socket PATH --prefix P --seed N`: one hostile visit.
fn hostile_client() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(2).collect();
    let value = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    let (Some(kind), Some(socket), Some(prefix), Some(seed)) = (
        args.first().cloned(),
        value("--socket"),
        value("--prefix"),
        value("--seed"),
    ) else {
        eprintln!("usage: soak --hostile KIND --socket PATH --prefix P --seed N");
        return ExitCode::from(2);
    };
    let (Ok(kind), Ok(seed)) = (kind.parse::<u64>(), seed.parse::<u64>()) else {
        eprintln!("soak --hostile: KIND and N are whole numbers");
        return ExitCode::from(2);
    };
    let (event, held, hold) =
        soak::hostile_action(kind, std::path::Path::new(&socket), &prefix, seed);
    println!("{event}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    std::thread::sleep(hold);
    drop(held);
    ExitCode::SUCCESS
}
