//! The node manager in-process: registration over its socket, budgets a
//! tenant cannot write, admission, operator changes, dead tenants, metrics.

use dilu_abi::node_client;
use dilu_abi::node_wire::SmShare;
use dilu_abi::node_wire::{self, Bytes, FromDaemon, SpecUpdate, TenantSpec, ToDaemon, WorkClass};
use dilu_abi::seqpacket;
use dilu_layout::budget::TenantBudget;
use dilu_layout::shm::Region;
use dilu_nodemgr::config::Config;
use dilu_nodemgr::daemon::Daemon;
use dilu_nodemgr::ops;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A test's own directory, removed when the test ends (passed or not).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("dilu-nodemgr-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

fn start(dir: &Path) -> Daemon {
    let config = Config {
        socket: dir.join("nodemgr.sock"),
        run_dir: dir.join("run"),
        metrics: Some("127.0.0.1:0".into()),
        ..Config::default()
    };
    Daemon::start(config).expect("daemon starts")
}

/// Registers like a tenant process would, keeping the raw descriptors (what
/// a hostile tenant has in hand).
fn register_raw(
    socket: &Path,
    tenant: &str,
    spec: Option<TenantSpec>,
) -> Result<(OwnedFd, OwnedFd, OwnedFd), String> {
    let connection = seqpacket::connect(socket, Some(Duration::from_secs(10))).unwrap();
    let request = node_wire::encode(&ToDaemon::Register {
        version: node_wire::PROTOCOL_VERSION,
        tenant: tenant.into(),
        spec,
        reattach: false,
    })
    .unwrap();
    seqpacket::send(&connection, &request, &[]).unwrap();
    let mut buffer = vec![0u8; seqpacket::MAX_MESSAGE];
    let (n, mut fds) = seqpacket::recv(&connection, &mut buffer).unwrap();
    match node_wire::decode::<FromDaemon>(&buffer[..n]).unwrap() {
        FromDaemon::Registered { .. } => {
            assert_eq!(fds.len(), 2);
            let telemetry = fds.pop().unwrap();
            Ok((connection, fds.pop().unwrap(), telemetry))
        }
        FromDaemon::Refused { reason } => Err(reason),
        other => panic!("unexpected {other:?}"),
    }
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Asks for a writable mapping of `fd` (MAP_SHARED or MAP_PRIVATE).
fn map_writable(fd: i32, size: usize, kind: i32) -> *mut libc::c_void {
    // SAFETY: a fresh mapping request; callers check the result.
    unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            kind,
            fd,
            0,
        )
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn latency_spec(request: f64, limit: f64) -> TenantSpec {
    TenantSpec {
        class: WorkClass::Latency,
        slo_ms: Some(50.0),
        sm_request: SmShare::percent(request),
        sm_limit: SmShare::percent(limit),
        mem: None,
    }
}

#[test]
fn a_tenant_cannot_raise_its_own_budget() {
    let dir = scratch("readonly");
    let daemon = start(&dir);
    let socket = dir.join("nodemgr.sock");
    let spec = TenantSpec {
        mem: Some(Bytes::mib(64)),
        ..latency_spec(30.0, 40.0)
    };
    let (_connection, budget_fd, _telemetry_fd) =
        register_raw(&socket, "victim", Some(spec)).unwrap();
    let budget = Region::<TenantBudget>::from_fd(budget_fd.as_raw_fd(), false).unwrap();
    wait_until("the controller's first write", || {
        budget.share_ppm(0) == 400_000
    });
    assert_eq!(budget.mem_budget(0), 64 << 20, "the memory budget is in it");
    let size = std::mem::size_of::<TenantBudget>();
    let address = (&*budget as *const TenantBudget)
        .cast_mut()
        .cast::<libc::c_void>();

    // 1. Make the read-only mapping writable.
    // SAFETY: mprotect on a mapping we own; the test expects it to fail.
    let r = unsafe { libc::mprotect(address, size, libc::PROT_READ | libc::PROT_WRITE) };
    assert_eq!(
        (r, errno()),
        (-1, libc::EACCES),
        "mprotect to writable must fail"
    );

    // 2. Map the descriptor it was given, writable and shared.
    let mapped = map_writable(budget_fd.as_raw_fd(), size, libc::MAP_SHARED);
    assert_eq!(
        mapped,
        libc::MAP_FAILED,
        "a writable shared mapping of the fd must fail"
    );

    // 3. Reopen the file read-write through /proc (works for its owner and
    //    for root), then map it writable or write(2) to it: the seal refuses.
    let path = format!("/proc/self/fd/{}", budget_fd.as_raw_fd());
    if let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
    {
        let mapped = map_writable(file.as_raw_fd(), size, libc::MAP_SHARED);
        assert_eq!(mapped, libc::MAP_FAILED, "sealed: no new writable mapping");
        assert_eq!(errno(), libc::EPERM);
        let garbage = vec![0xffu8; size];
        use std::os::unix::fs::FileExt;
        assert!(
            file.write_at(&garbage, 0).is_err(),
            "sealed: write(2) refused"
        );
        assert!(file.set_len(0).is_err(), "sealed: cannot shrink");
        // SAFETY: fcntl on a file we hold.
        let unsealed = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, 0) };
        assert_eq!(unsealed, -1, "seals are sealed");
    }

    // 4. A private copy can be written, but nobody else sees it.
    let private = map_writable(budget_fd.as_raw_fd(), size, libc::MAP_PRIVATE);
    assert_ne!(private, libc::MAP_FAILED);
    // SAFETY: a private mapping we write and unmap.
    unsafe {
        std::ptr::write_bytes(private.cast::<u8>(), 0xff, size);
        libc::munmap(private, size);
    }

    // 5. A plain store into the mapping kills the writer (SIGSEGV).
    // SAFETY: fork in a test; the child only stores and exits.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // SAFETY: deliberately writing through a read-only mapping.
        unsafe {
            std::ptr::write_volatile(address.cast::<u64>().add(2), u64::MAX);
            libc::_exit(0);
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the store must fault (status {status:#x})"
    );

    // The budget is still the daemon's, and the daemon can still change it.
    assert_eq!(budget.share_ppm(0), 400_000);
    assert_eq!(budget.mem_budget(0), 64 << 20);
    ops::set(
        &socket,
        "victim",
        SpecUpdate {
            sm_limit: Some(SmShare::percent(60.0)),
            mem: Some(Bytes::mib(128)),
            ..SpecUpdate::default()
        },
    )
    .unwrap();
    assert_eq!(
        budget.mem_budget(0),
        128 << 20,
        "the memory budget is written before `dilu set` returns"
    );
    wait_until("the operator's new limit", || {
        budget.share_ppm(0) == 600_000
    });
    let status = ops::fetch_status(&socket).unwrap();
    assert_eq!(status.tenants[0].mem_budget_bytes, Some(128 << 20));
    daemon.stop();
}

#[test]
fn admission_identity_departure_and_metrics() {
    let dir = scratch("admission");
    let daemon = start(&dir);
    let socket = dir.join("nodemgr.sock");

    let attached = node_client::attach_at(&socket, "infer", Some(latency_spec(30.0, 80.0)))
        .unwrap()
        .expect("a daemon is listening");
    assert_eq!(attached.spec().sm_limit.as_percent(), 80.0);
    let refused = register_raw(
        &socket,
        "greedy",
        Some(TenantSpec {
            sm_request: SmShare::percent(80.0),
            ..TenantSpec::default()
        }),
    )
    .unwrap_err();
    assert!(
        refused.contains("110%") && refused.contains("infer 30%"),
        "a clear reason: {refused}"
    );
    let bad_name = register_raw(&socket, "../etc", None).unwrap_err();
    assert!(bad_name.contains("invalid"), "{bad_name}");

    // The pid comes from the kernel, not from the message.
    let (connection, _, _) = register_raw(&socket, "train", None).unwrap();
    let status = ops::fetch_status(&socket).unwrap();
    let pids: Vec<i32> = status.tenants.iter().flat_map(|t| t.pids.clone()).collect();
    assert_eq!(pids, vec![std::process::id() as i32; 2]);

    // Metrics say what status says.
    let addr = daemon.metrics_addr.clone().unwrap();
    let text = http_get(&addr, "/metrics");
    let samples = parse_prometheus(&text);
    let status = ops::fetch_status(&socket).unwrap();
    for t in &status.tenants {
        let get = |name: &str| {
            samples
                .iter()
                .find(|(n, labels, _)| {
                    n == name && labels.contains(&format!("tenant=\"{}\"", t.name))
                })
                .map(|s| s.2)
                .unwrap_or_else(|| panic!("{name} for {} missing in:\n{text}", t.name))
        };
        assert_eq!(
            get("dilu_tenant_sm_request_ratio"),
            t.spec.sm_request.as_percent() / 100.0
        );
        assert_eq!(
            get("dilu_tenant_sm_limit_ratio"),
            t.spec.sm_limit.as_percent() / 100.0
        );
        assert_eq!(get("dilu_tenant_processes"), t.pids.len() as f64);
        assert!(get("dilu_tenant_launches_total") >= 0.0);
    }
    let table = ops::format_status(&status);
    assert!(
        table.contains("infer") && table.contains("latency") && table.contains("80%"),
        "{table}"
    );

    // A tenant whose processes are gone is dropped and its request freed.
    drop(connection);
    wait_until("the departed tenant to go", || {
        ops::fetch_status(&socket)
            .unwrap()
            .tenants
            .iter()
            .all(|t| t.name != "train")
    });
    register_raw(
        &socket,
        "bigger",
        Some(TenantSpec {
            sm_request: SmShare::percent(70.0),
            ..TenantSpec::default()
        }),
    )
    .expect("70% fits beside 30%");
    daemon.stop();
}

fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.") && head.contains(" 200"),
        "{head}"
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text")
    );
    body.to_string()
}

/// A strict reading of the exposition format: every sample line is
/// `name{label="value",...} number`, declared by a TYPE line, names and
/// labels well formed, ending in `# EOF`. Returns (name, labels, value).
fn parse_prometheus(text: &str) -> Vec<(String, String, f64)> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut families: Vec<(String, String)> = Vec::new();
    let mut samples = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
            assert!(valid_name(name) && name.starts_with("dilu_"), "{line}");
            assert!(["gauge", "counter"].contains(&kind), "{line}");
            families.push((name.into(), kind.into()));
            continue;
        }
        if line.starts_with("# HELP ") || line.starts_with("# UNIT ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment {line}");
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.strip_suffix('}').expect("labels close");
                for pair in labels.split(',') {
                    let (key, quoted) = pair
                        .split_once('=')
                        .unwrap_or_else(|| panic!("label=value in {line}"));
                    assert!(valid_name(key), "{line}");
                    assert!(
                        ["gpu", "uuid", "tenant", "advice"].contains(&key),
                        "no pid labels: {line}"
                    );
                    assert!(quoted.starts_with('"') && quoted.ends_with('"'), "{line}");
                }
                (name, labels.to_string())
            }
            None => (series, String::new()),
        };
        let family = families.last().expect("a sample follows its TYPE");
        match family.1.as_str() {
            "counter" => {
                assert_eq!(
                    name,
                    format!("{}_total", family.0),
                    "counter samples end in _total"
                )
            }
            _ => assert_eq!(name, family.0),
        }
        samples.push((name.to_string(), labels, value));
    }
    samples
}
