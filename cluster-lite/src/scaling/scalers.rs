//! Horizontal scalers, each asked once a second how many instances a
//! function should run, from what a second of serving showed
//! ([`Signals`]). All four act on the same instances, which the node
//! manager scales vertically in every case; they differ in what they read
//! and how lazily they act.
//!
//! * `dilu` (ours): the node manager's signals: how much of its instances'
//!   throughput at their SM limits a function's load uses (the headroom
//!   vertical scaling has left), and whether it is *saturated* (wanted
//!   more SM than it got, or load left over at its limits) and over its
//!   SLO. Out when, in at least 3 of the last 6 seconds, the load used more
//!   than 70% of that throughput or the function was saturated and over
//!   its SLO: vertical scaling is about to run out, or has; it adds as
//!   many instances as bring the recent peak to 50% of it. In after a long
//!   quiet spell (30 of 40 seconds, Dilu's counts) in which one instance
//!   fewer would have served the load at 50% of its throughput at the
//!   limits. The rule is [`DiluRule`], which the Kubernetes autoscaler
//!   runs too. Requests are what an instance is guaranteed; the limits carry
//!   bursts, so instances are counted at their limits, not their requests.
//! * `dilu-paper`: Dilu's published scaler (`scheduling/scaler.py`): a
//!   40-second history of requests per second; out by one when at least
//!   20 seconds saw more than instances × per-instance throughput, in by
//!   one when at least 30 saw fewer than (instances − 1) × throughput; the
//!   history is cleared after each action. Throughput is the profile's at
//!   the request share (the constant Dilu deploys a function with).
//! * `kpa`: Knative's pod autoscaler on concurrency (requests in flight):
//!   stable window 60 s, panic window 6 s (10%), panic when the panic
//!   window asks for at least twice the ready instances, no scale-down
//!   while panicking or within 60 s of it, target 70% of an instance's
//!   in-flight at its request share (Little's law: throughput × latency),
//!   at most halving per decision (Knative's defaults).
//! * `hpa`: Kubernetes' horizontal pod autoscaler on utilisation (load over
//!   the instances' throughput at their requests, as CPU utilisation is
//!   read against the CPU request): every 15 s, desired = ⌈ready ×
//!   utilisation / 0.7⌉ outside a 10% tolerance, scale-down stabilised
//!   over 300 s (the highest recommendation of the window wins).

use std::collections::VecDeque;

use super::service::Service;

/// What one second of serving showed for one function.
#[derive(Debug, Clone, Copy, Default)]
pub struct Signals {
    /// Requests that arrived in the second.
    pub requests: f64,
    /// Instances serving, and those still starting.
    pub ready: usize,
    pub starting: usize,
    /// The node manager's signal: instances wanted more SM than they got,
    /// or were at their limit with load left over.
    pub saturated: bool,
    /// Some requests of the second missed the SLO.
    pub over_slo: bool,
    /// Mean requests in flight (waiting or in a batch).
    pub concurrency: f64,
}

/// A horizontal scaling rule.
pub trait Scaler {
    fn name(&self) -> &'static str;
    /// Instances the function should run (ready and starting), at least 1.
    fn desired(&mut self, signals: &Signals, service: &Service) -> usize;
}

/// Every scaler, by its report name.
pub const SCALER_NAMES: [&str; 4] = ["dilu", "dilu-paper", "kpa", "hpa"];

pub fn scaler_by_name(name: &str) -> Option<Box<dyn Scaler>> {
    Some(match name {
        "dilu" => Box::new(DiluSignals::default()),
        "dilu-paper" => Box::new(DiluPaper::default()),
        "kpa" => Box::new(Kpa::default()),
        "hpa" => Box::new(Hpa::default()),
        _ => return None,
    })
}

fn push<T>(history: &mut VecDeque<T>, value: T, length: usize) {
    if history.len() >= length {
        history.pop_front();
    }
    history.push_back(value);
}

/// Dilu's published rule, with its constants.
#[derive(Debug, Default)]
pub struct DiluPaper {
    history: VecDeque<f64>,
}

const PAPER_HISTORY_S: usize = 40;
const PAPER_OUT_SECONDS: usize = 20;
const PAPER_IN_SECONDS: usize = 30;

impl Scaler for DiluPaper {
    fn name(&self) -> &'static str {
        "dilu-paper"
    }

    fn desired(&mut self, signals: &Signals, service: &Service) -> usize {
        let instances = signals.ready + signals.starting;
        let per_instance = service.throughput(service.request);
        push(&mut self.history, signals.requests, PAPER_HISTORY_S);
        let most = instances as f64 * per_instance;
        let fewer = instances.saturating_sub(1) as f64 * per_instance;
        if self.history.iter().filter(|&&x| x > most).count() >= PAPER_OUT_SECONDS {
            self.history.clear();
            return instances + 1;
        }
        let quiet = self.history.iter().filter(|&&x| x < fewer).count();
        if quiet >= PAPER_IN_SECONDS && instances > 1 {
            self.history.clear();
            return instances - 1;
        }
        instances.max(1)
    }
}

/// dilu's rule on the node manager's signals (module docs), as the
/// simulation feeds it: the load in instances' throughput at their limits.
#[derive(Debug, Default)]
pub struct DiluSignals {
    rule: DiluRule,
}

impl Scaler for DiluSignals {
    fn name(&self) -> &'static str {
        "dilu"
    }

    fn desired(&mut self, signals: &Signals, service: &Service) -> usize {
        let instances = signals.ready + signals.starting;
        let load = signals.requests / service.throughput(service.limit);
        self.rule
            .desired(instances, load, signals.saturated && signals.over_slo)
    }
}

/// dilu's scaling rule itself, asked once a period (a second) by the
/// simulation's `dilu` scaler and by the Kubernetes autoscaler
/// (`crate::autoscaler`), so both decide alike. `load` is how many
/// instances' throughput at their SM limits the period's load used (the
/// simulation: requests over one instance's throughput at its limit; a
/// cluster: the sum of its instances' SM time over their limits);
/// `exhausted`: the node manager saw an instance saturated at its limit and
/// over its SLO.
#[derive(Debug, Default)]
pub struct DiluRule {
    pressure: VecDeque<bool>,
    load: VecDeque<f64>,
    quiet: VecDeque<f64>,
}

/// Periods in the scale-out window, and how many of them must show pressure.
pub const OUT_WINDOW: usize = 6;
pub const OUT_PERIODS: usize = 3;
/// Share of the instances' throughput at their limits the load may use
/// before vertical scaling is about to run out (scale out), and what it
/// should use after scaling out.
const OUT_AT: f64 = 0.7;
const OUT_TO: f64 = 0.5;
/// Share of one instance fewer's throughput at their limits below which a
/// quiet period counts towards scaling in (the rest is kept for bursts).
const IN_BELOW: f64 = 0.5;
/// The scale-in window and its quiet periods (Dilu's 40 and 30 seconds).
pub const IN_WINDOW: usize = PAPER_HISTORY_S;
pub const IN_PERIODS: usize = PAPER_IN_SECONDS;

impl DiluRule {
    /// Instances to run (at least 1), given how many run or start now.
    pub fn desired(&mut self, instances: usize, load: f64, exhausted: bool) -> usize {
        let near_limits = load > OUT_AT * instances as f64;
        push(&mut self.pressure, exhausted || near_limits, OUT_WINDOW);
        push(&mut self.load, load, OUT_WINDOW);
        push(&mut self.quiet, load, IN_WINDOW);
        if self.pressure.iter().filter(|&&p| p).count() >= OUT_PERIODS {
            let peak = self.load.iter().copied().fold(0.0, f64::max);
            let needed = (peak / OUT_TO).ceil() as usize;
            if needed > instances {
                self.pressure.clear();
                self.quiet.clear();
                return needed;
            }
        }
        let fewer = instances.saturating_sub(1) as f64 * IN_BELOW;
        let quiet = self.quiet.iter().filter(|&&x| x < fewer).count();
        if quiet >= IN_PERIODS && instances > 1 {
            self.quiet.clear();
            return instances - 1;
        }
        instances.max(1)
    }
}

/// Knative's KPA (module docs).
#[derive(Debug, Default)]
pub struct Kpa {
    concurrency: VecDeque<f64>,
    panic_until_s: Option<u64>,
    now_s: u64,
}

const KPA_STABLE_S: usize = 60;
const KPA_PANIC_S: usize = 6;
const KPA_TARGET_UTILISATION: f64 = 0.7;

impl Scaler for Kpa {
    fn name(&self) -> &'static str {
        "kpa"
    }

    fn desired(&mut self, signals: &Signals, service: &Service) -> usize {
        self.now_s += 1;
        push(&mut self.concurrency, signals.concurrency, KPA_STABLE_S);
        let instances = signals.ready + signals.starting;
        let target = KPA_TARGET_UTILISATION
            * service.throughput(service.request)
            * service.batch_latency(service.request);
        let mean = |window: usize| {
            let recent: Vec<f64> = self
                .concurrency
                .iter()
                .rev()
                .take(window)
                .copied()
                .collect();
            recent.iter().sum::<f64>() / recent.len().max(1) as f64
        };
        let stable = (mean(KPA_STABLE_S) / target).ceil() as usize;
        let panic = (mean(KPA_PANIC_S) / target).ceil() as usize;
        if panic >= 2 * signals.ready.max(1) {
            self.panic_until_s = Some(self.now_s + KPA_STABLE_S as u64);
        }
        if self.panic_until_s.is_some_and(|until| self.now_s < until) {
            return instances.max(panic).max(stable).max(1);
        }
        self.panic_until_s = None;
        // At most halve per decision (max scale-down rate 2).
        stable.max(instances.div_ceil(2)).max(1)
    }
}

/// Kubernetes' HPA (module docs).
#[derive(Debug, Default)]
pub struct Hpa {
    utilisation: VecDeque<f64>,
    recommendations: VecDeque<usize>,
    now_s: u64,
    current: usize,
}

const HPA_PERIOD_S: u64 = 15;
const HPA_TARGET: f64 = 0.7;
const HPA_TOLERANCE: f64 = 0.1;
const HPA_DOWN_STABILISATION_S: u64 = 300;

impl Scaler for Hpa {
    fn name(&self) -> &'static str {
        "hpa"
    }

    fn desired(&mut self, signals: &Signals, service: &Service) -> usize {
        self.now_s += 1;
        let instances = signals.ready + signals.starting;
        if self.current == 0 {
            self.current = instances.max(1);
        }
        let capacity = signals.ready as f64 * service.throughput(service.request);
        let utilisation = if capacity > 0.0 {
            signals.requests / capacity
        } else {
            HPA_TARGET
        };
        push(&mut self.utilisation, utilisation, HPA_PERIOD_S as usize);
        if !self.now_s.is_multiple_of(HPA_PERIOD_S) {
            return self.current;
        }
        let mean = self.utilisation.iter().sum::<f64>() / self.utilisation.len().max(1) as f64;
        let ready = signals.ready.max(1);
        let ratio = mean / HPA_TARGET;
        let recommendation = if (ratio - 1.0).abs() <= HPA_TOLERANCE {
            instances.max(1)
        } else {
            ((ready as f64 * ratio).ceil() as usize).max(1)
        };
        push(
            &mut self.recommendations,
            recommendation,
            (HPA_DOWN_STABILISATION_S / HPA_PERIOD_S) as usize,
        );
        let highest = self.recommendations.iter().copied().max().unwrap_or(1);
        self.current = if recommendation >= instances {
            recommendation
        } else {
            highest.min(instances)
        };
        self.current
    }
}
