//! The analyses, one directory each. An analysis (`analysis.rs` in each)
//! is pure: plain event structs in, no BPF, no I/O, unit-tested.

pub mod alloc;
pub mod cpu;
pub mod locks;
pub mod sharing;

/// A fast hasher for the per-event maps of the analyses (addresses and
/// small keys): std's SipHash resists hash flooding, which the target's own
/// addresses cannot mount, at several times the cost, and the loader hashes
/// a few keys per allocator call.
#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

impl std::hash::Hasher for FastHasher {
    fn finish(&self) -> u64 {
        // Fold the well-mixed high bits down: aligned addresses have zero
        // low bits, and so does their product.
        self.0 ^ (self.0 >> 29)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(MULTIPLIER);
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FastHasher>>;
/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = std::collections::HashSet<K, std::hash::BuildHasherDefault<FastHasher>>;

/// A latency histogram: 1 ns to about 18 minutes, 3 significant digits.
pub fn latency_histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 1 << 40, 3).expect("static bounds are valid")
}

#[cfg(test)]
mod tests {
    use std::hash::{BuildHasher, BuildHasherDefault};

    use super::*;

    #[test]
    fn aligned_addresses_spread_over_buckets() {
        let build = BuildHasherDefault::<FastHasher>::default();
        let mut low_bits = std::collections::HashSet::new();
        for i in 0..1024u64 {
            low_bits.insert(build.hash_one(0x5555_0000_0000 + i * 64) & 1023);
        }
        assert!(low_bits.len() > 600, "{} distinct of 1024", low_bits.len());
    }
}
