//! The claims this node has prepared, kept in a file so that a restarted
//! plugin still knows them: the kubelet may call `NodeUnprepareResources`
//! for a claim prepared before the restart (and may prepare it again,
//! which must give the same answer).

use crate::claim::ClaimGrant;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Claims one node holds at most; a checkpoint with more is refused as
/// damaged rather than trusted.
pub const MAX_CLAIMS: usize = 4096;

/// One prepared claim.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub grant: ClaimGrant,
    /// The CDI device IDs handed to the kubelet.
    pub cdi_device_ids: Vec<String>,
}

/// The file's content: prepared claims by UID.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub version: u32,
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// The format written; older or newer ones are refused with a message.
pub const VERSION: u32 = 1;

/// The checkpoint file in the plugin's directory.
pub fn path(plugin_dir: &Path) -> PathBuf {
    plugin_dir.join("checkpoint.json")
}

impl Checkpoint {
    /// Reads the checkpoint at `path`; none there is an empty one.
    pub fn load(path: &Path) -> Result<Checkpoint, String> {
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: VERSION,
                    ..Default::default()
                });
            }
            Err(e) => return Err(format!("reading checkpoint {}: {e}", path.display())),
        };
        let checkpoint: Checkpoint = serde_json::from_slice(&text)
            .map_err(|e| format!("checkpoint {} is damaged: {e}", path.display()))?;
        if checkpoint.version != VERSION {
            return Err(format!(
                "checkpoint {} has format {}, this plugin reads {VERSION}",
                path.display(),
                checkpoint.version
            ));
        }
        if checkpoint.claims.len() > MAX_CLAIMS {
            return Err(format!(
                "checkpoint {} holds {} claims, more than a node can ({MAX_CLAIMS})",
                path.display(),
                checkpoint.claims.len()
            ));
        }
        Ok(checkpoint)
    }

    /// Writes it to `path` whole or not at all.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let temporary = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(&temporary, text)
            .and_then(|()| std::fs::rename(&temporary, path))
            .map_err(|e| format!("writing checkpoint {}: {e}", path.display()))
    }
}
