//! The searches. Two questions are asked of a function:
//! - [`latency`]: which (batch, SM share) gives the most throughput per SM
//!   percent while one batch still meets the SLO (an inference function's
//!   batch size and SM request);
//! - [`share`]: at a given batch, the smallest SM share whose throughput is
//!   within a fraction (2%) of the throughput at 100% (a training function's
//!   share, and every function's SM limit).
//!
//! Each has three methods: `dilu` (this crate's, built on what is known of
//! the shape), `dilu-paper` (the published Dilu profiler's, for comparison)
//! and `exhaustive` (measures everything: the optimum, at the most trials).

pub mod latency;
pub mod share;

/// Which search to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Dilu,
    Paper,
    Exhaustive,
}

impl Method {
    pub const ALL: [Method; 3] = [Method::Dilu, Method::Paper, Method::Exhaustive];

    pub fn name(self) -> &'static str {
        match self {
            Method::Dilu => "dilu",
            Method::Paper => "dilu-paper",
            Method::Exhaustive => "exhaustive",
        }
    }

    pub fn parse(text: &str) -> Result<Method, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == text)
            .ok_or_else(|| {
                format!("unknown search method {text:?}: expected dilu, dilu-paper or exhaustive")
            })
    }
}

/// Throughput within this fraction of the throughput at 100% counts as full
/// (Dilu's 98%).
pub const NEAR_FULL: f64 = 0.98;
