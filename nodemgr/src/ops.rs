//! Operator commands: `dilu status`, `dilu top`, `dilu set`.

use crate::error::{self, Error};
use dilu_abi::node_wire::SmShare;
use dilu_abi::node_wire::{
    self, ColoStatus, FromDaemon, NodeStatus, ScaleAdvice, SpecUpdate, TenantSpec, ToDaemon,
};
use dilu_abi::units::format_size;
use dilu_colocation::DELAY_BUDGET_PPM;
use std::fmt::Write;
use std::path::Path;
use std::time::Duration;

pub use dilu_abi::operator_client::ask;

/// The daemon's whole status, in as many parts as its tenants need.
pub fn fetch_status(socket: &Path) -> error::Result<NodeStatus> {
    dilu_abi::status_parts::fetch(socket, Duration::from_secs(5)).map_err(Error::NodeManager)
}

fn pct(v: f64) -> String {
    format!("{v:.0}%")
}

/// One GPU's line above its tenants' rows.
fn gpu_line(view: &crate::gpu_view::GpuView) -> String {
    let label = view
        .gpu
        .map_or("unplaced".to_string(), |gpu| format!("gpu{gpu}"));
    let busy = match view.utilization {
        Some(u) => format!("{:.0}% busy", u * 100.0),
        None => format!("{:.0}% used by tenants", view.achieved_pct),
    };
    let tenants = match view.tenants.len() {
        0 => "no tenants".to_string(),
        1 => "1 tenant".to_string(),
        n => format!("{n} tenants"),
    };
    let primary = view
        .colo_primary
        .as_ref()
        .map(|p| format!(" · co-location primary {p}"))
        .unwrap_or_default();
    format!(
        "{label} {} · {busy} · {tenants} · requests reserve {:.0}%{primary}",
        view.name, view.reserved_pct
    )
}

/// The status table: the node, then each GPU and its tenants.
pub fn format_status(status: &NodeStatus) -> String {
    let mut out = String::new();
    let work = if status.control_periods > 0 {
        format!(
            " · control CPU {:.3} ms/period (max {:.2} ms)",
            status.control_work_seconds_total * 1e3 / status.control_periods as f64,
            status.control_work_max_ms
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "controller {} · period {} ms · up {:.0} s · {} GPU(s){work}",
        status.controller,
        status.period_ms,
        status.uptime_seconds,
        status.gpus.len()
    );
    let _ = writeln!(
        out,
        "{:<14} {:<7} {:<12} {:>21} {:>9} {:>7} {:>8} {:>9} {:>10} {:>17} {:>8}",
        "TENANT",
        "CLASS",
        "PIDS",
        "MEMORY used/budget",
        "SM req",
        "limit",
        "current",
        "achieved",
        "throttled",
        "p99 / SLO",
        "bubbles"
    );
    for view in crate::gpu_view::by_gpu(status) {
        let _ = writeln!(out, "{}", gpu_line(&view));
        for t in status
            .tenants
            .iter()
            .filter_map(|t| crate::gpu_view::on_gpu(status, t, view.gpu))
        {
            tenant_row(&mut out, &t);
        }
    }
    if status.tenants.is_empty() {
        let _ = writeln!(out, "(no tenants)");
    }
    for t in status.tenants.iter().filter(|t| t.waiting) {
        let (why, fix) = if t.spec.sm_limit == SmShare::NONE {
            (
                "its SM limit is 0",
                format!("`dilu set {} --sm-limit PCT`", t.name),
            )
        } else {
            (
                "other tenants' requests reserve the whole device",
                "lowering one with `dilu set NAME --sm-request PCT`".to_string(),
            )
        };
        let _ = writeln!(
            out,
            "waiting: {} has SM share 0 ({why}); {fix} lets it run",
            t.name
        );
    }
    let granted: Vec<&str> = status
        .tenants
        .iter()
        .filter(|t| t.granted)
        .map(|t| t.name.as_str())
        .collect();
    if !granted.is_empty() {
        let _ = writeln!(
            out,
            "granted by the cluster (DRA claims; change the claim, not `dilu set`): {}",
            granted.join(", ")
        );
    }
    for t in &status.tenants {
        if let Some(reason) = &t.over_admitted {
            let _ = writeln!(
                out,
                "over-admitted: {} was running already and did not fit ({reason}); \
                 held to SM request {} and memory {}",
                t.name,
                t.spec.sm_request,
                t.spec.mem.map_or("unlimited".into(), |b| b.to_string())
            );
        }
    }
    for c in &status.colocation {
        let _ = writeln!(out, "{}", format_colocation(c));
    }
    for s in &status.signals {
        let advice = match s.advice {
            ScaleAdvice::ScaleOut => "scale out",
            ScaleAdvice::ScaleIn => "scale in",
        };
        let on = s.gpu.map(|g| format!(" on gpu{g}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "recommendation: {advice} {}{on} ({}, for {:.0} s)",
            s.tenant, s.reason, s.for_seconds
        );
    }
    out
}

/// One tenant's row of the status table.
fn tenant_row(out: &mut String, t: &dilu_abi::node_wire::TenantStatus) {
    let pids: Vec<String> = t.pids.iter().map(|p| p.to_string()).collect();
    let memory = format!(
        "{}/{}",
        format_size(t.mem_used_bytes),
        t.mem_budget_bytes.map_or("-".into(), format_size)
    );
    let latency = match (t.p99_ms, t.spec.slo_ms) {
        (Some(p), Some(s)) => format!("{p:.1}/{s:.0} ms"),
        (Some(p), None) => format!("{p:.1} ms"),
        (None, Some(s)) => format!("-/{s:.0} ms"),
        (None, None) => "-".into(),
    };
    let _ = writeln!(
        out,
        "{:<14} {:<7} {:<12} {:>21} {:>9} {:>7} {:>8} {:>9} {:>9.2}s {:>17} {:>8}",
        t.name,
        node_wire::class_name(t.spec.class),
        if pids.is_empty() {
            "-".into()
        } else {
            pids.join(",")
        },
        memory,
        pct(t.spec.sm_request.as_percent()),
        pct(t.spec.sm_limit.as_percent()),
        if t.waiting {
            "0% wait".to_string()
        } else {
            pct(t.sm_current_pct)
        },
        format!("{:.1}%", t.sm_achieved_pct),
        t.throttled_seconds_total,
        latency,
        pct(t.bubble_ratio * 100.0)
    );
}

/// One GPU's co-location as one line: gaps seen, how much of their time
/// fillers used, and the primary's slowdown estimate (said to be one).
pub fn format_colocation(c: &ColoStatus) -> String {
    let filled = c.filled_seconds_total / c.gap_seconds_total.max(f64::MIN_POSITIVE);
    let phases = match c.gap_period {
        0 => String::new(),
        1 => " (gaps alike)".into(),
        n => format!(" (phase of a {n}-gap iteration)"),
    };
    format!(
        "co-location gpu{} ({}): primary {} · {} gaps, {:.2} s · filled {:.2} s ({:.0}%) · next gap ~{:.1} ms{} · primary slowdown <= {:.1}% (filler work queued when it returned / its kernel time) · filler launches held {}, paced {}",
        c.device,
        c.group,
        c.primary_tenant,
        c.gaps_seen,
        c.gap_seconds_total,
        c.filled_seconds_total,
        100.0 * filled,
        c.predicted_gap_ms,
        phases,
        100.0 * c.primary_slowdown,
        c.filler_launches_held,
        c.filler_fallbacks,
    ) + &as_if_alone(c)
}

/// How a primary kept as if alone stands against its tail budget: the
/// kernel it accepts, how often fillers pushed its requests over its
/// bound, and whether they wait for the budget (a wait is never silent).
fn as_if_alone(c: &ColoStatus) -> String {
    if !c.kept_as_if_alone {
        return String::new();
    }
    let pushed =
        100.0 * c.requests_pushed_over_total as f64 / (c.requests_judged_total.max(1)) as f64;
    let paused = if c.risky_filling_paused {
        " · filler kernels beyond the tolerance wait: the budget is overdrawn"
    } else {
        ""
    };
    format!(
        " · kept as if alone: tolerates {:.2} ms, {} of {} requests pushed over its bound ({:.2}%, budget {:.1}%), {:.1} left{}",
        c.tolerance_ms,
        c.requests_pushed_over_total,
        c.requests_judged_total,
        pushed,
        DELAY_BUDGET_PPM as f64 / 1e4,
        c.delay_budget_requests,
        paused,
    )
}

pub fn status(socket: &Path, json: bool) -> error::Result<()> {
    let status = fetch_status(socket)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status)
                .map_err(|e| Error::NodeManager(format!("its status as JSON: {e}")))?
        );
    } else {
        print!("{}", format_status(&status));
    }
    Ok(())
}

/// Redraws the table every `interval` until interrupted (or `rounds` times).
/// On a terminal each refresh replaces the last (the screen is cleared, as
/// `top` does); otherwise (a pipe, a file, a test) the tables follow one
/// another, separated by a blank line, with no control characters.
pub fn top(socket: &Path, interval: Duration, rounds: Option<u64>) -> error::Result<()> {
    use std::io::{IsTerminal, Write as _};
    let terminal = std::io::stdout().is_terminal();
    let mut shown = 0;
    loop {
        let status = fetch_status(socket)?;
        let table = format_status(&status);
        if terminal {
            // Clear the screen and go home.
            print!("\x1b[2J\x1b[H{table}");
        } else {
            print!("{}{table}", if shown > 0 { "\n" } else { "" });
        }
        let _ = std::io::stdout().flush();
        shown += 1;
        if rounds.is_some_and(|r| shown >= r) {
            return Ok(());
        }
        std::thread::sleep(interval);
    }
}

pub fn set(socket: &Path, tenant: &str, update: SpecUpdate) -> error::Result<TenantSpec> {
    let answer = ask(
        socket,
        &ToDaemon::Set {
            tenant: tenant.to_string(),
            update,
        },
    )
    .map_err(Error::NodeManager)?;
    match answer {
        FromDaemon::Updated { spec, .. } => Ok(spec),
        FromDaemon::Error { reason } => Err(Error::Refused(reason)),
        other => Err(Error::NodeManager(format!("unexpected answer: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn colo(kept_as_if_alone: bool, risky_filling_paused: bool) -> ColoStatus {
        ColoStatus {
            group: "gpu".into(),
            device: 0,
            primary_tenant: "serve".into(),
            primary_pid: 42,
            gaps_seen: 1800,
            gap_seconds_total: 7.0,
            filled_seconds_total: 4.0,
            primary_busy_seconds_total: 0.7,
            primary_delay_seconds_total: 0.1,
            primary_slowdown: 0.14,
            predicted_gap_ms: 0.5,
            gap_period: 0,
            filler_launches_held: 10,
            filler_fallbacks: 0,
            kept_as_if_alone,
            tolerance_ms: 0.08,
            requests_judged_total: 1800,
            requests_pushed_over_total: 9,
            delay_budget_requests: if risky_filling_paused { -3.3 } else { 0.7 },
            risky_filling_paused,
        }
    }

    #[test]
    fn a_primary_kept_as_if_alone_shows_its_tail_budget_and_why_fillers_wait() {
        let line = format_colocation(&colo(true, false));
        assert!(
            line.contains("kept as if alone: tolerates 0.08 ms, 9 of 1800 requests pushed over its bound (0.50%, budget 0.5%), 0.7 left"),
            "{line}"
        );
        assert!(!line.contains("wait"), "{line}");
        let paused = format_colocation(&colo(true, true));
        assert!(
            paused.ends_with(
                "-3.3 left · filler kernels beyond the tolerance wait: the budget is overdrawn"
            ),
            "{paused}"
        );
        // A primary with an SLO spends its slack instead: no budget shown.
        let with_slo = format_colocation(&colo(false, false));
        assert!(!with_slo.contains("as if alone"), "{with_slo}");
    }
}
