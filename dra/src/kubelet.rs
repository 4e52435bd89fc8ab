//! Serving the plugin to the kubelet: the registration service on a socket
//! in the kubelet's plugin registry directory (the kubelet's plugin watcher
//! finds it there and asks `GetInfo`), and the DRA service on the endpoint
//! that names.

use crate::DRIVER;
use crate::api::dra::dra_plugin_server::{DraPlugin, DraPluginServer};
use crate::api::registration::registration_server::{Registration, RegistrationServer};
use crate::api::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// The plugin type the kubelet knows DRA drivers by.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The DRA service version served (the v1 `DRAPlugin`).
pub const SERVICE_VERSION: &str = "v1.DRAPlugin";
/// The DRA service's socket name in the plugin's directory.
pub const DRA_SOCKET: &str = "dra.sock";

/// The registration socket in the kubelet's registry directory.
pub fn registration_socket(registry_dir: &Path) -> PathBuf {
    registry_dir.join(format!("{DRIVER}-reg.sock"))
}

/// Answers the kubelet's plugin watcher.
pub struct Registrar {
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![SERVICE_VERSION.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!("registered with the kubelet");
        } else {
            tracing::error!("the kubelet refused the registration: {}", status.error);
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

fn listen(path: &Path) -> Result<UnixListener, String> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|e| format!("cannot listen on {}: {e}", path.display()))
}

/// Serves `service` on `<plugin_dir>/dra.sock` and the registration on
/// `<registry_dir>/gpu.dilu.io-reg.sock` until either server fails.
pub async fn serve<S: DraPlugin>(
    service: Arc<S>,
    plugin_dir: &Path,
    registry_dir: &Path,
) -> Result<(), String> {
    let endpoint = plugin_dir.join(DRA_SOCKET);
    let dra = listen(&endpoint)?;
    let registration = listen(&registration_socket(registry_dir))?;
    let dra_server = tonic::transport::Server::builder()
        .add_service(DraPluginServer::from_arc(service))
        .serve_with_incoming(UnixListenerStream::new(dra));
    let registration_server = tonic::transport::Server::builder()
        .add_service(RegistrationServer::new(Registrar {
            endpoint: endpoint.clone(),
        }))
        .serve_with_incoming(UnixListenerStream::new(registration));
    tracing::info!(endpoint = %endpoint.display(), "serving the DRA service");
    tokio::select! {
        result = dra_server => result.map_err(|e| format!("the DRA server failed: {e}")),
        result = registration_server => result.map_err(|e| format!("the registration server failed: {e}")),
    }
}
