//! The operator's end of the node manager's socket: one request, one
//! answer (`dilu set`, the DRA plugin's grants). A tenant's end is
//! [`crate::node_client`]; a status in parts is [`crate::status_parts`].

use crate::node_wire::{self, FromDaemon, TenantSpec, ToDaemon};
use crate::seqpacket;
use crate::status_parts::cannot_reach;
use std::path::Path;
use std::time::Duration;

/// How long one send or receive may wait: a daemon that stops answering is
/// reported, never waited on for ever.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// One request to the daemon at `socket`, one answer.
pub fn ask(socket: &Path, request: &ToDaemon) -> Result<FromDaemon, String> {
    let connection =
        seqpacket::connect(socket, Some(ANSWER_TIMEOUT)).map_err(|e| cannot_reach(socket, &e))?;
    let unanswered = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => format!(
            "the node manager at {} did not answer in {} s",
            socket.display(),
            ANSWER_TIMEOUT.as_secs()
        ),
        _ => e.to_string(),
    };
    seqpacket::send(&connection, &node_wire::encode(request)?, &[]).map_err(unanswered)?;
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, _) = seqpacket::recv(&connection, &mut buffer).map_err(unanswered)?;
    if n == 0 {
        return Err("the node manager closed the connection".into());
    }
    node_wire::decode(&buffer[..n])
}

/// Grants `spec` on `gpus` to `tenant` ([`ToDaemon::Grant`]); the spec in
/// force comes back.
pub fn grant(
    socket: &Path,
    tenant: &str,
    spec: &TenantSpec,
    gpus: &[u32],
) -> Result<TenantSpec, String> {
    let request = ToDaemon::Grant {
        tenant: tenant.to_string(),
        spec: spec.clone(),
        gpus: gpus.to_vec(),
    };
    match ask(socket, &request)? {
        FromDaemon::Updated { spec, .. } => Ok(spec),
        FromDaemon::Error { reason } | FromDaemon::Refused { reason } => Err(reason),
        other => Err(format!("unexpected answer to a grant: {other:?}")),
    }
}

/// Ends `tenant`'s grant ([`ToDaemon::Release`]); whether there was one.
pub fn release(socket: &Path, tenant: &str) -> Result<bool, String> {
    let request = ToDaemon::Release {
        tenant: tenant.to_string(),
    };
    match ask(socket, &request)? {
        FromDaemon::Released { held, .. } => Ok(held),
        FromDaemon::Error { reason } | FromDaemon::Refused { reason } => Err(reason),
        other => Err(format!("unexpected answer to a release: {other:?}")),
    }
}
