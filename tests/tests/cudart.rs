//! NVIDIA's own runtime on simgpu: a C program linked against the real
//! `libcudart.so.12` (12.9) and `libcudart.so.13` (13.2) initialises,
//! allocates, copies, launches kernels registered from a hand-built fatbin,
//! captures a graph, uses streams and events — plain on simgpu and under
//! `dilu run --sim` with memory and SM-time budgets.
//!
//! The runtimes come from PyPI's wheels (`nvidia-cuda-runtime-cu12`,
//! `nvidia-cuda-runtime`), unpacked by `.ci/run` / `scripts/test.sh` into
//! the directory named by `DILU_CUDART_DIR`. Without that variable the tests
//! print why and pass; with it (CI sets it), a runtime missing there is a
//! failure, since whoever named the directory meant these tests to run.
//! Needs `cc`. simgpu computes no kernel results: only what the runtime and
//! dilu observe (codes, memory, timing) is checked.

use dilu_abi::simtrace as trace;
use dilu_harness::workspace::{
    Scratch, artifact, dilu_run, output_within, read_trace, unique_name,
};
use dilu_tests::cubin::{Compression, Entry, cubin, fatbin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(180);
const MIB: u64 = 1 << 20;
/// Initial bytes of the image's `table` global (the client checks them).
const TABLE: [u8; 16] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16];

/// One runtime version, ready to run: the client linked against it.
struct Runtime {
    major: u32,
    client: PathBuf,
    /// `libcuda.so.1` and `libcuda.so` pointing at simgpu, for plain runs.
    driver_dir: PathBuf,
    fatbin: PathBuf,
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if path.file_name().is_some_and(|n| n == name) {
            return Some(path);
        }
        if path.is_dir()
            && let Some(found) = find_file(&path, name)
        {
            return Some(found);
        }
    }
    None
}

/// The hand-built image: one ELF entry (kernel `add_one`, global `table`)
/// plus a PTX entry, as nvcc would embed for two targets.
fn image() -> Vec<u8> {
    let elf = cubin(90, &["add_one"], &[("table", &TABLE)]);
    let ptx = ".version 8.0\n.target sm_90\n.address_size 64\n\
               .visible .entry add_one(.param .u64 p0, .param .u32 p1) { ret; }\n";
    fatbin(&[
        Entry::Elf(elf, Compression::None),
        Entry::Ptx(ptx.to_string(), Compression::None),
    ])
}

/// Builds the client for one runtime version, once. `None` (with the reason
/// printed) when the runtime is not available.
fn runtime(major: u32) -> Option<&'static Runtime> {
    static RUNTIMES: OnceLock<Vec<Runtime>> = OnceLock::new();
    let all = RUNTIMES.get_or_init(|| {
        let Some(root) = std::env::var_os("DILU_CUDART_DIR").map(PathBuf::from) else {
            return Vec::new();
        };
        let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique_name("cudart"));
        let mut out = Vec::new();
        for major in [12, 13] {
            let lib_name = format!("libcudart.so.{major}");
            let Some(lib) = find_file(&root, &lib_name) else {
                continue;
            };
            let lib_dir = lib.parent().expect("lib dir").to_path_buf();
            let dir = base.join(major.to_string());
            std::fs::create_dir_all(&dir).expect("fixture dir");
            let client = dir.join("cudart-client");
            let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("c/cudart_client.c");
            let status = Command::new("cc")
                .args(["-Wall", "-Werror", "-O1", "-o"])
                .arg(&client)
                .arg(&source)
                .arg("-L")
                .arg(&lib_dir)
                .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
                .arg(format!("-l:{lib_name}"))
                .args(["-ldl", "-lpthread"])
                .status()
                .expect("run cc");
            assert!(
                status.success(),
                "cc cudart_client.c against {lib_name} failed"
            );
            let driver_dir = dir.join("driver");
            std::fs::create_dir_all(&driver_dir).expect("driver dir");
            for name in ["libcuda.so.1", "libcuda.so"] {
                let link = driver_dir.join(name);
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(artifact("libsimgpu.so"), &link).expect("symlink");
            }
            let fatbin = dir.join("kernels.fatbin");
            std::fs::write(&fatbin, image()).expect("write fatbin");
            out.push(Runtime {
                major,
                client,
                driver_dir,
                fatbin,
            });
        }
        out
    });
    let found = all.iter().find(|r| r.major == major);
    if found.is_none() {
        let why = format!(
            "libcudart.so.{major} not found under DILU_CUDART_DIR ({:?}); \
             scripts/install-cudart.sh installs it (.ci/run does, scripts/test.sh uses its cache)",
            std::env::var_os("DILU_CUDART_DIR")
        );
        assert!(std::env::var_os("DILU_CUDART_DIR").is_none(), "{why}");
        eprintln!("SKIP: {why}");
    }
    found
}

/// Environment that isolates one run's simulated GPU.
fn isolate(command: &mut Command, instance: &str) {
    command
        .env("SIMGPU_INSTANCE", instance)
        .env_remove("SIMGPU_TRACE")
        .env_remove("SIMGPU_MEMORY")
        .env_remove("SIMGPU_DRIVER_VERSION")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("DILU_MEM_LIMIT")
        .env_remove("DILU_SM_LIMIT")
        .env_remove("DILU_TENANT");
}

/// Forgets an instance's shared device state.
fn drop_instance(instance: &str) {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let _ = std::fs::remove_file(format!("/dev/shm/simgpu-{uid}-{instance}"));
}

fn plain(rt: &Runtime, args: &[&str], env: &[(&str, &str)]) -> Output {
    let instance = unique_name("cudart-plain");
    let mut command = Command::new(&rt.client);
    command.arg(&rt.fatbin).args(args);
    isolate(&mut command, &instance);
    command.env("LD_LIBRARY_PATH", &rt.driver_dir);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = output_within(command, LIMIT);
    drop_instance(&instance);
    output
}

fn under_dilu(rt: &Runtime, dilu_args: &[&str], args: &[&str], env: &[(&str, &str)]) -> Output {
    let instance = unique_name("cudart-dilu");
    let mut full: Vec<String> = vec![rt.fatbin.display().to_string()];
    full.extend(args.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = full.iter().map(String::as_str).collect();
    let mut command = dilu_run(true, &rt.client, &refs);
    // `dilu run` options go before `--`.
    let mut with_options = Command::new(command.get_program());
    let mut original: Vec<_> = command.get_args().map(|a| a.to_os_string()).collect();
    let at = original.iter().position(|a| a == "--sim").expect("--sim") + 1;
    let tail = original.split_off(at);
    with_options.args(original).args(dilu_args).args(tail);
    command = with_options;
    isolate(&mut command, &instance);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = output_within(command, LIMIT);
    drop_instance(&instance);
    output
}

fn json(output: &Output, what: &str) -> Value {
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "{what}: no JSON line\nstdout: {stdout}\nstderr: {}",
                String::from_utf8_lossy(&output.stderr)
            )
        });
    let v: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{what}: {e}: {line}"));
    assert!(
        output.status.success() && v.get("failed").is_none(),
        "{what} failed: {v}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    v
}

fn check_basic(rt: &Runtime, v: &Value) {
    assert_eq!(v["devices"], 1, "{v}");
    assert_eq!(v["driver"], 13020, "simgpu reports a CUDA 13.2 driver: {v}");
    let runtime = v["runtime"].as_u64().unwrap_or(0);
    assert_eq!(runtime / 1000, rt.major as u64, "{v}");
    assert_eq!(v["roundtrip"], true, "{v}");
    assert_eq!(v["total"].as_u64(), Some(80 << 30), "{v}");
    assert_eq!(v["launches"], 10, "{v}");
    assert!(v["elapsed_ms"].as_f64().unwrap_or(0.0) > 0.0, "{v}");
    assert_eq!(v["symbol"], true, "the global's initial bytes: {v}");
}

fn basic_plain(major: u32) {
    let Some(rt) = runtime(major) else { return };
    let scratch = Scratch::new("cudart-basic");
    let trace_path = scratch.path("trace.jsonl");
    let trace_env = trace_path.display().to_string();
    let out = plain(rt, &["basic"], &[("SIMGPU_TRACE", &trace_env)]);
    check_basic(rt, &json(&out, &format!("cudart {major} basic")));
    // The registered kernel ran under its device name: 10 launches, then 2
    // from the captured graph.
    let records = read_trace(&trace_path);
    let named = |graph: bool| {
        records
            .iter()
            .filter(|r| r.name == "add_one" && r.graph == graph)
            .count()
    };
    assert_eq!((named(false), named(true)), (10, 2), "{records:?}");
}

#[test]
fn cudart12_runs_on_simgpu() {
    basic_plain(12);
}

#[test]
fn cudart13_runs_on_simgpu() {
    basic_plain(13);
}

#[test]
fn cudart13_needs_a_cuda13_driver_and_cudart12_does_not() {
    let (Some(rt12), Some(rt13)) = (runtime(12), runtime(13)) else {
        return;
    };
    let old = [("SIMGPU_DRIVER_VERSION", "12090")];
    let v = json(&plain(rt12, &["basic"], &old), "cudart 12 on a 12.9 driver");
    assert_eq!(v["driver"], 12090, "{v}");
    let out = plain(rt13, &["basic"], &old);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success(),
        "cudart 13 ran on a 12.9 driver: {stdout}"
    );
    assert!(
        stdout.contains("cudaErrorInsufficientDriver"),
        "cudart 13 must say the driver is too old: {stdout}"
    );
}

#[test]
fn every_kind_of_image_entry_registers() {
    let Some(rt) = runtime(12) else { return };
    let dir = Scratch::new("cudart-images");
    // ELF only, LZ4- then zstd-compressed (as PyTorch ships its kernels),
    // and PTX only, zstd-compressed (kernel and global from the PTX text).
    let bytes: Vec<String> = TABLE.iter().map(u8::to_string).collect();
    let ptx = format!(
        ".version 8.0\n.target sm_90\n.address_size 64\n\
         .visible .global .align 1 .b8 table[16] = {{{}}};\n\
         .visible .entry add_one(.param .u64 p0, .param .u32 p1) {{ ret; }}\n",
        bytes.join(", ")
    );
    let images = [
        ("zstd-ptx", fatbin(&[Entry::Ptx(ptx, Compression::Zstd)])),
        (
            "lz4-elf",
            fatbin(&[Entry::Elf(
                cubin(90, &["add_one"], &[("table", &TABLE)]),
                Compression::Lz4,
            )]),
        ),
        (
            "zstd-elf",
            fatbin(&[Entry::Elf(
                cubin(90, &["add_one"], &[("table", &TABLE)]),
                Compression::Zstd,
            )]),
        ),
    ];
    for (name, bytes) in images {
        let path = dir.path(name);
        std::fs::write(&path, bytes).expect("write image");
        let rt = Runtime {
            major: rt.major,
            client: rt.client.clone(),
            driver_dir: rt.driver_dir.clone(),
            fatbin: path,
        };
        let v = json(&plain(&rt, &["basic"], &[]), name);
        check_basic(&rt, &v);
    }
}

/// `--mem` is what cudaMemGetInfo shows, and cudaMalloc past it is
/// cudaErrorMemoryAllocation with nothing leaked.
fn memory_budget(major: u32) {
    let Some(rt) = runtime(major) else { return };
    let out = under_dilu(
        rt,
        &["--mem", "512MiB"],
        &["alloc", &(600 * MIB).to_string()],
        &[],
    );
    let v = json(&out, &format!("cudart {major} under --mem"));
    assert_eq!(v["total"].as_u64(), Some(512 * MIB), "{v}");
    assert_eq!(v["big_name"], "cudaErrorMemoryAllocation", "{v}");
    assert_eq!(v["big"], 2, "{v}");
    assert_eq!(
        v["free_after"], v["free_before"],
        "a refused cudaMalloc must leave nothing behind: {v}"
    );
    let out = under_dilu(
        rt,
        &["--mem", "512MiB"],
        &["alloc", &(256 * MIB).to_string()],
        &[],
    );
    let v = json(&out, &format!("cudart {major} within --mem"));
    assert_eq!(v["big"], 0, "{v}");
}

#[test]
fn cudart12_memory_budget_under_dilu() {
    memory_budget(12);
}

#[test]
fn cudart13_memory_budget_under_dilu() {
    memory_budget(13);
}

#[test]
fn interposer_sees_cudart12_calls() {
    interposer_sees_calls(12);
}

#[test]
fn interposer_sees_cudart13_calls() {
    interposer_sees_calls(13);
}

fn interposer_sees_calls(major: u32) {
    let Some(rt) = runtime(major) else { return };
    let scratch = Scratch::new("cudart-report");
    let report = scratch.path("calls.jsonl");
    let report_env = report.display().to_string();
    let out = under_dilu(rt, &[], &["basic"], &[("DILU_CALL_REPORT", &report_env)]);
    check_basic(rt, &json(&out, &format!("cudart {major} under dilu")));
    let text = std::fs::read_to_string(&report).expect("call report");
    let r: Value = serde_json::from_str(text.lines().next().expect("one report")).expect("JSON");
    for hooked in ["cuMemAlloc_v2", "cuMemFree_v2", "cuMemGetInfo_v2"] {
        assert!(
            r["calls"][hooked].as_u64().unwrap_or(0) >= 1,
            "interposer did not see {hooked}: {r}"
        );
    }
    let launches: u64 = ["cuLaunchKernel", "cuLaunchKernel_ptsz"]
        .iter()
        .map(|n| r["calls"][n].as_u64().unwrap_or(0))
        .sum();
    assert!(launches >= 10, "interposer saw {launches} launches: {r}");
}

/// Two cudart programs at `--sm 30` and `--sm 70` split the device roughly
/// 30:70 in simgpu's own trace.
#[test]
fn cudart_sm_shares_split_the_device() {
    let Some(rt) = runtime(12) else { return };
    let scratch = Scratch::new("cudart-sm");
    let trace_path = scratch.path("trace.jsonl");
    let instance = unique_name("cudart-sm");
    let spawn = |share: &str| {
        let mut command = Command::new(artifact("dilu"));
        command
            .args(["run", "--sim", "--sm", share, "--"])
            .arg(&rt.client)
            .arg(&rt.fatbin)
            .args(["loop", "1500"]);
        isolate(&mut command, &instance);
        command
            .env("SIMGPU_TRACE", &trace_path)
            // 1 ms kernels: long enough that shares show in a few seconds.
            .env("SIMGPU_KERNEL_COST", "add_one=1ms")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("spawn client")
    };
    let a = spawn("30");
    let b = spawn("70");
    for (child, name) in [(a, "30%"), (b, "70%")] {
        let out = child.wait_with_output().expect("wait");
        assert!(
            out.status.success(),
            "{name} client failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    drop_instance(&instance);
    let records = read_trace(&trace_path);
    let shares = trace::shares_in_common_window(&records);
    assert_eq!(shares.len(), 2, "both clients must appear: {shares:?}");
    let mut values: Vec<f64> = shares.values().copied().collect();
    values.sort_by(f64::total_cmp);
    let ratio = values[1] / values[0];
    eprintln!("cudart --sm 30/70: device shares {values:?}, ratio {ratio:.2}");
    assert!(
        ratio > 1.6,
        "a 30/70 split must favour the 70% tenant clearly: shares {values:?}, ratio {ratio:.2}"
    );
}
