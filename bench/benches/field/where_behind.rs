//! The field benchmark's "where dilu is not ahead" section: for every shape,
//! dilu's rows against each peer's on the primary's figure (p99 against
//! alone; a trainer's iterations/s) and on harvest, each case a peer is
//! ahead classed by what the same run says of it, so that the goal (dilu
//! ahead of every peer on both, in every shape) is answered shape by shape
//! with the reason where it is not met.

use super::{
    AS_IF_ALONE_P99, AS_IF_ALONE_RATE, DILU_NO_SLO, DILU_SLO, DILU_TRAINING, ShapeResult, p,
    p99_ratio_range,
};
use crate::colocation::{harvest, ratio};
use dilu_bench::report::Table;

/// Why a peer is ahead of a dilu row in one shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Ahead on harvest only, and its own primary surely missed the bar
    /// (p99 range wholly over 1.10× alone), with more harvest than fillers
    /// that cannot know the arrivals may take with the p99 kept.
    TailBeyondBound,
    /// Ahead on harvest only, its primary surely over the bar, within that
    /// bound: fillers keeping the p99 could take as much; dilu did not.
    TailWithinBound,
    /// Ahead on harvest only, its trainer under 0.98× alone.
    TrainerSlowed,
    /// Ahead on the primary's figure only, the two p99 ranges overlapping:
    /// this run does not tell them apart.
    NotToldApart,
    /// Any other case: a shortfall of dilu's this section exists to show.
    Shortfall,
}

impl Why {
    /// Its reason, where the section lists it case by case.
    fn text(self) -> &'static str {
        match self {
            Why::TailBeyondBound => "harvest taken from the primary's tail, beyond the bound",
            Why::TailWithinBound => "harvest taken from the primary's tail, within the bound",
            Why::TrainerSlowed => "harvest taken from the trainer's own device time",
            Why::NotToldApart => {
                "a lower p99 ratio, the two ratios' 95% ranges overlapping: not told apart in this run"
            }
            Why::Shortfall => "ahead of dilu with its own primary not surely over the bar",
        }
    }
}

/// One case of a peer ahead of a dilu row.
struct Behind {
    shape: String,
    dilu_row: &'static str,
    peer: String,
    /// The peer's and dilu's primary figure, as printed.
    peer_figure: String,
    dilu_figure: String,
    peer_harvest: f64,
    dilu_harvest: f64,
    why: Why,
}

/// The cases in `results` where a row of `peers` is ahead of a dilu row,
/// and how many pairs were compared.
fn cases(results: &[ShapeResult], peers: &[&str]) -> (Vec<Behind>, usize) {
    let mut behind = Vec::new();
    let mut compared = 0;
    for result in results {
        let dilu_rows: &[&'static str] = if result.inference {
            &[DILU_SLO, DILU_NO_SLO]
        } else {
            &[DILU_TRAINING]
        };
        let alone = &result.alone;
        let find = |name: &str| {
            result
                .rows
                .iter()
                .find(|(n, _)| n == name)
                .and_then(|(_, o)| o.as_ref().ok())
        };
        for &dilu_row in dilu_rows {
            let Some(dilu) = find(dilu_row) else { continue };
            for &peer in peers {
                let Some(run) = find(peer) else { continue };
                compared += 1;
                let (peer_h, dilu_h) = (harvest(run, alone), harvest(dilu, alone));
                let ahead_on_harvest = peer_h > dilu_h;
                let (ahead_on_figure, peer_surely_off, overlap, figures) = if result.inference {
                    let r = |x| ratio(p(x, "p99_ms"), p(alone, "p99_ms"));
                    let (peer_low, peer_high) = p99_ratio_range(run, alone);
                    let (dilu_low, dilu_high) = p99_ratio_range(dilu, alone);
                    let overlap = peer_high.is_none_or(|h| h >= dilu_low)
                        && dilu_high.is_none_or(|h| h >= peer_low);
                    (
                        r(run) < r(dilu),
                        peer_low > AS_IF_ALONE_P99,
                        overlap,
                        (format!("{:.2}×", r(run)), format!("{:.2}×", r(dilu))),
                    )
                } else {
                    let r = |x| {
                        ratio(
                            p(x, "iterations_per_second"),
                            p(alone, "iterations_per_second"),
                        )
                    };
                    (
                        r(run) > r(dilu),
                        r(run) < AS_IF_ALONE_RATE,
                        false,
                        (format!("{:.2}×", r(run)), format!("{:.2}×", r(dilu))),
                    )
                };
                if !ahead_on_harvest && !ahead_on_figure {
                    continue;
                }
                let why = if ahead_on_harvest && !ahead_on_figure && peer_surely_off {
                    match result.as_if_alone_bound {
                        _ if !result.inference => Why::TrainerSlowed,
                        Some(bound) if peer_h > bound => Why::TailBeyondBound,
                        _ => Why::TailWithinBound,
                    }
                } else if ahead_on_figure && !ahead_on_harvest && overlap {
                    Why::NotToldApart
                } else {
                    Why::Shortfall
                };
                behind.push(Behind {
                    shape: result.shape.clone(),
                    dilu_row,
                    peer: peer.to_string(),
                    peer_figure: figures.0,
                    dilu_figure: figures.1,
                    peer_harvest: peer_h,
                    dilu_harvest: dilu_h,
                    why,
                });
            }
        }
    }
    (behind, compared)
}

/// The section: counts by reason (the peers whose harvest was taken from
/// the primary's tail within the bound named), then every case this run
/// does not explain by the peer's primary: the ones dilu is to answer for.
pub(crate) fn section(results: &[ShapeResult], peers: &[&str]) -> String {
    let (behind, compared) = cases(results, peers);
    let count = |why: Why| behind.iter().filter(|b| b.why == why).count();
    let within_by_peer: Vec<String> = peers
        .iter()
        .filter_map(|&peer| {
            let n = behind
                .iter()
                .filter(|b| b.why == Why::TailWithinBound && b.peer == peer)
                .count();
            (n > 0).then(|| format!("{peer} {n}"))
        })
        .collect();
    let listed = |b: &&Behind| matches!(b.why, Why::NotToldApart | Why::Shortfall);
    let mut doc = format!(
        "## Where dilu is not ahead of a peer\n\n\
         Each shape's `{DILU_SLO}` and `{DILU_NO_SLO}` rows (training: `{DILU_TRAINING}`) against \
         each peer's row (time slicing, static shares, HAMi-core, XSched, TGS): a peer is ahead \
         where its primary's figure (p99 over alone's, lower is better; a trainer's \
         iterations/s over alone's, higher) or its harvest is better than dilu's. Of {compared} \
         pairs, a peer is ahead in {}:\n\n\
         - on harvest only, its p99 range wholly over {AS_IF_ALONE_P99:.2}× alone: {} beyond the \
         as-if-alone bound (no sharing that keeps the p99 takes that much), {} within it \
         ({}), where fillers keeping the p99 could take as much and dilu took less;\n\
         - on harvest only, its trainer under {AS_IF_ALONE_RATE:.2}× alone: {};\n\
         - on the p99 ratio only, within each other's 95% ranges (not told apart in this \
         run): {};\n\
         - otherwise: {}.\n\n",
        behind.len(),
        count(Why::TailBeyondBound),
        count(Why::TailWithinBound),
        if within_by_peer.is_empty() {
            "none".to_string()
        } else {
            within_by_peer.join(", ")
        },
        count(Why::TrainerSlowed),
        count(Why::NotToldApart),
        count(Why::Shortfall),
    );
    if behind.iter().any(|b| listed(&b)) {
        doc.push_str("The last two kinds, case by case:\n\n");
        let mut table = Table::new(&[
            "shape",
            "dilu row",
            "peer",
            "primary: peer / dilu",
            "harvest: peer / dilu",
            "why",
        ]);
        for b in behind.iter().filter(listed) {
            table.row(vec![
                b.shape.clone(),
                b.dilu_row.to_string(),
                b.peer.clone(),
                format!("{} / {}", b.peer_figure, b.dilu_figure),
                format!(
                    "{:.1}% / {:.1}%",
                    b.peer_harvest * 100.0,
                    b.dilu_harvest * 100.0
                ),
                b.why.text().to_string(),
            ]);
        }
        doc.push_str(&table.markdown());
        doc.push('\n');
    }
    doc
}
