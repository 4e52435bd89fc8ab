//! The tuning harness's check of the wake-last cost (shown, not used): the
//! chosen settings with the cost of waking an idle GPU fading as idle GPUs
//! run out (the default) and kept whole, beside the references.

use std::fmt::Write as _;

use crate::simulator::tuning_score::Score;

/// Appends the check's table to `out`: `dilu-paper`'s, `fgd`'s, and the
/// `chosen` settings' scores fading and whole, both families pooled.
pub(super) fn markdown(out: &mut String, chosen: &str, [paper, fgd, fading, whole]: [&Score; 4]) {
    let _ = writeln!(
        out,
        "\n## Check of the wake-last cost, both families (shown, not used)\n\n\
         `dilu` at the chosen settings with the cost of waking an idle GPU fading as idle\n\
         GPUs run out, as the price does (the default), and kept whole. Same traces.\n\n\
         | candidate | GPU-hours vs dilu-paper | risk minus dilu-paper's | allocated at 100% | at 130% | mean of both |\n\
         |---|---:|---:|---:|---:|---:|"
    );
    let rows = [
        ("dilu-paper".to_string(), paper),
        ("fgd".to_string(), fgd),
        (format!("{chosen}, wake-last cost fading"), fading),
        (format!("{chosen}, wake-last cost whole"), whole),
    ];
    for (label, score) in rows {
        let _ = writeln!(
            out,
            "| {label} | {:+.2}% | {:+.4} | {:.2}% | {:.2}% | {:.2}% |",
            100.0 * score.hours(),
            score.mean_risk() - paper.mean_risk(),
            100.0 * score.at_100 / score.protocol_runs.max(1.0),
            100.0 * score.at_130 / score.protocol_runs.max(1.0),
            100.0 * score.allocation(),
        );
    }
    let _ = writeln!(
        out,
        "\nFading against whole: {:+.2} points allocated under FGD's protocol (`fgd` {:+.2} \
         against fading), {:+.2} points of GPU-hours in time, {:+.4} risk.",
        100.0 * (fading.allocation() - whole.allocation()),
        100.0 * (fgd.allocation() - fading.allocation()),
        100.0 * (fading.hours() - whole.hours()),
        fading.mean_risk() - whole.mean_risk(),
    );
}
