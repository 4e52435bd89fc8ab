//! One process's execution engine per device: runs the kernels at the head
//! of every stream of this process on the shared device timeline.
//!
//! Kernels of one process run concurrently (up to one per hardware queue,
//! `CUDA_DEVICE_MAX_CONNECTIONS`, default 8), sharing the SMs by blocks: each
//! asks for `min(blocks, SMs)` SMs; when together they ask for more than
//! the device has, every one progresses at `SMs / asked` of its own speed.
//! Between processes the device is time-sliced (`timeslice.rs`): while this
//! process does not hold the device its kernels make no progress; at the
//! end of a slice with another process waiting, running kernels are
//! preempted (`SIMGPU_PREEMPT`) and resume in a later slice. Each stretch
//! a kernel runs is one trace row (a segment).
//!
//! The engine keeps a simulated clock `t` on the shared device timeline and
//! follows the wall clock with it: it sleeps until the next event (a kernel
//! ends, the slice ends, a queued kernel becomes ready) or until a stream
//! hands it a new kernel.
//!
//! Streams hand kernels over ahead of time (`submit`, then `wait`), as a
//! driver fills a hardware queue: each hardware queue runs its kernels in
//! the order they were handed over, one at a time, and the next one
//! becomes ready the kernel gap after the one before it ends. So the
//! engine starts a stream's next kernel on the simulated timeline without
//! waiting for the stream's thread to wake, and a slow host (a loaded
//! 2-core machine) costs wall-clock lag, not device time.

use crate::config::{Config, Preempt};
use crate::shm::Shm;
use crate::timeslice;
use crate::trace::{KernelRecord, Trace};
use crate::{now_ns, sleep_until};
use std::collections::HashMap;
use std::sync::atomic::Ordering::{AcqRel, Acquire};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// A kernel as a stream hands it over.
pub(crate) struct Submit {
    pub stream: u64,
    pub device: usize,
    pub name: Arc<str>,
    pub blocks: u64,
    pub graph: bool,
    /// Duration alone on the device (before jitter).
    pub dur_ns: u64,
    /// An event record waiting for the device (no work, no trace row).
    pub record: bool,
    pub ready: u64,
}

struct Job {
    id: u64,
    /// Hardware queue (`CUDA_DEVICE_MAX_CONNECTIONS`) the stream maps to.
    queue: usize,
    sub: Submit,
    /// Work in all and work left, in ns of running alone.
    work: f64,
    left: f64,
    /// Length of one wave of blocks, in ns of running alone.
    wave: f64,
    /// SMs the kernel asks for.
    width: f64,
    /// Start of the running segment.
    seg_start: Option<u64>,
    segments: u32,
}

struct State {
    jobs: Vec<Job>,
    done: HashMap<u64, u64>,
    next_id: u64,
    /// Device timeline time up to which the engine has simulated.
    t: u64,
    /// Start of this process's current slice, if it holds the device.
    slice: Option<u64>,
    /// Recent intervals in which this process held the device.
    held: Vec<(u64, u64)>,
    /// Slow drift of kernel durations (log-space, Ornstein–Uhlenbeck).
    drift: f64,
    drift_at: u64,
    rng: u64,
    started: bool,
    /// Per hardware queue: when the kernel gap after its last completed job
    /// ends (a job handed over later is ready no earlier).
    queue_free_at: [u64; MAX_QUEUES],
}

pub(crate) struct Engine {
    phys: usize,
    st: Mutex<State>,
    /// Signals the engine thread (new work) and waiting streams (done).
    cv: Condvar,
}

impl Engine {
    pub(crate) fn new(phys: usize, seed: u64) -> Engine {
        Engine {
            phys,
            st: Mutex::new(State {
                jobs: Vec::new(),
                done: HashMap::new(),
                next_id: 1,
                t: 0,
                slice: None,
                held: Vec::new(),
                drift: 0.0,
                drift_at: 0,
                rng: seed ^ 0x9e37_79b9_7f4a_7c15,
                started: false,
                queue_free_at: [0; MAX_QUEUES],
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs one kernel (or an event record waiting for the device); blocks
    /// until it has completed and returns its completion time. The caller
    /// counted it in the process's queued kernels; completion uncounts it.
    pub(crate) fn run(
        self: &Arc<Self>,
        cfg: &'static Config,
        shm: &'static Shm,
        trace: Option<&'static Trace>,
        sub: Submit,
    ) -> u64 {
        match self.submit(cfg, shm, trace, sub) {
            Ok(ticket) => self.wait(ticket),
            Err(end) => end,
        }
    }

    /// Hands a kernel (or an event record) to the engine without waiting
    /// for it: `Ok(ticket)` for [`Engine::wait`]. It runs after everything
    /// handed over before it on its hardware queue. `Err(end)` when no
    /// engine thread could be started: it then ran alone, unshared, and
    /// completed at `end` (never expected).
    pub(crate) fn submit(
        self: &Arc<Self>,
        cfg: &'static Config,
        shm: &'static Shm,
        trace: Option<&'static Trace>,
        sub: Submit,
    ) -> Result<u64, u64> {
        let mut st = self.lock();
        if !st.started {
            let me = self.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("simgpu-dev{}", self.phys))
                .spawn(move || me.main(cfg, shm, trace));
            if spawned.is_err() {
                drop(st);
                let end = sub.ready.max(now_ns()) + sub.dur_ns;
                sleep_until(end);
                uncount(shm, self.phys);
                return Err(end);
            }
            st.started = true;
        }
        let id = st.next_id;
        st.next_id += 1;
        let queue = (sub.stream % cfg.connections) as usize;
        let mut sub = sub;
        // The stream's thread may not have seen its previous kernel
        // complete yet: the queue knows when it did.
        sub.ready = sub.ready.max(st.queue_free_at[queue]);
        let factor = jitter(cfg, &mut st, sub.ready);
        let work = sub.dur_ns as f64 * factor;
        let waves = sub.blocks.div_ceil(cfg.sms).max(1) as f64;
        st.jobs.push(Job {
            id,
            queue,
            work,
            left: work,
            wave: work / waves,
            width: sub.blocks.clamp(1, cfg.sms) as f64,
            sub,
            seg_start: None,
            segments: 0,
        });
        self.cv.notify_all();
        Ok(id)
    }

    /// Blocks until the job `ticket` has completed; returns its completion
    /// time on the device timeline.
    pub(crate) fn wait(&self, ticket: u64) -> u64 {
        let mut st = self.lock();
        loop {
            if let Some(end) = st.done.remove(&ticket) {
                return end;
            }
            st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// When an event recorded in a stream, ready at `ready`, is
    /// timestamped: at `ready` if this process held the device then (or
    /// nobody else holds it now), else when it next gets the device.
    pub(crate) fn record_time(&self, shm: &Shm, ready: u64) -> Option<u64> {
        let st = self.lock();
        if st.slice.is_some_and(|s| s <= ready) {
            return Some(ready);
        }
        if st.held.iter().any(|&(a, b)| a <= ready && ready <= b) {
            return Some(ready);
        }
        match timeslice::holder(shm, self.phys) {
            timeslice::Holder::Free { since_ns, .. } if since_ns <= ready => Some(ready),
            _ => None,
        }
    }

    fn main(
        self: Arc<Self>,
        cfg: &'static Config,
        shm: &'static Shm,
        trace: Option<&'static Trace>,
    ) {
        crate::exact_timers_for_this_thread();
        let me_queued = shm.queued(shm.slot, self.phys);
        let mut st = self.lock();
        loop {
            if st.jobs.is_empty() && st.slice.is_none() {
                st = self.cv.wait(st).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            let Some(slice_start) = st.slice else {
                let heads = queue_heads(&st.jobs);
                let ready = st
                    .jobs
                    .iter()
                    .filter(|j| heads[j.queue] == j.id)
                    .map(|j| j.sub.ready)
                    .min()
                    .unwrap_or(0);
                drop(st);
                let start =
                    timeslice::acquire(shm, self.phys, ready, cfg.timeslice_ns, cfg.switch_ns);
                st = self.lock();
                st.slice = Some(start);
                st.t = st.t.max(start);
                continue;
            };
            let t = st.t;
            if st.jobs.is_empty() && me_queued.load(Acquire) == 0 {
                // Out of work: free the device at once (no idle grace).
                self.give_up(shm, &mut st, slice_start, t);
                continue;
            }
            // Start (or resume) every kernel at the head of its queue that
            // is ready.
            let heads = queue_heads(&st.jobs);
            for j in st.jobs.iter_mut() {
                if j.seg_start.is_none() && heads[j.queue] == j.id && j.sub.ready <= t {
                    j.seg_start = Some(t);
                }
            }
            let rate = rate(&st.jobs, cfg.sms as f64);
            let slice_end = (cfg.timeslice_ns > 0).then(|| slice_start + cfg.timeslice_ns);
            let next_done = st
                .jobs
                .iter()
                .filter(|j| j.seg_start.is_some())
                .map(|j| t + (j.left / rate).ceil() as u64)
                .min();
            let next_ready = st
                .jobs
                .iter()
                .filter(|j| j.seg_start.is_none() && heads[j.queue] == j.id)
                .map(|j| j.sub.ready)
                .min();
            // With no slice length, check for waiting processes now and then.
            let fallback = (cfg.timeslice_ns == 0).then(|| t.max(now_ns()) + 200_000);
            let target = [next_done, next_ready, slice_end, fallback]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(t);
            let now = now_ns();
            let n_jobs = st.jobs.len();
            if target > now {
                let (guard, _) = self
                    .cv
                    .wait_timeout(st, std::time::Duration::from_nanos(target - now))
                    .unwrap_or_else(|e| e.into_inner());
                st = guard;
                if st.jobs.len() != n_jobs {
                    // A new kernel arrived: simulate up to when it became
                    // ready (or now, if the engine lags), then add it.
                    let arrived = st.jobs[n_jobs..].iter().map(|j| j.sub.ready).min();
                    let upto = now_ns().min(arrived.unwrap_or(u64::MAX)).clamp(t, target);
                    let busy = advance(&mut st, upto, rate);
                    shm.add_busy(self.phys, busy);
                    continue;
                }
                if now_ns() < target {
                    continue; // woken early: look again
                }
            }
            let busy = advance(&mut st, target, rate);
            shm.add_busy(self.phys, busy);
            let finished = self.finish_done(cfg, shm, trace, &mut st);
            let t = st.t;
            let expired = slice_end.is_some_and(|e| t >= e);
            if !(expired || (cfg.timeslice_ns == 0 && (finished || fallback == Some(t)))) {
                continue;
            }
            if timeslice::others_have_work(shm, self.phys) {
                // Without slices, processes alternate kernel by kernel.
                let mode = if cfg.timeslice_ns == 0 {
                    Preempt::None
                } else {
                    cfg.preempt
                };
                let at = self.preempt(mode, cfg, shm, trace, &mut st);
                self.give_up(shm, &mut st, slice_start, at);
            } else if expired {
                if timeslice::renew(shm, self.phys, slice_start, t) {
                    st.slice = Some(t);
                } else {
                    st.slice = None;
                }
            }
        }
    }

    /// Frees the device at `at` and remembers that this process held it.
    fn give_up(&self, shm: &Shm, st: &mut State, slice_start: u64, at: u64) {
        timeslice::release(shm, self.phys, slice_start, at);
        st.held.push((slice_start, at));
        if st.held.len() > 8 {
            st.held.remove(0);
        }
        st.slice = None;
        st.t = st.t.max(at);
    }

    /// Completes every job with no work left at the engine's time.
    fn finish_done(&self, cfg: &Config, shm: &Shm, trace: Option<&Trace>, st: &mut State) -> bool {
        let t = st.t;
        let mut i = 0;
        let mut any = false;
        while i < st.jobs.len() {
            if st.jobs[i].seg_start.is_some() && st.jobs[i].left <= 0.5 {
                let mut j = st.jobs.swap_remove(i);
                close_segment(trace, &mut j, t, true);
                queue_freed(st, j.queue, t + cfg.gap_ns);
                st.done.insert(j.id, t);
                uncount(shm, self.phys);
                shm.dev(self.phys).busy_until.fetch_max(t, AcqRel);
                any = true;
            } else {
                i += 1;
            }
        }
        if any {
            self.cv.notify_all();
        }
        any
    }

    /// Stops the running kernels at the end of a slice, as the preemption
    /// mode says; returns when the device is free for the next process.
    fn preempt(
        &self,
        mode: Preempt,
        cfg: &Config,
        shm: &Shm,
        trace: Option<&Trace>,
        st: &mut State,
    ) -> u64 {
        let t = st.t;
        let rate = rate(&st.jobs, cfg.sms as f64);
        let mut release = t;
        for j in st.jobs.iter_mut().filter(|j| j.seg_start.is_some()) {
            // Work a running kernel still does before it can stop.
            let more = match mode {
                Preempt::Instruction => 0.0,
                Preempt::Wave => {
                    let done = j.work - j.left;
                    let into = done % j.wave;
                    if into > 0.5 {
                        (j.wave - into).min(j.left)
                    } else {
                        0.0
                    }
                }
                Preempt::None => j.left,
            };
            j.left -= more;
            let stop = t + (more / rate).ceil() as u64;
            release = release.max(stop);
            j.seg_start.get_or_insert(t);
            let last = j.left <= 0.5;
            close_segment(trace, j, stop, last);
            if last {
                j.seg_start = Some(stop); // completed below
            }
        }
        // Kernels that finished while stopping complete at their stop.
        let mut i = 0;
        while i < st.jobs.len() {
            if st.jobs[i].left <= 0.5 && st.jobs[i].seg_start.is_some() {
                let j = st.jobs.swap_remove(i);
                let end = j.seg_start.unwrap_or(t);
                queue_freed(st, j.queue, end + cfg.gap_ns);
                st.done.insert(j.id, end);
                uncount(shm, self.phys);
            } else {
                i += 1;
            }
        }
        self.cv.notify_all();
        shm.add_busy(self.phys, release - t);
        shm.dev(self.phys).busy_until.fetch_max(release, AcqRel);
        release
    }
}

/// Maximum hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS` is 1 to 32).
const MAX_QUEUES: usize = 32;

/// The id of the first job handed over on each hardware queue (`u64::MAX`
/// for an empty queue): only it may run.
fn queue_heads(jobs: &[Job]) -> [u64; MAX_QUEUES] {
    let mut heads = [u64::MAX; MAX_QUEUES];
    for j in jobs {
        heads[j.queue] = heads[j.queue].min(j.id);
    }
    heads
}

/// A job completed on `queue`: what follows it there becomes ready no
/// earlier than `at` (the completion plus the kernel gap).
fn queue_freed(st: &mut State, queue: usize, at: u64) {
    st.queue_free_at[queue] = st.queue_free_at[queue].max(at);
    if let Some(next) = st
        .jobs
        .iter_mut()
        .filter(|j| j.queue == queue)
        .min_by_key(|j| j.id)
    {
        next.sub.ready = next.sub.ready.max(at);
    }
}

fn uncount(shm: &Shm, phys: usize) {
    let _ = shm
        .queued(shm.slot, phys)
        .fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
}

/// Speed of every running kernel (all share the SMs alike).
fn rate(jobs: &[Job], sms: f64) -> f64 {
    let asked: f64 = jobs
        .iter()
        .filter(|j| j.seg_start.is_some())
        .map(|j| j.width)
        .sum();
    if asked <= sms { 1.0 } else { sms / asked }
}

/// Moves running kernels forward from `st.t` to `to` at `rate`.
/// Runs the started kernels up to `to`; returns the device time that
/// passed with at least one of them running (NVML's utilisation counts it).
fn advance(st: &mut State, to: u64, rate: f64) -> u64 {
    let dt = to.saturating_sub(st.t);
    let mut ran = false;
    for j in st.jobs.iter_mut().filter(|j| j.seg_start.is_some()) {
        j.left = (j.left - dt as f64 * rate).max(0.0);
        ran = true;
    }
    st.t = st.t.max(to);
    if ran { dt } else { 0 }
}

fn close_segment(trace: Option<&Trace>, j: &mut Job, end: u64, last: bool) {
    let Some(start) = j.seg_start.take() else {
        return;
    };
    if j.sub.record {
        return; // an event record, not a kernel
    }
    if let Some(tr) = trace {
        tr.kernel(&KernelRecord {
            device: j.sub.device,
            stream: j.sub.stream,
            start_ns: start,
            end_ns: end,
            name: &j.sub.name,
            blocks: j.sub.blocks,
            graph: j.sub.graph,
            kernel: j.id,
            segment: j.segments,
            last,
        });
    }
    j.segments += 1;
}

/// Duration factor of the next kernel: lognormal with mean 1 and
/// `SIMGPU_JITTER` sigma, times a slow drift (`SIMGPU_DRIFT` sigma, one
/// second correlation time).
fn jitter(cfg: &Config, st: &mut State, at: u64) -> f64 {
    let mut log = 0.0;
    if cfg.drift > 0.0 {
        let dt = at.saturating_sub(st.drift_at) as f64 / 1e9;
        let keep = (-dt).exp();
        st.drift = st.drift * keep + cfg.drift * (1.0 - keep * keep).sqrt() * normal(&mut st.rng);
        st.drift_at = at.max(st.drift_at);
        log += st.drift - cfg.drift * cfg.drift / 2.0;
    }
    if cfg.jitter > 0.0 {
        log += cfg.jitter * normal(&mut st.rng) - cfg.jitter * cfg.jitter / 2.0;
    }
    log.exp()
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A standard normal sample (Box–Muller).
fn normal(state: &mut u64) -> f64 {
    let u1 = ((splitmix(state) >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
    let u2 = (splitmix(state) >> 11) as f64 / (1u64 << 53) as f64;
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_samples_have_unit_spread() {
        let mut s = 42;
        let xs: Vec<f64> = (0..20_000).map(|_| normal(&mut s)).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / xs.len() as f64;
        assert!(mean.abs() < 0.03, "{mean}");
        assert!((var - 1.0).abs() < 0.05, "{var}");
    }
}
