//! End-to-end tests: `libdilu_interposer.so` preloaded into a C client that
//! reaches a fake driver (`tests/c/fakecuda.c`, built here as
//! `libcuda.so.1`) the ways real CUDA programs do: cudart's
//! `cuGetProcAddress` path, `dlsym` of exact ABI names, and direct linking.
//! No GPU needed; needs `cc`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

struct Fixture {
    dir: PathBuf,
    interposer: PathBuf,
    client: PathBuf,
    alt_driver: PathBuf,
}

fn run_ok(cmd: &mut Command) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Builds the interposer (cargo does not build a cdylib-only crate for its
/// integration tests) and compiles the fake driver and the client, once.
fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        // target/<profile>/deps/preload-<hash> -> target/<profile>/
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "-p", "dilu-interposer"]);
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(other) => {
                build.args(["--profile", other]);
            }
            None => panic!("unexpected test binary location {exe:?}"),
        }
        run_ok(build.current_dir(MANIFEST_DIR));
        let interposer = profile_dir.join("libdilu_interposer.so");
        assert!(interposer.exists(), "{interposer:?} missing after build");

        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("interposer-preload-{}", std::process::id()));
        let alt = dir.join("alt");
        std::fs::create_dir_all(&alt).unwrap();
        let c = Path::new(MANIFEST_DIR).join("tests/c");
        let driver = dir.join("libcuda.so.1");
        run_ok(
            Command::new("cc")
                .args(["-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-Bsymbolic"])
                .args(["-Wl,-soname,libcuda.so.1", "-o"])
                .arg(&driver)
                .arg(c.join("fakecuda.c")),
        );
        let alt_driver = alt.join("libcuda-alt.so");
        run_ok(
            Command::new("cc")
                .args(["-shared", "-fPIC", "-Wall", "-Werror", "-Wl,-Bsymbolic"])
                .args(["-DFAKE_TAG=\"alt:\"", "-Wl,-soname,libcuda-alt.so", "-o"])
                .arg(&alt_driver)
                .arg(c.join("fakecuda.c")),
        );
        let client = dir.join("client");
        run_ok(
            Command::new("cc")
                .args(["-Wall", "-Werror", "-o"])
                .arg(&client)
                .arg(c.join("client.c"))
                .arg("-L")
                .arg(&dir)
                .args(["-l:libcuda.so.1", "-ldl", "-lpthread"]),
        );
        Fixture {
            dir,
            interposer,
            client,
            alt_driver,
        }
    })
}

struct Run {
    out: Output,
    stdout: String,
    /// Parsed `DILU_CALL_REPORT` line, if one was written.
    report: Option<Value>,
    /// Lines the fake driver logged (one per real call).
    driver_log: Vec<String>,
}

/// Runs the client in `mode` with the interposer preloaded (unless
/// `preload` is false); `tag` names this run's report and log files.
fn client(tag: &str, preload: bool, args: &[&str], env: &[(&str, &str)]) -> Run {
    client_in(&fixture().dir, tag, preload, args, env)
}

/// As [`client`], with `libcuda.so.1` taken from `lib_dir`.
fn client_in(lib_dir: &Path, tag: &str, preload: bool, args: &[&str], env: &[(&str, &str)]) -> Run {
    let f = fixture();
    let report = f.dir.join(format!("{tag}.report.jsonl"));
    let log = f.dir.join(format!("{tag}.driver.log"));
    let _ = std::fs::remove_file(&report);
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new(&f.client);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", lib_dir)
        .env("FAKECUDA_LOG", &log)
        .env("DILU_CALL_REPORT", &report)
        .env_remove("DILU_LOG")
        .env_remove("DILU_REAL_LIBCUDA")
        .env_remove("LD_PRELOAD");
    if preload {
        cmd.env("LD_PRELOAD", &f.interposer);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let report = std::fs::read_to_string(&report).ok().map(|s| {
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 1, "one report line per process: {s}");
        serde_json::from_str(lines[0]).expect("report is JSON")
    });
    let driver_log = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect();
    Run {
        out,
        stdout,
        report,
        driver_log,
    }
}

impl Run {
    fn assert_ok(&self) -> &Self {
        assert!(
            self.out.status.success() && self.stdout.ends_with("ok\n"),
            "client failed ({:?}):\n{}\nstderr:\n{}",
            self.out.status,
            self.stdout,
            String::from_utf8_lossy(&self.out.stderr)
        );
        self
    }

    fn report(&self) -> &Value {
        self.report.as_ref().expect("DILU_CALL_REPORT written")
    }

    fn calls(&self) -> HashMap<String, u64> {
        self.report()["calls"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
            .collect()
    }

    /// Answer printed by the client for `what` ("<object>:<symbol>").
    fn answer(&self, what: &str) -> &str {
        let prefix = format!("{what} -> ");
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .unwrap_or_else(|| panic!("no `{what}` line in:\n{}", self.stdout))
    }

    fn driver_calls(&self, name: &str) -> usize {
        self.driver_log
            .iter()
            .filter(|l| l.split(' ').next() == Some(name))
            .count()
    }
}

const US: &str = "libdilu_interposer.so";

#[test]
fn cudart_style_lookups_are_wrapped_for_every_flags_value() {
    let run = client("gpa", true, &["gpa"], &[]);
    run.assert_ok();
    for (what, sym) in [
        ("dlsym cuGetProcAddress_v2", "cuGetProcAddress_v2"),
        ("gpa cuGetProcAddress@11030", "cuGetProcAddress"),
        ("gpa cuGetProcAddress@12000", "cuGetProcAddress_v2"),
        ("gpa cuMemAlloc@3020", "cuMemAlloc_v2"),
        ("gpa cuLaunchKernel@12000/0", "cuLaunchKernel"),
        ("gpa cuLaunchKernel@12000/2", "cuLaunchKernel_ptsz"),
        ("gpa cuStreamSynchronize@7000/2", "cuStreamSynchronize_ptsz"),
    ] {
        assert_eq!(run.answer(what), format!("{US}:{sym}"), "{what}");
    }
    // Not in the table: handed out untouched.
    assert_eq!(
        run.answer("gpa cuDriverGetVersion@2020"),
        "libcuda.so.1:cuDriverGetVersion"
    );

    let calls = run.calls();
    for (name, n) in [
        ("cuMemAlloc_v2", 1),
        ("cuLaunchKernel", 1),
        ("cuLaunchKernel_ptsz", 1),
        ("cuStreamSynchronize_ptsz", 1),
        ("cuStreamSynchronize", 0),
        ("cuCtxSynchronize", 1),
        ("cuMemFree_v2", 0),
    ] {
        assert_eq!(calls[name], n, "{name}");
        assert_eq!(run.driver_calls(name), n as usize, "driver saw {name}");
    }
    let lookups = &run.report()["lookups"];
    assert_eq!(lookups["flags0"], 7);
    assert_eq!(lookups["flags1"], 1);
    assert_eq!(lookups["flags2"], 2);
    assert_eq!(lookups["other"], 0);
    // 2x cuGetProcAddress, cuMemAlloc, 2x cuLaunchKernel,
    // cuStreamSynchronize, cuCtxSynchronize.
    assert_eq!(lookups["wrapped"], 7);
    assert_eq!(run.report()["dlsym_wrapped"], 1);
    assert!(run.report()["pid"].as_u64().unwrap() > 0);

    // Arguments reach the driver unchanged.
    assert!(
        run.driver_log.contains(
            &"cuLaunchKernel f=0xf1 grid=1,2,3 block=4,5,6 smem=7 stream=0x5 params=0x8 extra=0x9"
                .to_owned()
        )
    );
    assert!(run.driver_log.contains(
        &"cuLaunchKernel_ptsz f=0xf2 grid=11,12,13 block=14,15,16 smem=17 stream=(nil) params=(nil) extra=(nil)"
            .to_owned()
    ));
    assert!(run.driver_log.contains(&"cuMemAlloc_v2 n=4096".to_owned()));
}

#[test]
fn dlsym_of_abi_names_is_wrapped_and_rtld_next_is_callers() {
    let run = client("dlsym", true, &["dlsym"], &[]);
    run.assert_ok();
    assert_eq!(
        run.answer("dlsym cuMemAlloc_v2"),
        format!("{US}:cuMemAlloc_v2")
    );
    assert_eq!(
        run.answer("dlsym cuLaunchKernel_ptsz"),
        format!("{US}:cuLaunchKernel_ptsz")
    );
    assert_eq!(
        run.answer("dlsym cuDriverGetVersion"),
        "libcuda.so.1:cuDriverGetVersion"
    );
    #[cfg(target_arch = "x86_64")]
    {
        // From the executable, the next `dlsym` after it is ours (preloaded):
        // RTLD_NEXT must be resolved relative to the caller, not to us.
        assert_eq!(run.answer("dlsym RTLD_NEXT dlsym"), format!("{US}:dlsym"));
    }
    let calls = run.calls();
    assert_eq!(calls["cuMemAlloc_v2"], 1);
    assert_eq!(calls["cuLaunchKernel_ptsz"], 1);
    assert_eq!(calls["cuLaunchKernel"], 0);
    assert_eq!(run.report()["dlsym_wrapped"], 2);
    assert_eq!(run.driver_calls("cuMemAlloc_v2"), 1);
    assert!(run.driver_log.contains(
        &"cuLaunchKernel_ptsz f=0xf3 grid=21,22,23 block=24,25,26 smem=27 stream=0x2 params=(nil) extra=(nil)"
            .to_owned()
    ));
}

#[test]
fn dlsym_answers_are_untouched_without_the_interposer() {
    let run = client("dlsym-plain", false, &["dlsym"], &[]);
    run.assert_ok();
    assert!(run.report.is_none());
    assert_eq!(
        run.answer("dlsym cuMemAlloc_v2"),
        "libcuda.so.1:cuMemAlloc_v2"
    );
}

const REQUESTS: &str = "tests/data/cudart12.9_getprocaddress_requests.txt";

/// Replays cudart's request list with and without the interposer against the
/// driver in `lib_dir`: return codes and `symbolStatus` must be identical and
/// pointers identical, except that a hooked function becomes our wrapper of
/// the same name. Returns (the run with the interposer, names it wrapped).
fn replay_compare(lib_dir: &Path, tag: &str, env: &[(&str, &str)]) -> (Run, Vec<String>) {
    let list = Path::new(MANIFEST_DIR).join(REQUESTS);
    let list = list.to_str().unwrap();
    let plain = client_in(
        lib_dir,
        &format!("{tag}-plain"),
        false,
        &["replay", list],
        env,
    );
    let ours = client_in(lib_dir, tag, true, &["replay", list], env);
    plain.assert_ok();
    ours.assert_ok();
    let requests = std::fs::read_to_string(list).unwrap();
    let hooked: Vec<String> = ours.calls().into_keys().collect();
    let (p, o): (Vec<&str>, Vec<&str>) = (
        plain
            .stdout
            .lines()
            .filter(|l| l.contains(" -> "))
            .collect(),
        ours.stdout.lines().filter(|l| l.contains(" -> ")).collect(),
    );
    assert_eq!(p.len(), requests.lines().count());
    assert_eq!(p.len(), o.len());
    let mut wrapped = Vec::new();
    for (a, b) in p.iter().zip(&o) {
        let (a_req, a_ptr) = a.rsplit_once(' ').unwrap();
        let (b_req, b_ptr) = b.rsplit_once(' ').unwrap();
        assert_eq!(a_req, b_req, "request, return code and symbolStatus");
        if a_ptr == b_ptr {
            if let Some(sym) = a_ptr.strip_prefix("libcuda.so.1:") {
                assert!(!hooked.iter().any(|h| h == sym), "{sym} not wrapped");
            }
            continue;
        }
        let sym = a_ptr.strip_prefix("libcuda.so.1:").unwrap();
        assert_eq!(b_ptr, format!("{US}:{sym}"));
        wrapped.push(sym.to_owned());
    }
    let n_flags2 = requests.lines().filter(|l| l.ends_with("flags=2")).count();
    assert_eq!(n_flags2, 69);
    let lookups = &ours.report()["lookups"];
    assert_eq!(lookups["flags2"], n_flags2 as u64);
    assert_eq!(
        lookups["flags0"].as_u64().unwrap() + lookups["flags2"].as_u64().unwrap(),
        requests.lines().count() as u64 + 1
    );
    // The client's own extra look-up of cuGetProcAddress@12000 is wrapped too.
    assert_eq!(lookups["wrapped"], wrapped.len() as u64 + 1);
    (ours, wrapped)
}

/// Every request cudart 12.9 makes, replayed against the fake driver.
#[test]
fn cudart_request_list_replays_identically_except_wrapped_pointers() {
    let (_, wrapped) = replay_compare(&fixture().dir, "replay", &[]);
    // cuGetProcAddress x2, cuDeviceTotalMem_v2, cuCtxSynchronize,
    // cuMemAlloc_v2, cuMemFree_v2, cuLaunchKernel(+_ptsz),
    // cuStreamSynchronize(+_ptsz).
    assert_eq!(wrapped.len(), 10, "{wrapped:?}");
}

#[test]
fn linked_programs_reach_the_exports_from_many_threads() {
    let run = client("linked", true, &["linked"], &[]);
    run.assert_ok();
    assert_eq!(
        run.answer("linked cuMemAlloc_v2"),
        format!("{US}:cuMemAlloc_v2")
    );
    assert_eq!(run.calls()["cuMemAlloc_v2"], 800);
    assert_eq!(run.driver_calls("cuMemAlloc_v2"), 800);
}

#[test]
fn real_driver_path_can_be_overridden() {
    let alt = fixture().alt_driver.to_str().unwrap().to_owned();
    let run = client(
        "alt",
        true,
        &["linked"],
        &[("DILU_REAL_LIBCUDA", alt.as_str())],
    );
    run.assert_ok();
    // Our wrapper forwarded to the alternative driver, not to libcuda.so.1.
    assert_eq!(run.driver_calls("alt:cuMemAlloc_v2"), 800);
    assert_eq!(run.driver_calls("cuMemAlloc_v2"), 0);
}

#[test]
fn counting_is_off_without_report_variable() {
    let f = fixture();
    let out = Command::new(&f.client)
        .arg("gpa")
        .env("LD_LIBRARY_PATH", &f.dir)
        .env("LD_PRELOAD", &f.interposer)
        .env_remove("DILU_CALL_REPORT")
        .env_remove("DILU_LOG")
        .env_remove("FAKECUDA_LOG")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(out.stderr.is_empty(), "silent by default");
}

#[test]
fn bad_configuration_stops_the_process_with_one_line() {
    for (var, value) in [("DILU_LOG", "[[[nope"), ("DILU_CALL_REPORT", "")] {
        let run = client("badcfg", true, &["gpa"], &[(var, value)]);
        assert_eq!(run.out.status.code(), Some(2), "{var}={value:?}");
        let stderr = String::from_utf8_lossy(&run.out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(var), "{stderr}");
        assert!(run.stdout.is_empty());
    }
}

#[test]
fn debug_logging_goes_to_stderr() {
    let run = client("log", true, &["dlsym"], &[("DILU_LOG", "debug")]);
    run.assert_ok();
    let stderr = String::from_utf8_lossy(&run.out.stderr);
    assert!(stderr.contains("real driver loaded"), "{stderr}");
    assert!(stderr.contains("dlsym wrapped"), "{stderr}");
}

/// simgpu (the workspace's simulated driver) installed as `libcuda.so.1`.
fn simgpu_dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let f = fixture();
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "-p", "simgpu"])
            .current_dir(MANIFEST_DIR);
        let profile_dir = f.interposer.parent().unwrap();
        match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") => {}
            Some("release") => {
                build.arg("--release");
            }
            Some(other) => {
                build.args(["--profile", other]);
            }
            None => unreachable!(),
        }
        run_ok(&mut build);
        let dir = f.dir.join("simgpu");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(profile_dir.join("libsimgpu.so"), dir.join("libcuda.so.1")).unwrap();
        dir
    })
}

fn simgpu_env(tag: &str) -> String {
    format!("dilu-interposer-test-{}-{tag}", std::process::id())
}

/// Removes simgpu's shared device state for `instance` (under /dev/shm).
fn remove_simgpu_state(instance: &str) {
    let suffix = format!("-{instance}");
    if let Ok(dir) = std::fs::read_dir("/dev/shm") {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("simgpu-") && name.ends_with(&suffix) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

#[test]
fn simgpu_request_list_replays_identically_and_every_requested_hook_is_wrapped() {
    let instance = simgpu_env("replay");
    let (run, wrapped) = replay_compare(
        simgpu_dir(),
        "simgpu-replay",
        &[("SIMGPU_INSTANCE", instance.as_str())],
    );
    remove_simgpu_state(&instance);
    let requests = std::fs::read_to_string(Path::new(MANIFEST_DIR).join(REQUESTS)).unwrap();
    // Every hooked function cudart asks for (by base name) must come back
    // wrapped, in whichever version and stream variant the driver answers
    // for the version and flags cudart asks with.
    let base = |name: &str| {
        name.trim_end_matches("_ptsz")
            .trim_end_matches("_v2")
            .to_owned()
    };
    for name in run.calls().into_keys() {
        if requests.contains(&format!("\"{}\"", base(&name))) {
            assert!(
                wrapped.iter().any(|w| base(w) == base(&name)),
                "{name} not wrapped: {wrapped:?}"
            );
        }
    }
    assert!(wrapped.len() >= 30, "{wrapped:?}");
}

#[test]
fn simgpu_cudart_path_works_through_the_interposer() {
    let instance = simgpu_env("sim");
    let run = client_in(
        simgpu_dir(),
        "simgpu-sim",
        true,
        &["sim"],
        &[("SIMGPU_INSTANCE", instance.as_str())],
    );
    remove_simgpu_state(&instance);
    run.assert_ok();
    assert_eq!(
        run.answer("gpa cuMemAlloc@3020/0"),
        format!("{US}:cuMemAlloc_v2")
    );
    assert_eq!(
        run.answer("gpa cuStreamSynchronize@7000/2"),
        format!("{US}:cuStreamSynchronize_ptsz")
    );
    let calls = run.calls();
    assert_eq!(calls["cuMemAlloc_v2"], 1);
    assert_eq!(calls["cuMemFree_v2"], 2);
    assert_eq!(calls["cuMemGetInfo_v2"], 2);
    assert_eq!(calls["cuStreamSynchronize_ptsz"], 1);
    assert_eq!(calls["cuCtxSynchronize"], 1);
}
