//! Serving the plugin on its Unix socket in the kubelet's device plugin
//! directory and registering it with the kubelet.

use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::registration_client::RegistrationClient;
use crate::api::{DevicePluginOptions, RegisterRequest, VERSION};
use hyper_util::rt::TokioIo;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint};

/// The kubelet's registration socket in its device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The plugin's socket name in that directory.
pub const PLUGIN_SOCKET: &str = "dilu.sock";

/// A gRPC channel over a Unix socket (tonic needs a URI; it is not used).
pub async fn connect_unix(path: &Path) -> Result<Channel, String> {
    let path = path.to_path_buf();
    let shown = path.display().to_string();
    Endpoint::try_from("http://[::1]:1")
        .map_err(|e| e.to_string())?
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| format!("cannot connect to {shown}: {e}"))
}

/// Serves `plugin` on `<dir>/dilu.sock`, registers it with the kubelet at
/// `<dir>/kubelet.sock` under `resource`, and returns when the socket file
/// disappears (the kubelet removes plugin sockets when it restarts; the
/// caller then serves and registers again) or the server fails.
pub async fn serve_and_register<P: DevicePlugin>(
    plugin: Arc<P>,
    dir: &Path,
    resource: &str,
) -> Result<(), String> {
    let socket: PathBuf = dir.join(PLUGIN_SOCKET);
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(DevicePluginServer::from_arc(plugin))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let mut registration = RegistrationClient::new(connect_unix(&dir.join(KUBELET_SOCKET)).await?);
    registration
        .register(RegisterRequest {
            version: VERSION.into(),
            endpoint: PLUGIN_SOCKET.into(),
            resource_name: resource.into(),
            options: Some(DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|e| format!("the kubelet refused the registration: {e}"))?;
    tracing::info!(resource, socket = %socket.display(), "registered with the kubelet");
    while socket.exists() && !server.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    server.abort();
    match server.await {
        Ok(Err(e)) => Err(format!("the plugin's gRPC server failed: {e}")),
        _ => Ok(()),
    }
}
