//! Creating a pod's Binding through the Kubernetes API server, as an
//! extender that owns the bind verb must. Plain HTTP only (point it at
//! `kubectl proxy` running beside the extender, which adds the credentials
//! and TLS); a minimal HTTP/1.1 client so no TLS or HTTP crate is needed.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde_json::json;

use super::wire::ExtenderBindingArgs;

const TIMEOUT: Duration = Duration::from_secs(10);

/// POSTs `/api/v1/namespaces/{ns}/pods/{name}/binding` to `apiserver`
/// (`http://host:port`); Ok on HTTP 2xx.
pub fn create_binding(apiserver: &str, args: &ExtenderBindingArgs) -> Result<(), String> {
    let authority = apiserver
        .strip_prefix("http://")
        .ok_or_else(|| {
            format!("--apiserver {apiserver:?} must start with http:// (use kubectl proxy)")
        })?
        .trim_end_matches('/');
    let target = authority
        .to_socket_addrs()
        .map_err(|error| format!("{authority}: {error}"))?
        .next()
        .ok_or_else(|| format!("{authority} resolves to nothing"))?;
    let namespace = if args.pod_namespace.is_empty() {
        "default"
    } else {
        &args.pod_namespace
    };
    let body = json!({
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": { "name": args.pod_name, "namespace": namespace, "uid": args.pod_uid },
        "target": { "apiVersion": "v1", "kind": "Node", "name": args.node },
    })
    .to_string();
    let request = format!(
        "POST /api/v1/namespaces/{namespace}/pods/{}/binding HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        args.pod_name,
        body.len()
    );
    let mut stream =
        TcpStream::connect_timeout(&target, TIMEOUT).map_err(|e| format!("{authority}: {e}"))?;
    stream
        .set_read_timeout(Some(TIMEOUT))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(request.as_bytes())
        .map_err(|e| format!("{authority}: {e}"))?;
    let mut response = Vec::new();
    let _ = stream.take(64 * 1024).read_to_end(&mut response);
    let text = String::from_utf8_lossy(&response);
    let status: u16 = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("{authority} sent no HTTP status"))?;
    if (200..300).contains(&status) {
        Ok(())
    } else {
        let detail = text.split("\r\n\r\n").nth(1).unwrap_or("").trim();
        Err(format!(
            "HTTP {status}: {}",
            detail.chars().take(300).collect::<String>()
        ))
    }
}
