//! The daemon's Unix socket: tenants register, tools ask for status and
//! change specs, `dilu run` asks which GPU a tenant goes to. One thread per connection (a tenant process keeps its
//! connection open for its whole life, so that its death is noticed).
//!
//! Everything a peer sends is untrusted: the request must come, and the
//! reply must leave, within [`PEER_TIMEOUT`], and
//! descriptors a tenant hands back are inspected (without waiting) before
//! the registry lock is taken. The lock is held for memory work only, so a
//! stalled tenant stalls its own connection thread and nothing else.

use crate::registry::Peer;
use crate::shared_state::Shared;
use dilu_abi::node_wire::{self, FromDaemon, PROTOCOL_VERSION, TenantSpec, ToDaemon};
use dilu_abi::seqpacket;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a new connection may take to send its request, and a reply may
/// wait for room in the peer's socket buffer.
pub const PEER_TIMEOUT: Duration = Duration::from_secs(2);

/// Accepts connections until the daemon stops.
pub fn serve(shared: Arc<Shared>, listener: Arc<OwnedFd>) {
    loop {
        let connection = match seqpacket::accept(&listener) {
            Ok(fd) => fd,
            Err(e) => {
                if shared.stopping.load(Ordering::Acquire) {
                    return;
                }
                if e.kind() != std::io::ErrorKind::Interrupted {
                    tracing::warn!("accept: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                continue;
            }
        };
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let shared = shared.clone();
        let spawned = std::thread::Builder::new()
            .name("dilu-conn".into())
            .spawn(move || handle(shared, Arc::new(connection)));
        if let Err(e) = spawned {
            tracing::warn!("cannot start a connection thread: {e}");
        }
    }
}

/// Sends `message`; false where it did not reach the peer (gone, or its
/// buffer full past [`PEER_TIMEOUT`]).
fn reply(connection: &OwnedFd, message: &FromDaemon, fds: &[i32]) -> bool {
    match node_wire::encode(message) {
        Ok(bytes) if bytes.len() > seqpacket::MAX_MESSAGE => {
            let reason = format!(
                "the answer takes {} bytes, more than one message ({}); a status of many tenants \
                 comes in parts (StatusParts, as `dilu status` asks)",
                bytes.len(),
                seqpacket::MAX_MESSAGE
            );
            reply(connection, &FromDaemon::Error { reason }, &[]);
            false
        }
        Ok(bytes) => match seqpacket::send(connection, &bytes, fds) {
            Ok(_) => true,
            Err(e) => {
                tracing::debug!("reply: {e}");
                false
            }
        },
        Err(e) => {
            tracing::warn!("{e}");
            false
        }
    }
}

fn handle(shared: Arc<Shared>, connection: Arc<OwnedFd>) {
    let peer = match seqpacket::peer_cred(&connection) {
        Ok(peer) => peer,
        Err(e) => {
            tracing::warn!("SO_PEERCRED: {e}");
            return;
        }
    };
    if let Err(e) = seqpacket::set_timeout(&connection, Some(PEER_TIMEOUT)) {
        tracing::warn!("cannot bound a connection's reads: {e}");
        return;
    }
    // Counted for as long as this thread serves it.
    let _slot = match shared.connections.enter(peer.uid) {
        Ok(slot) => slot,
        Err(reason) => {
            tracing::debug!("{reason}");
            // The request is read (and dropped) first: closing on an unread
            // message would reset the connection before the peer reads why.
            let mut discard = [0u8; 64];
            let _ = seqpacket::recv(&connection, &mut discard);
            reply(&connection, &FromDaemon::Refused { reason }, &[]);
            return;
        }
    };
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, mut fds) = match seqpacket::recv(&connection, &mut buffer) {
        Ok(received) => received,
        // Too large, or too many descriptors: the peer learns why.
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            let reason = format!(
                "request refused: {e} (at most {} bytes and {} descriptors)",
                seqpacket::MAX_MESSAGE,
                seqpacket::MAX_FDS
            );
            reply(&connection, &FromDaemon::Error { reason }, &[]);
            return;
        }
        Err(_) => return,
    };
    if n == 0 {
        return;
    }
    let request = match node_wire::decode::<ToDaemon>(&buffer[..n]) {
        Ok(request) => request,
        Err(reason) => {
            reply(&connection, &FromDaemon::Error { reason }, &[]);
            return;
        }
    };
    match request {
        ToDaemon::Register {
            version,
            tenant,
            spec,
            reattach,
        } => {
            if version != PROTOCOL_VERSION {
                let reason = format!(
                    "protocol version {version} is not {PROTOCOL_VERSION}: the interposer and the daemon come from different dilu versions"
                );
                reply(&connection, &FromDaemon::Refused { reason }, &[]);
                return;
            }
            // A process that gave up waiting (the daemon stalled) runs on
            // its own limits and registers again: this try is stale.
            if seqpacket::peer_gone(&connection) {
                tracing::debug!(
                    tenant,
                    pid = peer.pid,
                    "registration given up by its process"
                );
                return;
            }
            // Only a re-attaching process hands back (budget, activity);
            // the budget is never read (the share is the daemon's), the
            // activity region is adopted only if it is size-sealed.
            let handed_back = if reattach && fds.len() == 2 {
                fds.pop()
            } else {
                None
            };
            drop(fds);
            let start_time = dilu_layout::ledger::process_start_time(peer.pid).unwrap_or(0);
            let fresh = match crate::registry::create_regions(&tenant, handed_back) {
                Ok(regions) => regions,
                Err(error) => {
                    let reason = error.to_string();
                    reply(&connection, &FromDaemon::Refused { reason }, &[]);
                    return;
                }
            };
            let registered = shared.registry.lock().expect("registry lock").register(
                &tenant,
                Peer {
                    pid: peer.pid,
                    uid: peer.uid,
                    connection: connection.clone(),
                },
                start_time,
                spec,
                fresh,
            );
            // The reply goes out after the lock is released; the shared
            // descriptors stay open until it is sent.
            let result = match registered {
                Ok((id, spec, fds)) => {
                    // Saved before it is answered: a daemon killed right
                    // after still re-adopts it.
                    shared.save_state();
                    let raw = [fds[0].as_raw_fd(), fds[1].as_raw_fd()];
                    reply(
                        &connection,
                        &FromDaemon::Registered {
                            tenant: tenant.clone(),
                            spec,
                        },
                        &raw,
                    );
                    Ok(id)
                }
                Err(reason) => {
                    reply(
                        &connection,
                        &FromDaemon::Refused {
                            reason: reason.to_string(),
                        },
                        &[],
                    );
                    Err(())
                }
            };
            let Ok(member) = result else {
                return;
            };
            tracing::info!(
                tenant,
                pid = peer.pid,
                reattach,
                "tenant process registered"
            );
            // The process writes nothing more: wait for its end.
            let _ = seqpacket::set_timeout(&connection, None);
            seqpacket::wait_closed(&connection);
            tracing::info!(tenant, pid = peer.pid, "tenant process left");
            shared.registry.lock().expect("registry lock").leave(member);
            shared.leftovers.process_left(peer.uid);
        }
        ToDaemon::Status => {
            let status = shared.status();
            reply(&connection, &FromDaemon::Status(Box::new(status)), &[]);
        }
        ToDaemon::StatusParts => {
            match dilu_abi::status_parts::split(shared.status(), seqpacket::MAX_MESSAGE) {
                Ok(parts) => {
                    let count = parts.len();
                    for (i, part) in parts.into_iter().enumerate() {
                        let message = FromDaemon::StatusPart {
                            status: Box::new(part),
                            last: i + 1 == count,
                        };
                        reply(&connection, &message, &[]);
                    }
                }
                Err(reason) => {
                    reply(&connection, &FromDaemon::Error { reason }, &[]);
                }
            }
        }
        ToDaemon::Set { tenant, update } => {
            if let Err(reason) = operator_only(peer.uid) {
                reply(&connection, &FromDaemon::Error { reason }, &[]);
                return;
            }
            let result = shared
                .registry
                .lock()
                .expect("registry lock")
                .update(&tenant, &update);
            let message = match result {
                Ok(spec) => {
                    shared.save_state();
                    tracing::info!(tenant, ?spec, "spec changed by uid {}", peer.uid);
                    FromDaemon::Updated { tenant, spec }
                }
                Err(reason) => FromDaemon::Error {
                    reason: reason.to_string(),
                },
            };
            reply(&connection, &message, &[]);
        }
        ToDaemon::Place { tenant, spec, gpus } => {
            // A `dilu run` that gave up waiting (the daemon stalled) starts
            // its program on the GPUs CUDA shows it: a hold it never heard
            // of would have its tenant controlled on GPUs it is not on.
            if seqpacket::peer_gone(&connection) {
                tracing::info!(
                    tenant,
                    "placement asked by a dilu run gone since; none made"
                );
                return;
            }
            let held_before = holds(&shared, &tenant);
            let message = place(&shared, &tenant, peer.uid, spec, gpus);
            if !reply(&connection, &message, &[]) && !held_before && holds(&shared, &tenant) {
                shared
                    .registry
                    .lock()
                    .expect("registry lock")
                    .held
                    .remove(&tenant);
                tracing::info!(tenant, "placement not delivered; its GPUs are not held");
            }
        }
        ToDaemon::Grant { tenant, spec, gpus } => {
            let message = match operator_only(peer.uid) {
                Err(reason) => FromDaemon::Error { reason },
                Ok(()) => {
                    let granted = shared
                        .registry
                        .lock()
                        .expect("registry lock")
                        .grant(&tenant, spec, gpus);
                    match granted {
                        Ok((spec, changed)) => {
                            shared.save_state();
                            // The DRA driver repeats its grants: only a
                            // change is worth a line at the default level.
                            if changed {
                                tracing::info!(tenant, ?spec, "spec granted by uid {}", peer.uid);
                            } else {
                                tracing::debug!(tenant, "grant repeated by uid {}", peer.uid);
                            }
                            FromDaemon::Updated { tenant, spec }
                        }
                        Err(reason) => FromDaemon::Error {
                            reason: reason.to_string(),
                        },
                    }
                }
            };
            reply(&connection, &message, &[]);
        }
        ToDaemon::Release { tenant } => {
            let message = match operator_only(peer.uid) {
                Err(reason) => FromDaemon::Error { reason },
                Ok(()) => {
                    let held = shared
                        .registry
                        .lock()
                        .expect("registry lock")
                        .release(&tenant);
                    tracing::info!(tenant, held, "grant released by uid {}", peer.uid);
                    FromDaemon::Released { tenant, held }
                }
            };
            reply(&connection, &message, &[]);
        }
    }
}

/// Whether GPUs are held for `tenant`'s first process.
fn holds(shared: &Shared, tenant: &str) -> bool {
    let registry = shared.registry.lock().expect("registry lock");
    registry.held.contains_key(tenant)
}

/// Changing tenants is for root and the daemon's own user.
fn operator_only(uid: u32) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if uid == 0 || uid == me {
        Ok(())
    } else {
        Err(format!(
            "only root or uid {me} may change tenants (you are uid {uid})"
        ))
    }
}

/// Chooses a GPU for a tenant `dilu run` is about to start (see
/// [`crate::registry::Registry::place`]). Each GPU's memory is NVML's
/// figure, else the configured `gpu_memory`, else unbounded.
fn place(
    shared: &Shared,
    tenant: &str,
    uid: u32,
    spec: Option<TenantSpec>,
    count: u32,
) -> FromDaemon {
    let Some(policy) = dilu_placement::policy::policy_by_name(&shared.config.placement) else {
        let reason = format!("unknown placement policy {:?}", shared.config.placement);
        return FromDaemon::Refused { reason };
    };
    let capacities: Vec<u64> = {
        let gpus = shared.gpus.lock().expect("gpus lock");
        let fallback = shared.config.gpu_memory.unwrap_or(u64::MAX);
        gpus.iter()
            .map(|g| g.memory_total_bytes.unwrap_or(fallback))
            .collect()
    };
    let placed = shared.registry.lock().expect("registry lock").place(
        tenant,
        uid,
        spec,
        &capacities,
        policy.as_ref(),
        count as usize,
    );
    match placed {
        Ok(gpus) => {
            if !gpus.is_empty() {
                tracing::info!(tenant, ?gpus, uid, "GPUs chosen for a tenant");
            }
            FromDaemon::Placed {
                tenant: tenant.to_string(),
                gpus,
            }
        }
        Err(error) => FromDaemon::Refused {
            reason: error.to_string(),
        },
    }
}
