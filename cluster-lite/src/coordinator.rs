//! Embedded-mode coordinator (`dilu-cluster serve`).
//!
//! It dials every node agent it is given, keeps one request/response
//! connection to each (reconnecting on failure, with I/O timeouts), and once
//! per tick: polls each node for load (the poll is the heartbeat), feeds each
//! function's summed request rate and scale signals to its autoscaler, and
//! reconciles the number of live instances with the desired one by placing
//! (through the placement policy) or removing instances on the nodes. On
//! scale-in the policy chooses which instance stops
//! (`PlacementPolicy::choose_scale_in_victim`; `dilu` stops the one whose GPU
//! it can empty or leaves least loaded), the others stop the newest.
//!
//! When a node disconnects, its instances still count as live for
//! `node_grace` (a node manager restarting keeps its tenants running); on
//! reconnect the coordinator re-learns the node's instances from its
//! `Registered` answer. After the grace they are replaced elsewhere, and any
//! surplus that reappears later is removed.
//!
//! Consolidation (see `consolidation`): while the cluster is shrinking, a
//! latency replica left alone on its GPU moves to the busy GPU the policy
//! names (`PlacementPolicy::consolidation_target`), make-before-break: the
//! new copy is placed first, the old one is *retiring* until the function's
//! cold start has passed and is then removed. A retiring copy no longer
//! counts as a live replica but still holds its GPU, which is draining
//! (admits nothing new) until it is gone. An instance of a function
//! deployed as restartable (training that resumes from its checkpoint)
//! that holds a GPU alone is restarted, break-before-make, with that share
//! on the GPU the policy names on the same node: removed, then placed again
//! under a new id. These are the rules the simulator applies, so the
//! simulator credits no mechanism this coordinator lacks (it does let
//! `dilu`'s gangs and their moves span nodes, which a node agent cannot).

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use dilu_abi::cluster_wire::{
    CoordinatorMessage, FunctionLoad, GpuInventory, InstanceRecord, NodeMessage,
};

use crate::consolidation::ShrinkWatch;
use crate::control::{
    ClusterStatus, ControlReply, ControlRequest, FunctionProfile, FunctionStatus, NodeStatus,
};
use crate::model::{ClusterState, GpuState, WorkClass};
use crate::policy::{MoveRequest, PlacementPolicy, Replica, place_on_one_node, policy_by_name};
use crate::scaling::{Autoscaler, LoadSample, ScalingRule};
use crate::wire_io::{WireError, read_frame, write_frame};

/// How `serve` runs.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub control_listen: SocketAddr,
    pub nodes: Vec<String>,
    pub policy: String,
    /// `responsive` or `dilu-paper` (see `scaling`).
    pub scaling: String,
    pub tick: Duration,
    pub io_timeout: Duration,
    pub node_grace: Duration,
}

/// A running coordinator.
pub struct CoordinatorHandle {
    control_addr: SocketAddr,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl CoordinatorHandle {
    pub fn control_addr(&self) -> SocketAddr {
        self.control_addr
    }

    /// Blocks until the coordinator stops (it stops only on `shutdown`).
    pub fn wait(mut self) {
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }

    pub fn shutdown(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

type ControlCall = (ControlRequest, Sender<ControlReply>);

/// Validates the configuration, binds the control port and starts.
pub fn start(config: CoordinatorConfig) -> Result<CoordinatorHandle, String> {
    let policy = policy_by_name(&config.policy)
        .ok_or_else(|| format!("unknown policy {:?}", config.policy))?;
    if ScalingRule::by_name(&config.scaling, 1).is_none() {
        return Err(format!(
            "unknown scaling rule {:?}: expected responsive or dilu-paper",
            config.scaling
        ));
    }
    let listener = TcpListener::bind(config.control_listen)
        .map_err(|error| format!("cannot listen on {}: {error}", config.control_listen))?;
    let control_addr = listener
        .local_addr()
        .map_err(|error| format!("listener address: {error}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|error| format!("listener setup: {error}"))?;
    let stop = Arc::new(AtomicBool::new(false));
    let (calls, incoming) = bounded::<ControlCall>(64);
    let acceptor = {
        let stop = stop.clone();
        let timeout = config.io_timeout;
        std::thread::Builder::new()
            .name("dilu-control".into())
            .spawn(move || accept_control(listener, calls, stop, timeout))
            .map_err(|error| format!("cannot start thread: {error}"))?
    };
    let mut coordinator = Coordinator {
        nodes: config
            .nodes
            .iter()
            .map(|address| NodeLink::new(address.clone()))
            .collect(),
        config,
        policy,
        functions: BTreeMap::new(),
        next_instance_id: 1,
        started_at: Instant::now(),
        shrink: ShrinkWatch::new(),
        retiring: BTreeMap::new(),
    };
    let control_loop = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("dilu-coordinator".into())
            .spawn(move || coordinator.run(incoming, stop))
            .map_err(|error| format!("cannot start thread: {error}"))?
    };
    Ok(CoordinatorHandle {
        control_addr,
        stop,
        threads: vec![acceptor, control_loop],
    })
}

fn accept_control(
    listener: TcpListener,
    calls: Sender<ControlCall>,
    stop: Arc<AtomicBool>,
    timeout: Duration,
) {
    while !stop.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let calls = calls.clone();
                let _ = std::thread::Builder::new()
                    .name("dilu-control-conn".into())
                    .spawn(move || serve_control(stream, calls, timeout));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn serve_control(mut stream: TcpStream, calls: Sender<ControlCall>, timeout: Duration) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(timeout));
    let _ = stream.set_write_timeout(Some(timeout));
    let reply = match read_frame::<ControlRequest>(&mut stream) {
        Ok(request) => {
            let (reply_to, reply) = bounded(1);
            if calls.send((request, reply_to)).is_err() {
                ControlReply::Error("coordinator is shutting down".into())
            } else {
                reply
                    .recv_timeout(Duration::from_secs(60))
                    .unwrap_or_else(|_| ControlReply::Error("coordinator did not answer".into()))
            }
        }
        Err(error) => ControlReply::Error(error.to_string()),
    };
    let _ = write_frame(&mut stream, &reply);
}

struct NodeLink {
    address: String,
    stream: Option<TcpStream>,
    name: String,
    gpus: Vec<GpuInventory>,
    instances: BTreeMap<u64, InstanceRecord>,
    loads: Vec<FunctionLoad>,
    disconnected_since: Option<Instant>,
}

impl NodeLink {
    fn new(address: String) -> Self {
        Self {
            address,
            stream: None,
            name: String::new(),
            gpus: Vec::new(),
            instances: BTreeMap::new(),
            loads: Vec::new(),
            disconnected_since: Some(Instant::now()),
        }
    }

    /// Sends one message and reads the answer; drops the connection on error.
    fn call(&mut self, message: &CoordinatorMessage) -> Result<NodeMessage, WireError> {
        let Some(stream) = self.stream.as_mut() else {
            return Err(WireError::Io(std::io::Error::from(
                std::io::ErrorKind::NotConnected,
            )));
        };
        let outcome = write_frame(stream, message).and_then(|()| read_frame(stream));
        if let Err(error) = &outcome {
            tracing::warn!("node {} lost: {error}", self.address);
            self.disconnect();
        }
        outcome
    }

    fn disconnect(&mut self) {
        self.stream = None;
        self.loads.clear();
        if self.disconnected_since.is_none() {
            self.disconnected_since = Some(Instant::now());
        }
    }

    fn connect(&mut self, timeout: Duration) -> Result<(), String> {
        let target = self
            .address
            .to_socket_addrs()
            .map_err(|error| error.to_string())?
            .next()
            .ok_or("address resolves to nothing")?;
        let stream = TcpStream::connect_timeout(&target, timeout).map_err(|e| e.to_string())?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|error| error.to_string())?;
        self.stream = Some(stream);
        let hello = CoordinatorMessage::Hello {
            coordinator: "dilu-cluster".into(),
        };
        match self.call(&hello).map_err(|error| error.to_string())? {
            NodeMessage::Registered {
                node_name,
                gpus,
                instances,
            } => {
                tracing::info!(
                    "node {} ({node_name}) registered: {} GPUs, {} instances",
                    self.address,
                    gpus.len(),
                    instances.len()
                );
                self.name = node_name;
                self.gpus = gpus;
                self.instances = instances.into_iter().map(|r| (r.instance_id, r)).collect();
                self.disconnected_since = None;
                Ok(())
            }
            other => {
                self.disconnect();
                Err(format!("expected Registered, got {other:?}"))
            }
        }
    }

    fn connected(&self) -> bool {
        self.stream.is_some()
    }

    /// Whether its instances still count: connected, or down for less than `grace`.
    fn counts_as_live(&self, grace: Duration) -> bool {
        self.connected()
            || self
                .disconnected_since
                .is_some_and(|since| since.elapsed() < grace && !self.gpus.is_empty())
    }
}

struct FunctionEntry {
    profile: FunctionProfile,
    desired: u32,
    scaler: Autoscaler,
}

/// The old copy of a moved replica, serving until its new copy is warm.
struct Retiring {
    function: String,
    /// When it is removed: the move plus the function's cold start.
    deadline: Instant,
}

struct Coordinator {
    config: CoordinatorConfig,
    policy: Box<dyn PlacementPolicy>,
    nodes: Vec<NodeLink>,
    functions: BTreeMap<String, FunctionEntry>,
    next_instance_id: u64,
    /// Origin of the shrink watch's clock (monotonic).
    started_at: Instant,
    /// Scale-out/deploy starts and scale-in stops (moves are neither).
    shrink: ShrinkWatch,
    /// Old copies of moved replicas, by (node link, instance id).
    retiring: BTreeMap<(usize, u64), Retiring>,
}

impl Coordinator {
    fn run(&mut self, incoming: Receiver<ControlCall>, stop: Arc<AtomicBool>) {
        let mut next_tick = Instant::now();
        while !stop.load(Ordering::SeqCst) {
            let wait = next_tick
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(100));
            if let Ok((request, reply_to)) = incoming.recv_timeout(wait) {
                let reply = self.handle(request);
                let _ = reply_to.send(reply);
            }
            if Instant::now() >= next_tick {
                self.tick();
                next_tick = Instant::now() + self.config.tick;
            }
        }
    }

    fn handle(&mut self, request: ControlRequest) -> ControlReply {
        match request {
            ControlRequest::Status => ControlReply::Status(self.status()),
            ControlRequest::Deploy {
                function,
                profile,
                replicas,
            } => {
                if let Err(reason) = check_profile(&profile) {
                    return ControlReply::Error(format!("function {function}: {reason}"));
                }
                let tick_s = self.config.tick.as_secs_f64().max(1e-3);
                let cold_start_ticks = (profile.cold_start_s / tick_s).ceil() as usize;
                let rule = ScalingRule::by_name(&self.config.scaling, cold_start_ticks)
                    .unwrap_or_else(ScalingRule::dilu_paper);
                self.functions.insert(
                    function.clone(),
                    FunctionEntry {
                        profile,
                        desired: replicas,
                        scaler: Autoscaler::new(rule),
                    },
                );
                self.reconcile(&function);
                let live = self.live_instances(&function).len() as u32;
                if replicas == 0 {
                    self.functions.remove(&function);
                }
                if live < replicas {
                    return ControlReply::Error(format!(
                        "function {function}: placed {live} of {replicas} instances (no GPU fits the rest, or nodes are unreachable); will keep trying"
                    ));
                }
                ControlReply::Deployed { function, live }
            }
        }
    }

    fn tick(&mut self) {
        for node in &mut self.nodes {
            if !node.connected() {
                if let Err(error) = node.connect(self.config.io_timeout) {
                    tracing::debug!("node {} unreachable: {error}", node.address);
                    continue;
                }
                let highest = node.instances.keys().max().copied().unwrap_or(0);
                self.next_instance_id = self.next_instance_id.max(highest + 1);
            }
            if let Ok(NodeMessage::Load {
                functions,
                instance_ids,
            }) = node.call(&CoordinatorMessage::Poll)
            {
                node.loads = functions;
                node.instances.retain(|id, _| instance_ids.contains(id));
            }
        }
        let names: Vec<String> = self.functions.keys().cloned().collect();
        for name in names {
            let sample = self.load_of(&name);
            if let Some(entry) = self.functions.get_mut(&name) {
                let wanted =
                    entry
                        .scaler
                        .observe(sample, entry.desired, entry.profile.throughput_rps);
                if wanted != entry.desired {
                    tracing::info!("function {name}: {} -> {wanted} instances", entry.desired);
                    entry.desired = wanted;
                }
            }
            self.reconcile(&name);
        }
        self.retire_expired();
        self.consolidate();
    }

    /// Seconds since the coordinator started, the shrink watch's clock.
    fn now_s(&self) -> f64 {
        self.started_at.elapsed().as_secs_f64()
    }

    fn load_of(&self, function: &str) -> LoadSample {
        let mut sample = LoadSample {
            request_rate: 0.0,
            wants_scale_out: false,
        };
        for load in self
            .nodes
            .iter()
            .flat_map(|node| &node.loads)
            .filter(|load| load.function == function)
        {
            sample.request_rate += load.request_rate;
            sample.wants_scale_out |= load.wants_scale_out;
        }
        sample
    }

    /// (node index, instance id) of the live instances of `function`.
    /// Retiring copies are not live: their replacements are.
    fn live_instances(&self, function: &str) -> Vec<(usize, u64)> {
        let grace = self.config.node_grace;
        self.nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.counts_as_live(grace))
            .flat_map(|(index, node)| {
                node.instances
                    .values()
                    .filter(|record| record.function == function)
                    .map(move |record| (index, record.instance_id))
            })
            .filter(|key| !self.retiring.contains_key(key))
            .collect()
    }

    fn reconcile(&mut self, function: &str) {
        let Some(entry) = self.functions.get(function) else {
            return;
        };
        let desired = entry.desired as usize;
        let demand = entry.profile.demand.clone();
        let mut live = self.live_instances(function);
        while live.len() > desired {
            let Some(position) = self.scale_in_victim(&live) else {
                break;
            };
            let (node, instance_id) = live.remove(position);
            let link = &mut self.nodes[node];
            if let Ok(NodeMessage::Ack { error: None, .. }) =
                link.call(&CoordinatorMessage::Remove { instance_id })
            {
                link.instances.remove(&instance_id);
                let now_s = self.now_s();
                self.shrink.stopped(now_s);
            }
        }
        for _ in live.len()..desired {
            if !self.place_one(function, &demand) {
                break;
            }
            let now_s = self.now_s();
            self.shrink.started(now_s);
        }
    }

    /// Which of `live` (one function's instances) stops when the function
    /// scales in by one: the policy's choice among the instances on
    /// connected nodes (`PlacementPolicy::choose_scale_in_victim`), else the
    /// newest of them; `None` when no instance is on a connected node.
    fn scale_in_victim(&self, live: &[(usize, u64)]) -> Option<usize> {
        let candidates: Vec<usize> = (0..live.len())
            .filter(|&position| self.nodes[live[position].0].connected())
            .collect();
        let newest = candidates
            .iter()
            .copied()
            .max_by_key(|&position| live[position].1)?;
        let (cluster, owners) = self.cluster_view();
        let mut records = Vec::with_capacity(candidates.len());
        for &position in &candidates {
            let (link, instance_id) = live[position];
            let node = owners.iter().position(|&owner| owner == link)?;
            let range = cluster.nodes[node].clone();
            let record = self.nodes[link].instances.get(&instance_id)?;
            records.push((&record.demand, global_gpus(record, &range)));
        }
        let replicas: Vec<Replica<'_>> = records
            .iter()
            .map(|(demand, gpus)| Replica {
                demand,
                gpus: gpus.as_slice(),
            })
            .collect();
        let chosen = self
            .policy
            .choose_scale_in_victim(&cluster, &replicas)
            .and_then(|index| candidates.get(index).copied());
        Some(chosen.unwrap_or(newest))
    }

    /// Places one instance through the policy; false when nothing fits.
    fn place_one(
        &mut self,
        function: &str,
        demand: &dilu_abi::cluster_wire::InstanceDemand,
    ) -> bool {
        let (cluster, owners) = self.cluster_view();
        // A node agent hosts an instance on its own GPUs only, so a gang
        // stays on one node here even under a policy that may span nodes.
        let Some(placement) = place_on_one_node(self.policy.as_ref(), &cluster, demand) else {
            tracing::warn!("function {function}: no GPU fits another instance");
            return false;
        };
        self.place_on(function, demand, &cluster, &owners, &placement.gpus)
            .is_some()
    }

    /// Sends a Place for a new instance of `function` on `gpus` (indices
    /// into `cluster`, all on one node); its id once the node acknowledged.
    fn place_on(
        &mut self,
        function: &str,
        demand: &dilu_abi::cluster_wire::InstanceDemand,
        cluster: &ClusterState,
        owners: &[usize],
        gpus: &[usize],
    ) -> Option<u64> {
        let node = cluster.gpus.get(*gpus.first()?)?.node;
        let node_index = *owners.get(node)?;
        let start = cluster.nodes.get(node)?.start;
        let record = InstanceRecord {
            instance_id: self.next_instance_id,
            function: function.to_string(),
            demand: demand.clone(),
            gpu_indices: gpus.iter().map(|gpu| (gpu - start) as u32).collect(),
        };
        self.next_instance_id += 1;
        let link = self.nodes.get_mut(node_index)?;
        match link.call(&CoordinatorMessage::Place(record.clone())) {
            Ok(NodeMessage::Ack { error: None, .. }) => {
                let instance_id = record.instance_id;
                link.instances.insert(instance_id, record);
                Some(instance_id)
            }
            Ok(other) => {
                tracing::warn!("node {} refused a placement: {other:?}", link.address);
                None
            }
            Err(_) => None,
        }
    }

    /// While the cluster is shrinking, moves each latency replica alone on
    /// its GPU to the GPU the policy names, make-before-break, then
    /// restarts each restartable gang that has a GPU to itself with that
    /// GPU's share moved where the policy names on the same node (see the
    /// module docs). A GPU already draining is no source, so a GPU has at
    /// most one move under way.
    fn consolidate(&mut self) {
        let now_s = self.now_s();
        if !self.shrink.is_shrinking(now_s) {
            return;
        }
        let (mut cluster, owners) = self.cluster_view();
        self.move_lone_replicas(&mut cluster, &owners);
        self.restart_gangs_with_lone_shares(&mut cluster, &owners);
    }

    /// Instances of known functions on connected nodes that `wanted`
    /// accepts, as (link, instance id, function, GPUs in the view), read
    /// before anything moves (the view of the nodes is read-only meanwhile).
    fn movable_instances(
        &self,
        cluster: &ClusterState,
        owners: &[usize],
        wanted: impl Fn(&FunctionProfile, &InstanceRecord) -> bool,
    ) -> Vec<(usize, u64, String, Vec<usize>)> {
        let mut found = Vec::new();
        for (node, &link_index) in owners.iter().enumerate() {
            let range = cluster.nodes[node].clone();
            for record in self.nodes[link_index].instances.values() {
                if self
                    .retiring
                    .contains_key(&(link_index, record.instance_id))
                {
                    continue;
                }
                let Some(entry) = self.functions.get(&record.function) else {
                    continue;
                };
                let gpus = global_gpus(record, &range);
                if gpus.len() == record.demand.gpus as usize && wanted(&entry.profile, record) {
                    found.push((
                        link_index,
                        record.instance_id,
                        record.function.clone(),
                        gpus,
                    ));
                }
            }
        }
        found
    }

    fn move_lone_replicas(&mut self, cluster: &mut ClusterState, owners: &[usize]) {
        let candidates = self.movable_instances(cluster, owners, |profile, record| {
            profile.demand.class == WorkClass::Latency
                && profile.demand.gpus == 1
                && record.demand.gpus == 1
        });
        // A replica may go to any connected node.
        let within: Vec<usize> = (0..cluster.gpus.len()).collect();
        for (source_link, instance_id, function, gpus) in candidates {
            let source = gpus[0];
            if !is_alone(&cluster.gpus[source]) {
                continue;
            }
            let Some(entry) = self.functions.get(&function) else {
                continue;
            };
            let demand = entry.profile.demand.clone();
            // check_profile keeps it finite and non-negative; the clamp
            // keeps the deadline representable (about 31 years).
            let cold_start = Duration::from_secs_f64(entry.profile.cold_start_s.clamp(0.0, 1e9));
            let request = MoveRequest {
                share: &demand,
                source,
                keeps: &[],
                within: &within,
            };
            let Some(target) = self
                .policy
                .consolidation_target(cluster, &request)
                .filter(|&target| is_move_target(cluster, source, target))
            else {
                continue;
            };
            let Some(new_id) = self.place_on(&function, &demand, cluster, owners, &[target]) else {
                tracing::warn!(
                    "function {function}: could not place the moved copy of instance {instance_id}; it stays"
                );
                continue;
            };
            tracing::info!(
                "function {function}: moving instance {instance_id} from {} to {} as instance {new_id} (GPU goes idle after cold start, {:.1} s)",
                self.gpu_name(cluster, owners, source),
                self.gpu_name(cluster, owners, target),
                cold_start.as_secs_f64()
            );
            self.retiring.insert(
                (source_link, instance_id),
                Retiring {
                    function,
                    deadline: Instant::now() + cold_start,
                },
            );
            // Later candidates in this pass see the move.
            cluster.apply(&demand, &[target]);
            cluster.gpus[source].draining += 1;
        }
    }

    /// Restarts each gang of a restartable function that holds a GPU alone
    /// with those shares on the GPUs the policy names on the same node
    /// (node agents host an instance on their own GPUs only). Break before
    /// make: the instance is removed (the job checkpoints and stops) and
    /// placed again with its new GPUs under a new id; if that placement
    /// fails it goes back on its old GPUs, and failing that the next
    /// reconcile places it anew.
    fn restart_gangs_with_lone_shares(&mut self, cluster: &mut ClusterState, owners: &[usize]) {
        let candidates = self.movable_instances(cluster, owners, |profile, record| {
            profile.restartable && record.demand.gpus > 1
        });
        for (link_index, instance_id, function, gpus) in candidates {
            let Some(record) = self.nodes[link_index].instances.get(&instance_id) else {
                continue;
            };
            let demand = record.demand.clone();
            let Some(node) = gpus.first().map(|&gpu| cluster.gpus[gpu].node) else {
                continue;
            };
            let within: Vec<usize> = cluster.nodes[node].clone().collect();
            let mut moved_gpus = gpus.clone();
            for position in 0..moved_gpus.len() {
                let source = moved_gpus[position];
                if !is_alone(&cluster.gpus[source]) {
                    continue;
                }
                let request = MoveRequest {
                    share: &demand,
                    source,
                    keeps: &moved_gpus,
                    within: &within,
                };
                let Some(target) =
                    self.policy
                        .consolidation_target(cluster, &request)
                        .filter(|&target| {
                            is_move_target(cluster, source, target) && !moved_gpus.contains(&target)
                        })
                else {
                    continue;
                };
                cluster.release(&demand, &[source]);
                cluster.apply(&demand, &[target]);
                moved_gpus[position] = target;
            }
            if moved_gpus == gpus {
                continue;
            }
            let first = cluster.nodes[node].start;
            let names =
                |gpus: &[usize]| -> Vec<usize> { gpus.iter().map(|gpu| gpu - first).collect() };
            let link = &mut self.nodes[link_index];
            match link.call(&CoordinatorMessage::Remove { instance_id }) {
                Ok(NodeMessage::Ack { error: None, .. }) => {
                    link.instances.remove(&instance_id);
                }
                _ => {
                    tracing::warn!(
                        "function {function}: node {} did not stop instance {instance_id} for a restart; it stays",
                        link.address
                    );
                    // Undo the view's move so later candidates see the truth.
                    cluster.release(&demand, &moved_gpus);
                    cluster.apply(&demand, &gpus);
                    continue;
                }
            }
            if let Some(new_id) = self.place_on(&function, &demand, cluster, owners, &moved_gpus) {
                tracing::info!(
                    "function {function}: restarted instance {instance_id} as instance {new_id} on node {} GPUs {:?} (was {:?}); a GPU goes idle",
                    self.nodes[link_index].address,
                    names(&moved_gpus),
                    names(&gpus)
                );
                continue;
            }
            cluster.release(&demand, &moved_gpus);
            if self
                .place_on(&function, &demand, cluster, owners, &gpus)
                .is_some()
            {
                cluster.apply(&demand, &gpus);
                tracing::warn!(
                    "function {function}: instance {instance_id} could not restart on GPUs {:?}; restarted where it was",
                    names(&moved_gpus)
                );
            } else {
                tracing::warn!(
                    "function {function}: instance {instance_id} stopped for a restart and could not be placed again; the next reconcile places it"
                );
            }
        }
    }

    /// Removes the retiring copies whose deadline has passed. A copy on an
    /// unreachable node is retried on later ticks; one its node no longer
    /// lists is forgotten.
    fn retire_expired(&mut self) {
        let now = Instant::now();
        let due: Vec<(usize, u64)> = self
            .retiring
            .iter()
            .filter(|(_, retiring)| retiring.deadline <= now)
            .map(|(&key, _)| key)
            .collect();
        for key in due {
            let (link_index, instance_id) = key;
            let Some(link) = self.nodes.get_mut(link_index) else {
                self.retiring.remove(&key);
                continue;
            };
            if !link.connected() {
                continue;
            }
            let function = self
                .retiring
                .get(&key)
                .map(|retiring| retiring.function.clone())
                .unwrap_or_default();
            if !link.instances.contains_key(&instance_id) {
                tracing::info!(
                    "function {function}: retiring instance {instance_id} is already gone from node {}",
                    link.address
                );
                self.retiring.remove(&key);
                continue;
            }
            match link.call(&CoordinatorMessage::Remove { instance_id }) {
                Ok(NodeMessage::Ack { error: None, .. }) => {
                    tracing::info!(
                        "function {function}: retired instance {instance_id} on node {} (its replacement is warm)",
                        link.address
                    );
                    link.instances.remove(&instance_id);
                    self.retiring.remove(&key);
                }
                Ok(NodeMessage::Ack {
                    error: Some(error), ..
                }) => {
                    // The node does not hold it (the agent's only refusal);
                    // its next poll drops it from the view.
                    tracing::warn!(
                        "function {function}: node {} refused to remove retiring instance {instance_id}: {error}",
                        link.address
                    );
                    self.retiring.remove(&key);
                }
                // An unexpected answer or a lost connection: retry later.
                Ok(other) => {
                    tracing::warn!("node {} answered a Remove with {other:?}", link.address)
                }
                Err(_) => {}
            }
        }
    }

    /// "ADDRESS GPU N" for a GPU of the cluster view, for logs.
    fn gpu_name(&self, cluster: &ClusterState, owners: &[usize], gpu: usize) -> String {
        let node = cluster.gpus[gpu].node;
        let local = gpu - cluster.nodes[node].start;
        format!("node {} GPU {local}", self.nodes[owners[node]].address)
    }

    /// The connected nodes as a `ClusterState`, and which link each node is.
    fn cluster_view(&self) -> (ClusterState, Vec<usize>) {
        let mut cluster = ClusterState::default();
        let mut owners = Vec::new();
        for (index, link) in self.nodes.iter().enumerate().filter(|(_, l)| l.connected()) {
            let node = cluster.add_node(link.gpus.len(), 0);
            let range = cluster.nodes[node].clone();
            for (gpu, inventory) in range.clone().zip(&link.gpus) {
                cluster.gpus[gpu].memory_capacity = inventory.memory_bytes;
            }
            for record in link.instances.values() {
                let gpus = global_gpus(record, &range);
                cluster.apply(&record.demand, &gpus);
                // A retiring copy holds its GPU, which takes nothing new.
                if self.retiring.contains_key(&(index, record.instance_id)) {
                    for &gpu in &gpus {
                        cluster.gpus[gpu].draining += 1;
                    }
                }
            }
            owners.push(index);
        }
        (cluster, owners)
    }

    fn status(&self) -> ClusterStatus {
        ClusterStatus {
            nodes: self
                .nodes
                .iter()
                .map(|node| NodeStatus {
                    address: node.address.clone(),
                    name: node.name.clone(),
                    connected: node.connected(),
                    gpus: node.gpus.len() as u32,
                    instances: node.instances.values().cloned().collect(),
                })
                .collect(),
            functions: self
                .functions
                .iter()
                .map(|(name, entry)| FunctionStatus {
                    function: name.clone(),
                    desired: entry.desired,
                    live: self.live_instances(name).len() as u32,
                    request_rate: self.load_of(name).request_rate,
                })
                .collect(),
        }
    }
}

/// Whether a GPU holds exactly one instance and is not draining: moving
/// that instance away leaves it idle.
fn is_alone(gpu: &GpuState) -> bool {
    gpu.instances() == 1 && gpu.draining == 0
}

/// The trait promises a busy, non-draining GPU other than the source;
/// anything else would not free a GPU.
fn is_move_target(cluster: &ClusterState, source: usize, target: usize) -> bool {
    target != source
        && cluster
            .gpus
            .get(target)
            .is_some_and(|gpu| gpu.is_active() && gpu.draining == 0)
}

/// An instance's GPUs as indices into the cluster view, given its node's
/// range there (local indices outside the node are dropped).
fn global_gpus(record: &InstanceRecord, range: &std::ops::Range<usize>) -> Vec<usize> {
    record
        .gpu_indices
        .iter()
        .map(|&local| range.start + local as usize)
        .filter(|gpu| range.contains(gpu))
        .collect()
}

fn check_profile(profile: &FunctionProfile) -> Result<(), String> {
    let demand = &profile.demand;
    if !(0.0..=1.0).contains(&demand.sm_request)
        || !(demand.sm_request..=1.0).contains(&demand.sm_limit)
    {
        return Err("need 0 <= sm-request <= sm-limit <= 1".into());
    }
    if demand.gpus == 0 {
        return Err("gpus must be at least 1".into());
    }
    if !(profile.throughput_rps.is_finite() && profile.throughput_rps > 0.0) {
        return Err("throughput must be a positive number of requests per second".into());
    }
    if !(profile.cold_start_s.is_finite() && profile.cold_start_s >= 0.0) {
        return Err("cold start must be a non-negative number of seconds".into());
    }
    Ok(())
}
