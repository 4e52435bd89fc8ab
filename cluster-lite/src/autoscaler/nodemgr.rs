//! What the autoscaler reads from a node manager: `/api/status` over plain
//! HTTP (its tenants' SM time and limits, and the scale signals). Only the
//! fields used here are parsed, so fields a newer node manager adds (a
//! signal's GPU, say) are ignored.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde::Deserialize;

/// The most of a reply that is read (a node's status is a few KiB).
const MAX_REPLY_BYTES: u64 = 16 << 20;

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeReport {
    #[serde(default)]
    pub tenants: Vec<TenantReport>,
    #[serde(default)]
    pub signals: Vec<SignalReport>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TenantReport {
    pub name: String,
    pub spec: SpecReport,
    /// Device time the tenant used over the last second (percent).
    #[serde(default)]
    pub sm_achieved_pct: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SpecReport {
    pub sm_limit_pct: f64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct SignalReport {
    pub tenant: String,
    /// `ScaleOut` or `ScaleIn`.
    pub advice: String,
}

impl NodeReport {
    /// The tenant's SM time over its limit in the last second (1: it used
    /// all its limit allows), if the node manager serves it.
    pub fn load_of(&self, tenant: &str) -> Option<f64> {
        let report = self.tenants.iter().find(|t| t.name == tenant)?;
        let limit = report.spec.sm_limit_pct;
        Some(if limit > 0.0 {
            (report.sm_achieved_pct / limit).clamp(0.0, 1.0)
        } else {
            0.0
        })
    }

    /// The node manager advises scaling the tenant out: it is saturated at
    /// its SM limit and over its SLO.
    pub fn advises_out(&self, tenant: &str) -> bool {
        self.signals
            .iter()
            .any(|s| s.tenant == tenant && s.advice == "ScaleOut")
    }
}

/// `GET http://address/api/status`, within `timeout` per step.
pub fn fetch_status(address: SocketAddr, timeout: Duration) -> Result<NodeReport, String> {
    let body = http_get(address, "/api/status", timeout)?;
    serde_json::from_slice(&body).map_err(|e| format!("node manager {address}: bad status: {e}"))
}

fn http_get(address: SocketAddr, path: &str, timeout: Duration) -> Result<Vec<u8>, String> {
    let failed = |e: std::io::Error| format!("node manager {address}: {e}");
    let mut stream = TcpStream::connect_timeout(&address, timeout).map_err(failed)?;
    stream.set_read_timeout(Some(timeout)).map_err(failed)?;
    stream.set_write_timeout(Some(timeout)).map_err(failed)?;
    write!(
        stream,
        "GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .map_err(failed)?;
    let mut reply = Vec::new();
    stream
        .take(MAX_REPLY_BYTES)
        .read_to_end(&mut reply)
        .map_err(failed)?;
    let Some(split) = reply.windows(4).position(|w| w == b"\r\n\r\n") else {
        return Err(format!("node manager {address}: no HTTP reply"));
    };
    let head = String::from_utf8_lossy(&reply[..split]);
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("node manager {address}: HTTP {status} for {path}"));
    }
    Ok(reply[split + 4..].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_a_newer_node_manager_adds_are_ignored() {
        let report: NodeReport = serde_json::from_str(
            r#"{"controller":"dilu","tenants":[{"name":"ns.a","gpu":1,"spec":{"class":"Latency","sm_limit_pct":50.0,"sm_request_pct":20.0},"sm_achieved_pct":40.0}],
                "signals":[{"tenant":"ns.a","gpu":1,"advice":"ScaleOut","for_seconds":3.0,"reason":"x"}]}"#,
        )
        .unwrap();
        assert_eq!(report.load_of("ns.a"), Some(0.8));
        assert!(report.advises_out("ns.a"));
        assert_eq!(report.load_of("ns.b"), None);
        assert!(!report.advises_out("ns.b"));
    }
}
