//! What this process reports without enforcing anything: sync-to-sync
//! intervals and reported latencies ([`sync`], into the tenant's telemetry
//! region) and the call counters of `DILU_CALL_REPORT` ([`stats`]).

pub mod stats;
pub mod sync;
