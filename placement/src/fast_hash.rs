//! A cheap hasher for the search's small integer keys (node-class keys,
//! fragmentation memo keys): std's SipHash cost more than the scoring it
//! saves on a 10,000-GPU cluster. The keys come from node inventories and
//! share sums, not from anyone who could choose collisions. The same
//! hasher folds a policy's parameters into the fingerprint that keys its
//! standing cost indexes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate over 64-bit words (the scheme of rustc's FxHasher).
#[derive(Debug, Default, Clone, Copy)]
pub struct WordHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl WordHasher {
    fn add(&mut self, word: u64) {
        self.hash = (self.hash.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.add(word);
    }

    fn write_usize(&mut self, word: usize) {
        self.add(word as u64);
    }

    fn write_u32(&mut self, word: u32) {
        self.add(u64::from(word));
    }

    fn write_u16(&mut self, word: u16) {
        self.add(u64::from(word));
    }

    fn write_u128(&mut self, word: u128) {
        self.add(word as u64);
        self.add((word >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` hashed by [`WordHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<WordHasher>>;

/// Folds `words` into one fingerprint (a policy's parameters and
/// cluster-wide inputs, for `PlacementPolicy::cost_context`).
pub fn fingerprint(words: impl IntoIterator<Item = u64>) -> u64 {
    let mut hasher = WordHasher::default();
    for word in words {
        hasher.write_u64(word);
    }
    hasher.finish()
}
