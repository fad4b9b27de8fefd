//! Rates over the last refresh: each report carries totals since the
//! session started; the dashboard shows how fast they grew since the
//! report before (since the start, for the first one).

use crate::report::Report;

/// The totals of one report the dashboard shows as rates.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Totals {
    samples: u64,
    /// The profiler's own CPU seconds.
    cpu_s: f64,
    /// Records read from each ring.
    rings: Vec<(String, u64)>,
    /// The BPF programs' run time and runs (None: not counted).
    bpf_run_ns: Option<u64>,
    bpf_runs: Option<u64>,
}

/// Per second over the last refresh.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rates {
    pub samples: f64,
    /// Share of one core the profiler used.
    pub cpu_share: f64,
    /// Ring records, all rings, then each ring, busiest first.
    pub ring_events: f64,
    pub rings: Vec<(String, f64)>,
    /// Share of one core the BPF programs ran, and their runs (None: not
    /// counted).
    pub bpf_run_share: Option<f64>,
    pub bpf_runs: Option<f64>,
}

impl Totals {
    pub fn of(report: &Report) -> Self {
        let l = &report.loader;
        Self {
            samples: report.sampling.samples,
            cpu_s: l.cpu_s,
            rings: l.rings.iter().map(|r| (r.name.clone(), r.events)).collect(),
            bpf_run_ns: l.bpf_run_ns,
            bpf_runs: l.bpf_runs,
        }
    }

    /// How fast these totals grew from `prev`, `dt_s` seconds before
    /// (`dt_s` > 0); a counter `prev` lacks counts from zero.
    pub fn rates_since(&self, prev: &Totals, dt_s: f64) -> Rates {
        let per_s = |now: u64, then: u64| now.saturating_sub(then) as f64 / dt_s;
        let mut rings: Vec<(String, f64)> = self
            .rings
            .iter()
            .map(|(name, n)| {
                let then = prev
                    .rings
                    .iter()
                    .find(|(p, _)| p == name)
                    .map_or(0, |r| r.1);
                (name.clone(), per_s(*n, then))
            })
            .collect();
        rings.sort_by(|a, b| b.1.total_cmp(&a.1));
        Rates {
            samples: per_s(self.samples, prev.samples),
            cpu_share: (self.cpu_s - prev.cpu_s).max(0.0) / dt_s,
            ring_events: rings.iter().map(|r| r.1).sum(),
            rings,
            bpf_run_share: self
                .bpf_run_ns
                .map(|ns| per_s(ns, prev.bpf_run_ns.unwrap_or(0)) / 1e9),
            bpf_runs: self.bpf_runs.map(|n| per_s(n, prev.bpf_runs.unwrap_or(0))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::sample_report;

    #[test]
    fn the_first_report_gives_rates_since_the_start() {
        let r = sample_report();
        let rates = Totals::of(&r).rates_since(&Totals::default(), r.duration_s);
        assert_eq!(rates.samples, 400.0);
        assert_eq!(rates.cpu_share, r.loader.cpu_share);
        assert_eq!(rates.ring_events, r.loader.ring_events_per_s);
        assert_eq!(rates.rings[0], ("lock_events".into(), 20_000.0));
        assert_eq!(rates.bpf_run_share, r.loader.bpf_run_share);
        assert_eq!(rates.bpf_runs, r.loader.bpf_runs_per_s);
    }

    #[test]
    fn later_reports_give_rates_over_the_last_refresh() {
        let mut before = sample_report();
        before.loader.rings[1].events = 40_000;
        before.loader.bpf_run_ns = Some(5_000_000);
        before.loader.cpu_s = 0.0;
        let now = sample_report();
        let rates = Totals::of(&now).rates_since(&Totals::of(&before), 0.5);
        assert_eq!(rates.samples, 0.0);
        assert_eq!(rates.rings[0], ("lock_events".into(), 20_000.0));
        assert_eq!(rates.rings[1], ("samples".into(), 0.0));
        assert_eq!(rates.ring_events, 20_000.0);
        assert_eq!(rates.bpf_run_share, Some(0.04), "20 ms in 0.5 s");
        assert_eq!(rates.cpu_share, 0.02);
    }

    #[test]
    fn uncounted_bpf_time_stays_unknown() {
        let mut r = sample_report();
        r.loader.bpf_run_ns = None;
        r.loader.bpf_runs = None;
        let rates = Totals::of(&r).rates_since(&Totals::default(), 1.0);
        assert_eq!((rates.bpf_run_share, rates.bpf_runs), (None, None));
    }
}
