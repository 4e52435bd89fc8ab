//! How closely simgpu behaves like a real, shared GPU: what driver calls
//! cost the host (and, later, preemption, concurrent streams, jitter).
//! Every scenario runs in a child process with its own SIMGPU_* settings.

mod common;

use common::*;
use std::time::Instant;

/// Entry point of child processes: plays the role named in SIMGPU_TEST_ROLE.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var("SIMGPU_TEST_ROLE") else {
        return;
    };
    match role.as_str() {
        "callcost" => role_callcost(),
        "freesync" => role_freesync(),
        other => panic!("unknown role {other}"),
    }
}

/// Median and minimum of `n` timed calls, in ns.
fn time_calls(n: usize, mut call: impl FnMut()) -> (u64, u64) {
    let mut ns: Vec<u64> = (0..n)
        .map(|_| {
            let t = Instant::now();
            call();
            t.elapsed().as_nanos() as u64
        })
        .collect();
    ns.sort_unstable();
    (ns[n / 2], ns[0])
}

fn role_callcost() {
    let a = Api::setup();
    let f = a.function(PTX, "k");
    let (mut timed, mut untimed): (H, H) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: valid out-pointers; flag 2 is CU_EVENT_DISABLE_TIMING.
    unsafe {
        assert_eq!((a.event_create)(&mut timed, 0), 0);
        assert_eq!((a.event_create)(&mut untimed, 2), 0);
    }
    let s = std::ptr::null_mut();
    let (launch, launch_min) = time_calls(2000, || {
        assert_eq!(a.launch_grid(f, [1, 1, 1], s), 0);
    });
    // SAFETY: valid handles.
    let (record, record_min) = time_calls(2000, || unsafe {
        assert_eq!((a.event_record)(timed, s), 0);
    });
    // SAFETY: valid handles.
    let (record_untimed, _) = time_calls(2000, || unsafe {
        assert_eq!((a.event_record)(untimed, s), 0);
    });
    let (info, info_min) = time_calls(500, || {
        a.mem_info();
    });
    println!(
        "LAUNCH={launch} LAUNCH_MIN={launch_min} RECORD={record} RECORD_MIN={record_min} \
         RECORD_UNTIMED={record_untimed} INFO={info} INFO_MIN={info_min}"
    );
}

fn num(out: &str, key: &str) -> u64 {
    value(out, key)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_launch_costs_the_set_host_time() {
    let inst = Instance::new("callcost");
    let set = [
        ("SIMGPU_INSTANCE", inst.0.as_str()),
        ("SIMGPU_NULL", "1"),
        (
            "SIMGPU_CALL_COST",
            "launch=20us,event_record=40us,mem_get_info=30us",
        ),
    ];
    let out = run_child("callcost", &set);
    // Every call lasts at least its set cost; the typical one not much more
    // (generous: the machine is shared).
    assert!(num(&out, "LAUNCH_MIN") >= 20_000, "{out}");
    assert!(num(&out, "LAUNCH") < 20_000 + 15_000, "{out}");
    assert!(num(&out, "RECORD_MIN") >= 40_000, "{out}");
    assert!(num(&out, "RECORD") < 40_000 + 15_000, "{out}");
    assert!(num(&out, "INFO_MIN") >= 30_000, "{out}");

    // Defaults (also in null mode): a launch ≈ 2 µs, a timed record 2.5 µs,
    // an untimed one about ten times cheaper, cuMemGetInfo 5 µs.
    let out = run_child(
        "callcost",
        &[("SIMGPU_INSTANCE", &inst.0), ("SIMGPU_NULL", "1")],
    );
    assert!(num(&out, "LAUNCH_MIN") >= 2_000, "{out}");
    assert!(num(&out, "RECORD_MIN") >= 2_500, "{out}");
    assert!(num(&out, "INFO_MIN") >= 5_000, "{out}");
    assert!(
        num(&out, "RECORD_UNTIMED") < num(&out, "RECORD"),
        "untimed records are cheaper: {out}"
    );

    // Off: calls cost only simgpu's own work.
    let out = run_child(
        "callcost",
        &[
            ("SIMGPU_INSTANCE", &inst.0),
            ("SIMGPU_NULL", "1"),
            ("SIMGPU_CALL_COST", "0"),
        ],
    );
    assert!(num(&out, "LAUNCH") < 20_000, "{out}");
}

/// cuMemFree waits for queued kernels, as the real driver does.
fn role_freesync() {
    let a = Api::setup();
    let f = a.function(PTX, "k");
    let p = a.alloc(1 << 20).unwrap();
    let mut s: H = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    unsafe { assert_eq!((a.stream_create)(&mut s, 1), 0) };
    let t = Instant::now();
    assert_eq!(a.launch_grid(f, [1, 1, 1], s), 0);
    let launched = t.elapsed().as_micros();
    // SAFETY: freeing our own allocation.
    assert_eq!(unsafe { (a.mem_free)(p) }, 0);
    let freed = t.elapsed().as_micros();
    println!("LAUNCHED_US={launched} FREED_US={freed}");
}

#[test]
fn mem_free_waits_for_queued_kernels() {
    let inst = Instance::new("freesync");
    let out = run_child(
        "freesync",
        &[
            ("SIMGPU_INSTANCE", &inst.0),
            ("SIMGPU_KERNEL_COST", "k=50ms"),
        ],
    );
    assert!(
        num(&out, "LAUNCHED_US") < 50_000,
        "the launch is asynchronous: {out}"
    );
    assert!(
        num(&out, "FREED_US") >= 50_000,
        "the free waited for the kernel: {out}"
    );
}
