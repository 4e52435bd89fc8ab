//! Workload traces for the simulator: the record format (one JSON object per
//! line) and the built-in generator with a function mix like Dilu's
//! evaluation.
//!
//! Mix: 20% of instances are LLM inference (20–30 GB, SM request 0.4–0.6),
//! 20% training on 2–4 GPUs (25–40 GB and SM request 0.4–0.8 per GPU), 60%
//! small inference (3–10 GB, SM request 0.2–0.4). Limits are the request
//! times a class-specific headroom, capped at 1. Every instance of an
//! inference function is a replica with the function's one configured
//! demand (request, limit, memory drawn once per function), as a serverless
//! platform deploys it; training jobs draw their demand per job. Durations are exponential
//! (means: small inference 30 min, LLM 60 min, training 120 min). Training
//! jobs are `restartable` (they resume from a checkpoint when restarted, as
//! a preemptible training job must); records read from a file are not,
//! unless they say so. Arrivals
//! are Poisson, or bursty (a two-phase modulated Poisson process alternating
//! 1.6× and 0.4× the mean rate). The mean rate is chosen so that about half
//! of the GPUs would be busy under exclusive placement, but never more
//! concurrent instances than a quarter of the trace, so every trace reaches
//! a steady state.

use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

use crate::model::{ClusterState, GpuModel, InstanceDemand, PodNeeds, WorkClass};
use crate::rng::SeededRng;

const GB: f64 = 1e9;

/// One instance: when it arrives, how long it runs, what it needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub id: u64,
    pub function: String,
    pub arrival_s: f64,
    pub duration_s: f64,
    pub class: WorkClass,
    pub sm_request: f64,
    pub sm_limit: f64,
    pub memory_bytes: u64,
    /// GPUs it takes; 0 for a pod that takes only cores and host memory
    /// (its shares and memory are then 0).
    pub gpus: u32,
    /// Whether the instance resumes from a checkpoint when restarted, so a
    /// policy may restart it on other GPUs (see `consolidation`).
    #[serde(default)]
    pub restartable: bool,
    /// What it needs of its node besides GPU shares (real-cluster pods;
    /// generated records need nothing and may span nodes).
    #[serde(default, flatten)]
    pub pod: PodSpec,
}

/// A record's host needs, as a real cluster's pod spec gives them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PodSpec {
    #[serde(default)]
    pub cpu_milli: u64,
    #[serde(default)]
    pub host_memory_mib: u64,
    /// GPU models it may run on; empty means any.
    #[serde(default)]
    pub gpu_models: Vec<String>,
    /// Whether all its GPUs must be on one node.
    #[serde(default)]
    pub one_node: bool,
}

impl TraceRecord {
    /// Its host needs on `cluster` (a model the cluster lacks matches no node).
    pub fn needs(&self, cluster: &ClusterState) -> PodNeeds {
        PodNeeds {
            cpu_milli: self.pod.cpu_milli,
            memory_mib: self.pod.host_memory_mib,
            models: self
                .pod
                .gpu_models
                .iter()
                .map(|name| {
                    cluster
                        .models
                        .iter()
                        .position(|model| model == name)
                        .map_or(GpuModel::MAX, |index| index as GpuModel)
                })
                .collect(),
            one_node: self.pod.one_node,
        }
    }

    /// What it asks of GPUs (`gpus` 0 for a pod without GPUs).
    pub fn demand(&self) -> InstanceDemand {
        InstanceDemand {
            class: self.class,
            sm_request: self.sm_request,
            sm_limit: self.sm_limit,
            memory_bytes: self.memory_bytes,
            gpus: self.gpus,
        }
    }

    /// Whether it takes GPUs (else it is placed by its host needs alone,
    /// `policy::place_host_only`).
    pub fn takes_gpus(&self) -> bool {
        self.gpus > 0
    }

    fn check(&self) -> Result<(), String> {
        let shares_ok = self.sm_request.is_finite()
            && self.sm_limit.is_finite()
            && (0.0..=1.0).contains(&self.sm_request)
            && self.sm_limit >= self.sm_request
            && self.sm_limit <= 1.0;
        if !shares_ok {
            return Err("need 0 <= sm_request <= sm_limit <= 1".into());
        }
        if !(self.arrival_s.is_finite() && self.arrival_s >= 0.0) {
            return Err("arrival_s must be a finite number >= 0".into());
        }
        if !(self.duration_s.is_finite() && self.duration_s > 0.0) {
            return Err("duration_s must be a finite number > 0".into());
        }
        if self.gpus == 0 && (self.sm_limit > 0.0 || self.memory_bytes > 0) {
            return Err(
                "gpus 0 is a pod without GPUs: its sm_request, sm_limit and memory_bytes must be 0"
                    .into(),
            );
        }
        Ok(())
    }
}

/// How many of `records` take no GPU.
pub fn count_without_gpus(records: &[TraceRecord]) -> usize {
    records.iter().filter(|record| !record.takes_gpus()).count()
}

/// How arrivals are spread in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArrivalPattern {
    Poisson,
    Bursty,
}

impl std::str::FromStr for ArrivalPattern {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "poisson" => Ok(Self::Poisson),
            "bursty" => Ok(Self::Bursty),
            other => Err(format!(
                "unknown arrival pattern {other:?}: expected poisson or bursty"
            )),
        }
    }
}

/// Parameters of a generated trace.
#[derive(Debug, Clone)]
pub struct TraceSpec {
    pub instances: usize,
    pub cluster_gpus: usize,
    pub arrival: ArrivalPattern,
    pub seed: u64,
}

struct FunctionProfile {
    name: String,
    class: WorkClass,
    request: (f64, f64),
    headroom: (f64, f64),
    memory_gb: (f64, f64),
    gpus: u32,
    mean_duration_s: f64,
}

fn catalogue(rng: &mut SeededRng) -> [Vec<FunctionProfile>; 3] {
    let mut catalogue: [Vec<FunctionProfile>; 3] = Default::default();
    for index in 0..8 {
        let memory = rng.between(20.0, 30.0);
        let request = rng.between(0.4, 0.6);
        let headroom = rng.between(1.2, 1.6);
        catalogue[0].push(FunctionProfile {
            name: format!("llm-{index}"),
            class: WorkClass::Latency,
            request: (request, request),
            headroom: (headroom, headroom),
            memory_gb: (memory, memory),
            gpus: 1,
            mean_duration_s: 3600.0,
        });
    }
    for index in 0..6 {
        catalogue[1].push(FunctionProfile {
            name: format!("train-{index}"),
            class: WorkClass::Batch,
            request: (0.4, 0.8),
            headroom: (1.1, 1.3),
            memory_gb: (25.0, 40.0),
            gpus: 2 + rng.below(3) as u32,
            mean_duration_s: 7200.0,
        });
    }
    for index in 0..26 {
        let memory = rng.between(3.0, 10.0);
        let request = rng.between(0.2, 0.4);
        let headroom = rng.between(1.3, 2.0);
        catalogue[2].push(FunctionProfile {
            name: format!("infer-{index}"),
            class: WorkClass::Latency,
            request: (request, request),
            headroom: (headroom, headroom),
            memory_gb: (memory, memory),
            gpus: 1,
            mean_duration_s: 1800.0,
        });
    }
    catalogue
}

/// Generates a trace; the same spec always yields the same trace.
pub fn generate(spec: &TraceSpec) -> Vec<TraceRecord> {
    let mut rng = SeededRng::new(spec.seed);
    let catalogue = catalogue(&mut rng);
    // Expected GPUs per instance (0.2 * 3 + 0.8 * 1) and duration.
    let gpus_per_instance = 1.4;
    let mean_duration = 0.2 * 3600.0 + 0.2 * 7200.0 + 0.6 * 1800.0;
    let concurrency = (0.5 * spec.cluster_gpus as f64 / gpus_per_instance)
        .min(spec.instances as f64 / 4.0)
        .max(1.0);
    let mean_rate = concurrency / mean_duration;
    let phase_mean_s = mean_duration / 4.0;
    let mut now = 0.0;
    let mut burst = false;
    let mut phase_end = rng.exponential(phase_mean_s);
    let mut records = Vec::with_capacity(spec.instances);
    for id in 0..spec.instances as u64 {
        let rate = match (spec.arrival, burst) {
            (ArrivalPattern::Poisson, _) => mean_rate,
            (ArrivalPattern::Bursty, true) => 1.6 * mean_rate,
            (ArrivalPattern::Bursty, false) => 0.4 * mean_rate,
        };
        now += rng.exponential(1.0 / rate);
        while spec.arrival == ArrivalPattern::Bursty && now > phase_end {
            burst = !burst;
            phase_end += rng.exponential(phase_mean_s);
        }
        let roll = rng.unit();
        let group = if roll < 0.2 {
            &catalogue[0]
        } else if roll < 0.4 {
            &catalogue[1]
        } else {
            &catalogue[2]
        };
        let profile = &group[rng.below(group.len() as u64) as usize];
        let sm_request = rng
            .between(profile.request.0, profile.request.1)
            .clamp(0.01, 1.0);
        let sm_limit = (sm_request * rng.between(profile.headroom.0, profile.headroom.1)).min(1.0);
        let memory_gb = rng.between(profile.memory_gb.0, profile.memory_gb.1);
        records.push(TraceRecord {
            id,
            function: profile.name.clone(),
            arrival_s: now,
            duration_s: rng.exponential(profile.mean_duration_s).max(1.0),
            class: profile.class,
            sm_request,
            sm_limit,
            memory_bytes: (memory_gb * GB) as u64,
            gpus: profile.gpus,
            restartable: profile.class == WorkClass::Batch,
            pod: PodSpec::default(),
        });
    }
    records
}

/// Reads a JSON-lines trace; blank lines and lines starting with `#` are
/// skipped. Errors name the line.
pub fn read_json_lines(reader: impl BufRead) -> Result<Vec<TraceRecord>, String> {
    let mut records = Vec::new();
    for (index, line) in reader.lines().enumerate() {
        let line = line.map_err(|error| format!("line {}: {error}", index + 1))?;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let record: TraceRecord = serde_json::from_str(trimmed)
            .map_err(|error| format!("line {}: {error}", index + 1))?;
        record
            .check()
            .map_err(|error| format!("line {}: {error}", index + 1))?;
        records.push(record);
    }
    records.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    Ok(records)
}

/// Writes a trace as JSON lines.
pub fn write_json_lines(records: &[TraceRecord], mut writer: impl Write) -> std::io::Result<()> {
    for record in records {
        let line = serde_json::to_string(record).map_err(std::io::Error::other)?;
        writeln!(writer, "{line}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(arrival: ArrivalPattern) -> TraceSpec {
        TraceSpec {
            instances: 2000,
            cluster_gpus: 1000,
            arrival,
            seed: 42,
        }
    }

    #[test]
    fn generated_mix_matches_the_documented_shares() {
        let trace = generate(&spec(ArrivalPattern::Poisson));
        assert_eq!(trace.len(), 2000);
        let llm = trace
            .iter()
            .filter(|r| r.function.starts_with("llm"))
            .count();
        let training = trace.iter().filter(|r| r.gpus > 1).count();
        assert!((300..500).contains(&llm), "llm share {llm}");
        assert!((300..500).contains(&training), "training share {training}");
        for record in &trace {
            record.check().expect("generated records are valid");
        }
        assert!(
            trace
                .windows(2)
                .all(|pair| pair[0].arrival_s <= pair[1].arrival_s)
        );
    }

    #[test]
    fn inference_replicas_of_one_function_share_one_demand() {
        let trace = generate(&spec(ArrivalPattern::Poisson));
        let mut seen = std::collections::HashMap::new();
        for record in trace.iter().filter(|r| r.class == WorkClass::Latency) {
            let demand = (record.sm_request, record.sm_limit, record.memory_bytes);
            assert_eq!(*seen.entry(&record.function).or_insert(demand), demand);
        }
        assert_eq!(seen.len(), 34, "8 LLM and 26 small inference functions");
    }

    #[test]
    fn same_seed_same_trace_different_seed_different_trace() {
        let first = generate(&spec(ArrivalPattern::Bursty));
        assert_eq!(first, generate(&spec(ArrivalPattern::Bursty)));
        let mut other = spec(ArrivalPattern::Bursty);
        other.seed = 43;
        assert_ne!(first, generate(&other));
    }

    #[test]
    fn json_lines_round_trip_and_bad_lines_are_named() {
        let trace = generate(&TraceSpec {
            instances: 5,
            cluster_gpus: 8,
            arrival: ArrivalPattern::Poisson,
            seed: 1,
        });
        let mut buffer = Vec::new();
        write_json_lines(&trace, &mut buffer).expect("write to memory");
        let back = read_json_lines(buffer.as_slice()).expect("round trip");
        assert_eq!(back.len(), trace.len());
        for (read, written) in back.iter().zip(&trace) {
            assert_eq!(
                (read.id, &read.function, read.gpus, read.restartable),
                (
                    written.id,
                    &written.function,
                    written.gpus,
                    written.restartable
                )
            );
        }
        assert!(
            trace.iter().any(|record| record.restartable),
            "generated training is restartable"
        );
        let without_flag = r#"{"id":1,"function":"t","arrival_s":0,"duration_s":5,"class":"Batch","sm_request":0.5,"sm_limit":0.6,"memory_bytes":1,"gpus":2}"#;
        let read = read_json_lines(without_flag.as_bytes()).expect("valid record");
        assert!(!read[0].restartable, "restarts need the trace's consent");
        let error = read_json_lines("# comment\n{\"id\": 1}\n".as_bytes()).unwrap_err();
        assert!(error.starts_with("line 2:"), "{error}");
        let bad_share = r#"{"id":1,"function":"f","arrival_s":0,"duration_s":5,"class":"Latency","sm_request":0.9,"sm_limit":0.5,"memory_bytes":1,"gpus":1}"#;
        assert!(
            read_json_lines(bad_share.as_bytes())
                .unwrap_err()
                .contains("sm_request")
        );
        // A pod without GPUs: cores and host memory only.
        let cores = r#"{"id":1,"function":"c","arrival_s":0,"duration_s":5,"class":"Batch","sm_request":0,"sm_limit":0,"memory_bytes":0,"gpus":0,"cpu_milli":4000}"#;
        let read = read_json_lines(cores.as_bytes()).expect("a pod without GPUs");
        assert!(!read[0].takes_gpus());
        assert_eq!(read[0].pod.cpu_milli, 4000);
        let half = cores.replace(r#""sm_limit":0,"#, r#""sm_limit":0.5,"#);
        let error = read_json_lines(half.as_bytes()).unwrap_err();
        assert!(error.contains("gpus 0 is a pod without GPUs"), "{error}");
    }
}
