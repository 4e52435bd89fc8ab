//! What a node plugin binary does as it starts (this crate's and the DRA
//! driver's): its log on stderr, a client of the API server, and how it
//! ends.

/// Logs to stderr at the level `DILU_LOG` names (default `info`).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DILU_LOG")
                .unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
}

/// A client for `apiserver` (plain HTTP, e.g. `kubectl proxy`), else from
/// in-cluster credentials or the kubeconfig.
pub async fn api_client(apiserver: Option<&str>) -> Result<kube::Client, String> {
    let config = match apiserver {
        Some(url) => kube::Config::new(url.parse().map_err(|e| format!("--apiserver {url}: {e}"))?),
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no API server credentials: {e}"))?,
    };
    kube::Client::try_from(config).map_err(|e| format!("API server client: {e}"))
}

/// The exit status of `program` after its run: failure, with the error on
/// stderr, where the run failed.
pub fn exit_code(program: &str, run: Result<(), String>) -> std::process::ExitCode {
    match run {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{program}: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}
