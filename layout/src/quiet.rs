//! The quiet board: how a process times a kernel longer than a time slice
//! without another process's slice inside the sample.
//!
//! A GPU shared by time slicing preempts a kernel at the end of its slice
//! (2.08 ms on an H100) whenever another process has work queued. A sample
//! of a longer kernel then spans the other process's slice too, every time
//! the other process is busy, so the smallest samples are no cleaner than
//! the rest and the kind is charged about twice its time: a 30% tenant of
//! 3 ms kernels beside a busy 70% one got 17-21% of the device.
//!
//! So before timing a long kind, a process *posts a hold* for its device:
//! the board's other members (every process under SM-time control on that
//! device, same user) hold their next launches until the hold ends, and
//! each *acknowledges* it once its own queued work is done. The holder times
//! its launch once the active members acknowledged (or a drain limit
//! passed) and *releases* the hold when the sample is read. Holds are rare
//! (a steady kind is timed one launch in thousands) and short (a queue's
//! drain and one kernel).
//!
//! The board is advisory: every member maps it writable. A member only ever
//! delays its own launches for it, for at most [`MAX_HOLD_NS`] per hold and
//! within a budget of its own (see the interposer's `quiet_samples`), so a
//! process that posts holds without end slows the others by that budget at
//! most and cannot stop them.
//!
//! The same members take **fair turns** at the device while each has an SM
//! share: a member's *vtime* is the GPU time it was charged divided by its
//! share, and a member whose vtime is ahead of another's by more than a lag
//! holds its next launch while that other one *waits on the device* (its
//! queued work, a synchronisation, the moment after one), or is let go by
//! its bucket or expected back before that launch would end. So two tenants
//! that both keep the device busy split the time they use by their shares,
//! not by who switches less; a tenant busy on its host holds nobody. The
//! member with the least vtime never waits, and an engagement lasts at most
//! [`MAX_ENGAGED_NS`] from when it was written, so turns cannot deadlock.
//! Turns are advisory too: a member waits for them at most a bounded time
//! per launch (see the interposer's `fair_turns`).
//!
//! Members **skip idle time** together: each says until when its token
//! bucket holds it back once the driver says its work ran, and its share
//! (counted once per tenant). When every active member is held back so,
//! and their shares add up to the whole device, the device
//! idles only because the charges stood for more time than the work took
//! (a sample holds the device's gap before its kernel, which a tenant's
//! other streams hide). Then the board's *skipped* total grows by the time
//! until the first member would wake ([`DeviceQuiet::skip_idle`]), and
//! every held member takes that much off its bucket's debt: each gains its
//! share of the skipped time, so the split of the device stays that of the
//! shares, and nobody gains anything while anyone has work to run or the
//! shares leave part of the device free. Hold times are written on the
//! board's clock (wall clock plus the skipped total when written), so one
//! skip moves every held member's wake at once without a write of theirs.

use crate::budget::FULL_SHARE_PPM;
use crate::shm::SharedLayout;
use std::sync::atomic::{AtomicU64, Ordering::*};

/// Processes per device that can take part.
pub const MAX_MEMBERS: usize = 32;
/// Longest hold a member honours: a hold posted longer (or a word written
/// by anything else) is ignored.
pub const MAX_HOLD_NS: u64 = 100_000_000;
/// A member that launched within this long is active: a holder waits for
/// its acknowledgement. A member idle longer has no queue to drain (or is
/// gone); its slot may be taken over after [`STALE_NS`] if its process is.
pub const ACTIVE_WITHIN_NS: u64 = 100_000_000;
/// A member idle this long whose process is gone leaves its slot free.
pub const STALE_NS: u64 = 10_000_000_000;
/// Longest a member may say it waits on the device, from the moment a
/// reader looks: a word further out (or written by anything else) engages
/// nobody.
pub const MAX_ENGAGED_NS: u64 = 100_000_000;
/// A member notes its launches at most this often (a write to its slot).
const SEEN_EVERY_NS: u64 = 1_000_000;

/// The hold of one device: one cache line every launch of every member
/// reads (`until_ns`, zero when no hold is posted) and only a holder writes.
#[repr(C, align(64))]
struct Hold {
    /// CLOCK_MONOTONIC instant the hold ends; 0: none.
    until_ns: AtomicU64,
    /// The holder's pid.
    holder: AtomicU64,
    /// Counts holds: a member acknowledges a hold by its number.
    seq: AtomicU64,
    /// Slots ever taken are all below this (a scan of the members stops
    /// there: on a device shared by two processes, two cache lines).
    slots_used: AtomicU64,
    /// Idle time skipped so far (see [`DeviceQuiet::skip_idle`]); only grows.
    skipped_ns: AtomicU64,
}

/// One member's slot (cache lines of its own: written by that member only).
#[repr(C, align(64))]
struct Member {
    /// The member's pid; 0: free.
    pid: AtomicU64,
    /// When it last launched (at most [`SEEN_EVERY_NS`] stale).
    seen_ns: AtomicU64,
    /// The last hold it found its queued work done for.
    drained_seq: AtomicU64,
    /// Its place in the fair turns: GPU time charged over its share
    /// (see [`DeviceQuiet::owed_turn`]).
    vtime_ns: AtomicU64,
    /// Until when it waits on the device (its queued work, a
    /// synchronisation and the moment after it); 0: not.
    engaged_until_ns: AtomicU64,
    /// Until when its token bucket holds it back, with its work run, on the
    /// board's clock (wall clock plus the skipped total); 0: not held.
    held_until_ns: AtomicU64,
    /// Its SM share (ppm) and its tenant's key (see
    /// [`crate::bucket::TokenBucket::tenant_key`]).
    share_ppm: AtomicU64,
    tenant_key: AtomicU64,
    /// When it is expected to launch again, its work run and its
    /// synchronisation on it returning (0: not expected).
    back_at_ns: AtomicU64,
}

#[repr(C)]
pub struct DeviceQuiet {
    hold: Hold,
    members: [Member; MAX_MEMBERS],
}

/// The quiet board of one GPU, shared by one user's processes.
#[repr(C)]
pub struct QuietBoard {
    magic: AtomicU64,
    device: DeviceQuiet,
}

// SAFETY: repr(C), atomics and padding only; all-zero is "no hold, no
// members", a valid state.
unsafe impl SharedLayout for QuietBoard {
    const MAGIC: u64 = 0x6469_6c75_5155_0005; // "diluQU" v5 (v3: fair turns; v4: idle skips; v5: expected returns)
    fn magic(&self) -> &AtomicU64 {
        &self.magic
    }
}

impl std::ops::Deref for QuietBoard {
    type Target = DeviceQuiet;
    fn deref(&self) -> &DeviceQuiet {
        &self.device
    }
}

/// Where a user's quiet board of the GPU with `uuid` lives:
/// `/dev/shm/dilu-<uid>/quiet-<uuid in hex>.board`. By the GPU's identity,
/// not the ordinal a process sees: two processes with different visible
/// devices agree on it (and two simulated GPUs never share one).
pub fn board_path(uid: u32, uuid: &[u8; 16]) -> std::path::PathBuf {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    crate::user_region_dir(uid).join(format!("quiet-{hex}.board"))
}

/// What a member publishes of its fair turn at a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Turn {
    /// GPU time charged over its share.
    pub vtime_ns: u64,
    /// Until when it waits on the device (0: not).
    pub engaged_until_ns: u64,
    /// Its SM share and its tenant's key.
    pub share_ppm: u32,
    pub tenant_key: u64,
}

/// A hold a member found posted by another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostedHold {
    pub until_ns: u64,
    pub seq: u64,
}

impl DeviceQuiet {
    /// Takes (or finds) `pid`'s slot; `alive` says whether a pid is a
    /// running process (asked only of slots idle for [`STALE_NS`]).
    /// `None` when every slot is in use.
    pub fn join(&self, pid: u32, now_ns: u64, alive: impl Fn(u32) -> bool) -> Option<usize> {
        let pid = u64::from(pid);
        if let Some(slot) = self.members.iter().position(|m| m.pid.load(Acquire) == pid) {
            return Some(slot);
        }
        for (slot, member) in self.members.iter().enumerate() {
            let current = member.pid.load(Acquire);
            let free = current == 0
                || (member.seen_ns.load(Relaxed).saturating_add(STALE_NS) < now_ns
                    && !alive(current as u32));
            if free
                && member
                    .pid
                    .compare_exchange(current, pid, AcqRel, Acquire)
                    .is_ok()
            {
                member.seen_ns.store(now_ns, Relaxed);
                member.drained_seq.store(0, Relaxed);
                member.vtime_ns.store(0, Relaxed);
                member.engaged_until_ns.store(0, Relaxed);
                member.held_until_ns.store(0, Relaxed);
                member.share_ppm.store(0, Relaxed);
                member.tenant_key.store(0, Relaxed);
                member.back_at_ns.store(0, Relaxed);
                self.hold.slots_used.fetch_max(slot as u64 + 1, AcqRel);
                return Some(slot);
            }
        }
        None
    }

    /// `pid` gives its slot up (at exit).
    pub fn leave(&self, slot: usize, pid: u32) {
        if let Some(member) = self.members.get(slot) {
            let _ = member
                .pid
                .compare_exchange(u64::from(pid), 0, AcqRel, Relaxed);
        }
    }

    /// Notes a launch of the member in `slot`.
    #[inline]
    pub fn seen(&self, slot: usize, now_ns: u64) {
        let seen = &self.members[slot].seen_ns;
        if seen.load(Relaxed).saturating_add(SEEN_EVERY_NS) <= now_ns {
            seen.store(now_ns, Relaxed);
        }
    }

    /// Whether any hold may be posted (one load: the launch path's test).
    #[inline]
    pub fn hold_posted(&self) -> bool {
        self.hold.until_ns.load(Relaxed) != 0
    }

    /// The hold a launch of `pid` must wait for, if any: posted by another
    /// process, not over, and no longer than [`MAX_HOLD_NS`] from now. An
    /// ended hold is cleared here.
    pub fn posted_for(&self, pid: u32, now_ns: u64) -> Option<PostedHold> {
        let until_ns = self.hold.until_ns.load(Acquire);
        if until_ns == 0 {
            return None;
        }
        if until_ns <= now_ns {
            let _ = self
                .hold
                .until_ns
                .compare_exchange(until_ns, 0, AcqRel, Relaxed);
            return None;
        }
        if self.hold.holder.load(Acquire) == u64::from(pid) || until_ns - now_ns > MAX_HOLD_NS {
            return None;
        }
        Some(PostedHold {
            until_ns,
            seq: self.hold.seq.load(Acquire),
        })
    }

    /// Posts a hold of `pid` until `until_ns` (at most [`MAX_HOLD_NS`] from
    /// now); its number, or `None` while another hold is in force.
    pub fn post(&self, pid: u32, now_ns: u64, until_ns: u64) -> Option<u64> {
        let current = self.hold.until_ns.load(Acquire);
        if current > now_ns {
            return None;
        }
        let until_ns = until_ns.clamp(now_ns + 1, now_ns + MAX_HOLD_NS);
        self.hold
            .until_ns
            .compare_exchange(current, until_ns, AcqRel, Acquire)
            .ok()?;
        // A member reading the number before this increment acknowledges
        // the previous hold and reads again on its next look.
        let seq = self.hold.seq.fetch_add(1, AcqRel) + 1;
        self.hold.holder.store(u64::from(pid), Release);
        Some(seq)
    }

    /// Moves the end of hold `seq` (if it is still the one in force) to
    /// `until_ns`, at most [`MAX_HOLD_NS`] after `now_ns`.
    pub fn extend(&self, seq: u64, now_ns: u64, until_ns: u64) {
        let current = self.hold.until_ns.load(Acquire);
        if current > now_ns && self.hold.seq.load(Acquire) == seq {
            let until_ns = until_ns.clamp(now_ns + 1, now_ns + MAX_HOLD_NS);
            let _ = self
                .hold
                .until_ns
                .compare_exchange(current, until_ns, AcqRel, Relaxed);
        }
    }

    /// Ends the hold numbered `seq` (if it is still the one in force).
    pub fn release(&self, seq: u64) {
        let until_ns = self.hold.until_ns.load(Acquire);
        if until_ns != 0 && self.hold.seq.load(Acquire) == seq {
            let _ = self
                .hold
                .until_ns
                .compare_exchange(until_ns, 0, AcqRel, Relaxed);
        }
    }

    /// The member in `slot` found its queued work done during hold `seq`.
    pub fn acknowledge(&self, slot: usize, seq: u64) {
        self.members[slot].drained_seq.store(seq, Release);
    }

    /// The member in `slot` publishes its turn: its vtime, until when it
    /// waits on the device, its share and its tenant.
    #[inline]
    pub fn publish_turn(&self, slot: usize, turn: Turn) {
        let member = &self.members[slot];
        member.vtime_ns.store(turn.vtime_ns, Relaxed);
        member.share_ppm.store(u64::from(turn.share_ppm), Relaxed);
        member.tenant_key.store(turn.tenant_key, Relaxed);
        member
            .engaged_until_ns
            .store(turn.engaged_until_ns, Release);
    }

    /// The idle time skipped so far on this board.
    #[inline]
    pub fn skipped_ns(&self) -> u64 {
        self.hold.skipped_ns.load(Acquire)
    }

    /// The member in `slot`, its queued work run, is held back by its token
    /// bucket until `until_ns` on the board's clock (wall clock plus
    /// [`Self::skipped_ns`] as the member last took it); 0: no longer.
    #[inline]
    pub fn hold_by_bucket(&self, slot: usize, until_ns: u64) {
        self.members[slot].held_until_ns.store(until_ns, Release);
    }

    /// Skips the device's idle time when it idles only because every
    /// member's token bucket holds it back: the member in `slot` (held, its
    /// own work run) finds every other active member held back by its
    /// bucket (for at most [`MAX_ENGAGED_NS`] more) with its work run, at
    /// least one such member, and their shares, once per tenant,
    /// adding up to the whole device. Then the skipped total grows by the
    /// time until the first of them wakes, and that time is returned (it
    /// may be taken off every held bucket's debt; `None`: no skip, or
    /// another member's skip came first).
    pub fn skip_idle(&self, slot: usize, now_ns: u64) -> Option<u64> {
        let skipped = self.skipped_ns();
        let mut tenants = [(0u64, 0u64); MAX_MEMBERS];
        let mut counted = 0;
        let mut others = 0;
        let mut first_wake = u64::MAX;
        for (i, m) in self.used().iter().enumerate() {
            if i != slot
                && (m.pid.load(Acquire) == 0
                    || m.seen_ns.load(Relaxed).saturating_add(ACTIVE_WITHIN_NS) <= now_ns)
            {
                continue;
            }
            let wake = m.held_until_ns.load(Acquire).saturating_sub(skipped);
            let held = wake > now_ns && wake - now_ns <= MAX_ENGAGED_NS;
            if !held {
                return None;
            }
            first_wake = first_wake.min(wake);
            others += usize::from(i != slot);
            let (key, share) = (
                m.tenant_key.load(Relaxed),
                m.share_ppm.load(Relaxed).min(FULL_SHARE_PPM as u64),
            );
            match tenants[..counted].iter_mut().find(|t| t.0 == key) {
                Some(tenant) => tenant.1 = tenant.1.max(share),
                None => {
                    tenants[counted] = (key, share);
                    counted += 1;
                }
            }
        }
        let shares: u64 = tenants[..counted].iter().map(|t| t.1).sum();
        if others == 0 || shares < FULL_SHARE_PPM as u64 {
            return None;
        }
        let skip = first_wake - now_ns;
        self.hold
            .skipped_ns
            .compare_exchange(skipped, skipped.saturating_add(skip), AcqRel, Relaxed)
            .ok()
            .map(|_| skip)
    }

    /// The member in `slot` waits on the device until `until_ns` (0: no
    /// longer), its vtime unchanged.
    #[inline]
    pub fn engage_until(&self, slot: usize, until_ns: u64) {
        self.members[slot].engaged_until_ns.store(until_ns, Release);
    }

    /// The member in `slot`, its work run, is expected to launch again at
    /// `at_ns` (0: no longer expected, e.g. it launched).
    #[inline]
    pub fn expect_back(&self, slot: usize, at_ns: u64) {
        self.members[slot].back_at_ns.store(at_ns, Release);
    }

    /// The largest vtime of the active members other than `slot` (a member
    /// back from idling starts no further behind it than its credit).
    pub fn leading_vtime(&self, slot: usize, now_ns: u64) -> Option<u64> {
        self.active_others(slot, now_ns)
            .map(|m| m.vtime_ns.load(Relaxed))
            .max()
    }

    /// Whether the member in `slot`, at `vtime_ns`, owes another its turn:
    /// another member is more than `lag_ns` behind it and waits on the
    /// device now, or is expected back or let go by its token bucket within
    /// `horizon_ns` (the work the member in `slot` is about to launch would
    /// still run then, and a kernel running when the other's comes holds the
    /// device up to a time slice). Then until when the first such member
    /// waits.
    pub fn owed_turn(
        &self,
        slot: usize,
        vtime_ns: u64,
        lag_ns: u64,
        now_ns: u64,
        horizon_ns: u64,
    ) -> Option<u64> {
        let skipped = self.skipped_ns();
        self.used().iter().enumerate().find_map(|(i, m)| {
            if i == slot || m.pid.load(Relaxed) == 0 {
                return None;
            }
            if m.vtime_ns.load(Relaxed).saturating_add(lag_ns) >= vtime_ns {
                return None;
            }
            let until = m.engaged_until_ns.load(Acquire);
            if until > now_ns && until - now_ns <= MAX_ENGAGED_NS {
                return Some(until);
            }
            let within = |at: u64| at > now_ns && at - now_ns <= horizon_ns.min(MAX_ENGAGED_NS);
            let back = m.back_at_ns.load(Acquire);
            if within(back) {
                return Some(back);
            }
            let wake = m.held_until_ns.load(Acquire).saturating_sub(skipped);
            within(wake).then_some(wake)
        })
    }

    /// The slots ever taken (a word anything sharing the file may write:
    /// never more than there are).
    fn used(&self) -> &[Member] {
        let used = self.hold.slots_used.load(Acquire).min(MAX_MEMBERS as u64);
        &self.members[..used as usize]
    }

    /// The members other than `slot` active at `now_ns`.
    fn active_others(&self, slot: usize, now_ns: u64) -> impl Iterator<Item = &Member> {
        self.used().iter().enumerate().filter_map(move |(i, m)| {
            (i != slot
                && m.pid.load(Acquire) != 0
                && m.seen_ns.load(Relaxed).saturating_add(ACTIVE_WITHIN_NS) > now_ns)
                .then_some(m)
        })
    }

    /// Whether another member launched lately (a hold then has something
    /// to keep off the device).
    pub fn others_active(&self, slot: usize, now_ns: u64) -> bool {
        self.active_others(slot, now_ns).next().is_some()
    }

    /// Whether every active member other than `slot` acknowledged hold `seq`.
    pub fn all_drained(&self, slot: usize, seq: u64, now_ns: u64) -> bool {
        self.active_others(slot, now_ns)
            .all(|m| m.drained_seq.load(Acquire) == seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shm::Region;

    fn board() -> Region<QuietBoard> {
        Region::<QuietBoard>::anonymous(|_| {}).unwrap()
    }

    /// Two members at `t`: one at 10 ms of vtime and one 3 ms behind it,
    /// neither waiting on the device.
    fn ahead_and_behind(device: &DeviceQuiet, t: u64) -> (usize, usize) {
        let ahead = device.join(1, t, |_| true).unwrap();
        let behind = device.join(2, t, |_| true).unwrap();
        device.publish_turn(ahead, turn(10_000_000, 0));
        device.publish_turn(behind, turn(7_000_000, 0));
        (ahead, behind)
    }

    fn turn(vtime_ns: u64, engaged_until_ns: u64) -> Turn {
        Turn {
            vtime_ns,
            engaged_until_ns,
            ..Turn::default()
        }
    }

    #[test]
    fn idle_time_is_skipped_only_when_every_bucket_holds_its_member_back() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 9_000_000_000;
        let (thirty, seventy) = (FULL_SHARE_PPM * 3 / 10, FULL_SHARE_PPM * 7 / 10);
        let a = device.join(1, t, |_| true).unwrap();
        let b = device.join(2, t, |_| true).unwrap();
        let publish = |slot, share_ppm, tenant_key| {
            device.publish_turn(
                slot,
                Turn {
                    share_ppm,
                    tenant_key,
                    ..Turn::default()
                },
            )
        };
        publish(a, thirty, 10);
        publish(b, seventy, 20);
        // a held for 3 ms, b not held (it runs, or its work does):
        // nothing idles because of buckets.
        device.hold_by_bucket(a, t + 3_000_000);
        assert_eq!(device.skip_idle(a, t), None);
        // Both held, both queues run, shares adding up to the device: the
        // time until the first wakes (b, in 1 ms) is skipped, once.
        device.hold_by_bucket(b, t + 1_000_000);
        assert_eq!(device.skip_idle(a, t), Some(1_000_000));
        assert_eq!(device.skipped_ns(), 1_000_000);
        // b now wakes at once on the board's clock: nothing more to skip.
        assert_eq!(device.skip_idle(a, t), None);
        // A hold written before the skip moved with it: a, held to 3 ms,
        // now wakes at 2 ms. Holds written later are on the board's clock.
        device.hold_by_bucket(b, t + 2_500_000 + device.skipped_ns());
        assert_eq!(device.skip_idle(b, t), Some(2_000_000));
        assert_eq!(device.skipped_ns(), 3_000_000);
        let hold = |slot, wake| device.hold_by_bucket(slot, wake + device.skipped_ns());
        hold(a, t + 1_000_000);
        hold(b, t + 500_000);
        // b no longer held (its work not run, or launching): no skip.
        device.hold_by_bucket(b, 0);
        assert_eq!(device.skip_idle(a, t), None);
        hold(b, t + 500_000);
        // Shares that leave part of the device free keep it free, also when
        // two processes of one tenant would add up to more.
        publish(b, seventy - 1, 20);
        assert_eq!(device.skip_idle(a, t), None);
        let c = device.join(3, t, |_| true).unwrap();
        publish(c, seventy - 1, 20);
        hold(c, t + 500_000);
        assert_eq!(device.skip_idle(a, t), None);
        device.leave(c, 3);
        publish(b, seventy, 20);
        // A hold further out than a member may say, or past, holds nobody
        // back; nor is a member alone on the board given any skip.
        hold(b, t + MAX_ENGAGED_NS + 1);
        assert_eq!(device.skip_idle(a, t), None);
        hold(b, t);
        assert_eq!(device.skip_idle(a, t), None);
        hold(b, t + 500_000);
        assert_eq!(device.skip_idle(a, t), Some(500_000));
        hold(a, t + 1_000_000);
        hold(b, t + 500_000);
        device.leave(b, 2);
        assert_eq!(device.skip_idle(a, t), None);
    }

    #[test]
    fn the_hold_word_every_launch_reads_has_a_cache_line_of_its_own() {
        let path = board_path(1000, &[0xab; 16]);
        assert!(path.ends_with(format!("quiet-{}.board", "ab".repeat(16))));
        assert_eq!(std::mem::size_of::<Hold>(), 64);
        assert_eq!(std::mem::offset_of!(DeviceQuiet, members) % 64, 0);
        assert_eq!(std::mem::size_of::<Member>() % 64, 0);
    }

    #[test]
    fn a_hold_keeps_the_others_until_it_ends_or_is_released() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 1_000_000_000;
        let holder = device.join(100, t, |_| true).unwrap();
        let other = device.join(200, t, |_| true).unwrap();
        assert_ne!(holder, other);
        assert!(!device.hold_posted());
        let seq = device.post(100, t, t + 5_000_000).unwrap();
        assert!(device.hold_posted());
        // The holder itself is not held; the other member is, until the end.
        assert_eq!(device.posted_for(100, t + 1), None);
        let held = device.posted_for(200, t + 1).unwrap();
        assert_eq!(
            held,
            PostedHold {
                until_ns: t + 5_000_000,
                seq
            }
        );
        // A second hold waits for the first.
        assert_eq!(device.post(200, t + 2, t + 3_000_000), None);
        // Drained: acknowledged by the only other active member.
        assert!(!device.all_drained(holder, seq, t + 3));
        device.acknowledge(other, seq);
        assert!(device.all_drained(holder, seq, t + 3));
        device.release(seq);
        assert_eq!(device.posted_for(200, t + 4), None);
        assert!(!device.hold_posted());
        // A hold nobody released ends at its time and is cleared then.
        let seq2 = device.post(200, t + 10, t + 1_000).unwrap();
        assert_eq!(seq2, seq + 1);
        assert!(device.posted_for(100, t + 500).is_some());
        assert_eq!(device.posted_for(100, t + 1_000), None);
        assert!(!device.hold_posted());
        // The holder moves its end once it knows when its kernel starts.
        let seq_e = device.post(100, t + 1_100, t + 1_500).unwrap();
        device.extend(seq_e, t + 1_200, t + 1_900);
        assert_eq!(
            device.posted_for(200, t + 1_600).unwrap().until_ns,
            t + 1_900
        );
        device.release(seq_e);
        // Releasing an old hold does not end a newer one.
        let seq3 = device.post(100, t + 2_000, t + 9_000).unwrap();
        device.release(seq2);
        assert!(device.posted_for(200, t + 2_001).is_some());
        device.release(seq3);
        assert!(device.posted_for(200, t + 2_002).is_none());
    }

    #[test]
    fn a_hold_is_never_longer_than_the_limit() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 5_000_000_000;
        let seq = device.post(1, t, u64::MAX).unwrap();
        let held = device.posted_for(2, t).unwrap();
        assert_eq!((held.until_ns, held.seq), (t + MAX_HOLD_NS, seq));
        // A word no holder could have written (anything sharing the file
        // may write it) holds nobody.
        device.hold.until_ns.store(t + 10 * MAX_HOLD_NS, Relaxed);
        assert_eq!(device.posted_for(2, t), None);
    }

    #[test]
    fn a_member_ahead_by_more_than_the_lag_owes_a_turn_only_to_one_waiting_on_the_device() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 7_000_000_000;
        let lag = 2_000_000;
        let ahead = device.join(1, t, |_| true).unwrap();
        let behind = device.join(2, t, |_| true).unwrap();
        device.publish_turn(ahead, turn(10_000_000, t + 500_000));
        device.publish_turn(behind, turn(7_000_000, t + 1_000_000));
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, t, 0),
            Some(t + 1_000_000)
        );
        assert_eq!(device.leading_vtime(behind, t), Some(10_000_000));
        // The one behind never waits for the one ahead, waiting or not.
        assert_eq!(device.owed_turn(behind, 7_000_000, lag, t, 0), None);
        // Within the lag, nobody waits.
        assert_eq!(device.owed_turn(ahead, 8_900_000, lag, t, 0), None);
        // Once its work ran out it waits on the device no longer: busy on
        // its host, it holds nobody.
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, t + 1_000_000, 0),
            None
        );
        device.engage_until(behind, 0);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 0), None);
        // An engagement further out than a member may say holds nobody
        // (nor does a member that left).
        device.engage_until(behind, t + MAX_ENGAGED_NS + 1);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 0), None);
        device.engage_until(behind, t + MAX_ENGAGED_NS);
        assert!(device.owed_turn(ahead, 10_000_000, lag, t, 0).is_some());
        device.leave(behind, 2);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 0), None);
        // A newcomer in the slot does not inherit the engagement.
        let newcomer = device.join(3, t, |_| true).unwrap();
        assert_eq!(newcomer, behind);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 0), None);
        // Scans stop at the slots ever taken, however that word was written.
        device.publish_turn(newcomer, turn(1_000_000, t + 1_000_000));
        device.hold.slots_used.store(1, Relaxed);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 0), None);
        device.hold.slots_used.store(u64::MAX, Relaxed);
        assert!(device.owed_turn(ahead, 10_000_000, lag, t, 0).is_some());
    }

    #[test]
    fn a_member_its_bucket_lets_go_before_the_launch_would_end_is_owed_its_turn() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 9_000_000_000;
        let lag = 2_000_000;
        // Behind, its work run, held by its bucket for 1.3 ms more: not
        // waiting on the device now.
        let (ahead, behind) = ahead_and_behind(device, t);
        device.hold_by_bucket(behind, t + 1_300_000);
        // A 3 ms kernel launched now would still run when the other's
        // next one comes: the one ahead waits until then.
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, t, 3_000_000),
            Some(t + 1_300_000)
        );
        // A 20 µs kernel ends before: it goes.
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 20_000), None);
        // Within the lag, nobody waits either way.
        assert_eq!(device.owed_turn(ahead, 8_900_000, lag, t, 3_000_000), None);
        // The hold is on the board's clock: once idle time was skipped,
        // the member wakes that much sooner in wall-clock time.
        device.hold.skipped_ns.store(1_000_000, Relaxed);
        device.hold_by_bucket(behind, t + 1_000_000 + 1_300_000);
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, t, 3_000_000),
            Some(t + 1_300_000)
        );
        // A hold word further out than a member may say holds nobody, nor
        // does one already past or taken back.
        device.hold_by_bucket(behind, t + 1_000_000 + MAX_ENGAGED_NS + 1);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, u64::MAX), None);
        device.hold_by_bucket(behind, t);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 3_000_000), None);
        device.hold_by_bucket(behind, 0);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 3_000_000), None);
    }

    #[test]
    fn a_member_expected_back_before_the_launch_would_end_is_owed_its_turn() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 11_000_000_000;
        let lag = 2_000_000;
        // Behind, its work run and its synchronisation returning: expected
        // to launch again in 300 µs.
        let (ahead, behind) = ahead_and_behind(device, t);
        device.expect_back(behind, t + 300_000);
        // A 230 µs graph launched 100 µs before then would still run: the
        // one ahead waits until the other is back.
        let soon = t + 200_000;
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, soon, 230_000),
            Some(t + 300_000)
        );
        // A 20 µs kernel ends before; so does the graph launched now (the
        // device is the other's while it is busy on its host).
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, soon, 20_000), None);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, 230_000), None);
        assert_eq!(device.owed_turn(ahead, 8_900_000, lag, soon, 230_000), None);
        // Past the time, nobody waits for it.
        assert_eq!(
            device.owed_turn(ahead, 10_000_000, lag, t + 300_000, 230_000),
            None
        );
        device.expect_back(behind, 0);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, u64::MAX), None);
        // A word further out than a member may say holds nobody, and a
        // newcomer in the slot inherits nothing.
        device.expect_back(behind, t + MAX_ENGAGED_NS + 1);
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, u64::MAX), None);
        device.expect_back(behind, t + 300_000);
        device.leave(behind, 2);
        let newcomer = device.join(3, t, |_| true).unwrap();
        assert_eq!(newcomer, behind);
        device.publish_turn(newcomer, turn(7_000_000, 0));
        assert_eq!(device.owed_turn(ahead, 10_000_000, lag, t, u64::MAX), None);
    }

    #[test]
    fn only_active_members_are_waited_for_and_dead_ones_give_their_slot_up() {
        let board = board();
        let device: &DeviceQuiet = &board;
        let t = 100_000_000_000;
        let me = device.join(1, t, |_| true).unwrap();
        assert!(!device.others_active(me, t), "alone");
        let idle = device.join(2, t, |_| true).unwrap();
        assert!(device.others_active(me, t + 1));
        let seq = device.post(1, t + 1, t + 2_000_000).unwrap();
        assert!(!device.all_drained(me, seq, t + 2));
        // Idle for longer than ACTIVE_WITHIN_NS: nothing queued to wait for.
        assert!(device.all_drained(me, seq, t + ACTIVE_WITHIN_NS + 1));
        device.seen(idle, t + ACTIVE_WITHIN_NS);
        assert!(!device.all_drained(me, seq, t + ACTIVE_WITHIN_NS + 1));
        // Every slot taken: a newcomer gets none, unless a slot's process
        // is gone and it has been idle for STALE_NS.
        for pid in 3..=MAX_MEMBERS as u32 {
            device.join(pid, t, |_| true).unwrap();
        }
        assert_eq!(device.join(99, t + 1, |_| false), None);
        let later = t + ACTIVE_WITHIN_NS + STALE_NS + 1;
        assert_eq!(device.join(99, later, |pid| pid != 3), Some(2));
        assert_eq!(device.join(99, later, |_| true), Some(2), "found again");
        device.leave(2, 99);
        assert_eq!(device.join(100, later, |_| true), Some(2), "left free");
    }
}
