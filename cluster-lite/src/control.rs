//! The coordinator's control port: what `dilu-cluster deploy` and
//! `dilu-cluster status` send to `dilu-cluster serve`, framed like the node
//! protocol (postcard, versioned), one request and one reply per connection.

use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use dilu_abi::cluster_wire::{InstanceDemand, InstanceRecord};
use serde::{Deserialize, Serialize};

use crate::wire_io::{read_frame, write_frame};

/// What the cluster knows about a function.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionProfile {
    pub demand: InstanceDemand,
    /// Requests per second one instance serves within its SLO.
    pub throughput_rps: f64,
    /// Seconds from placement until an instance serves.
    pub cold_start_s: f64,
    /// Whether an instance resumes from its checkpoint when restarted (a
    /// training job that checkpoints when stopped): `dilu` may then restart
    /// it with part of it on other GPUs of its node to empty a GPU while
    /// the cluster shrinks.
    pub restartable: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControlRequest {
    /// Run `replicas` instances of `function` (0 removes it); the autoscaler
    /// moves the count from there.
    Deploy {
        function: String,
        profile: FunctionProfile,
        replicas: u32,
    },
    Status,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControlReply {
    Deployed { function: String, live: u32 },
    Status(ClusterStatus),
    Error(String),
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub nodes: Vec<NodeStatus>,
    pub functions: Vec<FunctionStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub address: String,
    pub name: String,
    pub connected: bool,
    pub gpus: u32,
    pub instances: Vec<InstanceRecord>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionStatus {
    pub function: String,
    pub desired: u32,
    pub live: u32,
    pub request_rate: f64,
}

impl ClusterStatus {
    pub fn function(&self, name: &str) -> Option<&FunctionStatus> {
        self.functions
            .iter()
            .find(|function| function.function == name)
    }
}

/// Sends one request to the coordinator at `address` and waits for the reply.
pub fn send(
    address: &str,
    request: &ControlRequest,
    timeout: Duration,
) -> Result<ControlReply, String> {
    let target = address
        .to_socket_addrs()
        .map_err(|error| format!("bad coordinator address {address:?}: {error}"))?
        .next()
        .ok_or_else(|| format!("coordinator address {address:?} resolves to nothing"))?;
    let mut stream = TcpStream::connect_timeout(&target, timeout)
        .map_err(|error| format!("cannot reach coordinator at {address}: {error}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .and_then(|()| stream.set_write_timeout(Some(timeout)))
        .map_err(|error| format!("socket setup failed: {error}"))?;
    write_frame(&mut stream, request).map_err(|error| format!("coordinator {address}: {error}"))?;
    read_frame(&mut stream).map_err(|error| format!("coordinator {address}: {error}"))
}
