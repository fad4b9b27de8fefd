//! The heap profile: allocations sampled by bytes (jemalloc's unbiased
//! byte sampling), each with its call chain, weighted back to estimates
//! of all allocations per chain: `alloc_space` and `alloc_objects` (all
//! allocated), `inuse_space` and `inuse_objects` (allocated and not
//! freed when tracing ended), as pprof's heap profiles have them.
//!
//! Each thread counts down a gap drawn from an exponential distribution
//! of mean `m` bytes ([`gaps`] are its quantiles, for the programs); the
//! allocation that crosses zero is sampled. By memorylessness an
//! allocation of `s` bytes is sampled with probability `p = 1 - e^(-s/m)`
//! whatever came before, so a sample stands for `1/p` allocations and
//! `s/p` bytes: unbiased totals per chain.
//!
//! Also the allocation wrappers: a chain's site is its first frame
//! outside them ([`is_wrapper_name`], or code that returns the
//! allocation, found by the collector).

use crate::{features::FastMap, heap::site_name::is_wrapper_name, process::maps::Place};

/// One frame of a sampled chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HeapFrame {
    /// The call instruction.
    pub place: Place,
    /// The function returns what this call returned (a wrapper, by its
    /// code).
    pub returns_result: bool,
}

/// Estimated allocations of one chain.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChainStats {
    /// Samples taken (unweighted).
    pub samples: u64,
    pub alloc_objects: f64,
    pub alloc_space: f64,
    pub inuse_objects: f64,
    pub inuse_space: f64,
}

/// A sampled block still live: its chain and weights.
#[derive(Debug, Clone, Copy)]
struct LiveSample {
    chain: usize,
    objects: f64,
    bytes: f64,
}

/// Most distinct chains kept; samples of new chains beyond are counted.
pub const MAX_CHAINS: usize = 1 << 16;
/// Most sampled blocks remembered as live.
const MAX_LIVE_SAMPLES: usize = 1 << 20;

/// The byte-sampled heap profile of one session.
#[derive(Debug)]
pub struct HeapProfile {
    mean: f64,
    chains: Vec<(Vec<HeapFrame>, ChainStats)>,
    index: FastMap<Vec<HeapFrame>, usize>,
    live: FastMap<u64, LiveSample>,
    samples: u64,
    /// Samples not kept (chain table full, or no frame found).
    dropped: u64,
    /// Samples the kernel's per-second cap held back that those received
    /// stand for.
    held_back: u64,
}

/// `n` byte gaps with mean `mean`: the quantiles `(i + ½) / n` of the
/// exponential distribution, for the programs to draw from.
pub fn gaps(mean: u64, n: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let q = (f64::from(i) + 0.5) / f64::from(n);
            let gap = -(1.0 - q).ln() * mean as f64;
            (gap.round() as u32).max(1)
        })
        .collect()
}

impl HeapProfile {
    pub fn new(mean_bytes: u64) -> Self {
        Self {
            mean: mean_bytes.max(1) as f64,
            chains: Vec::new(),
            index: FastMap::default(),
            live: FastMap::default(),
            samples: 0,
            dropped: 0,
            held_back: 0,
        }
    }

    pub fn mean_bytes(&self) -> u64 {
        self.mean as u64
    }

    /// What one sampled allocation of `size` bytes stands for: (objects,
    /// bytes).
    pub fn weight(&self, size: u64) -> (f64, f64) {
        let s = size.max(1) as f64;
        let p = -(-s / self.mean).exp_m1();
        (1.0 / p, s / p)
    }

    /// A sampled allocation of `size` bytes at `ptr`, made through
    /// `chain` (innermost first), standing also for `held_back` samples
    /// the kernel's cap held back just before it: the cap's scaling
    /// follows the rate of the moment, not the session's.
    pub fn add_sample(&mut self, chain: Vec<HeapFrame>, ptr: u64, size: u64, held_back: u64) {
        self.samples += 1;
        self.held_back += held_back;
        if chain.is_empty() {
            self.dropped += 1;
            return;
        }
        let id = match self.index.get(&chain) {
            Some(&id) => id,
            None if self.chains.len() < MAX_CHAINS => {
                let id = self.chains.len();
                self.index.insert(chain.clone(), id);
                self.chains.push((chain, ChainStats::default()));
                id
            }
            None => {
                self.dropped += 1;
                return;
            }
        };
        let (objects, bytes) = self.weight(size);
        let (objects, bytes) = (
            objects * (1 + held_back) as f64,
            bytes * (1 + held_back) as f64,
        );
        let stats = &mut self.chains[id].1;
        stats.samples += 1;
        stats.alloc_objects += objects;
        stats.alloc_space += bytes;
        if ptr != 0 && (self.live.len() < MAX_LIVE_SAMPLES || self.live.contains_key(&ptr)) {
            stats.inuse_objects += objects;
            stats.inuse_space += bytes;
            let old = self.live.insert(
                ptr,
                LiveSample {
                    chain: id,
                    objects,
                    bytes,
                },
            );
            // A block handed out again without a traced free.
            if let Some(old) = old {
                self.forget(old);
            }
        }
    }

    /// Block `ptr` was freed (or moved by `realloc`).
    pub fn on_free(&mut self, ptr: u64) {
        if let Some(s) = self.live.remove(&ptr) {
            self.forget(s);
        }
    }

    fn forget(&mut self, s: LiveSample) {
        let stats = &mut self.chains[s.chain].1;
        stats.inuse_objects = (stats.inuse_objects - s.objects).max(0.0);
        stats.inuse_space = (stats.inuse_space - s.bytes).max(0.0);
    }

    /// Samples received, and those not kept.
    pub fn samples(&self) -> (u64, u64) {
        (self.samples, self.dropped)
    }

    /// Samples held back by the kernel's cap that those received stand
    /// for.
    pub fn held_back(&self) -> u64 {
        self.held_back
    }

    /// Every chain with its estimates.
    pub fn chains(&self) -> impl Iterator<Item = (&[HeapFrame], &ChainStats)> {
        self.chains.iter().map(|(c, s)| (c.as_slice(), s))
    }
}

/// The index of a chain's site: its first frame outside the wrappers
/// (`name` gives a frame's function), or its last frame if all are.
pub fn site_index(chain: &[HeapFrame], mut name: impl FnMut(&Place) -> String) -> usize {
    chain
        .iter()
        .position(|f| !f.returns_result && !is_wrapper_name(&name(&f.place)))
        .unwrap_or(chain.len().saturating_sub(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(offset: u64, returns_result: bool) -> HeapFrame {
        HeapFrame {
            place: crate::process::maps::prog_place(offset),
            returns_result,
        }
    }

    #[test]
    fn the_gaps_have_the_mean_and_the_spread_of_an_exponential() {
        let g = gaps(512 << 10, 256);
        let mean = g.iter().map(|&x| f64::from(x)).sum::<f64>() / 256.0;
        assert!((mean / f64::from(512 << 10) - 1.0).abs() < 0.02, "{mean}");
        // Half of an exponential lies below ln 2 of its mean.
        let median = f64::from(g[128]);
        assert!((median / (0.693 * 524288.0) - 1.0).abs() < 0.02, "{median}");
        assert!(g.windows(2).all(|w| w[0] <= w[1]) && g[0] >= 1);
    }

    #[test]
    fn weights_make_small_and_large_samples_unbiased() {
        let h = HeapProfile::new(1000);
        // Small: p ≈ s/m, so a sample stands for ~m bytes.
        let (n, b) = h.weight(10);
        assert!(
            (n - 100.5).abs() < 0.1 && (b - 1005.0).abs() < 1.0,
            "{n} {b}"
        );
        // Larger than the mean: nearly always sampled, itself.
        let (n, b) = h.weight(100_000);
        assert!((n - 1.0).abs() < 1e-9 && (b - 100_000.0).abs() < 1e-3);
    }

    /// Simulates the programs' countdown on a known stream of
    /// allocations and checks the weighted totals against it.
    #[test]
    fn sampling_a_stream_estimates_its_totals() {
        let mean = 4096;
        let table = gaps(mean, 256);
        let mut h = HeapProfile::new(mean);
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut countdown = i64::from(table[(next() % 256) as usize]);
        let (mut small, mut large) = (0u64, 0u64);
        for i in 0..400_000u64 {
            // Site 1 allocates 16-byte blocks, site 2 one 3000-byte block
            // per 100 calls.
            let (site, size) = if i % 100 == 0 { (2, 3000) } else { (1, 16) };
            if site == 1 {
                small += size
            } else {
                large += size
            }
            countdown -= size as i64;
            if countdown <= 0 {
                countdown = i64::from(table[(next() % 256) as usize]);
                h.add_sample(vec![frame(site, false)], 0x1000 + i, size, 0);
            }
        }
        let space = |site| {
            h.chains()
                .find(|(c, _)| c[0] == frame(site, false))
                .map(|(_, s)| s.alloc_space)
                .unwrap()
        };
        for (site, truth) in [(1, small), (2, large)] {
            let err = space(site) / truth as f64 - 1.0;
            assert!(err.abs() < 0.05, "site {site}: {err:+.3}");
        }
    }

    /// A program that churns faster than the kernel's cap, then keeps
    /// blocks at the same pace: the kept blocks' samples pass the cap at
    /// a lower rate than the session's (whose first second rode the
    /// bucket's credit), so one session-wide factor under-counts them;
    /// each sample standing for those held back just before it does not.
    #[test]
    fn samples_standing_for_those_held_back_follow_the_rate_of_the_moment() {
        use memprof_common::{futex::take_token, ALLOC_STACKS_PER_S};
        let mut h = HeapProfile::new(1);
        let (mut credit, mut refilled, mut held) = (0, 0, 0);
        let (mut sent, mut kept, mut kept_sent) = (0u64, 0u64, 0u64);
        // 3,000 samples a second: 2 s of blocks freed at once, 0.5 s kept.
        for i in 0..7_500u64 {
            let now = 1_000_000_000 + i * 1_000_000 / 3;
            let (ok, left) = take_token(
                credit,
                refilled,
                now,
                1_000_000_000 / ALLOC_STACKS_PER_S,
                1_000_000_000,
            );
            (credit, refilled) = (left, now);
            let keep = i >= 6_000;
            kept += u64::from(keep);
            if !ok {
                held += 1;
                continue;
            }
            sent += 1;
            kept_sent += u64::from(keep);
            h.add_sample(vec![frame(1, false)], 0x1000 + i, 100, held);
            held = 0;
            if !keep {
                h.on_free(0x1000 + i);
            }
        }
        let (_, s) = h.chains().next().unwrap();
        assert!(
            (s.alloc_objects - 7_500.0).abs() <= 3.0,
            "{}",
            s.alloc_objects
        );
        assert!(
            (s.inuse_objects - kept as f64).abs() <= 3.0,
            "{} of {kept}",
            s.inuse_objects
        );
        // One session-wide factor would have said 2/3 of it.
        let session = kept_sent as f64 * 7_500.0 / sent as f64;
        assert!(session < 0.75 * kept as f64, "{session} of {kept}");
        assert_eq!(h.held_back(), 7_500 - sent - held);
    }

    #[test]
    fn frees_take_sampled_blocks_out_of_what_is_in_use() {
        let mut h = HeapProfile::new(1);
        h.add_sample(vec![frame(1, false)], 0x10, 100, 0);
        h.add_sample(vec![frame(1, false)], 0x20, 100, 0);
        h.on_free(0x10);
        h.on_free(0x999); // not sampled
        let (_, s) = h.chains().next().unwrap();
        assert_eq!(s.samples, 2);
        assert!((s.alloc_space - 200.0).abs() < 1e-6);
        assert!((s.inuse_space - 100.0).abs() < 1e-6 && (s.inuse_objects - 1.0).abs() < 1e-9);
        h.add_sample(Vec::new(), 0x30, 100, 0);
        assert_eq!(h.samples(), (3, 1), "a chain without frames is not kept");
    }

    #[test]
    fn the_site_is_the_first_frame_outside_the_wrappers() {
        let name = |p: &Place| match p {
            Place::File { file_offset: 1, .. } => "zmalloc".to_string(),
            Place::File { file_offset: 2, .. } => "sdsnewlen".to_string(),
            _ => "main".to_string(),
        };
        // zmalloc by name, then a frame whose code returns the block.
        let chain = [frame(1, false), frame(2, true), frame(3, false)];
        assert_eq!(site_index(&chain, name), 2);
        assert_eq!(site_index(&chain[..1], name), 0, "only wrappers: the last");
        assert_eq!(site_index(&[frame(3, false), frame(1, false)], name), 0);
        assert!(is_wrapper_name("operator new(unsigned long)"));
        assert!(is_wrapper_name("g_malloc0") && !is_wrapper_name("g_malloc_trim"));
    }
}
