//! The node-manager endpoint of the cluster protocol.
//!
//! A node agent listens on TCP, answers the coordinator's messages
//! (`dilu_abi::cluster_wire`) and keeps an in-memory view of the instances
//! placed on its GPUs, checking that each placement fits the GPU memory it
//! knows about. It reports per-function load: today that is a synthetic
//! request rate set through [`NodeAgentHandle::set_request_rate`] (what a load
//! generator or the node manager's telemetry would report). It tracks
//! placements **without starting processes**; the node manager daemon embeds
//! it and attaches real tenants later.
//!
//! With a state file the agent survives restarts: it writes its instances on
//! every change and reads them back at start, so a coordinator that
//! reconnects re-learns them from the `Registered` answer.

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use dilu_abi::cluster_wire::{
    CoordinatorMessage, FunctionLoad, GpuInventory, InstanceRecord, NodeMessage,
};

use crate::wire_io::{WireError, read_frame, write_frame};

/// How often blocked reads and accepts wake up to notice a shutdown.
const WAKE_INTERVAL: Duration = Duration::from_millis(100);

/// What a node agent is started with.
#[derive(Debug, Clone)]
pub struct NodeAgentConfig {
    pub listen: SocketAddr,
    pub node_name: String,
    pub gpus: u32,
    pub gpu_memory: u64,
    pub state_file: Option<PathBuf>,
}

#[derive(Debug, Default)]
struct AgentState {
    instances: BTreeMap<u64, InstanceRecord>,
    loads: BTreeMap<String, FunctionLoad>,
}

/// A running node agent; dropping it without [`shutdown`](Self::shutdown)
/// leaves the threads running until the process exits.
pub struct NodeAgentHandle {
    addr: SocketAddr,
    state: Arc<Mutex<AgentState>>,
    stop: Arc<AtomicBool>,
    acceptor: Option<JoinHandle<()>>,
}

impl NodeAgentHandle {
    /// The address the agent actually listens on (useful with port 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Sets the synthetic request rate this node reports for `function`.
    pub fn set_request_rate(&self, function: &str, requests_per_second: f64) {
        let mut state = lock(&self.state);
        let load = state
            .loads
            .entry(function.to_string())
            .or_insert_with(|| FunctionLoad {
                function: function.to_string(),
                request_rate: 0.0,
                wants_scale_out: false,
            });
        load.request_rate = requests_per_second.max(0.0);
    }

    /// Raises or clears this node's scale-out signal for `function`.
    pub fn set_wants_scale_out(&self, function: &str, wants: bool) {
        let mut state = lock(&self.state);
        let load = state
            .loads
            .entry(function.to_string())
            .or_insert_with(|| FunctionLoad {
                function: function.to_string(),
                request_rate: 0.0,
                wants_scale_out: false,
            });
        load.wants_scale_out = wants;
    }

    /// The instances this node currently tracks.
    pub fn instances(&self) -> Vec<InstanceRecord> {
        lock(&self.state).instances.values().cloned().collect()
    }

    /// Stops accepting, closes every connection and waits for the threads.
    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn lock(state: &Mutex<AgentState>) -> MutexGuard<'_, AgentState> {
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Binds the listener, loads the state file if any, and starts serving.
pub fn start(config: NodeAgentConfig) -> io::Result<NodeAgentHandle> {
    let listener = TcpListener::bind(config.listen)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let mut initial = AgentState::default();
    if let Some(path) = &config.state_file {
        initial.instances = load_state(path)?;
    }
    let state = Arc::new(Mutex::new(initial));
    let stop = Arc::new(AtomicBool::new(false));
    let config = Arc::new(config);
    let acceptor = {
        let (state, stop) = (state.clone(), stop.clone());
        std::thread::Builder::new()
            .name("dilu-node-accept".into())
            .spawn(move || accept_loop(listener, config, state, stop))?
    };
    Ok(NodeAgentHandle {
        addr,
        state,
        stop,
        acceptor: Some(acceptor),
    })
}

fn load_state(path: &PathBuf) -> io::Result<BTreeMap<u64, InstanceRecord>> {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let records: Vec<InstanceRecord> = serde_json::from_str(&text).map_err(|error| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("state file {}: {error}", path.display()),
                )
            })?;
            Ok(records.into_iter().map(|r| (r.instance_id, r)).collect())
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(error) => Err(error),
    }
}

fn save_state(config: &NodeAgentConfig, state: &AgentState) {
    let Some(path) = &config.state_file else {
        return;
    };
    let records: Vec<&InstanceRecord> = state.instances.values().collect();
    let written = serde_json::to_string_pretty(&records)
        .map_err(io::Error::other)
        .and_then(|text| {
            let temporary = path.with_extension("tmp");
            std::fs::write(&temporary, text)?;
            std::fs::rename(&temporary, path)
        });
    if let Err(error) = written {
        tracing::warn!("cannot write node state {}: {error}", path.display());
    }
}

fn accept_loop(
    listener: TcpListener,
    config: Arc<NodeAgentConfig>,
    state: Arc<Mutex<AgentState>>,
    stop: Arc<AtomicBool>,
) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, peer)) => {
                let (config, state, stop) = (config.clone(), state.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("dilu-node-conn".into())
                    .spawn(move || {
                        if let Err(error) = serve_connection(stream, &config, &state, &stop) {
                            tracing::info!("coordinator {peer} disconnected: {error}");
                        }
                    });
                match spawned {
                    Ok(handle) => connections.push(handle),
                    Err(error) => tracing::warn!("cannot start connection thread: {error}"),
                }
                connections.retain(|handle| !handle.is_finished());
            }
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(WAKE_INTERVAL / 5);
            }
            Err(error) => {
                tracing::warn!("accept failed: {error}");
                std::thread::sleep(WAKE_INTERVAL);
            }
        }
    }
    for handle in connections {
        let _ = handle.join();
    }
}

fn serve_connection(
    mut stream: TcpStream,
    config: &NodeAgentConfig,
    state: &Mutex<AgentState>,
    stop: &AtomicBool,
) -> Result<(), WireError> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(WAKE_INTERVAL))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    stream.set_nodelay(true)?;
    while !stop.load(Ordering::SeqCst) {
        let message: CoordinatorMessage = match read_frame(&mut stream) {
            Ok(message) => message,
            Err(error) if error.is_timeout() => continue,
            Err(WireError::Decode(reason)) => {
                write_frame(&mut stream, &NodeMessage::Rejected { reason })?;
                continue;
            }
            Err(error) => return Err(error),
        };
        let reply = answer(message, config, state);
        write_frame(&mut stream, &reply)?;
    }
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// Answers one coordinator message against the node's view.
fn answer(
    message: CoordinatorMessage,
    config: &NodeAgentConfig,
    state: &Mutex<AgentState>,
) -> NodeMessage {
    let mut state = lock(state);
    match message {
        CoordinatorMessage::Hello { coordinator } => {
            tracing::info!("coordinator {coordinator} connected");
            NodeMessage::Registered {
                node_name: config.node_name.clone(),
                gpus: (0..config.gpus)
                    .map(|index| GpuInventory {
                        index,
                        memory_bytes: config.gpu_memory,
                    })
                    .collect(),
                instances: state.instances.values().cloned().collect(),
            }
        }
        CoordinatorMessage::Place(record) => {
            let instance_id = record.instance_id;
            let error = check_fits(&record, config, &state).err();
            if error.is_none() {
                state.instances.insert(instance_id, record);
                save_state(config, &state);
            }
            NodeMessage::Ack { instance_id, error }
        }
        CoordinatorMessage::Remove { instance_id } => {
            let error = match state.instances.remove(&instance_id) {
                Some(_) => {
                    save_state(config, &state);
                    None
                }
                None => Some(format!("instance {instance_id} is not on this node")),
            };
            NodeMessage::Ack { instance_id, error }
        }
        CoordinatorMessage::Poll => NodeMessage::Load {
            functions: state.loads.values().cloned().collect(),
            instance_ids: state.instances.keys().copied().collect(),
        },
    }
}

fn check_fits(
    record: &InstanceRecord,
    config: &NodeAgentConfig,
    state: &AgentState,
) -> Result<(), String> {
    if state.instances.contains_key(&record.instance_id) {
        return Err(format!("instance {} already placed", record.instance_id));
    }
    if record.gpu_indices.is_empty() {
        return Err("placement names no GPU".into());
    }
    for &gpu in &record.gpu_indices {
        if gpu >= config.gpus {
            return Err(format!(
                "GPU {gpu} does not exist (node has {})",
                config.gpus
            ));
        }
        let used: u64 = state
            .instances
            .values()
            .filter(|other| other.gpu_indices.contains(&gpu))
            .map(|other| other.demand.memory_bytes)
            .sum();
        if used.saturating_add(record.demand.memory_bytes) > config.gpu_memory {
            return Err(format!(
                "GPU {gpu} has no room for {} bytes",
                record.demand.memory_bytes
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::cluster_wire::{InstanceDemand, WorkClass};

    fn record(instance_id: u64, gpu: u32, memory_bytes: u64) -> InstanceRecord {
        InstanceRecord {
            instance_id,
            function: "resnet".into(),
            demand: InstanceDemand {
                class: WorkClass::Latency,
                sm_request: 0.2,
                sm_limit: 0.4,
                memory_bytes,
                gpus: 1,
            },
            gpu_indices: vec![gpu],
        }
    }

    fn config() -> NodeAgentConfig {
        NodeAgentConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            node_name: "n1".into(),
            gpus: 2,
            gpu_memory: 100,
            state_file: None,
        }
    }

    #[test]
    fn placements_are_checked_against_gpus_and_memory() {
        let state = Mutex::new(AgentState::default());
        let config = config();
        let place = |record| answer(CoordinatorMessage::Place(record), &config, &state);
        assert_eq!(
            place(record(1, 0, 60)),
            NodeMessage::Ack {
                instance_id: 1,
                error: None
            }
        );
        let NodeMessage::Ack {
            error: Some(full), ..
        } = place(record(2, 0, 60))
        else {
            panic!("second 60-byte instance must not fit a 100-byte GPU");
        };
        assert!(full.contains("no room"), "{full}");
        let NodeMessage::Ack {
            error: Some(missing),
            ..
        } = place(record(3, 7, 1))
        else {
            panic!("GPU 7 does not exist");
        };
        assert!(missing.contains("does not exist"), "{missing}");
        let removed = answer(
            CoordinatorMessage::Remove { instance_id: 1 },
            &config,
            &state,
        );
        assert_eq!(
            removed,
            NodeMessage::Ack {
                instance_id: 1,
                error: None
            }
        );
        assert!(lock(&state).instances.is_empty());
    }

    #[test]
    fn speaks_the_protocol_over_tcp_and_rejects_garbage() {
        use std::io::Write;
        let agent = start(config()).expect("bind loopback");
        agent.set_request_rate("resnet", 42.0);
        let mut stream = TcpStream::connect(agent.addr()).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        write_frame(
            &mut stream,
            &CoordinatorMessage::Hello {
                coordinator: "t".into(),
            },
        )
        .unwrap();
        let NodeMessage::Registered {
            node_name,
            gpus,
            instances,
        } = read_frame(&mut stream).unwrap()
        else {
            panic!("Hello must be answered by Registered");
        };
        assert_eq!(
            (node_name.as_str(), gpus.len(), instances.len()),
            ("n1", 2, 0)
        );
        // A well-framed but undecodable body gets a Rejected answer.
        // (A version below 128 is one postcard byte.)
        let version = dilu_abi::cluster_wire::PROTOCOL_VERSION as u8;
        stream.write_all(&[2, 0, 0, 0, version, 0xff]).unwrap();
        let reply: NodeMessage = read_frame(&mut stream).unwrap();
        assert!(matches!(reply, NodeMessage::Rejected { .. }), "{reply:?}");
        write_frame(&mut stream, &CoordinatorMessage::Poll).unwrap();
        let NodeMessage::Load { functions, .. } = read_frame(&mut stream).unwrap() else {
            panic!("Poll must be answered by Load");
        };
        assert_eq!(functions[0].request_rate, 42.0);
        agent.shutdown();
    }
}
