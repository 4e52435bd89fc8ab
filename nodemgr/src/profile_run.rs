//! `dilu profile`: finds a function's batch size, SM request and SM limit.
//!
//! The search is `dilu_profile`'s; this module supplies the two ways to
//! measure one configuration and the command's input and output:
//! - `--table FILE.csv`: a measured table (nothing runs);
//! - `-- CMD`: the program itself, for one bounded trial per configuration,
//!   under the interposer beside an embedded node manager (static
//!   controller) that holds it at the trial's SM share. The program gets the
//!   batch size as `DILU_BATCH` and keeps running from one trial to the
//!   next of the same batch size, its share changed live (as `dilu set`
//!   does): a server that takes a minute to load its framework loads it once
//!   per batch size, not once per trial. A new program's trial starts at its
//!   first request (or synchronisation), which it has `--startup-seconds`
//!   to reach. Each request it reports with
//!   `dilu_report_latency` is one batch, so the trial's mean reported
//!   latency is the batch latency and reports × batch / time the throughput.
//!   A program that reports nothing is measured by its sync-to-sync
//!   intervals (the telemetry's p99, in power-of-two buckets: coarse, and
//!   said so). The first quarter of each trial is warm-up (the program
//!   settling at its new share) and not counted.
//!   A trial in which nothing was measured (a program gone quiet) is run
//!   once more, twice as long, before its setting is called unable to run.
//!
//! Ctrl-C (or SIGTERM) stops the trial's program, the node manager and the
//! scratch directory, and leaves nothing behind.

use crate::artifacts;
use crate::config::Config;
use crate::daemon::Daemon;
use crate::error::{self, Error};
use crate::launch::{self, LaunchSpec};
use dilu_abi::node_wire::SmShare;
use dilu_abi::node_wire::{SOCKET_ENV, SpecUpdate, WorkClass};
use dilu_profile::measure::{Measure, Trials};
use dilu_profile::profile::{self, Class, Question};
use dilu_profile::search::Method;
use dilu_profile::table::ProfileTable;
use dilu_profile::{Config as Trial, Grid, Sample};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct ProfileSpec {
    pub class: Class,
    pub slo_ms: Option<f64>,
    /// Batch class: the batch to profile at (default: the grid's largest).
    pub batch: Option<u32>,
    pub method: Method,
    pub table: Option<PathBuf>,
    pub command: Vec<String>,
    pub sim: bool,
    pub trial_seconds: f64,
    /// How long a newly started program has to reach its first request.
    pub startup_seconds: f64,
    pub max_batch: u32,
    pub sm_step: u32,
    /// A trial meets the SLO only with this fraction to spare (programs only).
    pub headroom: f64,
    pub output: PathBuf,
    pub json: bool,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

fn catch_interrupts() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(signal, on_interrupt as *const () as libc::sighandler_t) };
    }
}

/// The flags' own checks, before anything runs.
fn validate(spec: &ProfileSpec) -> Result<(), String> {
    if spec.class == Class::Latency && spec.slo_ms.is_none() {
        return Err("a latency-class profile needs --slo-ms".into());
    }
    if let Some(slo) = spec.slo_ms
        && !(slo.is_finite() && slo > 0.0)
    {
        return Err(format!(
            "--slo-ms {slo} must be a positive number of milliseconds"
        ));
    }
    Ok(())
}

pub fn run(spec: &ProfileSpec) -> error::Result<ExitCode> {
    validate(spec).map_err(Error::Invalid)?;
    let mut progress = |trial: Trial, sample: Option<Sample>| {
        let what = sample.map_or("cannot run".to_string(), |s| {
            format!(
                "{:.3} ms per batch, {:.1} samples/s",
                s.latency_s * 1e3,
                s.throughput
            )
        });
        eprintln!(
            "dilu profile: batch {:>4} at SM {:>3}%: {what}",
            trial.batch, trial.sm
        );
    };
    let (result, headroom) = match (&spec.table, spec.command.is_empty()) {
        (Some(_), false) => {
            return Err(Error::Invalid(
                "give either --table FILE or a command after --, not both".into(),
            ));
        }
        (None, true) => {
            return Err(Error::Invalid(
                "nothing to profile: give --table FILE.csv or a command after --".into(),
            ));
        }
        (Some(path), true) => {
            let mut table = ProfileTable::load(path).map_err(Error::Invalid)?;
            let grid = table.grid();
            let mut trials = Trials::with_progress(&mut table, &mut progress);
            (profile::find(&mut trials, &grid, &question(spec, 0.0)), 0.0)
        }
        (None, false) => {
            let grid = Grid::standard(spec.max_batch, spec.sm_step).map_err(Error::Invalid)?;
            catch_interrupts();
            let mut program = ProgramTrials::start(spec)?;
            let result = {
                let mut trials = Trials::with_progress(&mut program, &mut progress);
                profile::find(&mut trials, &grid, &question(spec, spec.headroom))
            };
            program.stop();
            (result, spec.headroom)
        }
    };
    // No configuration meets the question (or the program never ran):
    // the question, or the program, needs changing.
    let mut profile = result.map_err(Error::Invalid)?;
    // The file records the SLO asked for, not the tightened one searched.
    profile.slo_ms = spec.slo_ms;
    std::fs::write(&spec.output, profile.to_toml()).map_err(|e| {
        Error::System(format!(
            "cannot write the profile to {}: {e}",
            spec.output.display()
        ))
    })?;
    if spec.json {
        println!(
            "{}",
            serde_json::to_string(&profile)
                .map_err(|e| Error::System(format!("the profile as JSON: {e}")))?
        );
    } else {
        println!(
            "batch {}, SM request {}% ({:.1} samples/s), SM limit {}% ({:.1} samples/s); {} configurations measured{}",
            profile.batch,
            profile.sm_request,
            profile.throughput_at_request,
            profile.sm_limit,
            profile.throughput_at_limit,
            profile.trials,
            if headroom > 0.0 {
                format!(" (SLO met with {:.0}% to spare)", headroom * 100.0)
            } else {
                String::new()
            }
        );
        println!("profile written to {}", spec.output.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn question(spec: &ProfileSpec, headroom: f64) -> Question {
    Question {
        class: spec.class,
        slo_s: spec.slo_ms.map(|ms| ms / 1e3 * (1.0 - headroom)),
        batch: spec.batch,
        method: spec.method,
    }
}

/// Runs the program once per configuration beside an embedded node manager.
struct ProgramTrials {
    daemon: Option<Daemon>,
    scratch: PathBuf,
    instance: String,
    command: Vec<String>,
    sim: bool,
    class: WorkClass,
    trial: Duration,
    startup: Duration,
    next: u32,
    /// The program of the last trial, kept for the next trial of its batch.
    running: Option<Running>,
}

/// A trial's program left running for the next trial of the same batch.
struct Running {
    child: Child,
    tenant: String,
    batch: u32,
    log: PathBuf,
}

impl ProgramTrials {
    fn start(spec: &ProfileSpec) -> error::Result<ProgramTrials> {
        if !(0.5..=600.0).contains(&spec.trial_seconds) {
            return Err(Error::Invalid(format!(
                "--trial-seconds {} must be from 0.5 to 600",
                spec.trial_seconds
            )));
        }
        if !(1.0..=3600.0).contains(&spec.startup_seconds) {
            return Err(Error::Invalid(format!(
                "--startup-seconds {} must be from 1 to 3600",
                spec.startup_seconds
            )));
        }
        artifacts::find(artifacts::INTERPOSER_FILE)?;
        let tag = format!("profile-{}", std::process::id());
        let scratch = std::env::temp_dir().join(format!("dilu-{tag}"));
        std::fs::create_dir_all(&scratch)
            .map_err(|e| Error::System(format!("{}: {e}", scratch.display())))?;
        let config = Config {
            socket: scratch.join("nodemgr.sock"),
            run_dir: scratch.join("run"),
            metrics: None,
            controller: "static".into(),
            ..Config::default()
        };
        let daemon = Daemon::start(config).inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&scratch);
        })?;
        Ok(ProgramTrials {
            daemon: Some(daemon),
            scratch,
            instance: tag,
            command: spec.command.clone(),
            sim: spec.sim,
            class: match spec.class {
                Class::Latency => WorkClass::Latency,
                Class::Batch => WorkClass::Batch,
            },
            trial: Duration::from_secs_f64(spec.trial_seconds),
            startup: Duration::from_secs_f64(spec.startup_seconds),
            next: 0,
            running: None,
        })
    }

    fn stop(&mut self) {
        self.end_program();
        if let Some(daemon) = self.daemon.take() {
            daemon.stop();
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }

    fn spawn(&self, tenant: &str, trial: Trial, log: &Path) -> Result<Child, String> {
        let daemon = self.daemon.as_ref().ok_or("the node manager has stopped")?;
        let (program, args) = self.command.split_first().ok_or("no command")?;
        let share = SmShare::percent(f64::from(trial.sm));
        let env = launch::environment(&LaunchSpec {
            sim: self.sim,
            mem: None,
            sm: None,
            tenant: Some(tenant.to_string()),
            socket: None,
            class: Some(self.class),
            slo_ms: None,
            sm_request: Some(share),
            sm_limit: Some(share),
            batch: None,
            colo: None,
            gpus: 1,
            cpu_nice: None,
            command: Vec::new(),
        })
        .map_err(|e| e.to_string())?;
        let log = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        Command::new(program)
            .args(args)
            .envs(env)
            .env("DILU_BATCH", trial.batch.to_string())
            .env(SOCKET_ENV, &daemon.shared.config.socket)
            .env("SIMGPU_INSTANCE", &self.instance)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            // Its own process group, so a trial's whole process tree stops.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start {program}: {e}"))
    }
}

impl Drop for ProgramTrials {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the node manager reports of the trial's tenant at one instant.
#[derive(Clone, Copy)]
struct Reading {
    at: Instant,
    reports: u64,
    latency_seconds: f64,
}

fn stop_group(child: &mut Child) {
    let group = child.id() as libc::pid_t;
    // SAFETY: signalling a process group this module created.
    unsafe { libc::kill(-group, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above; whatever is left of the group is killed.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let _ = child.wait();
}

fn last_line(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|text| {
            text.lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// What one run of the program at a trial's setting gave.
enum Attempt {
    Measured(Sample),
    /// The program exited with an error (said already).
    Failed,
    /// It ran, but neither reported a latency nor synchronised in time;
    /// the last line of its log.
    NothingMeasured(String),
    /// It never reached its first request within the start-up allowance;
    /// the last line of its log.
    NeverStarted(String),
}

impl Measure for ProgramTrials {
    fn measure(&mut self, trial: Trial) -> Result<Option<Sample>, String> {
        // A program that goes quiet within a trial (a loaded host) gets one
        // more, twice as long, before the setting is called unable to run.
        let mut length = self.trial;
        for attempt in 0..2 {
            match self.attempt(trial, length)? {
                Attempt::Measured(sample) => return Ok(Some(sample)),
                Attempt::Failed => return Ok(None),
                Attempt::NeverStarted(last_words) => {
                    eprintln!(
                        "dilu profile: batch {}: the program reached no request (no latency reported, no synchronisation) within {:.0} s of its start (--startup-seconds){}",
                        trial.batch,
                        self.startup.as_secs_f64(),
                        match last_words {
                            line if line.is_empty() => String::new(),
                            line => format!("; its last words: {line}"),
                        }
                    );
                    return Ok(None);
                }
                Attempt::NothingMeasured(last_words) if attempt == 1 => {
                    eprintln!(
                        "dilu profile: batch {} at SM {}%: nothing was measured (no latency reported, no synchronisation seen){}",
                        trial.batch,
                        trial.sm,
                        match last_words {
                            line if line.is_empty() => String::new(),
                            line => format!("; its last words: {line}"),
                        }
                    );
                }
                Attempt::NothingMeasured(_) => {
                    eprintln!(
                        "dilu profile: batch {} at SM {}%: nothing measured in {:.1} s; trying once more for twice as long",
                        trial.batch,
                        trial.sm,
                        length.as_secs_f64()
                    );
                    length *= 2;
                }
            }
        }
        Ok(None)
    }
}

impl ProgramTrials {
    fn end_program(&mut self) {
        if let Some(mut running) = self.running.take() {
            stop_group(&mut running.child);
        }
    }

    /// The program for `trial`: the one left running by the last trial when
    /// it has the same batch size (its share changed live), else a new one.
    /// Returns whether it was already running.
    fn program_for(&mut self, trial: Trial) -> Result<bool, String> {
        if let Some(running) = &mut self.running
            && running.batch == trial.batch
            && matches!(running.child.try_wait(), Ok(None))
        {
            let share = SmShare::percent(f64::from(trial.sm));
            let update = SpecUpdate {
                sm_request: Some(share),
                sm_limit: Some(share),
                ..SpecUpdate::default()
            };
            let daemon = self.daemon.as_ref().ok_or("the node manager has stopped")?;
            daemon
                .shared
                .registry
                .lock()
                .expect("registry lock")
                .update(&running.tenant, &update)
                .map_err(|e| e.to_string())?;
            return Ok(true);
        }
        self.end_program();
        self.next += 1;
        let tenant = format!("{}-{}", self.instance, self.next);
        let log = self.scratch.join(format!("trial-{}.log", self.next));
        let child = self.spawn(&tenant, trial, &log)?;
        self.running = Some(Running {
            child,
            tenant,
            batch: trial.batch,
            log,
        });
        Ok(false)
    }

    fn attempt(&mut self, trial: Trial, length: Duration) -> Result<Attempt, String> {
        let reused = self.program_for(trial)?;
        let mut running = self.running.take().expect("program_for started one");
        let tenant = running.tenant.clone();
        let started = Instant::now();
        // A new program's trial runs from its first request (or
        // synchronisation): its start-up is not the configuration's cost.
        let mut origin = reused.then_some(started);
        let mut said_waiting = false;
        let warm_up = length / 4;
        let (mut first, mut last, mut peak, mut proxy_p99) =
            (None::<Reading>, None::<Reading>, None::<u64>, None);
        let mut exit = None;
        loop {
            match origin {
                Some(origin) if origin.elapsed() >= length => break,
                None if started.elapsed() >= self.startup => break,
                None if !said_waiting && started.elapsed() >= Duration::from_secs(10) => {
                    eprintln!(
                        "dilu profile: batch {}: the program has not reached its first request after 10 s; waiting up to {:.0} s (--startup-seconds)",
                        trial.batch,
                        self.startup.as_secs_f64()
                    );
                    said_waiting = true;
                }
                _ => {}
            }
            if INTERRUPTED.load(Ordering::Relaxed) {
                stop_group(&mut running.child);
                self.stop();
                return Err(
                    "interrupted: the trial's program and the node manager were stopped".into(),
                );
            }
            if let Ok(Some(status)) = running.child.try_wait() {
                exit = Some(status);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            let daemon = self.daemon.as_ref().ok_or("the node manager has stopped")?;
            let status = daemon.shared.status();
            let Some(t) = status.tenants.iter().find(|t| t.name == tenant) else {
                continue;
            };
            peak = peak.max(Some(t.mem_used_bytes));
            proxy_p99 = t.p99_ms.or(proxy_p99);
            let now = Instant::now();
            if origin.is_none() && (t.latency_reports_total > 0 || t.p99_ms.is_some()) {
                origin = Some(now);
            }
            let Some(origin) = origin else { continue };
            let reading = Reading {
                at: now,
                reports: t.latency_reports_total,
                latency_seconds: t.latency_seconds_total,
            };
            if first.is_none() && origin.elapsed() >= warm_up {
                first = Some(reading);
            }
            last = Some(reading);
        }
        let log = running.log.clone();
        if exit.is_none() && origin.is_some() {
            // Kept for the next trial of this batch size.
            self.running = Some(running);
        } else if exit.is_none() {
            stop_group(&mut running.child);
        }
        if let Some(status) = exit.filter(|s| !s.success()) {
            eprintln!(
                "dilu profile: batch {} at SM {}%: the program failed ({status}): {}",
                trial.batch,
                trial.sm,
                last_line(&log)
            );
            return Ok(Attempt::Failed);
        }
        if origin.is_none() {
            return Ok(Attempt::NeverStarted(last_line(&log)));
        }
        let memory_peak = peak.filter(|b| *b > 0);
        if let (Some(a), Some(b)) = (first, last)
            && b.reports > a.reports
        {
            let count = (b.reports - a.reports) as f64;
            let seconds = b.at.duration_since(a.at).as_secs_f64().max(1e-3);
            return Ok(Attempt::Measured(Sample {
                latency_s: (b.latency_seconds - a.latency_seconds) / count,
                throughput: count * f64::from(trial.batch) / seconds,
                memory_peak,
            }));
        }
        match proxy_p99 {
            Some(ms) if ms > 0.0 => {
                eprintln!(
                    "dilu profile: the program reported no latency (dilu_report_latency); using its sync-to-sync intervals (coarse)"
                );
                Ok(Attempt::Measured(Sample {
                    latency_s: ms / 1e3,
                    throughput: f64::from(trial.batch) / (ms / 1e3),
                    memory_peak,
                }))
            }
            _ => Ok(Attempt::NothingMeasured(last_line(&log))),
        }
    }
}
