//! What a shared line costs, and what fixing it would gain.
//!
//! **Cost counts the instruction, not only the placed sample.** A sample
//! is placed on a line only when its address could be computed; samples
//! of the same instruction that could not be placed (its first sample,
//! before the instruction was decoded; a slice whose stack read failed)
//! took the same time. Once an instruction is known to access the line,
//! all its samples count, in the proportion of its placed samples that hit
//! this line.
//!
//! **Predicted gain (Cheetah's assessment, by sampling).** Timer samples
//! land after the instruction that took the time. An access to a
//! contended line takes far longer than one to an uncontended line, so its
//! instruction collects far more samples than the instructions around it.
//! The excess over that background rate, in the neighbourhood of the same
//! code, is the time the contention costs; taken out of the accessing
//! threads' time, it gives the speedup if the line were fixed. The low end
//! counts the excess of the line's accesses over the neighbours' median;
//! the high end the excess of every instruction around them over the
//! neighbours' 25th percentile (a store waiting for the line stalls the
//! instructions after it, where timer samples land too). Without a PMU's
//! latencies this is a range, often wide; the benchmark compares it with
//! measured padded/unpadded pairs.

use super::analysis::LineFinding;
use crate::features::FastMap;

/// Code bytes around the line's accessing instructions whose samples make
/// the background rate.
const NEIGHBOURHOOD: u64 = 256;
/// Fewest neighbouring instructions for a background rate.
const MIN_NEIGHBOURS: usize = 2;
/// The largest share of time the prediction may take out.
const MAX_EXCESS: f64 = 0.9;

/// The samples the sharing feature saw, per instruction and per thread.
#[derive(Debug, Default)]
pub struct CodeSamples {
    /// User-mode samples at each sampled IP, placed or not.
    pub by_ip: FastMap<u64, u64>,
    /// The accessing instruction each decoded IP's samples stand for (the
    /// IP itself, or the instruction before it).
    pub insn_of_ip: FastMap<u64, u64>,
    /// Accesses placed (on any line) per accessing instruction.
    pub placed: FastMap<u64, u64>,
    /// CPU samples per thread.
    pub by_thread: FastMap<u32, u64>,
}

/// A line's cost.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LineCost {
    /// Samples of the instructions accessing the line attributed to it.
    pub samples: f64,
    /// `samples` as a share of all the target's samples.
    pub share: f64,
    pub gain: Option<Gain>,
}

/// The predicted speedup of the accessing threads if the line were fixed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gain {
    pub low: f64,
    pub high: f64,
    /// Excess samples (middle estimate) over the threads' samples.
    pub excess_share: f64,
    /// The threads' samples the share is taken of.
    pub thread_samples: u64,
}

impl CodeSamples {
    /// Records a user-mode sample at `ip`.
    pub fn on_user_sample(&mut self, ip: u64) {
        *self.by_ip.entry(ip).or_default() += 1;
    }

    /// Records a CPU sample of `tid`.
    pub fn on_thread_sample(&mut self, tid: u32) {
        *self.by_thread.entry(tid).or_default() += 1;
    }

    /// Records a placed access by instruction `insn`.
    pub fn on_placed(&mut self, insn: u64) {
        *self.placed.entry(insn).or_default() += 1;
    }

    /// The share of each accessing instruction's placed samples that hit
    /// the line.
    fn fractions(&self, f: &LineFinding) -> FastMap<u64, f64> {
        f.code
            .iter()
            .filter_map(|c| {
                let placed = *self.placed.get(&c.insn)?;
                Some((c.insn, (c.samples as f64 / placed.max(1) as f64).min(1.0)))
            })
            .collect()
    }

    /// The cost of finding `f` among `total` samples of the target.
    pub fn line_cost(&self, f: &LineFinding, total: u64) -> LineCost {
        let fractions = self.fractions(f);
        // The sampled IPs standing for the line's accesses (their samples,
        // and the share of them that is the line's), and the others.
        let mut on_line: Vec<(u64, f64)> = Vec::new();
        let mut others: Vec<(u64, u64)> = Vec::new();
        for (&ip, &n) in &self.by_ip {
            match self.insn_of_ip.get(&ip).and_then(|i| fractions.get(i)) {
                Some(&frac) => on_line.push((n, frac)),
                None => others.push((ip, n)),
            }
        }
        let samples: f64 = on_line.iter().map(|&(n, frac)| n as f64 * frac).sum();
        // Samples placed but not through a decoded IP (precise events).
        let samples = samples.max(f.samples as f64);
        LineCost {
            samples,
            share: samples / total.max(1) as f64,
            gain: self.gain(f, &fractions, &on_line, &others),
        }
    }

    fn gain(
        &self,
        f: &LineFinding,
        fractions: &FastMap<u64, f64>,
        on_line: &[(u64, f64)],
        others: &[(u64, u64)],
    ) -> Option<Gain> {
        let lo = *fractions.keys().min()?;
        let hi = *fractions.keys().max()?;
        let mut near: Vec<u64> = others
            .iter()
            .filter(|&&(ip, _)| ip + NEIGHBOURHOOD >= lo && ip <= hi + NEIGHBOURHOOD)
            .map(|&(_, n)| n)
            .collect();
        if near.len() < MIN_NEIGHBOURS {
            return None;
        }
        near.sort_unstable();
        let quantile = |q: f64| near[((near.len() - 1) as f64 * q).round() as usize];
        let thread_samples: u64 = f.threads.iter().filter_map(|t| self.by_thread.get(t)).sum();
        if thread_samples == 0 {
            return None;
        }
        // The low end: the line's accesses in excess of the neighbours'
        // median. The high end: every instruction near them in excess of
        // the neighbours' 25th percentile (a store waiting for the line
        // stalls the instructions after it, where timer samples land).
        let excess = |base: u64, with_near: bool| {
            let mut e: f64 = on_line
                .iter()
                .map(|&(n, frac)| n.saturating_sub(base) as f64 * frac)
                .sum();
            if with_near {
                e += near
                    .iter()
                    .map(|&n| n.saturating_sub(base) as f64)
                    .sum::<f64>();
            }
            (e / thread_samples as f64).min(MAX_EXCESS)
        };
        let speedup = |e: f64| 1.0 / (1.0 - e);
        let (low, high) = (excess(quantile(0.5), false), excess(quantile(0.25), true));
        if low >= MAX_EXCESS {
            // A loop that does little but access the line: the neighbours
            // say nothing of what an uncontended access would cost.
            return None;
        }
        Some(Gain {
            low: speedup(low),
            high: speedup(high),
            excess_share: (low + high) / 2.0,
            thread_samples,
        })
    }

    /// CPU samples of all threads.
    pub fn cpu_samples(&self) -> u64 {
        self.by_thread.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::features::sharing::{analysis::CodeUse, words::SharingKind};

    fn finding(code: &[(u64, u64)], threads: &[u32]) -> LineFinding {
        LineFinding {
            line: 0x1000,
            kind: SharingKind::False,
            invalidations: 10,
            samples: code.iter().map(|c| c.1).sum(),
            cost_share: 0.0,
            invalidation_rate: 0.5,
            threads: threads.to_vec(),
            words: Vec::new(),
            code: code
                .iter()
                .map(|&(insn, n)| CodeUse {
                    insn,
                    reads: n,
                    writes: 0,
                    samples: n,
                    threads: threads.iter().copied().collect(),
                    offset: 0,
                })
                .collect(),
            raw: 0,
            waw: 0,
            war: 0,
            first_addr: 0x1000,
            parts: Vec::new(),
        }
    }

    /// A loop of ten instructions sampled 10 times each, but the one after
    /// the contended load (at 0x400) sampled 110 times, of which 80 were
    /// placed on the line (20 could not be placed: first sample, fault).
    fn session() -> CodeSamples {
        let mut c = CodeSamples::default();
        for i in 0..10u64 {
            let ip = 0x400 + 4 * i;
            c.insn_of_ip.insert(ip, ip.saturating_sub(4));
            c.by_ip.insert(ip, 10);
        }
        c.by_ip.insert(0x404, 110);
        c.placed.insert(0x400, 80);
        c.by_thread.insert(1, 100);
        c.by_thread.insert(2, 100);
        c
    }

    #[test]
    fn every_sample_of_an_instruction_on_the_line_counts() {
        let c = session();
        let f = finding(&[(0x400, 80)], &[1, 2]);
        let cost = c.line_cost(&f, 1000);
        assert!((cost.samples - 110.0).abs() < 1e-9, "{cost:?}");
        assert!((cost.share - 0.11).abs() < 1e-9);
        // Half the instruction's placed samples on another line: half
        // its samples.
        let f = finding(&[(0x400, 40)], &[1, 2]);
        assert!((c.line_cost(&f, 1000).samples - 55.0).abs() < 1e-9);
    }

    #[test]
    fn the_gain_is_the_excess_over_the_neighbouring_instructions() {
        let c = session();
        let f = finding(&[(0x400, 80)], &[1, 2]);
        let gain = c.line_cost(&f, 1000).gain.expect("a prediction");
        // 110 - 10 = 100 excess samples of 200: twice as fast (the
        // neighbours are all at the background rate: one answer).
        assert!((gain.low - 2.0).abs() < 1e-9, "{gain:?}");
        assert!((gain.high - 2.0).abs() < 1e-9, "{gain:?}");
        assert!((gain.excess_share - 0.5).abs() < 1e-9);
        assert_eq!(gain.thread_samples, 200);
    }

    #[test]
    fn a_loop_that_only_hammers_the_line_gets_no_prediction() {
        let mut c = session();
        c.by_ip.insert(0x404, 100_000);
        c.placed.insert(0x400, 100_000);
        c.by_thread.insert(1, 100_000);
        let f = finding(&[(0x400, 100_000)], &[1, 2]);
        assert_eq!(c.line_cost(&f, 200_000).gain, None);
    }

    #[test]
    fn no_background_no_prediction() {
        let mut c = CodeSamples::default();
        c.insn_of_ip.insert(0x404, 0x400);
        c.by_ip.insert(0x404, 50);
        c.placed.insert(0x400, 50);
        c.by_thread.insert(1, 50);
        let f = finding(&[(0x400, 50)], &[1]);
        assert_eq!(c.line_cost(&f, 100).gain, None);
    }
}
