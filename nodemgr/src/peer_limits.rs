//! Fair limits per user: how many connections each uid holds open, so one
//! local user cannot use up the daemon's descriptors and threads and lock
//! every other user's tenants out. (Tenants per uid are capped where they
//! are registered, in [`crate::registry`].)

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Open connections per uid, against one cap.
pub struct ConnectionCounts {
    max_per_uid: usize,
    by_uid: Mutex<HashMap<u32, usize>>,
}

/// One open connection, counted until it is dropped.
pub struct ConnectionSlot {
    counts: Arc<ConnectionCounts>,
    uid: u32,
}

impl ConnectionCounts {
    pub fn new(max_per_uid: usize) -> Arc<Self> {
        Arc::new(ConnectionCounts {
            max_per_uid,
            by_uid: Mutex::new(HashMap::new()),
        })
    }

    /// Counts a new connection of `uid`, or says why it is refused.
    pub(crate) fn enter(self: &Arc<Self>, uid: u32) -> Result<ConnectionSlot, String> {
        let mut by_uid = self.by_uid.lock().expect("connection counts lock");
        let count = by_uid.entry(uid).or_insert(0);
        if *count >= self.max_per_uid {
            return Err(format!(
                "uid {uid} already holds {count} connections to the node manager \
                 (max_connections_per_uid = {}); end some of its processes",
                self.max_per_uid
            ));
        }
        *count += 1;
        Ok(ConnectionSlot {
            counts: self.clone(),
            uid,
        })
    }

    /// Connections `uid` holds now.
    pub fn held_by(&self, uid: u32) -> usize {
        let by_uid = self.by_uid.lock().expect("connection counts lock");
        by_uid.get(&uid).copied().unwrap_or(0)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut by_uid = self.counts.by_uid.lock().expect("connection counts lock");
        if let Some(count) = by_uid.get_mut(&self.uid) {
            *count -= 1;
            if *count == 0 {
                by_uid.remove(&self.uid);
            }
        }
    }
}

/// Raises this process's descriptor limit (every tenant process holds a
/// connection, every tenant two regions): the soft limit to the hard one,
/// and both to `wanted` when that is higher (`open_files_limit`; raising
/// the hard limit needs CAP_SYS_RESOURCE, where it is refused the hard
/// limit stays). Returns the soft limit now in force.
pub fn raise_descriptor_limit(wanted: Option<u64>) -> std::io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the rlimit we own.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if let Some(wanted) = wanted
        && wanted > limit.rlim_max
    {
        let higher = libc::rlimit {
            rlim_cur: wanted,
            rlim_max: wanted,
        };
        // SAFETY: setrlimit reads the rlimit we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &higher) } == 0 {
            return Ok(wanted);
        }
        tracing::warn!(
            "cannot raise the descriptor limit to open_files_limit = {wanted}: {}; \
             the hard limit {} stays",
            std::io::Error::last_os_error(),
            limit.rlim_max
        );
    }
    if limit.rlim_cur < limit.rlim_max {
        limit.rlim_cur = limit.rlim_max;
        // SAFETY: setrlimit reads the rlimit we own.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(limit.rlim_cur)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_at_its_cap_is_refused_and_others_are_not() {
        let counts = ConnectionCounts::new(2);
        let first = counts.enter(1000).unwrap();
        let _second = counts.enter(1000).unwrap();
        let refused = counts.enter(1000).err().expect("a third is over the cap");
        assert!(refused.contains("max_connections_per_uid = 2"), "{refused}");
        assert!(refused.contains("uid 1000"), "{refused}");
        // Another user is not affected by the first one's connections.
        let _other = counts.enter(1001).unwrap();
        assert_eq!(counts.held_by(1001), 1);
        // A closed connection frees its place.
        drop(first);
        assert_eq!(counts.held_by(1000), 1);
        let _again = counts.enter(1000).unwrap();
        assert_eq!(counts.held_by(1000), 2);
    }

    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        let mut lowered = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit/setrlimit on an rlimit we own; the soft limit
        // goes down to 256 only until the call under test raises it.
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lowered), 0);
            lowered.rlim_cur = lowered.rlim_max.min(256);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lowered), 0);
        }
        let raised = raise_descriptor_limit(None).unwrap();
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        assert_eq!(
            // SAFETY: getrlimit writes into the rlimit we own.
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(raised, limit.rlim_max);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
