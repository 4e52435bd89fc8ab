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
//! it may use; all its GPUs are on one node. A pod without GPUs (`num_gpu`
//! or `gpu_milli` 0) becomes a record of 0 GPUs: it takes cores and host
//! memory on the node the policy chooses for it (`place_host_only`), which
//! GPU pods then lack. FGD's lists of non-GPU work (`cpu050` … `cpu300`)
//! differ from the default list only in such pods.

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
    fn find(&self, name: &str) -> Option<usize> {
        self.0.iter().position(|column| column == name)
    }

    fn column(&self, name: &str) -> Result<usize, String> {
        self.find(name).ok_or_else(|| {
            format!(
                "no column {name:?} in the header (it has {}); the openb lists always have it",
                self.0.join(",")
            )
        })
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
        let fields: Vec<String> = line.trim().split(',').map(str::to_string).collect();
        // A short row would read its missing fields as empty: say so instead.
        if fields.len() < header.0.len() {
            return Err(format!(
                "line {}: {} fields, the header names {}",
                index + 1,
                fields.len(),
                header.0.len()
            ));
        }
        out.push((index + 1, fields));
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

/// A text field; the dataset's documentation writes an absent value as `nan`.
fn text(fields: &[String], column: Option<usize>) -> &str {
    match column
        .and_then(|column| fields.get(column))
        .map(String::as_str)
    {
        Some("nan") | None => "",
        Some(value) => value,
    }
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
                model: text(&fields, Some(model)).to_string(),
            })
        })
        .collect()
}

/// Columns every openb pod list has; the rest are optional.
pub const REQUIRED_POD_COLUMNS: [&str; 5] =
    ["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"];

/// A pod list as read: its pods and what its header lacked.
#[derive(Debug, Clone)]
pub struct PodList {
    /// Its pods, with GPUs or without, sorted by arrival (by line when the
    /// list has no times).
    pub records: Vec<TraceRecord>,
    /// Whether the list has `creation_time` and `deletion_time`: without
    /// them it holds no arrivals or departures, only FGD's protocol (pods
    /// drawn at random, never leaving) can use it.
    pub timed: bool,
    /// Optional columns the header lacks, in the dataset's order.
    pub absent: Vec<&'static str>,
}

impl PodList {
    /// How many of its pods take no GPU.
    pub fn without_gpus(&self) -> usize {
        super::trace::count_without_gpus(&self.records)
    }

    /// The records for a replay in time, or why this list cannot give one.
    pub fn replayable(&self) -> Result<&[TraceRecord], String> {
        if self.timed {
            return Ok(&self.records);
        }
        Err(format!(
            "it has no {} column, so no pod has an arrival or a departure to replay \
             (openb's multigpu lists carry only {}); use --protocol fgd, which draws \
             pods at random and never lets them leave",
            self.absent
                .iter()
                .filter(|name| ["creation_time", "deletion_time"].contains(name))
                .map(|name| format!("{name:?}"))
                .collect::<Vec<_>>()
                .join(" or "),
            REQUIRED_POD_COLUMNS.join(", ")
        ))
    }

    /// One line for a report: what the absent columns were taken to mean.
    pub fn absent_note(&self) -> Option<String> {
        if self.absent.is_empty() {
            return None;
        }
        let mut meanings = Vec::new();
        if self.absent.contains(&"gpu_spec") {
            meanings.push("no GPU-model constraint");
        }
        if self.absent.contains(&"qos") {
            meanings.push("every pod batch (no LS class)");
        }
        if !self.timed {
            meanings.push("no times (FGD's protocol only)");
        }
        Some(format!(
            "columns absent: {} ({})",
            self.absent.join(", "),
            meanings.join("; ")
        ))
    }
}

/// Reads a pod list as a trace sorted by arrival (see the module docs);
/// `gpu_memory` turns a pod's share into bytes. Optional columns the
/// header lacks are absent (no model constraint, batch class, no times),
/// columns it does not know are ignored, and a bad row is named by line.
pub fn read_pods(
    reader: impl BufRead,
    limits: LimitRule,
    gpu_memory: u64,
) -> Result<PodList, String> {
    let (header, rows) = rows(reader)?;
    let [name, cpu, memory, gpus, milli] = REQUIRED_POD_COLUMNS.map(|name| header.column(name));
    let (name, cpu, memory, gpus, milli) = (name?, cpu?, memory?, gpus?, milli?);
    let mut absent = Vec::new();
    let mut optional = |column: &'static str| {
        let found = header.find(column);
        if found.is_none() {
            absent.push(column);
        }
        found
    };
    let spec = optional("gpu_spec");
    let qos = optional("qos");
    let _phase = optional("pod_phase");
    let times = (optional("creation_time"), optional("deletion_time"));
    let _scheduled = optional("scheduled_time");
    let times = match times {
        (Some(created), Some(deleted)) => Some((created, deleted)),
        _ => None,
    };
    let mut records = Vec::new();
    for (line, fields) in rows {
        let count = number(&fields, gpus, line, "num_gpu")?;
        let share_milli = number(&fields, milli, line, "gpu_milli")?;
        let takes_gpus = count > 0 && share_milli > 0;
        if share_milli > 1000 {
            return Err(format!("line {line}: gpu_milli {share_milli} > 1000"));
        }
        let (arrival, departure) = match times {
            Some((created, deleted)) => {
                let arrival = number(&fields, created, line, "creation_time")?;
                let departure = number(&fields, deleted, line, "deletion_time")?;
                (arrival, departure)
            }
            // FGD's protocol numbers the pods itself; line order is kept.
            None => (0, 1),
        };
        let class = match text(&fields, qos) {
            "LS" => WorkClass::Latency,
            _ => WorkClass::Batch,
        };
        let factor = match class {
            WorkClass::Latency => limits.latency_factor,
            WorkClass::Batch => limits.batch_factor,
        };
        let request = if takes_gpus {
            share_milli as f64 / 1000.0
        } else {
            0.0
        };
        records.push(TraceRecord {
            id: records.len() as u64,
            function: fields[name].clone(),
            arrival_s: arrival as f64,
            duration_s: departure.saturating_sub(arrival).max(1) as f64,
            class,
            sm_request: request,
            sm_limit: (request * factor).min(1.0),
            memory_bytes: (request * gpu_memory as f64) as u64,
            gpus: if takes_gpus { count as u32 } else { 0 },
            restartable: false,
            pod: PodSpec {
                cpu_milli: number(&fields, cpu, line, "cpu_milli")?,
                host_memory_mib: number(&fields, memory, line, "memory_mib")?,
                gpu_models: text(&fields, spec)
                    .split('|')
                    .filter(|model| !model.is_empty())
                    .map(str::to_string)
                    .collect(),
                one_node: true,
            },
        });
    }
    records.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s).then(a.id.cmp(&b.id)));
    Ok(PodList {
        records,
        timed: times.is_some(),
        absent,
    })
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
        let list = read_pods(pods.as_bytes(), LimitRule::default(), 1000).unwrap();
        assert_eq!(list.without_gpus(), 1);
        let pods = list.records;
        assert_eq!(pods.len(), 4, "the CPU-only pod is kept");
        let cpu = &pods[0];
        assert_eq!(cpu.function, "cpu", "sorted by arrival");
        assert!(!cpu.takes_gpus());
        assert_eq!(
            (cpu.sm_request, cpu.sm_limit, cpu.memory_bytes),
            (0.0, 0.0, 0)
        );
        assert_eq!((cpu.pod.cpu_milli, cpu.pod.host_memory_mib), (4000, 1000));
        let pods = &pods[1..];
        assert_eq!(pods[0].function, "a");
        assert!((pods[0].sm_limit - 0.69).abs() < 1e-9);
        assert!((pods[1].sm_limit - 0.6).abs() < 1e-9);
        assert_eq!(pods[0].pod.gpu_models, vec!["V100M16", "V100M32"]);
        assert_eq!((pods[2].gpus, pods[2].sm_limit), (8, 1.0));
        assert!(pods.iter().all(|pod| pod.pod.one_node));
        assert_eq!(pods[0].duration_s, 100.0);
    }

    #[test]
    fn a_list_without_spec_qos_or_times_reads_for_fgd_and_refuses_a_replay() {
        // openb's multigpu lists: only the five required columns.
        let pods = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n\
                    p0,12000,16384,1,460\n\
                    cpu,4000,1000,0,0\n\
                    p2,88000,327680,8,1000\n";
        let list = read_pods(pods.as_bytes(), LimitRule::default(), 1000).unwrap();
        assert_eq!(list.records.len(), 3);
        assert_eq!(list.without_gpus(), 1);
        assert!(!list.timed);
        assert_eq!(
            list.absent,
            [
                "gpu_spec",
                "qos",
                "pod_phase",
                "creation_time",
                "deletion_time",
                "scheduled_time"
            ]
        );
        assert_eq!(list.records[0].function, "p0", "line order is kept");
        assert!(list.records.iter().all(|pod| pod.pod.gpu_models.is_empty()));
        assert!(list.records.iter().all(|pod| pod.class == WorkClass::Batch));
        let refusal = list.replayable().unwrap_err();
        assert!(refusal.contains("\"creation_time\""), "{refusal}");
        assert!(refusal.contains("--protocol fgd"), "{refusal}");
        assert!(list.absent_note().unwrap().contains("FGD's protocol only"));
    }

    #[test]
    fn unknown_columns_are_ignored_and_nan_means_no_constraint() {
        let pods = "name,cluster,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,creation_time,deletion_time,extra\n\
                    a,eu,1000,2048,1,250,nan,LS,5,65,x\n\
                    b,us,2000,4096,2,1000,T4|P100,BE,1,2,y\n";
        let list = read_pods(pods.as_bytes(), LimitRule::default(), 1000).unwrap();
        assert!(list.timed);
        assert_eq!(list.absent, ["pod_phase", "scheduled_time"]);
        assert!(list.replayable().is_ok());
        let [b, a] = [&list.records[0], &list.records[1]];
        assert_eq!((a.pod.cpu_milli, a.pod.host_memory_mib), (1000, 2048));
        assert!(a.pod.gpu_models.is_empty(), "nan is no constraint");
        assert_eq!(
            (a.class, a.duration_s, a.sm_request),
            (WorkClass::Latency, 60.0, 0.25)
        );
        assert_eq!(b.pod.gpu_models, ["T4", "P100"]);
        assert_eq!(b.gpus, 2);
    }

    #[test]
    fn bad_rows_and_missing_required_columns_are_named() {
        let head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,qos\n";
        let read = |body: &str| {
            read_pods(
                format!("{head}{body}").as_bytes(),
                LimitRule::default(),
                1000,
            )
            .unwrap_err()
        };
        let short = read("a,1000,2048,1,250,LS\nb,1000,2048,1\n");
        assert!(short.starts_with("line 3: 4 fields"), "{short}");
        let bad = read("a,1000,2048,1,2x0,LS\n");
        assert!(bad.starts_with("line 2: gpu_milli \"2x0\""), "{bad}");
        let over = read("\na,1000,2048,1,1500,LS\n");
        assert!(over.starts_with("line 3: gpu_milli 1500"), "{over}");
        let missing = read_pods(
            "name,cpu_milli,memory_mib,gpu_milli\n".as_bytes(),
            LimitRule::default(),
            1000,
        )
        .unwrap_err();
        assert!(missing.contains("no column \"num_gpu\""), "{missing}");
    }
}
