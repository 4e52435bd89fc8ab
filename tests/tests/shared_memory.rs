//! Device memory shared between processes with CUDA IPC handles (as
//! `torch.multiprocessing` shares CUDA tensors, or many LoRA servers map
//! one backbone's weights) or shareable VMM handles: the mapping process
//! sees the exporter's bytes, the memory is charged once, to its exporter,
//! for as long as any process maps it, and nobody else is charged for it.

use dilu_harness::workspace::{artifact, dilu, unique_name};
use dilu_tests::probe::Probe;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// `mem-probe` under `dilu run --sim RUN_ARGS` on simulated GPU `instance`
/// (no context allowance, so budgets are what it allocates).
fn probe(instance: &str, run_args: &[&str]) -> Probe {
    let mut command = Command::new(dilu());
    command
        .args(["run", "--sim"])
        .args(run_args)
        .arg("--")
        .arg(artifact("mem-probe"))
        .env("SIMGPU_INSTANCE", instance)
        .env("DILU_CONTEXT_MEMORY", "0")
        .env_remove("DILU_TENANT")
        .env_remove(dilu_abi::node_wire::SOCKET_ENV);
    Probe::spawn(command)
}

/// (free, total) the process is told by `cuMemGetInfo`.
fn info(p: &mut Probe) -> (u64, u64) {
    let answer = p.ask("info");
    let words: Vec<u64> = answer
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.parse().ok())
        .collect();
    assert_eq!(words.len(), 2, "info answered {answer:?}");
    (words[0], words[1])
}

/// An IPC handle of the probe's last allocation, filled with `byte`.
fn share(p: &mut Probe, bytes: u64, byte: u8) -> String {
    assert_eq!(p.alloc(bytes), "alloc 0");
    assert_eq!(p.ask(&format!("fill {byte}")), "fill 0");
    let answer = p.ask("share");
    answer
        .strip_prefix("share ")
        .filter(|h| h.len() == 128)
        .unwrap_or_else(|| panic!("no IPC handle: {answer:?}"))
        .to_string()
}

#[test]
fn shared_memory_stays_charged_to_its_exporter_until_the_last_mapping_closes() {
    let instance = unique_name("ipc-rule");
    let mut exporter = probe(&instance, &["--mem", "256MiB"]);
    let mut mapper = probe(&instance, &["--mem", "32MiB"]);
    let handle = share(&mut exporter, 128 * MIB, 7);

    // 128 MiB mapped under a 32 MiB budget: the mapper is charged nothing
    // and reads the exporter's bytes.
    assert_eq!(mapper.ask(&format!("open {handle}")), "open 0");
    assert_eq!(mapper.ask("peek"), "peek 7");
    assert_eq!(info(&mut mapper), (32 * MIB, 32 * MIB));

    // Freed by its exporter while mapped: the driver keeps the memory, and
    // the exporter's budget still counts it.
    assert_eq!(exporter.ask("free"), "free 0");
    assert_eq!(info(&mut exporter), (128 * MIB, 256 * MIB));
    assert_eq!(
        exporter.alloc(200 * MIB),
        "alloc 2",
        "the exporter cannot reuse memory another process still maps"
    );
    assert_eq!(mapper.ask("peek"), "peek 7", "the mapping still reads");

    // The last mapping closes: the charge comes back.
    assert_eq!(mapper.ask("close"), "close 0");
    assert_eq!(info(&mut exporter), (256 * MIB, 256 * MIB));
    assert_eq!(exporter.alloc(200 * MIB), "alloc 0");
    exporter.finish();
    mapper.finish();
}

#[test]
fn a_backbone_mapped_by_three_adapters_is_charged_once() {
    let instance = unique_name("ipc-lora");
    let mut backbone = probe(&instance, &["--mem", "256MiB"]);
    let weights = share(&mut backbone, 192 * MIB, 3);
    let (device_free_before, _) = {
        let mut observer = probe(&instance, &[]);
        let seen = info(&mut observer);
        observer.finish();
        seen
    };
    let mut adapters: Vec<Probe> = (0..3)
        .map(|_| probe(&instance, &["--mem", "64MiB"]))
        .collect();
    for adapter in &mut adapters {
        assert_eq!(adapter.ask(&format!("open {weights}")), "open 0");
        assert_eq!(adapter.ask("peek"), "peek 3");
        assert_eq!(adapter.alloc(32 * MIB), "alloc 0", "its own adapter");
        assert_eq!(
            info(adapter),
            (32 * MIB, 64 * MIB),
            "only its adapter counts against its budget"
        );
    }
    let mut observer = probe(&instance, &[]);
    let (device_free, _) = info(&mut observer);
    observer.finish();
    assert_eq!(
        device_free_before - device_free,
        3 * 32 * MIB,
        "the device holds the backbone once and the three adapters"
    );
    for adapter in adapters {
        adapter.finish();
    }
    backbone.finish();
}

#[test]
fn a_killed_mapper_gives_freed_shared_memory_back() {
    let instance = unique_name("ipc-kill");
    let mut exporter = probe(&instance, &["--mem", "256MiB"]);
    let mut mapper = probe(&instance, &[]);
    let handle = share(&mut exporter, 128 * MIB, 9);
    assert_eq!(mapper.ask(&format!("open {handle}")), "open 0");
    assert_eq!(exporter.ask("free"), "free 0");
    assert_eq!(info(&mut exporter), (128 * MIB, 256 * MIB));
    mapper.child.kill().expect("kill the mapper");
    mapper.child.wait().expect("reap the mapper");
    assert_eq!(
        info(&mut exporter),
        (256 * MIB, 256 * MIB),
        "a dead mapper holds no budget"
    );
    exporter.finish();
}

#[test]
fn a_handle_opens_in_other_processes_only_and_never_after_its_memory_is_gone() {
    let instance = unique_name("ipc-misuse");
    let mut exporter = probe(&instance, &[]);
    let handle = share(&mut exporter, MIB, 1);
    assert_eq!(
        exporter.ask(&format!("open {handle}")),
        "open 201",
        "its own process: CUDA_ERROR_INVALID_CONTEXT"
    );
    assert_eq!(exporter.ask("free"), "free 0");
    let mut late = probe(&instance, &[]);
    assert_eq!(
        late.ask(&format!("open {handle}")),
        "open 400",
        "freed and unmapped: CUDA_ERROR_INVALID_HANDLE"
    );
    late.finish();
    exporter.finish();
}

/// A shareable VMM handle (a POSIX descriptor passed over a socket) follows
/// the rule of IPC handles: the importer is charged nothing, and the
/// exporter's release while the importer holds the memory keeps its charge
/// until the importer lets go.
#[test]
fn a_shared_vmm_allocation_stays_charged_to_its_exporter_until_the_importer_releases_it() {
    let instance = unique_name("vmm-rule");
    let socket = std::env::temp_dir().join(format!("{}.sock", unique_name("vmm-offer")));
    let socket = socket.to_str().unwrap();
    let mut exporter = probe(&instance, &["--mem", "256MiB"]);
    let mut importer = probe(&instance, &["--mem", "32MiB"]);
    assert_eq!(
        exporter.ask(&format!("vmm-create {}", 128 * MIB)),
        "vmm-create 0"
    );
    assert_eq!(exporter.ask(&format!("vmm-offer {socket}")), "vmm-offer 0");
    assert_eq!(importer.ask(&format!("vmm-take {socket}")), "vmm-take 0");
    let _ = std::fs::remove_file(socket);
    assert_eq!(
        info(&mut importer),
        (32 * MIB, 32 * MIB),
        "importer: nothing charged"
    );

    assert_eq!(exporter.ask("vmm-release"), "vmm-release 0");
    assert_eq!(
        info(&mut exporter),
        (128 * MIB, 256 * MIB),
        "still held by the importer"
    );
    assert_eq!(
        exporter.alloc(200 * MIB),
        "alloc 2",
        "the exporter cannot reuse memory another process still holds"
    );

    assert_eq!(importer.ask("vmm-drop"), "vmm-drop 0");
    assert_eq!(info(&mut exporter), (256 * MIB, 256 * MIB));
    assert_eq!(exporter.alloc(200 * MIB), "alloc 0");
    exporter.finish();
    importer.finish();
}
