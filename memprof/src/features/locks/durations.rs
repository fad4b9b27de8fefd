//! Durations as the kernel aggregates them: log2 buckets with the exact
//! count, total and longest. A few hundred bytes per lock whatever the
//! number of events, so that a program with 100,000 mutexes costs the
//! loader megabytes, not gigabytes (an HDR histogram per lock did).
//!
//! Percentiles are estimates: the rank is found in its bucket and placed
//! linearly inside it (a bucket spans a factor of 2), never above the
//! exact longest.

use memprof_common::futex::{log2_bucket, LOCK_HIST_BUCKETS};

/// Durations of one kind (waits, holds...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Durations {
    /// Bucket `i` counts durations `d` with `log2_bucket(d) == i`: 0 for
    /// 0 ns, then `[2^(i-1), 2^i)` ns; the last holds everything above.
    pub buckets: [u64; LOCK_HIST_BUCKETS],
    pub count: u64,
    pub total_ns: u64,
    pub max_ns: u64,
}

impl Default for Durations {
    fn default() -> Self {
        Self {
            buckets: [0; LOCK_HIST_BUCKETS],
            count: 0,
            total_ns: 0,
            max_ns: 0,
        }
    }
}

impl Durations {
    /// Durations the kernel aggregated (same bucket layout).
    pub fn from_log2(
        buckets: [u64; LOCK_HIST_BUCKETS],
        count: u64,
        total_ns: u64,
        max_ns: u64,
    ) -> Self {
        Self {
            buckets,
            count,
            total_ns,
            max_ns,
        }
    }

    pub fn record(&mut self, ns: u64) {
        self.buckets[log2_bucket(ns)] += 1;
        self.count += 1;
        self.total_ns = self.total_ns.saturating_add(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn add(&mut self, other: &Durations) {
        for (a, b) in self.buckets.iter_mut().zip(other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.total_ns = self.total_ns.saturating_add(other.total_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub fn mean_ns(&self) -> u64 {
        if self.count == 0 {
            0
        } else {
            (self.total_ns as f64 / self.count as f64).round() as u64
        }
    }

    /// The 99th percentile (estimated within its bucket), never above
    /// the exact longest.
    pub fn p99_ns(&self) -> u64 {
        self.quantile_ns(0.99)
    }

    /// The `q` quantile, placed linearly inside its bucket.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).ceil().max(1.0);
        let mut below = 0u64;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n == 0 {
                continue;
            }
            if (below + n) as f64 >= rank {
                let (lo, hi) = bucket_range(i);
                let within = (rank - below as f64 - 0.5) / n as f64;
                let v = lo as f64 + within * (hi - lo) as f64;
                return (v.round() as u64).min(self.max_ns);
            }
            below += n;
        }
        self.max_ns
    }

    /// The non-empty buckets as (upper bound in ns, count), for the report.
    pub fn log2_buckets(&self) -> Vec<(u64, u64)> {
        self.buckets
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, n)| (bucket_range(i).1, *n))
            .collect()
    }
}

/// The durations bucket `i` holds: `[lo, hi)` ns (the last is open above;
/// its `hi` is the longest a bucket can name).
fn bucket_range(i: usize) -> (u64, u64) {
    match i {
        0 => (0, 1),
        _ => (1u64 << (i - 1), 1u64 << i.min(63)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_totals_and_buckets_are_exact() {
        let mut d = Durations::default();
        for ns in [0, 1, 3, 1000, 1000, 5000] {
            d.record(ns);
        }
        assert_eq!((d.count(), d.total_ns, d.max_ns), (6, 7004, 5000));
        assert_eq!(d.mean_ns(), 1167);
        // 1000 is in [512, 1024), 5000 in [4096, 8192).
        assert_eq!(
            d.log2_buckets(),
            vec![(1, 1), (2, 1), (4, 1), (1024, 2), (8192, 1)]
        );
        let mut sum = Durations::default();
        sum.add(&d);
        sum.add(&d);
        assert_eq!((sum.count(), sum.total_ns, sum.max_ns), (12, 14008, 5000));
    }

    #[test]
    fn percentiles_stay_inside_their_bucket_and_below_the_longest() {
        let mut d = Durations::default();
        for _ in 0..99 {
            d.record(600);
        }
        d.record(3000);
        let p99 = d.p99_ns();
        assert!((512..1024).contains(&p99), "{p99}");
        assert_eq!(d.quantile_ns(1.0), 3000, "capped by the exact longest");
        assert_eq!(Durations::default().p99_ns(), 0);
        let mut one = Durations::default();
        one.record(700);
        assert_eq!(one.p99_ns(), 700);
    }

    #[test]
    fn kernel_aggregates_read_back_the_same() {
        let mut d = Durations::default();
        d.record(5);
        d.record(70);
        let k = Durations::from_log2(d.buckets, 2, 75, 70);
        assert_eq!(k, d);
    }
}
