//! Files a tenant's dead processes left in their user's region directory
//! (`/dev/shm/dilu-<uid>`): co-location and quiet boards, standalone
//! regions. A process killed by a signal never removes its own, and
//! programs that SIGKILL their workers at shutdown (vLLM's engine) are
//! common; so when a tenant process leaves, the daemon sweeps that user's
//! files that no process holds any more.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long after a process left its user's directory is swept: the
/// kernel drops a dead process's file locks while it closes its files,
/// which may come just after its socket closed.
const SETTLE: Duration = Duration::from_millis(300);

/// Users with a process that left, by when the last one left.
#[derive(Default)]
pub struct Leftovers {
    pending: Mutex<BTreeMap<u32, Instant>>,
}

impl Leftovers {
    /// A process of user `uid` left (its connection closed).
    pub fn process_left(&self, uid: u32) {
        self.pending
            .lock()
            .expect("leftovers lock")
            .insert(uid, Instant::now());
    }

    /// Sweeps the directory of each user whose process left at least
    /// `SETTLE` ago; returns how many files went.
    pub fn sweep_due(&self) -> usize {
        let due: Vec<u32> = {
            let mut pending = self.pending.lock().expect("leftovers lock");
            let due: Vec<u32> = pending
                .iter()
                .filter(|(_, left)| left.elapsed() >= SETTLE)
                .map(|(uid, _)| *uid)
                .collect();
            for uid in &due {
                pending.remove(uid);
            }
            due
        };
        due.into_iter()
            .map(|uid| {
                let dir = dilu_layout::user_region_dir(uid);
                let removed = dilu_layout::sweep::sweep_unused_of(&dir, uid);
                if removed > 0 {
                    tracing::info!(
                        uid,
                        removed,
                        dir = %dir.display(),
                        "removed files that ended processes left"
                    );
                }
                removed
            })
            .sum()
    }
}
