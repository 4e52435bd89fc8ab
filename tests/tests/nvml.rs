//! NVML memory queries under dilu, end to end on simgpu. A C client asks
//! for every GPU's memory with `nvmlDeviceGetMemoryInfo` and `_v2`, once
//! linked against NVML and once through `dlopen` + `dlsym` only.
//!
//! Two NVMLs answer: simgpu's simulated NVML (what `dilu run --sim` puts
//! first on `LD_LIBRARY_PATH`), whose figures are the shared device's real
//! usage, and a stand-in (`tests/c/fakenvml.c`: two GPUs on the PCI buses of
//! simgpu's two devices) that still checks what the simulated one cannot
//! show: driver-reserved memory (`reserved` ≠ 0) and usage that is not the
//! tenant's. The stand-in clients carry a `DT_RPATH` to it, which the loader
//! searches before `LD_LIBRARY_PATH`. Needs `cc`.

use dilu_harness::workspace::{dilu, dilu_run, output_within, simgpu_uuid, unique_name};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// What the stand-in NVML reports for GPU `index` (see fakenvml.c).
struct Real {
    total: u64,
    reserved: u64,
    used: u64,
}

fn real(index: u64) -> Real {
    Real {
        total: 80 * GIB,
        reserved: 512 * MIB,
        used: (index + 1) * 10 * GIB,
    }
}

/// Compiles the stand-in NVML and both clients, once.
fn fixture() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(unique_name("nvml"));
        std::fs::create_dir_all(&dir).expect("fixture dir");
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("c");
        // `flags` go before the source, `libraries` after it (link order).
        let cc = |flags: &[&str], out: &str, source: &str, libraries: &[&str]| {
            let status = Command::new("cc")
                .args(["-Wall", "-Werror"])
                .args(flags)
                .arg("-o")
                .arg(dir.join(out))
                .arg(c.join(source))
                .arg("-L")
                .arg(&dir)
                .arg(format!("-Wl,-rpath,{}", dir.display()))
                .args(libraries)
                .arg("-ldl")
                .status()
                .expect("run cc");
            assert!(status.success(), "cc {source} failed");
        };
        cc(
            &["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1"],
            "libnvidia-ml.so.1",
            "fakenvml.c",
            &[],
        );
        // DT_RPATH (not RUNPATH): the stand-in wins over LD_LIBRARY_PATH.
        cc(
            &["-DLINKED", "-Wl,--disable-new-dtags"],
            "client-linked",
            "nvml_client.c",
            &["-l:libnvidia-ml.so.1"],
        );
        cc(
            &["-Wl,--disable-new-dtags"],
            "client-dlopen",
            "nvml_client.c",
            &[],
        );
        // RUNPATH: LD_LIBRARY_PATH (simgpu's NVML under --sim) wins.
        cc(
            &["-DLINKED", "-Wl,--enable-new-dtags"],
            "sim-client-linked",
            "nvml_client.c",
            &["-l:libnvidia-ml.so.1"],
        );
        cc(
            &["-Wl,--enable-new-dtags"],
            "sim-client-dlopen",
            "nvml_client.c",
            &[],
        );
        cc(&[], "nvml-fork", "nvml_fork.c", &[]);
        dir
    })
}

/// Runs both stand-in clients under `dilu run --sim` on a two-device simgpu
/// with `env`; returns every reported line (one per client and GPU).
fn query(env: &[(&str, &str)]) -> Vec<Value> {
    query_clients(["client-linked", "client-dlopen"], env)
}

/// The same through simgpu's simulated NVML.
fn query_simulated(env: &[(&str, &str)]) -> Vec<Value> {
    query_clients(["sim-client-linked", "sim-client-dlopen"], env)
}

/// The simgpu instance `env` names, or a new one.
fn instance_in(env: &[(&str, &str)], tag: &str) -> String {
    env.iter()
        .find(|(key, _)| *key == "SIMGPU_INSTANCE")
        .map_or_else(|| unique_name(tag), |(_, value)| value.to_string())
}

fn query_clients(clients: [&str; 2], env: &[(&str, &str)]) -> Vec<Value> {
    let dir = fixture();
    let mut lines = Vec::new();
    for client in clients {
        let instance = instance_in(env, "nvml");
        let mut command = dilu_run(true, &dir.join(client), &[&(64 * MIB).to_string()]);
        command
            .env("SIMGPU_INSTANCE", &instance)
            .env("SIMGPU_DEVICES", "2")
            .env("LD_LIBRARY_PATH", dir)
            .env_remove("CUDA_VISIBLE_DEVICES")
            .env_remove("DILU_MEM_LIMIT")
            .env_remove("DILU_TENANT")
            .env_remove("DILU_CONTEXT_MEMORY")
            .env_remove("CUDA_DEVICE_MEMORY_LIMIT");
        for (key, value) in env {
            command.env(key, value);
        }
        let output = output_within(command, Duration::from_secs(120));
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let _ = std::fs::remove_file(format!("/dev/shm/simgpu-{uid}-{instance}"));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "{client}: {stdout}{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let answers: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        assert_eq!(answers.len(), 2, "{client}: one line per GPU: {stdout}");
        lines.extend(answers);
    }
    lines
}

fn field(answer: &Value, version: &str, name: &str) -> u64 {
    answer[version][name]
        .as_u64()
        .unwrap_or_else(|| panic!("{version}.{name} missing: {answer}"))
}

/// Both answers are exactly what NVML itself said.
fn assert_unchanged(answer: &Value) {
    let r = real(answer["index"].as_u64().unwrap());
    assert_eq!(answer["v1"]["result"], 0, "{answer}");
    assert_eq!(answer["v2"]["result"], 0, "{answer}");
    assert_eq!(field(answer, "v1", "total"), r.total, "{answer}");
    assert_eq!(field(answer, "v1", "used"), r.used + r.reserved, "{answer}");
    assert_eq!(
        field(answer, "v1", "free"),
        r.total - r.used - r.reserved,
        "{answer}"
    );
    assert_eq!(field(answer, "v2", "total"), r.total, "{answer}");
    assert_eq!(field(answer, "v2", "reserved"), r.reserved, "{answer}");
    assert_eq!(field(answer, "v2", "used"), r.used, "{answer}");
    assert_eq!(
        field(answer, "v2", "free"),
        r.total - r.used - r.reserved,
        "{answer}"
    );
}

/// Both answers report the budget with `used` bytes of it in use.
fn assert_budget(answer: &Value, budget: u64, used: u64) {
    for version in ["v1", "v2"] {
        assert_eq!(answer[version]["result"], 0, "{answer}");
        assert_eq!(
            field(answer, version, "total"),
            budget,
            "{version}: {answer}"
        );
        assert_eq!(field(answer, version, "used"), used, "{version}: {answer}");
        assert_eq!(
            field(answer, version, "free"),
            budget - used,
            "{version}: {answer}"
        );
    }
    // Total = reserved + free + used still holds for the v2 structure.
    assert_eq!(field(answer, "v2", "reserved"), 0, "{answer}");
}

fn gpu(lines: &[Value], via: &str, index: u64) -> Value {
    lines
        .iter()
        .find(|l| l["via"] == via && l["index"] == index)
        .unwrap_or_else(|| panic!("no answer for GPU {index} via {via}: {lines:?}"))
        .clone()
}

#[test]
fn nvml_reports_the_budget_of_the_cuda_device_on_the_same_pci_bus() {
    // The program sees only simgpu's device 1 (PCI bus 0x19, NVML's GPU 1)
    // as CUDA device 0; its budget and usage (the default 256 MiB context
    // allowance plus 64 MiB allocated) must show on NVML's GPU 1, and NVML's
    // GPU 0, which the program cannot use, must be left alone.
    let lines = query(&[("CUDA_VISIBLE_DEVICES", "1"), ("DILU_MEM_LIMIT", "1GiB")]);
    for via in ["linked", "dlsym"] {
        assert_budget(&gpu(&lines, via, 1), GIB, 320 * MIB);
        assert_unchanged(&gpu(&lines, via, 0));
    }
}

#[test]
fn nvml_passes_through_devices_without_a_budget() {
    // All devices visible; only CUDA device 1 has a budget, and the client's
    // usage is on device 0.
    let lines = query(&[("DILU_MEM_LIMIT", "1:1GiB")]);
    for via in ["linked", "dlsym"] {
        assert_unchanged(&gpu(&lines, via, 0));
        assert_budget(&gpu(&lines, via, 1), GIB, 0);
    }
    // No budget at all: everything as NVML said.
    for answer in query(&[]) {
        assert_unchanged(&answer);
    }
}

/// What simgpu's simulated NVML reports for a device without a budget: the
/// shared device as it is (80 GiB, `used` = bytes allocated on it, nothing
/// reserved).
fn assert_simulated(answer: &Value, used: u64) {
    for version in ["v1", "v2"] {
        assert_eq!(answer[version]["result"], 0, "{answer}");
        assert_eq!(field(answer, version, "total"), 80 * GIB, "{answer}");
        assert_eq!(field(answer, version, "used"), used, "{version}: {answer}");
        assert_eq!(field(answer, version, "free"), 80 * GIB - used, "{answer}");
    }
    assert_eq!(field(answer, "v2", "reserved"), 0, "{answer}");
}

#[test]
fn simulated_nvml_shows_the_budget_under_dilu_run_sim() {
    // `dilu run --sim` makes simgpu's NVML the one the program and the
    // interposer load. CUDA device 0 is simgpu's device 1 (NVML's GPU 1):
    // the budget and the tenant's usage (256 MiB context allowance + 64 MiB)
    // show there; NVML's GPU 0 is the untouched shared device.
    let lines = query_simulated(&[("CUDA_VISIBLE_DEVICES", "1"), ("DILU_MEM_LIMIT", "1GiB")]);
    for via in ["linked", "dlsym"] {
        assert_budget(&gpu(&lines, via, 1), GIB, 320 * MIB);
        assert_simulated(&gpu(&lines, via, 0), 0);
    }
}

#[test]
fn simulated_nvml_shows_the_budget_of_a_gpu_named_by_uuid() {
    // Schedulers, Ray and vLLM name GPUs by UUID; NVIDIA's driver also
    // takes a prefix only one GPU's UUID starts with. CUDA device 0 is
    // simgpu's device 1 either way: its budget shows on NVML's GPU 1.
    let instance = unique_name("nvml-uuid");
    let uuid = simgpu_uuid(&instance, 1);
    let prefix = &uuid[..uuid.len() - 2];
    for named in [uuid.as_str(), prefix] {
        let lines = query_simulated(&[
            ("SIMGPU_INSTANCE", &instance),
            ("CUDA_VISIBLE_DEVICES", named),
            ("DILU_MEM_LIMIT", "1GiB"),
        ]);
        for via in ["linked", "dlsym"] {
            assert_budget(&gpu(&lines, via, 1), GIB, 320 * MIB);
            assert_simulated(&gpu(&lines, via, 0), 0);
        }
    }
}

#[test]
fn simulated_nvml_passes_through_devices_without_a_budget() {
    // The client's 64 MiB sit on device 0, which has no budget: NVML shows
    // the device's real usage there; device 1 shows its budget.
    let lines = query_simulated(&[("DILU_MEM_LIMIT", "1:1GiB")]);
    for via in ["linked", "dlsym"] {
        assert_simulated(&gpu(&lines, via, 0), 64 * MIB);
        assert_budget(&gpu(&lines, via, 1), GIB, 0);
    }
    for answer in query_simulated(&[]) {
        let used = if answer["index"] == 0 { 64 * MIB } else { 0 };
        assert_simulated(&answer, used);
    }
}

/// Runs `nvml-fork` (NVML asked, then a fork, then CUDA in the child and in
/// the parent) under `dilu run --sim FLAGS` on simgpu's NVML with `env`;
/// returns its JSON lines, having asserted that every step succeeded.
fn nvml_then_fork(flags: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    let instance = instance_in(env, "nvml-fork");
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim"])
        .args(flags)
        .arg("--")
        .arg(fixture().join("nvml-fork"))
        .arg((64 * MIB).to_string())
        .env("SIMGPU_INSTANCE", &instance)
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("DILU_MEM_LIMIT")
        .env_remove("DILU_TENANT")
        .env_remove("DILU_SM_LIMIT");
    for (key, value) in env {
        command.env(key, value);
    }
    let output = output_within(command, Duration::from_secs(120));
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let _ = std::fs::remove_file(format!("/dev/shm/simgpu-{uid}-{instance}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let cuda = |who: &str| {
        lines
            .iter()
            .find(|l| l["step"] == "cuda" && l["who"] == who)
            .cloned()
            .unwrap_or_else(|| panic!("no CUDA line from the {who}: {stdout}"))
    };
    // The child is where a driver initialised behind the program's back
    // shows: simgpu, like NVIDIA's driver, refuses a child of a parent
    // that had initialised it.
    assert_eq!(
        cuda("child")["result"],
        0,
        "CUDA in the forked child failed: {stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(cuda("parent")["result"], 0, "{stdout}");
    assert!(output.status.success(), "{stdout}");
    lines
}

/// What NVML reported as GPU `index`'s total memory before CUDA started.
fn nvml_total(lines: &[Value], index: u64) -> u64 {
    let nvml = lines
        .iter()
        .find(|l| l["step"] == "nvml" && l["index"] == index)
        .unwrap_or_else(|| panic!("no NVML line for GPU {index}: {lines:?}"));
    assert_eq!(nvml["result"], 0, "{nvml}");
    nvml["total"].as_u64().expect("total")
}

#[test]
fn a_program_that_asks_nvml_then_forks_can_use_cuda_in_the_child_under_mem() {
    // vLLM's shape: NVML first, then the engine process is forked. The
    // budget must already show in NVML's answer, before CUDA is initialised.
    let lines = nvml_then_fork(&["--mem", "1GiB"], &[]);
    assert_eq!(nvml_total(&lines, 0), GIB);
}

#[test]
fn before_cuda_starts_nvml_finds_the_budgeted_gpu_through_cuda_visible_devices() {
    // CUDA device 0 is simgpu's device 1 (NVML's GPU 1). Without the driver
    // the interposer must still put the budget on NVML's GPU 1 and leave
    // GPU 0, which the program cannot use, as it is.
    let lines = nvml_then_fork(
        &["--mem", "1GiB"],
        &[("SIMGPU_DEVICES", "2"), ("CUDA_VISIBLE_DEVICES", "1")],
    );
    assert_eq!(nvml_total(&lines, 1), GIB);
    assert_eq!(nvml_total(&lines, 0), 80 * GIB);
}

#[test]
fn before_cuda_starts_nvml_finds_the_budgeted_gpu_named_by_uuid() {
    // vLLM sizes itself from NVML before CUDA starts, under a
    // CUDA_VISIBLE_DEVICES its launcher wrote with UUIDs: the interposer
    // matches them with NVML's to put the budget on NVML's GPU 1.
    let instance = unique_name("nvml-fork-uuid");
    let uuid = simgpu_uuid(&instance, 1);
    let lines = nvml_then_fork(
        &["--mem", "1GiB"],
        &[
            ("SIMGPU_INSTANCE", &instance),
            ("SIMGPU_DEVICES", "2"),
            ("CUDA_VISIBLE_DEVICES", &uuid),
        ],
    );
    assert_eq!(nvml_total(&lines, 1), GIB);
    assert_eq!(nvml_total(&lines, 0), 80 * GIB);
}

#[test]
fn a_program_that_asks_nvml_then_forks_can_use_cuda_in_the_child_under_sm() {
    // A named tenant: its (standalone) ledger is set up at the NVML query.
    let tenant = unique_name("nvml-fork-sm");
    let lines = nvml_then_fork(&["--sm", "50", "--tenant", &tenant], &[]);
    assert_eq!(nvml_total(&lines, 0), 80 * GIB);
}
