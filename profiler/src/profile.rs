//! The profile a search produces, and its file.
//!
//! The file is TOML whose keys are the node manager's tenant spec keys
//! (`class`, `slo_ms`, `sm_request`, `sm_limit`) plus what the search found
//! besides (`batch`, `memory_peak_bytes`, throughputs, `trials`, `method`),
//! so a profile can stand where a spec is read.

use crate::Grid;
use crate::measure::Trials;
use crate::search::{Method, latency, share};
use serde::{Deserialize, Serialize};

/// Which question is asked: an inference function (meet an SLO per batch)
/// or a batch/training function (run near full speed on the least share).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Latency,
    Batch,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub class: Class,
    /// The SLO the request was searched for (latency class).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub slo_ms: Option<f64>,
    /// Batch size the function should run with.
    pub batch: u32,
    /// Latency class: the smallest share meeting the SLO at `batch`. Batch
    /// class: the same as the limit (the share at which it runs at full
    /// speed).
    pub sm_request: u32,
    /// The smallest share (≥ the request) within 2% of the throughput at
    /// 100%, at `batch`.
    pub sm_limit: u32,
    /// Samples per second at the request and at the limit.
    pub throughput_at_request: f64,
    pub throughput_at_limit: f64,
    /// The highest device memory any trial used, where it was measured.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub memory_peak_bytes: Option<u64>,
    /// Configurations measured to find this.
    pub trials: usize,
    /// The search that found it.
    pub method: String,
}

impl Profile {
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("a profile always serialises")
    }

    /// Reads a profile as `dilu profile` writes it: its TOML file, or the
    /// JSON object `--json` prints (e.g. in a Kubernetes annotation).
    pub fn from_text(text: &str) -> Result<Profile, String> {
        if text.trim_start().starts_with('{') {
            let profile: Profile =
                serde_json::from_str(text).map_err(|e| format!("not a dilu profile: {e}"))?;
            return profile.validated();
        }
        Profile::from_toml(text)
    }

    pub fn from_toml(text: &str) -> Result<Profile, String> {
        let profile: Profile =
            toml::from_str(text).map_err(|e| format!("not a dilu profile: {e}"))?;
        profile.validated()
    }

    /// Loads a profile file (TOML or JSON).
    pub fn load(path: &std::path::Path) -> Result<Profile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read profile {}: {e}", path.display()))?;
        Profile::from_text(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Requests per second one instance serves at its request (a request
    /// is one batch).
    pub fn requests_per_second(&self) -> f64 {
        self.throughput_at_request / f64::from(self.batch.max(1))
    }

    fn validated(self) -> Result<Profile, String> {
        let profile = self;
        for (name, share) in [
            ("sm_request", profile.sm_request),
            ("sm_limit", profile.sm_limit),
        ] {
            if !(0..=100).contains(&share) {
                return Err(format!(
                    "not a dilu profile: {name} = {share} is not a percentage"
                ));
            }
        }
        if profile.sm_request > profile.sm_limit {
            return Err(format!(
                "not a dilu profile: sm_request {} is above sm_limit {}",
                profile.sm_request, profile.sm_limit
            ));
        }
        Ok(profile)
    }
}

/// What a profile search is asked.
#[derive(Debug, Clone)]
pub struct Question {
    pub class: Class,
    /// Latency class: the SLO on one batch.
    pub slo_s: Option<f64>,
    /// Batch class: the batch size to profile at (default: the grid's
    /// largest).
    pub batch: Option<u32>,
    pub method: Method,
}

/// Runs the search and builds the profile. The limit is always searched
/// with dilu's method (it is part of the profile, not of the comparison).
pub fn find(trials: &mut Trials, grid: &Grid, question: &Question) -> Result<Profile, String> {
    let (batch, request) = match question.class {
        Class::Latency => {
            let slo_s = question
                .slo_s
                .ok_or("a latency-class profile needs an SLO (--slo-ms)")?;
            let Some(found) = latency::search(question.method, trials, grid, slo_s)? else {
                // A search may give up without running the whole device (a
                // bound showed it would not be fast enough): the smallest
                // batch on every SM shows the user the real floor.
                trials.get(crate::Config {
                    batch: grid.batches[0],
                    sm: grid.max_sm(),
                })?;
                return Err(no_config_meets(trials, grid, slo_s));
            };
            (found.batch, Some(found.sm))
        }
        Class::Batch => {
            let batch = question
                .batch
                .unwrap_or(grid.batches[grid.batches.len() - 1]);
            (batch, None)
        }
    };
    let limit = share::search(
        if request.is_some() {
            Method::Dilu
        } else {
            question.method
        },
        trials,
        grid,
        batch,
        request.unwrap_or(0),
    )?;
    let request = request.unwrap_or(limit);
    let at = |sm| crate::Config { batch, sm };
    Ok(Profile {
        class: question.class,
        slo_ms: question.slo_s.map(|s| s * 1000.0),
        batch,
        sm_request: request,
        sm_limit: limit,
        throughput_at_request: trials.throughput(at(request))?,
        throughput_at_limit: trials.throughput(at(limit))?,
        memory_peak_bytes: trials.memory_peak(),
        trials: trials.count(),
        method: question.method.name().to_string(),
    })
}

/// The error when nothing meets the SLO: names the fastest configuration
/// measured, so the user sees how far off the SLO is.
fn no_config_meets(trials: &Trials, grid: &Grid, slo_s: f64) -> String {
    let fastest = grid
        .batches
        .iter()
        .flat_map(|&batch| grid.sms.iter().map(move |&sm| crate::Config { batch, sm }))
        .filter_map(|c| trials.known(c).map(|s| (c, s.latency_s)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    match fastest {
        Some((c, latency)) => format!(
            "no configuration meets the SLO of {:.3} ms: the fastest measured was {:.3} ms (batch {} at SM {}%; batch {} at SM {}% was measured too)",
            slo_s * 1000.0,
            latency * 1000.0,
            c.batch,
            c.sm,
            grid.batches[0],
            grid.max_sm()
        ),
        None => format!(
            "no configuration meets the SLO of {:.3} ms: none could run",
            slo_s * 1000.0
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::ProfileTable;

    fn bert() -> ProfileTable {
        ProfileTable::parse(include_str!(
            "../../bench/data/dilu-profiles/bs_sm_bert_base.csv"
        ))
        .unwrap()
    }

    #[test]
    fn a_latency_profile_has_a_request_meeting_the_slo_and_a_limit_above_it() {
        let mut table = bert();
        let grid = table.grid();
        let mut trials = Trials::new(&mut table);
        let question = Question {
            class: Class::Latency,
            slo_s: Some(0.040),
            batch: None,
            method: Method::Dilu,
        };
        let profile = find(&mut trials, &grid, &question).unwrap();
        let table = bert();
        let at_request = table
            .get(crate::Config {
                batch: profile.batch,
                sm: profile.sm_request,
            })
            .unwrap();
        assert!(at_request.latency_s <= 0.040);
        assert!(profile.sm_limit >= profile.sm_request);
        assert!(profile.trials < 60);
        assert_eq!(Profile::from_toml(&profile.to_toml()).unwrap(), profile);
        let json = serde_json::to_string(&profile).unwrap();
        assert_eq!(Profile::from_text(&json).unwrap(), profile);
        let json = serde_json::to_string(&profile).unwrap();
        assert_eq!(Profile::from_text(&json).unwrap(), profile);
    }

    #[test]
    fn an_unmeetable_slo_says_how_fast_the_fastest_configuration_was() {
        let mut table = bert();
        let grid = table.grid();
        let mut trials = Trials::new(&mut table);
        let question = Question {
            class: Class::Latency,
            slo_s: Some(0.001),
            batch: None,
            method: Method::Dilu,
        };
        let error = find(&mut trials, &grid, &question).unwrap_err();
        assert!(
            error.contains(
                "the fastest measured was 16.135 ms (batch 1 at SM 10%; batch 1 at SM 100% was measured too)"
            ),
            "{error}"
        );
    }

    #[test]
    fn a_profile_file_with_the_request_above_the_limit_is_refused() {
        let text = "class = \"latency\"\nbatch = 4\nsm_request = 60\nsm_limit = 40\nthroughput_at_request = 1.0\nthroughput_at_limit = 1.0\ntrials = 3\nmethod = \"dilu\"\n";
        assert!(
            Profile::from_toml(text)
                .unwrap_err()
                .contains("above sm_limit")
        );
    }
}
