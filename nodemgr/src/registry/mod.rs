//! The daemon's tenants: their specs, regions, member processes and
//! sampling state; admission and re-adoption.
//!
//! A tenant is identified by (name, uid): the uid is the one the kernel
//! reported for its first process (`SO_PEERCRED`), and other users cannot
//! join it. The daemon holds the only writable mapping of each tenant's
//! budget region (a sealed memfd holding its SM share and its memory budget
//! per device); members get a read-only descriptor. The tenant's memory
//! ledger (a file its processes write) only counts usage: the daemon reads
//! a copy of it for status (never a mapping the tenant could truncate), but
//! the budget the interposer enforces is the one in the sealed region, and
//! real usage is audited from NVML ([`crate::audit`]).
//!
//! Nothing here performs I/O or waits: callers hold the registry lock, which
//! the control loop needs every period. Regions are made, and descriptors a
//! tenant hands back are inspected, before the lock is taken
//! ([`create_regions`]).
//!
//! - [`tenant`]: what is held per tenant (and per placement not yet
//!   registered);
//! - [`regions`]: the budget and activity regions the daemon makes and
//!   writes;
//! - [`admission`]: whether a spec fits on its GPUs;
//! - [`devices_in_use`]: the devices of a tenant not placed, as its
//!   processes use them;
//! - [`grants`]: specs the cluster granted (DRA claims), which win;
//! - [`placement_holds`]: GPUs chosen before a tenant's first process;
//! - [`persistence`]: the saved state and re-adoption;
//! - [`views`]: status, audit and ledger views.

pub mod admission;
pub mod devices_in_use;
pub mod grants;
pub mod persistence;
pub mod placement_holds;
pub mod regions;
pub mod tenant;
pub mod views;

pub use regions::{
    Regions, create_regions, effective_share, write_queue_bounds, write_share, write_shares,
};
pub use tenant::{
    Grant, HeldPlacement, MAX_HELD_PLACEMENTS, Member, PLACEMENT_GRACE, Peer, READOPT_GRACE,
    Tenant, TenantDevice, devices_on,
};

use crate::error::{self, Error};
use crate::observe::Sampler;
use dilu_abi::node_wire::{SpecUpdate, TenantSpec};
use dilu_abi::tenant_flags::check_tenant_name;
use regions::configure;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use tenant::initial_share;

pub struct Registry {
    /// Specs from the operator's configuration (win over the tenant's).
    pub configured: BTreeMap<String, TenantSpec>,
    /// What the cluster granted ([`grants`]; its specs win over both).
    pub granted: BTreeMap<String, Grant>,
    pub gpu_memory: Option<u64>,
    /// The node's GPUs (NVML's count; 0 or 1: every tenant is on the one
    /// GPU, placed or not).
    pub node_gpus: usize,
    pub tenants: BTreeMap<String, Tenant>,
    /// GPUs chosen for tenants not registered yet, by tenant name.
    pub held: BTreeMap<String, HeldPlacement>,
    /// Bumped when the tenant set changes (controllers reset).
    pub epoch: u64,
    next_member: u64,
    /// Tenants one uid may have registered (`max_tenants_per_uid`).
    pub max_tenants_per_uid: usize,
}

impl Registry {
    pub fn new(configured: BTreeMap<String, TenantSpec>, gpu_memory: Option<u64>) -> Self {
        Registry {
            configured,
            granted: BTreeMap::new(),
            gpu_memory,
            node_gpus: 0,
            tenants: BTreeMap::new(),
            held: BTreeMap::new(),
            epoch: 0,
            next_member: 1,
            max_tenants_per_uid: crate::config::DEFAULT_MAX_TENANTS_PER_UID,
        }
    }

    /// The spec tenant `name` runs with: the cluster's grant for this name,
    /// else the operator's configuration, else what it asked, else the
    /// default.
    pub(super) fn spec_of(&self, name: &str, asked: Option<TenantSpec>) -> TenantSpec {
        self.granted
            .get(name)
            .map(|grant| &grant.spec)
            .or_else(|| self.configured.get(name))
            .cloned()
            .or(asked)
            .unwrap_or_default()
    }

    /// Registers a process of tenant `name`. `fresh` are regions made for
    /// it outside the lock ([`create_regions`]; the telemetry a re-attaching
    /// process handed back, if it could be adopted): used when the tenant is
    /// new or is re-adopted after a restart, dropped otherwise. Nothing here
    /// reads a tenant's descriptor or waits: the caller holds the registry
    /// lock. The share never comes from the tenant: a re-adopted tenant gets
    /// the one the previous daemon saved, a new one its limit.
    /// Returns the member id, the spec in force and the fds to send.
    pub fn register(
        &mut self,
        name: &str,
        peer: Peer,
        start_time: u64,
        asked: Option<TenantSpec>,
        fresh: Regions,
    ) -> error::Result<(u64, TenantSpec, [Arc<OwnedFd>; 2])> {
        check_tenant_name(name).map_err(Error::Invalid)?;
        let mut fresh = Some(fresh);
        if let Some(tenant) = self.tenants.get_mut(name)
            && tenant.uid == peer.uid
            && tenant.awaiting_since.take().is_some()
            && fresh.as_ref().is_some_and(|r| r.adopted)
        {
            // Re-adopted from the state file: the first process back hands
            // over the telemetry its processes write.
            let regions = fresh.take().expect("checked above");
            configure(&regions, tenant.devices[0].share_ppm, tenant.spec.mem);
            write_shares(&regions.budget, tenant.shares());
            tenant.regions = regions;
            for device in &mut tenant.devices {
                device.sampler = Sampler::for_device(device.ordinal);
            }
        }
        if !self.tenants.contains_key(name) {
            let spec = self.spec_of(name, asked);
            // A GPU chosen for it by `dilu run`, or granted by the
            // cluster, is its GPU from now on.
            let gpus = match self.held.get(name) {
                Some(held) if held.uid != peer.uid => {
                    return Err(Error::Refused(format!(
                        "tenant {name:?} belongs to another user (uid {})",
                        held.uid
                    )));
                }
                Some(held) => held.gpus.clone(),
                None => self.granted_gpus(name),
            };
            self.check_tenant_cap(peer.uid)?;
            // A process handing back its regions is already running (it
            // started while the daemon was away, or outlived a previous
            // one): refusing it would leave it unmanaged, so it is held to
            // the room left and named as over-admitted.
            let running = fresh.as_ref().is_some_and(|r| r.adopted);
            let (spec, over_admitted) = match self.admit_each(name, &spec, &gpus) {
                Ok(()) => (spec, None),
                Err(reason) if running => {
                    let held = self.room_left_on(name, &spec, &gpus);
                    tracing::warn!(
                        tenant = name,
                        uid = peer.uid,
                        "over-admitted: {reason}; held to SM request {} and memory {}",
                        held.sm_request,
                        held.mem.map_or("unlimited".into(), |b| b.to_string())
                    );
                    (held, Some(reason.to_string()))
                }
                Err(reason) => return Err(reason),
            };
            self.held.remove(name);
            let share = initial_share(&spec);
            let regions = fresh.take().expect("not used above for a new tenant");
            configure(&regions, share, spec.mem);
            self.tenants.insert(
                name.to_string(),
                Tenant {
                    name: name.to_string(),
                    uid: peer.uid,
                    spec,
                    regions,
                    members: BTreeMap::new(),
                    ledger: None,
                    awaiting_since: None,
                    placed: !gpus.is_empty(),
                    seen_on_gpus: Vec::new(),
                    devices: devices_on(&gpus, share),
                    over_admitted,
                },
            );
            self.epoch += 1;
        }
        let tenant = self.tenants.get_mut(name).expect("inserted above");
        if tenant.uid != peer.uid {
            return Err(Error::Refused(format!(
                "tenant {name:?} belongs to another user (uid {})",
                tenant.uid
            )));
        }
        let id = self.next_member;
        self.next_member += 1;
        tenant.members.insert(
            id,
            Member {
                pid: peer.pid,
                start_time,
                connection: peer.connection,
            },
        );
        let fds = [
            tenant.regions.budget_ro.clone(),
            tenant.regions.activity_fd.clone(),
        ];
        Ok((id, tenant.spec.clone(), fds))
    }

    /// A member's connection closed. A tenant with no member left is gone:
    /// its share goes back to the others.
    pub fn leave(&mut self, member: u64) {
        let mut emptied = None;
        for (name, tenant) in &mut self.tenants {
            if tenant.members.remove(&member).is_some() && tenant.members.is_empty() {
                emptied = Some(name.clone());
            }
        }
        if let Some(name) = emptied {
            self.tenants.remove(&name);
            self.epoch += 1;
        }
    }

    /// Applies an operator's change after admission.
    pub fn update(&mut self, name: &str, update: &SpecUpdate) -> error::Result<TenantSpec> {
        if self.granted.contains_key(name) {
            // The grant would put it back at its next renewal.
            return Err(Error::Refused(format!(
                "tenant {name:?} runs under a cluster's grant (a DRA ResourceClaim): \
                 change its claim instead"
            )));
        }
        let tenant = self
            .tenants
            .get(name)
            .ok_or_else(|| Error::Invalid(format!("no tenant named {name:?}")))?;
        let mut spec = tenant.spec.clone();
        if let Some(v) = update.class {
            spec.class = v;
        }
        if let Some(v) = update.slo_ms {
            spec.slo_ms = Some(v);
        }
        if let Some(v) = update.sm_request {
            spec.sm_request = v;
        }
        if let Some(v) = update.sm_limit {
            spec.sm_limit = v;
            spec.sm_request = spec.sm_request.min(v);
        }
        if let Some(v) = update.mem {
            spec.mem = Some(v);
        }
        self.admit_each(name, &spec, &tenant.gpus())?;
        let tenant = self.tenants.get_mut(name).expect("checked above");
        tenant.spec = spec.clone();
        // Live: every member's next allocation is held to the new budget.
        tenant
            .regions
            .budget
            .set_mem_budget_all(spec.mem.map(dilu_abi::units::Bytes::get));
        self.epoch += 1;
        Ok(spec)
    }

    /// Housekeeping every ~100 ms: re-adoption grace expired; the devices
    /// unplaced tenants use ([`Registry::follow_devices_in_use`]: here, not
    /// in the control period, whose cost it doubled at 64 tenants, reading
    /// every device's counters). Memory only (the ledgers are read outside
    /// the lock: [`Registry::ledger_sources`]).
    pub fn housekeeping(&mut self) {
        self.follow_devices_in_use();
        let before = self.tenants.len();
        self.tenants.retain(|_, t| {
            t.awaiting_since
                .is_none_or(|since| since.elapsed() < READOPT_GRACE)
        });
        if self.tenants.len() != before {
            self.epoch += 1;
        }
        self.held.retain(|_, h| h.since.elapsed() < PLACEMENT_GRACE);
    }
}

/// Registering tenants in unit tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::{HeldPlacement, Peer, Registry, create_regions};
    use dilu_abi::node_wire::TenantSpec;
    use std::sync::Arc;
    use std::time::Instant;

    /// Registers a process `pid` of tenant `name` (uid 1) with `spec`,
    /// placed on `gpus` (empty: not placed).
    pub fn register_on(
        registry: &mut Registry,
        name: &str,
        pid: i32,
        gpus: &[u32],
        spec: TenantSpec,
    ) {
        if !gpus.is_empty() {
            let held = HeldPlacement {
                uid: 1,
                spec: spec.clone(),
                gpus: gpus.to_vec(),
                since: Instant::now(),
            };
            registry.held.insert(name.into(), held);
        }
        let peer = Peer {
            pid,
            uid: 1,
            connection: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
        };
        let fresh = create_regions(name, None).unwrap();
        registry.register(name, peer, 0, Some(spec), fresh).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dilu_abi::node_wire::{Bytes, SmShare};
    use dilu_layout::activity::TenantActivity;
    use dilu_layout::budget::FULL_SHARE_PPM;
    use dilu_layout::memfd;
    use std::time::Instant;

    fn peer(uid: u32) -> Peer {
        Peer {
            pid: std::process::id() as i32,
            uid,
            connection: Arc::new(std::fs::File::open("/dev/null").unwrap().into()),
        }
    }

    fn shares(request: f64, limit: f64) -> TenantSpec {
        TenantSpec {
            sm_request: SmShare::percent(request),
            sm_limit: SmShare::percent(limit),
            ..TenantSpec::default()
        }
    }

    #[test]
    fn a_placed_tenant_keeps_its_gpu_and_is_admitted_only_against_that_gpu() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let big = shares(60.0, 60.0);
        let gpus = [80u64 << 30; 2];
        let place = |registry: &mut Registry, name: &str, uid: u32| {
            registry
                .place(name, uid, Some(big.clone()), &gpus, dilu.as_ref(), 1)
                .map(|gpus| gpus.first().copied())
        };
        assert_eq!(
            registry.place("a", 1, Some(big.clone()), &gpus[..1], dilu.as_ref(), 1),
            Ok(Vec::new()),
            "one GPU: nothing to choose"
        );
        let a = place(&mut registry, "a", 1).unwrap().unwrap();
        assert_eq!(place(&mut registry, "a", 1), Ok(Some(a)), "held: same GPU");
        assert!(
            place(&mut registry, "a", 2)
                .unwrap_err()
                .message()
                .contains("another user")
        );
        let b = place(&mut registry, "b", 1).unwrap().unwrap();
        assert_ne!(a, b);
        assert!(
            place(&mut registry, "c", 1)
                .unwrap_err()
                .message()
                .contains("no GPU of 2")
        );
        // Registration takes the held GPU; 60% + 60% is admitted because
        // the two are on different GPUs.
        for name in ["a", "b"] {
            let fresh = create_regions("test", None).unwrap();
            registry
                .register(name, peer(1), 0, Some(big.clone()), fresh)
                .unwrap();
        }
        assert!(registry.held.is_empty());
        assert_eq!(registry.tenants["a"].gpus(), vec![a]);
        assert_eq!(
            place(&mut registry, "a", 1),
            Ok(Some(a)),
            "running: same GPU"
        );
        // An unplaced tenant is admitted against unplaced ones only.
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("free", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(
            registry.saved().iter().filter(|s| s.gpu.is_some()).count(),
            2
        );
    }

    #[test]
    fn a_tenant_given_several_gpus_holds_its_spec_on_each_of_them() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let big = shares(60.0, 60.0);
        let gpus = [80u64 << 30; 4];
        let place = |registry: &mut Registry, name: &str, count: usize| {
            registry.place(name, 1, Some(big.clone()), &gpus, dilu.as_ref(), count)
        };
        assert_eq!(
            place(&mut registry, "wide", 5).unwrap_err(),
            Error::Invalid("wide asks 5 GPUs; this node has 4".into())
        );
        let wide = place(&mut registry, "wide", 2).unwrap();
        assert_eq!(wide.len(), 2);
        assert!(wide[0] < wide[1], "ascending: {wide:?}");
        assert!(
            place(&mut registry, "wide", 1)
                .unwrap_err()
                .message()
                .contains("--gpus 2"),
            "its processes share one placement"
        );
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("wide", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(registry.tenants["wide"].gpus(), wide);
        assert_eq!(registry.saved()[0].more_gpus, wide[1..]);
        // A restarted daemon gives each device back its own share.
        registry.tenants.get_mut("wide").unwrap().devices[1].share_ppm = 450_000;
        let mut restarted = Registry::new(BTreeMap::new(), None);
        restarted.restore(registry.saved());
        let back = &restarted.tenants["wide"];
        assert_eq!(back.gpus(), wide);
        assert_eq!(back.devices[1].share_ppm, 450_000);
        assert_eq!(back.regions.budget.share_ppm(1), 450_000);
        assert_eq!(back.regions.budget.share_ppm(0), back.devices[0].share_ppm);
        // Each of its GPUs is full for another 60%: the other two are left.
        let two = place(&mut registry, "other", 2).unwrap();
        assert!(two.iter().all(|g| !wide.contains(g)), "{two:?} {wide:?}");
        let refused = place(&mut registry, "third", 1).unwrap_err();
        assert!(matches!(refused, Error::Refused(_)), "{refused:?}");
        assert!(
            refused.message().contains("no GPU of 4 has room"),
            "{refused}"
        );
        // Raising its request past what its second GPU has left is refused.
        registry.held.insert(
            "small".into(),
            HeldPlacement {
                uid: 1,
                spec: shares(30.0, 30.0),
                gpus: vec![wide[1]],
                since: Instant::now(),
            },
        );
        let raise = |pct| SpecUpdate {
            sm_request: Some(SmShare::percent(pct)),
            sm_limit: Some(SmShare::percent(pct)),
            ..SpecUpdate::default()
        };
        registry.update("wide", &raise(70.0)).unwrap();
        let refused = registry.update("wide", &raise(80.0)).unwrap_err();
        assert!(
            matches!(&refused, Error::Refused(reason)
                if reason.starts_with(&format!("on gpu{}:", wide[1]))),
            "{refused:?}"
        );
    }

    #[test]
    fn a_user_at_its_tenant_cap_does_not_stop_another_users_registration() {
        let mut registry = Registry::new(BTreeMap::new(), None);
        registry.max_tenants_per_uid = 3;
        let register = |registry: &mut Registry, name: &str, uid: u32| {
            let fresh = create_regions("test", None).unwrap();
            registry
                .register(name, peer(uid), 0, None, fresh)
                .map(|_| ())
        };
        for i in 0..3 {
            register(&mut registry, &format!("hog{i}"), 1000).unwrap();
        }
        let refused = register(&mut registry, "hog3", 1000).unwrap_err();
        assert!(
            matches!(&refused, Error::Refused(reason) if reason.contains("max_tenants_per_uid = 3")),
            "{refused:?}"
        );
        // More processes of a tenant it has are not more tenants.
        register(&mut registry, "hog0", 1000).unwrap();
        // Another user registers as if the first had none.
        register(&mut registry, "victim", 1001).unwrap();
        assert_eq!(registry.tenants["victim"].uid, 1001);
        // A tenant that leaves frees its place.
        let member = *registry.tenants["hog1"].members.keys().next().unwrap();
        registry.leave(member);
        register(&mut registry, "hog3", 1000).unwrap();
    }

    #[test]
    fn a_running_process_that_does_not_fit_is_over_admitted_within_the_room_left() {
        let gib = 1u64 << 30;
        let mut registry = Registry::new(BTreeMap::new(), Some(8 * gib));
        let big = TenantSpec {
            mem: Some(Bytes::new(6 * gib)),
            ..shares(70.0, 100.0)
        };
        let fresh = create_regions("test", None).unwrap();
        registry
            .register("first", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        // A new process asking for the same is refused...
        let fresh = create_regions("test", None).unwrap();
        let refused = registry.register("second", peer(1), 0, Some(big.clone()), fresh);
        assert!(refused.is_err());
        // ...but one that hands back its activity region is already running.
        let (_, handed_back) =
            memfd::create::<TenantActivity>(c"dilu-test-activity", |_| {}).unwrap();
        memfd::seal_size(&handed_back).unwrap();
        let fresh = create_regions("test", Some(handed_back)).unwrap();
        let (_, spec, _) = registry
            .register("second", peer(1), 0, Some(big.clone()), fresh)
            .unwrap();
        assert_eq!(
            spec.sm_request,
            SmShare::percent(30.0),
            "the unrequested share"
        );
        assert_eq!(spec.mem, Some(Bytes::new(2 * gib)), "the unbudgeted memory");
        let reason = registry.tenants["second"].over_admitted.clone().unwrap();
        assert!(reason.contains("SM requests would sum"), "{reason}");
        let status = registry.status();
        assert!(
            status
                .iter()
                .any(|t| t.name == "second" && t.over_admitted.is_some())
        );
        assert!(
            status
                .iter()
                .any(|t| t.name == "first" && t.over_admitted.is_none())
        );
        // Admission holds with it counted: nothing more fits.
        let fresh = create_regions("test", None).unwrap();
        let small = TenantSpec {
            mem: Some(Bytes::new(gib)),
            ..shares(1.0, 100.0)
        };
        assert!(
            registry
                .register("third", peer(1), 0, Some(small), fresh)
                .is_err()
        );
    }

    #[test]
    fn held_placements_are_bounded() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let small = shares(0.0, 1.0);
        let gpus = [80u64 << 30; 8];
        for i in 0..MAX_HELD_PLACEMENTS {
            let name = format!("t{i}");
            registry
                .place(&name, 1, Some(small.clone()), &gpus, dilu.as_ref(), 1)
                .unwrap();
        }
        let refused = registry.place("more", 1, Some(small), &gpus, dilu.as_ref(), 1);
        let refused = refused.unwrap_err();
        assert!(matches!(refused, Error::Refused(_)), "{refused:?}");
        assert!(refused.message().contains("try again later"), "{refused}");
    }

    /// A tenant's regions hold 16 devices: a node of more GPUs gives no
    /// tenant more than that (its 17th device would have no share).
    #[test]
    fn no_tenant_is_placed_on_more_gpus_than_its_regions_hold() {
        let dilu = dilu_placement::policy::policy_by_name("dilu").unwrap();
        let mut registry = Registry::new(BTreeMap::new(), None);
        let gpus = [80u64 << 30; 20];
        let small = Some(shares(1.0, 1.0));
        let refused = registry.place("wide", 1, small.clone(), &gpus, dilu.as_ref(), 17);
        let refused = refused.unwrap_err();
        assert!(matches!(refused, Error::Invalid(_)), "{refused:?}");
        assert!(refused.message().contains("at most 16"), "{refused}");
        let placed = registry.place("wide", 1, small, &gpus, dilu.as_ref(), 16);
        assert_eq!(placed.map(|g| g.len()), Ok(16));
    }

    proptest::proptest! {
        /// Whatever name and spec a tenant sends, registration admits it
        /// within the GPU or refuses it with a reason; admitted requests
        /// never sum past the whole GPU.
        #[test]
        fn any_registration_is_admitted_within_the_gpu_or_refused(
            asks in proptest::collection::vec((
                "[ -~]{0,70}",
                proptest::num::u32::ANY,
                proptest::num::u32::ANY,
                proptest::option::of(proptest::num::u64::ANY),
                0u32..3,
            ), 1..6),
        ) {
            let mut registry = Registry::new(BTreeMap::new(), Some(80 << 30));
            for (name, request, limit, mem, uid) in asks {
                let spec = TenantSpec {
                    sm_request: SmShare::from_ppm(request),
                    sm_limit: SmShare::from_ppm(limit),
                    mem: mem.map(Bytes::new),
                    ..TenantSpec::default()
                };
                let Ok(fresh) = create_regions("fuzz", None) else { continue };
                if let Err(reason) = registry.register(&name, peer(uid), 0, Some(spec), fresh) {
                    proptest::prop_assert!(!reason.message().is_empty());
                }
            }
            let requested: u32 = registry.tenants.values().map(|t| t.spec.sm_request.ppm()).sum();
            proptest::prop_assert!(requested <= FULL_SHARE_PPM);
            let _ = registry.status();
        }
    }
}
