//! Result files: markdown tables and the description of the machine the
//! numbers came from.

use std::path::PathBuf;
use std::sync::OnceLock;

/// A markdown table. The first column is left-aligned, the others (numbers)
/// right-aligned.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row; it must have as many cells as the header.
    pub fn row(&mut self, cells: Vec<String>) -> &mut Table {
        assert_eq!(
            cells.len(),
            self.header.len(),
            "row {cells:?} does not match the header {:?}",
            self.header
        );
        self.rows.push(cells);
        self
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let line = |cells: &[String]| format!("| {} |\n", cells.join(" | "));
        out.push_str(&line(&self.header));
        let rule: Vec<String> = (0..self.header.len())
            .map(|i| if i == 0 { "---" } else { "---:" }.to_string())
            .collect();
        out.push_str(&line(&rule));
        for row in &self.rows {
            out.push_str(&line(row));
        }
        out
    }
}

/// `bench/results/<name>`.
pub fn results_path(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("results")
        .join(name)
}

/// Writes `text` to `bench/results/<name>` and says so on stderr.
pub fn write_result(name: &str, text: &str) {
    let path = results_path(name);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create bench/results");
    }
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    eprintln!("results written to {}", path.display());
}

/// One line about where the numbers came from: CPU model, online cores,
/// load average when measured, kernel.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    format!(
        "{cpu}, {cores} cores online, load average {load} (1/5/15 min) when measured, Linux {kernel}{}{}",
        scheduling(),
        host_steal()
    )
}

/// The machine's CPU time so far, all of it and what the hypervisor gave
/// to others (steal), in clock ticks, from the `cpu` line of /proc/stat.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap_or(0))
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is
    // counted in user already).
    let total = ticks.iter().take(8).sum();
    Some((total, *ticks.get(7)?))
}

static RUN_STEAL: OnceLock<StealSince> = OnceLock::new();

/// Called as a benchmark starts: [`machine`] then also says how much of the
/// machine's CPU time the host took for others during the run. On a shared
/// VM that time moves one run's latencies against another's (in a run with
/// 2-19% steal, a primary's alone p99 read 19.9 ms where quieter runs read
/// 2.4-9.3 ms).
pub fn start_counting_steal() {
    RUN_STEAL.get_or_init(StealSince::now);
}

/// Measures the host's steal from now on: [`StealSince::percent`] says how
/// much of the machine's CPU time since then the host took for others.
pub struct StealSince(Option<(u64, u64)>);

impl StealSince {
    pub fn now() -> Self {
        Self(cpu_ticks())
    }

    pub fn percent(&self) -> Option<f64> {
        let (total_then, steal_then) = self.0?;
        let (total, steal) = cpu_ticks()?;
        (total > total_then)
            .then(|| 100.0 * steal.saturating_sub(steal_then) as f64 / (total - total_then) as f64)
    }
}

fn host_steal() -> String {
    RUN_STEAL
        .get()
        .and_then(StealSince::percent)
        .map_or(String::new(), |p| {
            format!(", the host taking {p:.1}% of its CPU time for others (steal) during the run")
        })
}

/// How the benchmark process is scheduled, where not as usual: a run at
/// real-time priority (`chrt`) is not delayed by the host's other work.
fn scheduling() -> String {
    // Field 41 of /proc/self/stat, counted after the command name (which
    // may hold spaces) ends at the last ')': 0 normal, 1 FIFO, 2 round-robin.
    let policy = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let rest = &stat[stat.rfind(')')? + 1..];
            rest.split_whitespace().nth(38).map(str::to_string)
        });
    match policy.as_deref() {
        Some("1") => ", at real-time priority (SCHED_FIFO)".into(),
        Some("2") => ", at real-time priority (SCHED_RR, `chrt -r`)".into(),
        _ => String::new(),
    }
}

/// A nanosecond figure for a table cell.
pub fn ns(value: f64) -> String {
    if value.abs() >= 100_000.0 {
        format!("{:.0}", value)
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_renders_header_rule_and_rows() {
        let mut table = Table::new(&["call", "ns"]);
        assert!(table.is_empty());
        table.row(vec!["launch".into(), "1.5".into()]);
        assert_eq!(
            table.markdown(),
            "| call | ns |\n| --- | ---: |\n| launch | 1.5 |\n"
        );
    }

    #[test]
    #[should_panic(expected = "does not match the header")]
    fn a_short_row_is_refused() {
        Table::new(&["a", "b"]).row(vec!["only one".into()]);
    }

    #[test]
    fn machine_line_names_cores_and_load() {
        let line = machine();
        assert!(line.contains("cores online"), "{line}");
        assert!(line.contains("load average"), "{line}");
    }
}
