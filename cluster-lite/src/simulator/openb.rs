//! Alibaba's GPU-sharing cluster trace ("openb", cluster-trace-gpu-v2023,
//! published with FGD): its node list and pod list, read as the simulator's
//! cluster and trace.
//!
//! Nodes: `sn,cpu_milli,memory_mib,gpu,model`. Pods:
//! `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
//! creation_time,deletion_time,scheduled_time` (times in seconds). Each pod
//! with GPUs becomes one record: it arrives at its creation and holds its
//! GPUs until its deletion; SM request = `gpu_milli`/1000 per GPU; the trace
//! has no limits, so the limit is the request times `LimitRule`'s factor
//! for its QoS class (latency-sensitive `LS` pods are latency work, the rest
//! batch); its memory share equals its SM share (the trace's share is one
//! number for both); `gpu_spec` (models joined by `|`) restricts the models
//! it may use; all its GPUs are on one node. Pods without GPUs are skipped:
//! the simulator places GPU work only.

use std::io::BufRead;

use super::NodeSpec;
use super::trace::{PodSpec, TraceRecord};
use crate::model::WorkClass;

/// Limits the trace lacks: limit = factor × request, at most one GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitRule {
    pub latency_factor: f64,
    pub batch_factor: f64,
}

impl Default for LimitRule {
    fn default() -> Self {
        Self {
            latency_factor: 1.5,
            batch_factor: 1.2,
        }
    }
}

/// Columns of a CSV header, by name.
struct Header(Vec<String>);

impl Header {
    fn column(&self, name: &str) -> Result<usize, String> {
        self.0
            .iter()
            .position(|column| column == name)
            .ok_or_else(|| format!("no column {name:?} in the header"))
    }
}

/// A data row: its line number and its fields.
type Row = (usize, Vec<String>);

fn rows(reader: impl BufRead) -> Result<(Header, Vec<Row>), String> {
    let mut lines = reader.lines().enumerate();
    let header = match lines.next() {
        Some((_, line)) => line.map_err(|error| error.to_string())?,
        None => return Err("empty file".into()),
    };
    let header = Header(header.trim().split(',').map(str::to_string).collect());
    let mut out = Vec::new();
    for (index, line) in lines {
        let line = line.map_err(|error| format!("line {}: {error}", index + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        out.push((
            index + 1,
            line.trim().split(',').map(str::to_string).collect(),
        ));
    }
    Ok((header, out))
}

fn number(fields: &[String], column: usize, line: usize, name: &str) -> Result<u64, String> {
    let text = fields.get(column).map(String::as_str).unwrap_or("");
    if text.is_empty() {
        return Ok(0);
    }
    text.parse::<u64>()
        .map_err(|error| format!("line {line}: {name} {text:?}: {error}"))
}

/// Reads a node list; `gpu_memory` is each GPU's memory (the list has none).
pub fn read_nodes(reader: impl BufRead, gpu_memory: u64) -> Result<Vec<NodeSpec>, String> {
    let (header, rows) = rows(reader)?;
    let (cpu, memory, gpus, model) = (
        header.column("cpu_milli")?,
        header.column("memory_mib")?,
        header.column("gpu")?,
        header.column("model")?,
    );
    rows.into_iter()
        .map(|(line, fields)| {
            Ok(NodeSpec {
                gpus: number(&fields, gpus, line, "gpu")? as usize,
                gpu_memory,
                cpu_milli: number(&fields, cpu, line, "cpu_milli")?,
                memory_mib: number(&fields, memory, line, "memory_mib")?,
                model: fields.get(model).cloned().unwrap_or_default(),
            })
        })
        .collect()
}

/// Reads a pod list as a trace sorted by arrival (see the module docs);
/// `gpu_memory` turns a pod's share into bytes.
pub fn read_pods(
    reader: impl BufRead,
    limits: LimitRule,
    gpu_memory: u64,
) -> Result<Vec<TraceRecord>, String> {
    let (header, rows) = rows(reader)?;
    let name = header.column("name")?;
    let cpu = header.column("cpu_milli")?;
    let memory = header.column("memory_mib")?;
    let gpus = header.column("num_gpu")?;
    let milli = header.column("gpu_milli")?;
    let spec = header.column("gpu_spec")?;
    let qos = header.column("qos")?;
    let created = header.column("creation_time")?;
    let deleted = header.column("deletion_time")?;
    let mut records = Vec::new();
    for (line, fields) in rows {
        let count = number(&fields, gpus, line, "num_gpu")?;
        let share_milli = number(&fields, milli, line, "gpu_milli")?;
        if count == 0 || share_milli == 0 {
            continue;
        }
        if share_milli > 1000 {
            return Err(format!("line {line}: gpu_milli {share_milli} > 1000"));
        }
        let arrival = number(&fields, created, line, "creation_time")?;
        let departure = number(&fields, deleted, line, "deletion_time")?;
        let class = match fields.get(qos).map(String::as_str) {
            Some("LS") => WorkClass::Latency,
            _ => WorkClass::Batch,
        };
        let factor = match class {
            WorkClass::Latency => limits.latency_factor,
            WorkClass::Batch => limits.batch_factor,
        };
        let request = share_milli as f64 / 1000.0;
        records.push(TraceRecord {
            id: records.len() as u64,
            function: fields.get(name).cloned().unwrap_or_default(),
            arrival_s: arrival as f64,
            duration_s: departure.saturating_sub(arrival).max(1) as f64,
            class,
            sm_request: request,
            sm_limit: (request * factor).min(1.0),
            memory_bytes: (request * gpu_memory as f64) as u64,
            gpus: count as u32,
            restartable: false,
            pod: PodSpec {
                cpu_milli: number(&fields, cpu, line, "cpu_milli")?,
                host_memory_mib: number(&fields, memory, line, "memory_mib")?,
                gpu_models: fields
                    .get(spec)
                    .map(|text| {
                        text.split('|')
                            .filter(|model| !model.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default(),
                one_node: true,
            },
        });
    }
    records.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s).then(a.id.cmp(&b.id)));
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_and_nodes_read_with_limits_models_and_one_node_gangs() {
        let nodes =
            "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,2,P100\nn1,96000,786432,8,G2\n";
        let nodes = read_nodes(nodes.as_bytes(), 1000).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!((nodes[1].gpus, nodes[1].model.as_str()), (8, "G2"));
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                    b,8000,1000,1,500,,BE,Running,20,120,20\n\
                    a,12000,16384,1,460,V100M16|V100M32,LS,Running,10,110,10\n\
                    cpu,4000,1000,0,0,,BE,Running,5,50,5\n\
                    g,32000,1000,8,1000,,LS,Running,30,31,30\n";
        let pods = read_pods(pods.as_bytes(), LimitRule::default(), 1000).unwrap();
        assert_eq!(pods.len(), 3, "the CPU-only pod is skipped");
        assert_eq!(pods[0].function, "a");
        assert!((pods[0].sm_limit - 0.69).abs() < 1e-9);
        assert!((pods[1].sm_limit - 0.6).abs() < 1e-9);
        assert_eq!(pods[0].pod.gpu_models, vec!["V100M16", "V100M32"]);
        assert_eq!((pods[2].gpus, pods[2].sm_limit), (8, 1.0));
        assert!(pods.iter().all(|pod| pod.pod.one_node));
        assert_eq!(pods[0].duration_s, 100.0);
    }
}
