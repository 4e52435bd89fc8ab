//! What each live allocation was charged, so a free returns exactly that.
//!
//! A fixed-size open-addressing hash table of atomics: insert and remove are
//! a few compare-and-swaps, with no lock and no allocation on the hot path.
//! Keys are device pointers or handles (never 0); a removed entry becomes a
//! tombstone that later inserts reuse. Should the table ever fill up (more
//! than `CAPACITY` live allocations), further entries go to a mutex-guarded
//! overflow map, which is slow but correct.
//!
//! Every entry carries the table's *epoch* at insertion. [`AllocTable::forget_all`]
//! moves to the next epoch in O(1), after which older entries read as absent:
//! a forked child uses this so that it never refunds (or double-refunds) an
//! allocation its parent made.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

const DEFAULT_CAPACITY: usize = 1 << 18;
const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;
/// Probes before giving up on the array and using the overflow map.
const MAX_PROBES: usize = 64;
/// Largest charge one entry can record (48 bits: 256 TiB).
const MAX_BYTES: u64 = (1 << 48) - 1;

/// What one allocation was charged: device index and bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    pub device: u8,
    pub bytes: u64,
}

impl Charge {
    /// bytes (48 bits) | epoch (8 bits) | device (8 bits).
    fn pack(self, epoch: u8) -> u64 {
        debug_assert!(self.bytes <= MAX_BYTES);
        (self.bytes.min(MAX_BYTES) << 16) | (u64::from(epoch) << 8) | u64::from(self.device)
    }

    /// The charge in `word`, if it was recorded in `epoch`.
    fn unpack(word: u64, epoch: u8) -> Option<Self> {
        ((word >> 8) as u8 == epoch).then_some(Charge {
            device: (word & 0xff) as u8,
            bytes: word >> 16,
        })
    }
}

/// The overflow map: key -> packed charge.
pub type Overflow = HashMap<u64, u64>;

pub struct AllocTable {
    /// Capacity − 1 (capacity is a power of two).
    mask: usize,
    keys: Box<[AtomicU64]>,
    values: Box<[AtomicU64]>,
    overflow: Mutex<Overflow>,
    epoch: AtomicU8,
}

impl Default for AllocTable {
    fn default() -> Self {
        Self::new()
    }
}

impl AllocTable {
    pub fn new() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }

    /// A table with room for `capacity` (a power of two) entries before the
    /// overflow map is used.
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity.is_power_of_two());
        AllocTable {
            mask: capacity - 1,
            keys: (0..capacity).map(|_| AtomicU64::new(EMPTY)).collect(),
            values: (0..capacity).map(|_| AtomicU64::new(0)).collect(),
            overflow: Mutex::new(HashMap::new()),
            epoch: AtomicU8::new(0),
        }
    }

    /// Treats every entry recorded so far as absent (a forked child's view
    /// of its parent's allocations). O(1).
    pub fn forget_all(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// Locks the overflow map (held across `fork` so the child never
    /// inherits it locked by a thread that does not exist there).
    pub fn lock_overflow(&self) -> MutexGuard<'_, Overflow> {
        self.overflow
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn slot_of(&self, key: u64) -> usize {
        // Fibonacci hashing spreads pointers that share their low
        // (alignment) bits.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize & self.mask
    }

    /// Records `charge` for `key` (a live allocation's pointer or handle).
    /// Sizes must fit in 56 bits (64 PiB).
    pub fn insert(&self, key: u64, charge: Charge) {
        debug_assert!(key != EMPTY && key != TOMBSTONE);
        let word = charge.pack(self.epoch.load(Ordering::Acquire));
        let start = self.slot_of(key);
        for probe in 0..MAX_PROBES.min(self.mask + 1) {
            let index = (start + probe) & self.mask;
            let current = self.keys[index].load(Ordering::Relaxed);
            if (current == EMPTY || current == TOMBSTONE)
                && self.keys[index]
                    .compare_exchange(current, key, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                // The key is only looked up after the allocation returned to
                // the program, i.e. after this store.
                self.values[index].store(word, Ordering::Release);
                return;
            }
        }
        self.lock_overflow().insert(key, word);
    }

    /// Removes `key` and returns what it was charged, or `None` if it is not
    /// a live allocation this process made (double free, foreign pointer, an
    /// entry from before [`AllocTable::forget_all`]).
    pub fn remove(&self, key: u64) -> Option<Charge> {
        if key == EMPTY || key == TOMBSTONE {
            return None;
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let start = self.slot_of(key);
        for probe in 0..MAX_PROBES.min(self.mask + 1) {
            let index = (start + probe) & self.mask;
            let current = self.keys[index].load(Ordering::Acquire);
            if current == EMPTY {
                break;
            }
            if current == key {
                let word = self.values[index].load(Ordering::Acquire);
                if self.keys[index]
                    .compare_exchange(key, TOMBSTONE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
                {
                    return Charge::unpack(word, epoch);
                }
                return None; // a concurrent free of the same pointer won
            }
        }
        self.lock_overflow()
            .remove(&key)
            .and_then(|word| Charge::unpack(word, epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_free_returns_exactly_what_was_charged() {
        let table = AllocTable::new();
        table.insert(
            0x7f00_0000_0200,
            Charge {
                device: 1,
                bytes: 12345,
            },
        );
        assert_eq!(
            table.remove(0x7f00_0000_0200),
            Some(Charge {
                device: 1,
                bytes: 12345
            })
        );
        assert_eq!(
            table.remove(0x7f00_0000_0200),
            None,
            "double free must not refund twice"
        );
        assert_eq!(table.remove(0xdead_0000), None, "unknown pointer");
    }

    #[test]
    fn concurrent_threads_keep_every_entry() {
        let table = Arc::new(AllocTable::new());
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let table = table.clone();
                std::thread::spawn(move || {
                    let mut refunded = 0;
                    for round in 0..20_000u64 {
                        // 256-byte aligned keys, like device pointers.
                        let key = ((t << 40) | (round << 8)) + 0x1000;
                        table.insert(
                            key,
                            Charge {
                                device: t as u8,
                                bytes: round + 1,
                            },
                        );
                        if round >= 100 {
                            let old = ((t << 40) | ((round - 100) << 8)) + 0x1000;
                            refunded += table.remove(old).expect("live entry").bytes;
                        }
                    }
                    refunded
                })
            })
            .collect();
        for thread in threads {
            let refunded = thread.join().unwrap();
            // Each thread removed rounds 0..19_900, charged 1..=19_900 bytes.
            assert_eq!(refunded, (1..=19_900u64).sum::<u64>());
        }
    }

    #[test]
    fn a_full_table_overflows_without_loss() {
        let table = AllocTable::with_capacity(8);
        let keys: Vec<u64> = (1..=100u64).map(|i| i << 8).collect();
        for &key in &keys {
            table.insert(
                key,
                Charge {
                    device: 2,
                    bytes: key,
                },
            );
        }
        for &key in keys.iter().rev() {
            assert_eq!(
                table.remove(key),
                Some(Charge {
                    device: 2,
                    bytes: key
                })
            );
        }
        assert_eq!(table.remove(keys[0]), None);
    }

    #[test]
    fn forgotten_entries_are_never_refunded_and_new_ones_are() {
        let table = AllocTable::with_capacity(8);
        let charge = |bytes| Charge { device: 0, bytes };
        // Some in the array, some in the overflow map.
        let inherited: Vec<u64> = (1..=20u64).map(|i| i << 8).collect();
        for &key in &inherited {
            table.insert(key, charge(key));
        }
        table.forget_all();
        let fresh = 0xabc_0000;
        table.insert(fresh, charge(777));
        for &key in &inherited {
            assert_eq!(table.remove(key), None, "inherited entry {key:#x}");
        }
        assert_eq!(table.remove(fresh), Some(charge(777)));
        // After 256 forks the epoch wraps; entries of the current epoch
        // still work.
        for _ in 0..256 {
            table.forget_all();
        }
        table.insert(fresh, charge(1 << 40));
        assert_eq!(table.remove(fresh), Some(charge(1 << 40)));
    }
}
