//! simgpu's kernel trace (`SIMGPU_TRACE`, one JSON object per executed
//! kernel segment: a kernel preempted at a time-slice end has one row per
//! stretch it ran): parsing and the device-time arithmetic every accuracy
//! claim rests on. Callers read the file; this module only interprets text.
//! Count kernels with [`KernelRecord::last`] rows; sum time over all rows.

use std::collections::BTreeMap;

/// One executed kernel as simgpu recorded it.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelRecord {
    pub pid: u32,
    pub device: u32,
    pub stream: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub name: String,
    /// Thread blocks in the grid.
    pub blocks: u64,
    pub graph: bool,
    /// Per-process kernel number shared by the segments of one kernel (0 in
    /// traces from before segments).
    pub kernel: u64,
    /// Whether this row ends its kernel (true in traces from before
    /// segments, where every row was a whole kernel).
    pub last: bool,
}

/// Parses one trace line.
pub fn parse_line(line: &str) -> Result<KernelRecord, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("trace line is not JSON ({e}): {line}"))?;
    let field = |key: &str| {
        value[key]
            .as_u64()
            .ok_or_else(|| format!("trace line lacks {key}: {line}"))
    };
    Ok(KernelRecord {
        pid: field("pid")? as u32,
        device: field("device")? as u32,
        stream: field("stream")?,
        start_ns: field("start_ns")?,
        end_ns: field("end_ns")?,
        name: value["name"].as_str().unwrap_or_default().to_string(),
        blocks: value["blocks"].as_u64().unwrap_or(0),
        graph: value["graph"].as_bool().unwrap_or(false),
        kernel: value["kernel"].as_u64().unwrap_or(0),
        last: value["last"].as_bool().unwrap_or(true),
    })
}

/// Parses every complete line of a trace. A trace being appended to may end
/// in a partial line; it is left out, any other bad line is an error.
pub fn parse(text: &str) -> Result<Vec<KernelRecord>, String> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..end],
        None => "",
    };
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(parse_line)
        .collect()
}

/// The interval in which every pid in the trace had kernels on the device:
/// from the latest first start to the earliest last end.
pub fn common_window(records: &[KernelRecord]) -> Option<(u64, u64)> {
    let mut spans: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
    for r in records {
        let span = spans.entry(r.pid).or_insert((r.start_ns, r.end_ns));
        span.0 = span.0.min(r.start_ns);
        span.1 = span.1.max(r.end_ns);
    }
    let start = spans.values().map(|s| s.0).max()?;
    let end = spans.values().map(|s| s.1).min()?;
    (end > start).then_some((start, end))
}

/// Device time per pid inside `[from, to)`, clipping kernels at the edges:
/// the length of the union of its kernels' rows (kernels of one process's
/// streams may run at the same time; together they occupy the device once).
pub fn busy_ns_by_pid(records: &[KernelRecord], from: u64, to: u64) -> BTreeMap<u32, u64> {
    let mut spans: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    for r in records {
        let start = r.start_ns.max(from);
        let end = r.end_ns.min(to);
        if end > start {
            spans.entry(r.pid).or_default().push((start, end));
        }
    }
    spans
        .into_iter()
        .map(|(pid, mut spans)| {
            spans.sort_unstable();
            let (mut busy, mut reached) = (0, 0);
            for (start, end) in spans {
                let start = start.max(reached);
                if end > start {
                    busy += end - start;
                    reached = end;
                }
            }
            (pid, busy)
        })
        .collect()
}

/// Each pid's fraction of the device time used inside the common window.
pub fn shares_in_common_window(records: &[KernelRecord]) -> BTreeMap<u32, f64> {
    let Some((from, to)) = common_window(records) else {
        return BTreeMap::new();
    };
    let busy = busy_ns_by_pid(records, from, to);
    let total: u64 = busy.values().sum();
    busy.into_iter()
        .map(|(pid, ns)| (pid, ns as f64 / total.max(1) as f64))
        .collect()
}

/// Pairs of kernels of different processes on the same device whose
/// execution overlaps; a GPU without MPS runs one context at a time, so
/// this must be empty (one process's streams may overlap).
pub fn overlapping(records: &[KernelRecord]) -> Vec<(KernelRecord, KernelRecord)> {
    let mut sorted: Vec<&KernelRecord> = records.iter().collect();
    sorted.sort_by_key(|r| (r.device, r.start_ns));
    let mut found = Vec::new();
    // The row reaching furthest so far on the current device.
    let mut reach: Option<&KernelRecord> = None;
    for r in sorted {
        if let Some(prev) = reach
            && prev.device == r.device
        {
            if r.start_ns < prev.end_ns && prev.pid != r.pid {
                found.push((prev.clone(), r.clone()));
            }
            if r.end_ns <= prev.end_ns {
                continue;
            }
        }
        reach = Some(r);
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, start_ns: u64, end_ns: u64) -> KernelRecord {
        KernelRecord {
            pid,
            device: 0,
            stream: 0,
            start_ns,
            end_ns,
            name: "k".into(),
            blocks: 1,
            graph: false,
            kernel: 0,
            last: true,
        }
    }

    #[test]
    fn a_process_busy_on_two_streams_at_once_counts_once() {
        let records = vec![record(1, 0, 100), record(1, 50, 150), record(2, 150, 200)];
        assert_eq!(busy_ns_by_pid(&records, 0, 200)[&1], 150);
        assert!(overlapping(&records).is_empty());
        let clash = vec![record(1, 0, 100), record(2, 50, 150)];
        assert_eq!(overlapping(&clash).len(), 1);
    }

    #[test]
    fn shares_count_only_the_common_window() {
        // pid 1 runs alone for 0..100, then the two alternate; pid 2 runs
        // alone again after 300, outside the common window.
        let records = vec![
            record(1, 0, 100),
            record(2, 100, 150),
            record(1, 150, 200),
            record(2, 200, 250),
            record(1, 250, 300),
            record(2, 300, 350),
        ];
        assert_eq!(common_window(&records), Some((100, 300)));
        let shares = shares_in_common_window(&records);
        assert!((shares[&1] - 0.5).abs() < 1e-9, "{shares:?}");
        assert!((shares[&2] - 0.5).abs() < 1e-9, "{shares:?}");
    }

    #[test]
    fn parses_lines_and_skips_a_trailing_partial_one() {
        let text = "{\"pid\":7,\"device\":0,\"stream\":3,\"start_ns\":10,\"end_ns\":20,\"name\":\"busy\",\"graph\":true}\n{\"pid\":7,";
        let records = parse(text).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].name, "busy");
        assert!(records[0].graph);
        assert!(parse("{\"pid\":1}\n").is_err());
    }

    #[test]
    fn overlap_is_detected() {
        let records = vec![record(1, 0, 100), record(2, 50, 150), record(1, 150, 160)];
        let overlaps = overlapping(&records);
        assert_eq!(overlaps.len(), 1);
        assert_eq!(overlaps[0].1.pid, 2);
    }
}
