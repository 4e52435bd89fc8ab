//! `profile-compare TABLE.csv... [--held-out TABLE.csv...]`: runs every
//! search method of `dilu profile` over measured tables and prints the
//! comparison as Markdown (used by `scripts/bench.sh profile`).

use dilu_profile::compare;
use dilu_profile::table::ProfileTable;
use std::path::Path;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut tables = Vec::new();
    let mut held_out = false;
    for arg in std::env::args().skip(1) {
        if arg == "--held-out" {
            held_out = true;
            continue;
        }
        if arg == "-h" || arg == "--help" {
            println!("usage: profile-compare TABLE.csv... [--held-out TABLE.csv...]");
            return ExitCode::SUCCESS;
        }
        let path = Path::new(&arg);
        match ProfileTable::load(path) {
            Ok(table) => {
                let name = path.file_stem().map_or(arg.clone(), |s| {
                    s.to_string_lossy().trim_start_matches("bs_sm_").to_string()
                });
                tables.push((name, table, held_out));
            }
            Err(e) => {
                eprintln!("profile-compare: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if tables.is_empty() {
        eprintln!("usage: profile-compare TABLE.csv... [--held-out TABLE.csv...]");
        return ExitCode::from(2);
    }
    print!("{}", compare::report(&tables));
    ExitCode::SUCCESS
}
