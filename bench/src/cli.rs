//! The shared `main` of the benchmark binaries.

use std::process::ExitCode;

/// Parses the command line, runs, and prints the run's output. A bad
/// command line prints the message and `usage` and exits 2; a failed run
/// prints its error and exits 1. Both messages start with `program:`.
pub fn main<O>(
    program: &str,
    usage: &str,
    parse: impl FnOnce() -> Result<O, String>,
    run: impl FnOnce(O) -> Result<String, String>,
) -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{program}: {message}\n{usage}");
            return ExitCode::from(2);
        }
    };
    match run(options) {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("{program}: {message}");
            ExitCode::FAILURE
        }
    }
}
