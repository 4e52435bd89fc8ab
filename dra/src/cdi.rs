//! The CDI spec a prepared claim becomes: one file per claim in the CDI
//! directory the container runtime reads (`/var/run/cdi`), naming one
//! device, `gpu.dilu.io/claim=<claim UID>`, whose container edits put the
//! container's processes under the claim's tenant:
//!
//! - `LD_PRELOAD` of the interposer, mounted read-only from the node;
//! - the node manager's socket directory, mounted, and its path;
//! - `DILU_TENANT` and `DILU_SPEC` (the grant's spec, so the interposer
//!   enforces it even before the node manager answers) and `DILU_COLO`;
//! - `CUDA_VISIBLE_DEVICES` naming the claim's GPUs by UUID, which selects
//!   them whether the runtime exposes every GPU or only these;
//! - the claim's GPU device nodes and the driver's control nodes, those
//!   present on the node.
//!
//! The driver's libraries are not injected: they come from the NVIDIA
//! runtime class or NVIDIA's own CDI spec, as for any CUDA container.

use crate::claim::ClaimGrant;
use dilu_abi::node_wire::{SOCKET_ENV, SpecVar};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The CDI specification version written: the oldest with what is used
/// (`hostPath` of device nodes came in 0.5.0).
pub const CDI_VERSION: &str = "0.5.0";
/// The CDI kind of the plugin's devices.
pub const KIND: &str = "gpu.dilu.io/claim";
/// Where a container finds the interposer.
pub const CONTAINER_INTERPOSER: &str = "/usr/local/lib/dilu/libdilu_interposer.so";
/// Where a container finds the node manager's socket directory: the whole
/// directory is mounted so a restarted node manager's new socket is seen.
pub const CONTAINER_SOCKET_DIR: &str = "/run/dilu";
/// Device nodes every CUDA process needs beside its GPUs'.
pub const CONTROL_NODES: [&str; 3] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"];

/// Where the node keeps what containers get.
#[derive(Debug, Clone)]
pub struct NodeLayout {
    /// The interposer library on the node.
    pub host_interposer: PathBuf,
    /// The node manager's socket directory on the node.
    pub host_socket_dir: PathBuf,
    /// The socket's file name in that directory.
    pub socket_name: String,
    /// The node's device directory (`/dev`).
    pub dev_dir: PathBuf,
}

/// The CDI device ID of a claim (what the kubelet hands the runtime).
pub fn device_id(claim_uid: &str) -> String {
    format!("{KIND}={claim_uid}")
}

/// The spec file of a claim in CDI directory `dir`.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("gpu.dilu.io-{claim_uid}.json"))
}

/// The CDI spec for claim `claim_uid` granted `grant` on GPUs with UUIDs
/// `uuids` and minor numbers `minors` (in the order of its GPU indices).
pub fn spec(
    claim_uid: &str,
    grant: &ClaimGrant,
    uuids: &[String],
    minors: &[u32],
    layout: &NodeLayout,
) -> Value {
    let mut env = vec![
        format!("LD_PRELOAD={CONTAINER_INTERPOSER}"),
        format!("{SOCKET_ENV}={CONTAINER_SOCKET_DIR}/{}", layout.socket_name),
        format!("DILU_TENANT={}", grant.tenant),
        "CUDA_DEVICE_ORDER=PCI_BUS_ID".to_string(),
        format!("CUDA_VISIBLE_DEVICES={}", uuids.join(",")),
    ];
    if let Some((key, value)) = SpecVar::of(&grant.spec).env() {
        env.push(format!("{key}={value}"));
    }
    if let Some(role) = &grant.colocation {
        env.push(format!("DILU_COLO={role}"));
    }
    let nodes: Vec<Value> = minors
        .iter()
        .map(|minor| format!("nvidia{minor}"))
        .chain(CONTROL_NODES.iter().map(|n| n.to_string()))
        .map(|name| layout.dev_dir.join(name))
        .filter(|path| path.exists())
        .map(|path| {
            let name = path.file_name().expect("joined a name").to_string_lossy();
            json!({"path": format!("/dev/{name}"), "hostPath": path.display().to_string()})
        })
        .collect();
    let mut edits = json!({
        "env": env,
        "mounts": [
            {
                "hostPath": layout.host_interposer.display().to_string(),
                "containerPath": CONTAINER_INTERPOSER,
                "options": ["ro", "nosuid", "nodev", "bind"],
            },
            {
                "hostPath": layout.host_socket_dir.display().to_string(),
                "containerPath": CONTAINER_SOCKET_DIR,
                "options": ["rw", "nosuid", "nodev", "bind"],
            },
        ],
    });
    if !nodes.is_empty() {
        edits["deviceNodes"] = Value::Array(nodes);
    }
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "devices": [{"name": claim_uid, "containerEdits": edits}],
    })
}

/// Writes `spec` for `claim_uid` into `dir` whole or not at all (a
/// temporary file renamed), so a runtime never reads half a spec.
pub fn write(dir: &Path, claim_uid: &str, spec: &Value) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("CDI directory {}: {e}", dir.display()))?;
    let path = spec_path(dir, claim_uid);
    let temporary = dir.join(format!(".gpu.dilu.io-{claim_uid}.json.tmp"));
    let text = serde_json::to_vec_pretty(spec).map_err(|e| e.to_string())?;
    std::fs::write(&temporary, text)
        .and_then(|()| std::fs::rename(&temporary, &path))
        .map_err(|e| format!("writing CDI spec {}: {e}", path.display()))?;
    Ok(path)
}

/// Removes the spec of `claim_uid` from `dir`; a spec already gone is fine.
pub fn remove(dir: &Path, claim_uid: &str) -> Result<(), String> {
    let path = spec_path(dir, claim_uid);
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing CDI spec {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::{ClaimDevice, ClaimGrant};
    use dilu_abi::node_wire::SmShare;
    use dilu_abi::node_wire::TenantSpec;

    /// A name segment as the CDI specification defines it: alphanumeric
    /// at both ends, `-`, `_`, `.` and alphanumerics between.
    fn cdi_name(text: &str) -> bool {
        let alnum = |c: char| c.is_ascii_alphanumeric();
        !text.is_empty()
            && text.starts_with(alnum)
            && text.ends_with(alnum)
            && text
                .chars()
                .all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
    }

    /// A DNS subdomain: dot-separated labels of lowercase alphanumerics
    /// and `-`, at most 253 characters.
    fn dns_subdomain(text: &str) -> bool {
        text.len() <= 253
            && text.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && !label.starts_with('-')
                    && !label.ends_with('-')
                    && label
                        .chars()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            })
    }

    #[test]
    fn the_spec_names_its_kind_and_device_as_cdi_requires_and_edits_only_what_it_must() {
        let (prefix, name) = KIND.split_once('/').unwrap();
        assert!(
            dns_subdomain(prefix) && cdi_name(name) && name.len() <= 63,
            "{KIND}"
        );
        let dev = std::env::temp_dir().join(format!("dilu-cdi-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dev).unwrap();
        for node in ["nvidia1", "nvidiactl"] {
            std::fs::write(dev.join(node), "").unwrap();
        }
        let grant = ClaimGrant {
            tenant: "serving.infer".into(),
            spec: TenantSpec {
                mem: Some(dilu_abi::units::Bytes::gib(1)),
                sm_request: SmShare::percent(20.0),
                ..TenantSpec::default()
            },
            colocation: Some("filler".into()),
            devices: vec![ClaimDevice {
                request: "gpu".into(),
                pool: "node-a".into(),
                device: "gpu-1".into(),
                share_id: None,
                gpu_index: 1,
            }],
        };
        let layout = NodeLayout {
            host_interposer: "/var/lib/dilu/lib/libdilu_interposer.so".into(),
            host_socket_dir: "/run/dilu".into(),
            socket_name: "nodemgr.sock".into(),
            dev_dir: dev.clone(),
        };
        let uid = "0f9a7a52-5c1e-4a55-9c55-3f7e3c6a1b2d";
        let spec = spec(uid, &grant, &["GPU-1111".into()], &[1], &layout);
        assert_eq!(device_id(uid), format!("gpu.dilu.io/claim={uid}"));
        let device = &spec["devices"][0];
        assert!(cdi_name(device["name"].as_str().unwrap()));
        let edits = &device["containerEdits"];
        let env: Vec<&str> = edits["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert!(
            env.iter()
                .all(|e| e.split_once('=').is_some_and(|(k, _)| !k.is_empty()))
        );
        for wanted in [
            "DILU_TENANT=serving.infer",
            "CUDA_VISIBLE_DEVICES=GPU-1111",
            "DILU_COLO=filler",
            "LD_PRELOAD=/usr/local/lib/dilu/libdilu_interposer.so",
            "DILU_NODEMGR_SOCKET=/run/dilu/nodemgr.sock",
        ] {
            assert!(env.contains(&wanted), "{wanted} in {env:?}");
        }
        assert!(
            env.iter()
                .any(|e| e.starts_with("DILU_SPEC=") && e.contains("mem=1073741824"))
        );
        // Only device nodes the node has: the claim's GPU and nvidiactl.
        let nodes: Vec<&str> = edits["deviceNodes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["path"].as_str().unwrap())
            .collect();
        assert_eq!(nodes, ["/dev/nvidia1", "/dev/nvidiactl"]);
        let mounts = edits["mounts"].as_array().unwrap();
        assert!(
            mounts
                .iter()
                .all(|m| m["containerPath"].as_str().unwrap().starts_with('/'))
        );
        assert!(
            mounts[0]["options"]
                .as_array()
                .unwrap()
                .contains(&"ro".into()),
            "the interposer is read-only"
        );
        // Written whole, and removed once (again is fine).
        let written = write(&dev, uid, &spec).unwrap();
        let back: Value = serde_json::from_slice(&std::fs::read(&written).unwrap()).unwrap();
        assert_eq!(back, spec);
        remove(&dev, uid).unwrap();
        remove(&dev, uid).unwrap();
        assert!(!written.exists());
        std::fs::remove_dir_all(&dev).unwrap();
    }
}
