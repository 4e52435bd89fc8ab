//! The `main` every workload binary shares: parse the options (exit 2 with
//! the usage on a bad one), run, print the summary (exit 1 on an error).

use std::process::ExitCode;

pub fn main<O, E: std::fmt::Display>(
    name: &str,
    usage: &str,
    parse: impl FnOnce() -> Result<O, String>,
    run: impl FnOnce(&O) -> Result<String, E>,
) -> ExitCode {
    let options = match parse() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{name}: {message}\n{usage}");
            return ExitCode::from(2);
        }
    };
    match run(&options) {
        Ok(summary) => {
            println!("{summary}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{name}: {error}");
            ExitCode::FAILURE
        }
    }
}
