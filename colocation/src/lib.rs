//! Work-conserving co-location on one GPU: the **gap board** a primary
//! tenant and its fillers share.
//!
//! The primary's interposer publishes, at every launch and synchronisation,
//! whether it has work in flight and when it expects that work to end; it
//! also learns how long its gaps (idle intervals) last. A filler's
//! interposer asks the board before every launch and goes only when the
//! primary is idle and the filler's estimated kernel time fits the
//! predicted rest of the gap (or the primary tolerates one filler kernel of
//! delay); fillers together keep at most about one kernel queued, so a
//! returning primary waits at most about one filler kernel. The decision is
//! a few atomic loads and one CAS: no lock, no system call, no daemon.
//!
//! The board is advisory, like telemetry: every co-located tenant maps it
//! writable, and a filler that ignores it is still held to its token
//! bucket share by the node manager. It makes fillers wait, and a primary
//! only for a sample hold: at most [`MAX_SAMPLE_HOLD_NS`] per launch, and
//! within a budget of its time its interposer keeps.
//!
//! Gap prediction ([`predict_gap`]): gaps shorter than the hold-off (the
//! primary's own host time between dependent launches, e.g. between the
//! kernels of one request) are not fillable and are not learned; the last
//! [`HISTORY`](dilu_layout::colocation::HISTORY) fillable gaps are kept. When they repeat with a period (a
//! training iteration with several gaps of different lengths: data
//! loading, an all-reduce, a pipeline bubble), the next gap is predicted
//! from the gaps at the same position of the last iterations (the shortest
//! of them); otherwise (random gaps, e.g. an inference server's) it is the
//! shortest of the last [`RING`](dilu_layout::colocation::RING), a cautious value. A filler whose kernels
//! are longer than every recent gap falls back to its guaranteed share (the
//! caller paces it). Where the gaps repeat or are alike, such a kernel goes
//! as one of the longest gaps opens, where it overruns the gap least; where
//! they are random no moment is better than another. A filler owed its
//! share goes ahead of the filler whose turn it is, and claims the next
//! opening of a gap it can use, which the others leave to it for
//! [`OPENING_NS`].
//!
//! Filler turns ([`FILLER_TURN_NS`]): the device hands over between
//! processes at a cost (138 µs on an H100), so the filler that ran last
//! keeps the gaps for a while before the next one gets them, instead of
//! fillers alternating kernel by kernel. A filler about to wait for its own
//! SM-time tokens ends its turn ([`Board::end_turn_of`](crate::Board::end_turn_of)): the others
//! would otherwise wait for a holder that is asleep.
//!
//! Sample holds ([`Board::post_sample_hold`](crate::Board::post_sample_hold)): a filler kernel
//! longer than a time slice is preempted by the primary's next launch, so a
//! sample of it timed by events also holds the primary's slice (a 3 ms
//! kernel beside 2 ms gaps read 5.4 ms). A filler's guarantee is counted
//! in those estimates, so such a filler got about half of it. A filler
//! timing one kernel of that length in a gap asks the primary to hold its
//! launches until the kernel ran: it costs the primary about what the
//! kernel's overrun of the gap costs it anyway, and holds are spaced
//! ([`SAMPLE_HOLD_SPACING`]).
//!
//! Risk ration ([`ration`]): beside a primary kept as if alone (no
//! latency target), a filler kernel longer than the tolerance may still go
//! into a gap no prediction vouches for, at a cost in the ration fillers
//! share: the expected requests it pushes over the primary's bound, from
//! the primary's own latencies alone, within half a percent of them,
//! scaled by how likely the primary is to return while the kernel runs
//! given how long the gap has lasted ([`gap_lengths`]: a pause between
//! bursts is cheap, a moment mid-burst dear).
//!
//! The board's memory is [`dilu_layout::colocation`]; this crate is what
//! the processes do with it, through [`Board`]: [`primary`] (the primary's
//! side), [`filler`] (the fillers'), [`ration`], [`gap_lengths`],
//! [`sample_hold`], [`gap_prediction`] and the [`timing`] they share. The interposer calls it at every launch
//! and synchronisation of a co-located process; nothing here blocks.
//!
//! It owns the rules of co-location; it touches nothing but the board it
//! is handed (atomics in shared memory): no file, no system call, no clock
//! (callers pass the time), so its tests run on a board in anonymous
//! memory.

pub mod board;
pub mod filler;
pub mod gap_lengths;
pub mod gap_prediction;
pub mod primary;
pub mod ration;
pub mod sample_hold;
pub mod timing;

pub use board::Board;
pub use filler::{FillerGate, Owed};
pub use gap_prediction::{GapPrediction, predict_gap, record_in_ring};
pub use primary::{DELAY_BUDGET_PPM, DelayBudget, GapEnded, SYNCED_GAPS_TRUSTED, delay_budget};
pub use ration::{RATION_DEPTH_NS, ration_costs};
pub use sample_hold::SampleHoldPost;
pub use timing::*;

#[cfg(test)]
mod tests;
