//! The state a restarted daemon re-adopts its tenants from (`state.json`
//! under `run_dir`): every tenant's spec, GPUs and share.
//!
//! It is written when it changed, by housekeeping every ~100 ms (shares
//! move with control) and, before the daemon answers, by every request
//! that adds or changes a tenant (a registration, `dilu set`, a grant): a
//! daemon killed right after it answered has the tenant saved. Writers are
//! serialized, each writing what the registry holds when its turn comes,
//! so a slower writer never puts older state over newer.

use crate::registry::Registry;
use crate::registry::persistence::SavedTenant;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub const STATE_FILE: &str = "state.json";

pub struct StateFile {
    path: PathBuf,
    /// What the file holds now (as written), under the writers' lock.
    written: Mutex<String>,
}

impl StateFile {
    /// The state file under `run_dir`.
    pub fn in_dir(run_dir: &Path) -> StateFile {
        StateFile {
            path: run_dir.join(STATE_FILE),
            written: Mutex::new(String::new()),
        }
    }

    /// What a previous daemon saved (nothing where there is no file; a
    /// file that does not parse is named and ignored).
    pub fn load(&self) -> Vec<SavedTenant> {
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return Vec::new();
        };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!("ignoring {}: {e}", self.path.display());
            Vec::new()
        })
    }

    /// Writes what `registry` holds now, if it changed since the last
    /// write. The registry lock is held only to copy the state out; the
    /// file is written (whole, then renamed over the old one) outside it.
    pub fn save(&self, registry: &Mutex<Registry>) {
        let mut written = self.written.lock().expect("state file lock");
        let saved = registry.lock().expect("registry lock").saved();
        let Ok(text) = serde_json::to_string_pretty(&saved) else {
            return;
        };
        if text == *written {
            return;
        }
        let staging = self.path.with_extension("json.new");
        match std::fs::write(&staging, &text).and_then(|()| std::fs::rename(&staging, &self.path)) {
            Ok(()) => *written = text,
            Err(e) => tracing::warn!("cannot write {}: {e}", self.path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::testing::register_on;
    use dilu_abi::node_wire::TenantSpec;

    #[test]
    fn what_is_saved_is_what_a_new_daemon_loads_and_an_unreadable_file_is_ignored() {
        let dir = std::env::temp_dir().join(format!("dilu-state-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = StateFile::in_dir(&dir);
        assert!(file.load().is_empty(), "no file: nothing to re-adopt");
        let registry = Mutex::new(Registry::new(Default::default(), None));
        register_on(
            &mut registry.lock().unwrap(),
            "train",
            7,
            &[],
            TenantSpec::default(),
        );
        file.save(&registry);
        let loaded = file.load();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].name, "train");
        std::fs::write(dir.join(STATE_FILE), "{ not json").unwrap();
        assert!(file.load().is_empty());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
