//! `as-if-alone-bound`: the most of a primary's idle time a filler that
//! runs its kernels in its own order (a training step) may keep with the
//! primary's p99 within a factor of its p99 alone, when it cannot know when
//! requests arrive (`dilu_bench::as_if_alone`). The field benchmark computes
//! this in-process for its generated fillers; `scripts/frameworks_report.py`
//! runs this for real programs from their runs alone.
//!
//!     as-if-alone-bound --requests FILE --kernels FILE [--factor 1.10] [--handoff-ns N]
//!
//! `--requests`: the primary's requests alone, one per line, its arrival
//! and latency in ns (`demo-tenant serve --requests`' format). `--kernels`:
//! the filler's kernel lengths alone, one per line in ns. Prints one JSON
//! line: the share bound (0 to 1), and the counts it came from.

use dilu_bench::as_if_alone::{filler_mix_share_bound, kernel_mix, parse_requests};
use std::process::ExitCode;

const USAGE: &str = "usage: as-if-alone-bound --requests FILE --kernels FILE [--factor F (default 1.10)] [--handoff-ns N (default: dilu's measured hand-off)]";

#[derive(Debug)]
struct Args {
    requests: String,
    kernels: String,
    factor: f64,
    handoff_ns: u64,
}

fn parse_args(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut requests, mut kernels) = (None, None);
    let mut factor = 1.10;
    let mut handoff_ns = dilu_colocation::HANDOFF_NS;
    while let Some(flag) = argv.next() {
        let value = argv
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        match flag.as_str() {
            "--requests" => requests = Some(value),
            "--kernels" => kernels = Some(value),
            "--factor" => {
                factor = value
                    .parse()
                    .ok()
                    .filter(|f: &f64| *f >= 1.0)
                    .ok_or_else(|| format!("--factor {value:?}: a number of at least 1"))?
            }
            "--handoff-ns" => {
                handoff_ns = value
                    .parse()
                    .map_err(|_| format!("--handoff-ns {value:?}: a whole number of ns"))?
            }
            _ => return Err(format!("unknown argument {flag:?}\n{USAGE}")),
        }
    }
    Ok(Args {
        requests: requests.ok_or_else(|| format!("--requests is needed\n{USAGE}"))?,
        kernels: kernels.ok_or_else(|| format!("--kernels is needed\n{USAGE}"))?,
        factor,
        handoff_ns,
    })
}

fn read(path: &str) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))
}

fn run(args: &Args) -> Result<String, String> {
    let requests =
        parse_requests(&read(&args.requests)?).map_err(|e| format!("{}: {e}", args.requests))?;
    let lengths = read(&args.kernels)?
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            line.trim()
                .parse::<u64>()
                .map_err(|_| format!("{}: not a kernel length in ns: {line:?}", args.kernels))
        })
        .collect::<Result<Vec<u64>, String>>()?;
    let mix = kernel_mix(&lengths);
    if mix.is_empty() {
        return Err(format!("{}: no kernel of any length", args.kernels));
    }
    let bound = filler_mix_share_bound(&requests, &mix, args.handoff_ns, args.factor);
    Ok(format!(
        "{{\"share_bound\": {:.6}, \"allowance\": {}, \"pushes_per_share\": {:.4}, \"requests\": {}, \"kernels\": {}, \"factor\": {}, \"handoff_ns\": {}}}",
        bound.share,
        bound.allowance,
        bound.pushes_per_share,
        requests.len(),
        lengths.len(),
        args.factor,
        args.handoff_ns
    ))
}

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let outcome = parse_args(std::env::args().skip(1)).and_then(|args| run(&args));
    match outcome {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("as-if-alone-bound: {message}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse_args(list.iter().map(|s| s.to_string()))
    }

    #[test]
    fn both_files_are_needed_and_a_bad_value_is_named() {
        assert!(
            args(&["--requests", "r"])
                .unwrap_err()
                .contains("--kernels")
        );
        assert!(
            args(&["--kernels", "k"])
                .unwrap_err()
                .contains("--requests")
        );
        let err = args(&["--requests", "r", "--kernels", "k", "--factor", "0.9"]).unwrap_err();
        assert!(err.contains("0.9"), "{err}");
        assert!(
            args(&["--requests", "r", "--kernels"])
                .unwrap_err()
                .contains("needs a value")
        );
        assert!(
            args(&["--frobnicate", "1"])
                .unwrap_err()
                .contains("--frobnicate")
        );
        let parsed = args(&["--requests", "r", "--kernels", "k"]).expect("defaults");
        assert_eq!(parsed.factor, 1.10);
        assert_eq!(parsed.handoff_ns, dilu_colocation::HANDOFF_NS);
    }

    #[test]
    fn a_run_reads_both_files_and_names_a_bad_line() {
        let dir = std::env::temp_dir().join(format!("as-if-alone-bound-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let requests = dir.join("requests");
        let kernels = dir.join("kernels");
        // 200 requests of 1 ms, 10 ms apart, and kernels of 50 µs.
        let lines: String = (0..200u64)
            .map(|i| format!("{} 1000000\n", i * 10_000_000))
            .collect();
        std::fs::write(&requests, lines).unwrap();
        std::fs::write(&kernels, "50000\n50000\n").unwrap();
        let run_with = |kernels: &std::path::Path| {
            run(&Args {
                requests: requests.display().to_string(),
                kernels: kernels.display().to_string(),
                factor: 1.10,
                handoff_ns: dilu_colocation::HANDOFF_NS,
            })
        };
        let line = run_with(&kernels).expect("a bound");
        assert!(line.starts_with("{\"share_bound\": "), "{line}");
        assert!(line.contains("\"requests\": 200"), "{line}");
        std::fs::write(&kernels, "50000\nfifty\n").unwrap();
        assert!(run_with(&kernels).unwrap_err().contains("fifty"));
        std::fs::write(&kernels, "\n").unwrap();
        assert!(run_with(&kernels).unwrap_err().contains("no kernel"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
