//! `cluster-sim-tune`: prints the tuning harness's table (see
//! `dilu_cluster::simulator::tuning`): how `dilu`'s fragmentation-fit
//! settings were chosen, on the built-in generator's traces only.
//!
//! usage: cluster-sim-tune [--seeds N] [--first-seed S]

use dilu_cluster::simulator::tuning;

fn main() {
    let mut seeds = 3u64;
    let mut first_seed = 101u64;
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let value = words.next().and_then(|text| text.parse().ok());
        match (word.as_str(), value) {
            ("--seeds", Some(value)) => seeds = value,
            ("--first-seed", Some(value)) => first_seed = value,
            _ => {
                eprintln!("usage: cluster-sim-tune [--seeds N] [--first-seed S]");
                std::process::exit(2);
            }
        }
    }
    print!(
        "{}",
        tuning::tune(seeds, first_seed, |trace| eprintln!("{trace}"))
    );
}
