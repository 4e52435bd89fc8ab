//! A node status of any size over the seqpacket socket, whose messages are
//! at most [`seqpacket::MAX_MESSAGE`] bytes: the daemon answers
//! [`ToDaemon::StatusParts`] with one or more [`FromDaemon::StatusPart`]
//! messages, each a [`NodeStatus`] with a slice of the tenants, signals and
//! co-location entries (the first also carries everything else), the last
//! one marked. One snapshot is split, so the parts are consistent.

use crate::node_wire::{self, FromDaemon, NodeStatus, ToDaemon};
use crate::seqpacket;
use serde::Serialize;
use std::path::Path;
use std::time::Duration;

/// Room kept in each part for the lengths of its lists and the message's
/// own framing (varints of at most 5 bytes each).
const FRAMING: usize = 64;
/// Most parts a client reads before it calls the answer malformed.
pub const MAX_PARTS: usize = 100_000;

fn encoded_len<T: Serialize>(value: &T) -> Result<usize, String> {
    node_wire::encode(value).map(|bytes| bytes.len())
}

/// Moves items from `from` into `into` while the part stays under `room`
/// bytes (`used` counts what it holds); an item that can never fit is an
/// error.
fn fill<T: Serialize>(
    from: &mut std::collections::VecDeque<T>,
    into: &mut Vec<T>,
    used: &mut usize,
    room: usize,
    fresh_part: bool,
) -> Result<(), String> {
    while let Some(item) = from.front() {
        let len = encoded_len(item)?;
        if *used + len > room {
            if fresh_part && into.is_empty() {
                return Err(format!(
                    "one status entry takes {len} bytes, more than a message holds"
                ));
            }
            return Ok(());
        }
        *used += len;
        into.push(from.pop_front().expect("front checked"));
    }
    Ok(())
}

/// Splits a status into parts whose messages each fit `max_message` bytes.
pub fn split(status: NodeStatus, max_message: usize) -> Result<Vec<NodeStatus>, String> {
    let mut tenants = std::collections::VecDeque::from(status.tenants);
    let mut signals = std::collections::VecDeque::from(status.signals);
    let mut colocation = std::collections::VecDeque::from(status.colocation);
    let header = NodeStatus {
        tenants: Vec::new(),
        signals: Vec::new(),
        colocation: Vec::new(),
        ..status
    };
    let empty = NodeStatus {
        gpus: Vec::new(),
        ..header.clone()
    };
    let mut parts = Vec::new();
    loop {
        let mut part = if parts.is_empty() {
            header.clone()
        } else {
            empty.clone()
        };
        let message = FromDaemon::StatusPart {
            status: Box::new(part.clone()),
            last: false,
        };
        let mut used = encoded_len(&message)? + FRAMING;
        if used > max_message {
            return Err("the status header alone is larger than a message".into());
        }
        fill(
            &mut tenants,
            &mut part.tenants,
            &mut used,
            max_message,
            true,
        )?;
        let fresh = part.tenants.is_empty();
        fill(
            &mut signals,
            &mut part.signals,
            &mut used,
            max_message,
            fresh,
        )?;
        let fresh = fresh && part.signals.is_empty();
        fill(
            &mut colocation,
            &mut part.colocation,
            &mut used,
            max_message,
            fresh,
        )?;
        parts.push(part);
        if tenants.is_empty() && signals.is_empty() && colocation.is_empty() {
            return Ok(parts);
        }
    }
}

/// Joins parts back into one status (the first part's header).
pub fn merge(parts: Vec<NodeStatus>) -> Result<NodeStatus, String> {
    let mut parts = parts.into_iter();
    let mut status = parts.next().ok_or("no status part")?;
    for part in parts {
        status.tenants.extend(part.tenants);
        status.signals.extend(part.signals);
        status.colocation.extend(part.colocation);
    }
    Ok(status)
}

/// What an operator tool says when the daemon's socket does not answer.
pub fn cannot_reach(socket: &Path, error: &std::io::Error) -> String {
    format!(
        "cannot reach the node manager at {} ({error}); is `dilu nodemgr` running? (set {} or --socket)",
        socket.display(),
        node_wire::SOCKET_ENV
    )
}

/// Asks the daemon at `socket` for its whole status (every part);
/// `timeout` bounds each send and receive.
pub fn fetch(socket: &Path, timeout: Duration) -> Result<NodeStatus, String> {
    let connection =
        seqpacket::connect(socket, Some(timeout)).map_err(|e| cannot_reach(socket, &e))?;
    let request = node_wire::encode(&ToDaemon::StatusParts)?;
    seqpacket::send(&connection, &request, &[]).map_err(|e| e.to_string())?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let mut parts = Vec::new();
    while parts.len() < MAX_PARTS {
        let (n, _) = seqpacket::recv(&connection, &mut buffer).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the node manager closed the connection mid-status".into());
        }
        match node_wire::decode::<FromDaemon>(&buffer[..n])? {
            FromDaemon::StatusPart { status, last } => {
                parts.push(*status);
                if last {
                    return merge(parts);
                }
            }
            FromDaemon::Error { reason } | FromDaemon::Refused { reason } => return Err(reason),
            other => return Err(format!("unexpected answer: {other:?}")),
        }
    }
    Err(format!("the status came in more than {MAX_PARTS} parts"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node_wire::{ScaleAdvice, ScaleSignal, TenantSpec, TenantStatus};

    fn tenant(i: usize) -> TenantStatus {
        TenantStatus {
            name: format!("idle-tenant-with-a-long-name-{i:05}"),
            uid: 1000,
            spec: TenantSpec::default(),
            pids: vec![i as i32, i as i32 + 1],
            mem_used_bytes: 0,
            mem_budget_bytes: Some(1 << 30),
            mem_audited_bytes: None,
            sm_current_pct: 0.0,
            sm_achieved_pct: 0.0,
            busy_seconds_total: 0.0,
            launches_total: 0,
            throttled_seconds_total: 0.0,
            p99_ms: None,
            latency_reports_total: 0,
            latency_seconds_total: 0.0,
            bubble_ratio: 1.0,
            gpu: None,
            more_gpus: Vec::new(),
            waiting: false,
            over_admitted: None,
            granted: false,
        }
    }

    fn node(tenants: usize) -> NodeStatus {
        NodeStatus {
            controller: "dilu".into(),
            period_ms: 5.0,
            uptime_seconds: 1.0,
            gpus: Vec::new(),
            tenants: (0..tenants).map(tenant).collect(),
            signals: (0..tenants)
                .map(|i| ScaleSignal {
                    tenant: format!("idle-tenant-with-a-long-name-{i:05}"),
                    advice: ScaleAdvice::ScaleIn,
                    for_seconds: 300.0,
                    reason: "no kernel launched".into(),
                    gpu: Some((i % 8) as u32),
                })
                .collect(),
            control_periods: 7,
            control_work_seconds_total: 0.5,
            control_work_max_ms: 0.2,
            colocation: Vec::new(),
        }
    }

    #[test]
    fn a_status_of_5000_tenants_comes_in_parts_that_each_fit_a_message() {
        let status = node(5000);
        let whole = node_wire::encode(&FromDaemon::Status(Box::new(status.clone()))).unwrap();
        assert!(whole.len() > seqpacket::MAX_MESSAGE, "the case this is for");
        let parts = split(status.clone(), seqpacket::MAX_MESSAGE).unwrap();
        assert!(parts.len() > 1);
        for (i, part) in parts.iter().enumerate() {
            let message = FromDaemon::StatusPart {
                status: Box::new(part.clone()),
                last: i + 1 == parts.len(),
            };
            let len = node_wire::encode(&message).unwrap().len();
            assert!(len <= seqpacket::MAX_MESSAGE, "part {i}: {len} bytes");
        }
        assert_eq!(merge(parts).unwrap(), status);
    }

    #[test]
    fn a_small_status_is_one_part_and_an_empty_one_too() {
        for tenants in [0, 3] {
            let status = node(tenants);
            let parts = split(status.clone(), seqpacket::MAX_MESSAGE).unwrap();
            assert_eq!(parts.len(), 1);
            assert_eq!(merge(parts).unwrap(), status);
        }
        assert!(
            split(node(3), 100).is_err(),
            "a header larger than a message"
        );
    }
}
