//! How much a figure measured in several windows varies between them,
//! and how much it may vary given so few windows.

/// Running mean and variance (Welford), in bounded memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Spread {
    /// Samples added.
    pub n: u64,
    mean: f64,
    m2: f64,
}

impl Spread {
    /// Adds a sample.
    pub fn add(&mut self, x: f64) {
        self.n += 1;
        let d = x - self.mean;
        self.mean += d / self.n as f64;
        self.m2 += d * (x - self.mean);
    }

    /// Standard deviation over the mean (0 with fewer than 2 samples).
    pub fn relative(&self) -> f64 {
        if self.n < 2 || self.mean <= 0.0 {
            0.0
        } else {
            (self.m2 / (self.n - 1) as f64).sqrt() / self.mean
        }
    }

    /// [`Self::relative`] as large as the samples allow it to be at
    /// [`SPREAD_CONFIDENCE`]: a few windows' spread is itself a rough
    /// figure, and low more often than high (two windows that fell in
    /// the same phase of a program that alternates between two paces
    /// differed by 17% where the paces differed 5x).
    pub fn relative_upper(&self) -> f64 {
        self.relative() * spread_upper_factor(self.n.saturating_sub(1))
    }
}

/// One-sided confidence of the upper bound put on the windows' spread.
pub const SPREAD_CONFIDENCE: f64 = 0.8;

/// Quantiles of χ² at 1 − [`SPREAD_CONFIDENCE`] (0.2) for 1 to 3 degrees
/// of freedom; Wilson and Hilferty's approximation beyond (within 1% from
/// 2 degrees up).
const CHI2_AT_0_2: [f64; 3] = [0.064_18, 0.446_3, 1.005_2];

/// By how much a sample standard deviation with `df` degrees of freedom
/// is multiplied for its upper confidence bound: √(df / χ²(0.2, df))
/// (3.95 for two samples, 2.12 for three, 1.46 for six, towards 1).
pub fn spread_upper_factor(df: u64) -> f64 {
    if df == 0 {
        return 1.0;
    }
    let k = df as f64;
    let quantile = match CHI2_AT_0_2.get(df as usize - 1) {
        Some(q) => *q,
        None => {
            // The standard normal's quantile at 0.2.
            const Z: f64 = -0.841_621;
            let h = 2.0 / (9.0 * k);
            k * (1.0 - h + Z * h.sqrt()).powi(3)
        }
    };
    (k / quantile).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The upper bound put on a sample's spread: the χ² quantiles at 0.2
    /// (√(df / χ²)), exact to three places up to 3 degrees of freedom and
    /// within 1% beyond.
    #[test]
    fn few_windows_spread_is_taken_at_its_upper_bound() {
        let exact = [
            (1, 3.947),
            (2, 2.117),
            (3, 1.728),
            (4, 1.558),
            (5, 1.461),
            (10, 1.272),
        ];
        for (df, factor) in exact {
            let f = spread_upper_factor(df);
            assert!((f / factor - 1.0).abs() < 0.01, "{df}: {f} for {factor}");
        }
        assert_eq!(spread_upper_factor(0), 1.0);
        assert!((spread_upper_factor(1000) - 1.0).abs() < 0.03);
    }

    #[test]
    fn two_samples_spread_is_widened_by_the_bound() {
        let mut s = Spread::default();
        assert_eq!(s.relative_upper(), 0.0);
        s.add(1000.0);
        assert_eq!(s.relative_upper(), 0.0, "one sample: no spread");
        s.add(2000.0);
        let cv = 500f64.hypot(500.0) / 1500.0;
        assert!((s.relative() - cv).abs() < 1e-12);
        assert!((s.relative_upper() - cv * spread_upper_factor(1)).abs() < 1e-12);
    }
}
