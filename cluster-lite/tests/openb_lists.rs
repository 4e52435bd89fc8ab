//! `dilu-cluster simulate --pods --nodes` on pod lists shaped like each of
//! openb's variants (fixtures in `tests/data/openb/`): a list without times
//! runs under FGD's protocol, a replay asked of it says why it cannot, and a
//! bad row is named by its line.

use std::path::PathBuf;
use std::process::{Command, Output};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/openb")
        .join(name)
}

fn simulate(pods: &str, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dilu-cluster"))
        .arg("simulate")
        .arg("--pods")
        .arg(fixture(pods))
        .arg("--nodes")
        .arg(fixture("nodes.csv"))
        .args(extra)
        .output()
        .expect("dilu-cluster runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_list_without_times_runs_under_fgds_protocol() {
    let out = simulate(
        "pods_multigpu.csv",
        &["--protocol", "fgd", "--policy", "dilu"],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("from 6 records"),
        "the six pods are read, the one without GPUs too: {stdout}"
    );
    assert!(
        stdout.contains("without GPUs) from"),
        "the drawn pods without GPUs are counted: {stdout}"
    );
    assert!(
        stderr.contains("columns absent: gpu_spec, qos"),
        "the absent columns are said: {stderr}"
    );
}

#[test]
fn a_replay_of_a_list_without_times_says_why_it_cannot() {
    let out = simulate("pods_multigpu.csv", &["--policy", "dilu"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("cannot be replayed") && stderr.contains("--protocol fgd"),
        "{stderr}"
    );
}

#[test]
fn a_bad_row_is_named_by_its_line() {
    let out = simulate("pods_bad_row.csv", &["--policy", "dilu"]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("line 3: deletion_time \"oops\""),
        "{stderr}"
    );
}

#[test]
fn power_aware_policies_run_by_name_and_their_settings_need_them() {
    let out = simulate(
        "pods_multigpu.csv",
        &[
            "--protocol",
            "fgd",
            "--policy",
            "fgd,pwr-fgd,dilu-power",
            "--power-weight",
            "0.5",
            "--pwr-fgd-weights",
            "100,900",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    for row in ["| pwr-fgd |", "| dilu-power |", "| policy (kW drawn) |"] {
        assert!(stdout.contains(row), "{row} in:\n{stdout}");
    }
    // A setting for a policy not asked for is an error, not ignored.
    let out = simulate(
        "pods_multigpu.csv",
        &[
            "--protocol",
            "fgd",
            "--policy",
            "dilu",
            "--power-weight",
            "0.5",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--power-weight applies to --policy dilu-power only"),
        "{}",
        text(&out.stderr)
    );
    let out = simulate(
        "pods_multigpu.csv",
        &[
            "--protocol",
            "fgd",
            "--policy",
            "pwr-fgd",
            "--pwr-fgd-weights",
            "0,0",
        ],
    );
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("rank nothing"),
        "{}",
        text(&out.stderr)
    );
}
