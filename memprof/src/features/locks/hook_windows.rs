//! The always-on contention hooks in windows, when their base cost (the
//! runs on every context switch and wake-up of the machine that find
//! nothing to do, which no stride lowers) alone exceeds their share of
//! the budget: attached for [`WINDOW`], then detached for `scale - 1`
//! windows ([`super::governor::Governor::scale`]).
//!
//! The counts, wait times and holder blame the kernel aggregates are then
//! those of the waits that began and ended inside a window; the report
//! scales them by the session's time over the time attached ([`factor`]),
//! which takes the rate seen in the windows for the rate in the gaps: the
//! spread of the rate between windows ([`HookWindows::rate_error`]) goes
//! into the claimed error. A wait longer than a window is never seen
//! whole; the contended waits this is for last microseconds.
//!
//! Pure: fed with instants and the kernel's wait counts, it says when to
//! attach and detach.
//!
//! [`factor`]: HookWindows::factor

use std::time::{Duration, Instant};

use memprof_common::Contention;

/// How long the hooks stay attached in a window: short, so that a
/// session of seconds has windows enough to tell how steady the rate is
/// (attaching four raw tracepoints takes well under a millisecond).
pub const WINDOW: Duration = Duration::from_millis(100);
/// Least time attached for an interval's rate to count in the spread.
const MIN_INTERVAL: Duration = Duration::from_millis(50);

/// What to do with the hooks now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switch {
    Attach,
    Detach,
}

/// The hooks' windows over a session.
#[derive(Debug, Clone)]
pub struct HookWindows {
    started: Instant,
    /// Attached since then (None: detached).
    open_since: Option<Instant>,
    /// Waits the kernel had counted when the current window opened.
    waits_at_open: u64,
    /// The end of the current gap.
    gap_until: Option<Instant>,
    /// Time attached in closed windows.
    attached: Duration,
    /// (waits, seconds) of each closed window, the first one (from the
    /// start) included.
    intervals: Vec<(u64, f64)>,
    /// Gaps so far (0: attached the whole session).
    gaps: u64,
    /// When the session ended (the factor stops growing then).
    ended: Option<Instant>,
}

impl HookWindows {
    /// Windows of a session whose hooks were attached at `now`.
    pub fn new(now: Instant) -> Self {
        Self {
            started: now,
            open_since: Some(now),
            waits_at_open: 0,
            gap_until: None,
            attached: Duration::ZERO,
            intervals: Vec::new(),
            gaps: 0,
            ended: None,
        }
    }

    /// Whether the hooks are attached.
    pub fn open(&self) -> bool {
        self.open_since.is_some()
    }

    /// Gaps so far: the hooks were attached in this many windows after
    /// the first (0: the whole session).
    pub fn gaps(&self) -> u64 {
        self.gaps
    }

    /// Seconds since the hooks were first attached, up to `now`.
    pub fn session_s(&self, now: Instant) -> f64 {
        now.saturating_duration_since(self.started).as_secs_f64()
    }

    /// Seconds attached up to `now`.
    pub fn attached_s(&self, now: Instant) -> f64 {
        let open = self
            .open_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        (self.attached + open).as_secs_f64()
    }

    /// When [`HookWindows::step`] has something to do at `scale`.
    pub fn next_switch(&self, scale: u64) -> Option<Instant> {
        match (self.open_since, self.gap_until) {
            (Some(since), _) => (scale > 1).then_some(since + WINDOW),
            (None, until) => until,
        }
    }

    /// Attaches or detaches at `now`, when the windows for `scale` (one
    /// window attached in `scale`) call for it; `waits` is the kernel's
    /// count of waits so far.
    pub fn step(&mut self, now: Instant, scale: u64, waits: u64) -> Option<Switch> {
        if self.ended.is_some() {
            return None;
        }
        match self.open_since {
            Some(since) if scale > 1 && now >= since + WINDOW => {
                let secs = now.saturating_duration_since(since);
                self.attached += secs;
                self.intervals
                    .push((waits.saturating_sub(self.waits_at_open), secs.as_secs_f64()));
                self.open_since = None;
                self.gap_until = Some(now + WINDOW * (scale as u32 - 1));
                self.gaps += 1;
                Some(Switch::Detach)
            }
            None if scale <= 1 || self.gap_until.is_none_or(|t| now >= t) => {
                self.open_since = Some(now);
                self.waits_at_open = waits;
                self.gap_until = None;
                Some(Switch::Attach)
            }
            _ => None,
        }
    }

    /// The session ends at `now`: the factor stops there.
    pub fn end(&mut self, now: Instant) {
        self.ended.get_or_insert(now);
    }

    /// Session time over time attached: what the kernel's aggregates are
    /// multiplied by. Exactly 1 while the hooks were never detached.
    pub fn factor(&self, now: Instant) -> f64 {
        if self.gaps == 0 {
            return 1.0;
        }
        let end = self.ended.unwrap_or(now);
        let attached = self.attached_s(end);
        let session = self.session_s(end);
        if attached <= 0.0 {
            return 1.0;
        }
        (session / attached).max(1.0)
    }

    /// The relative standard error of the waits' rate in the gaps, taken
    /// for the rate seen in the windows: the spread of the windows' rates
    /// over their number, for the share of the session in gaps. 0 without
    /// gaps; 1 (unknown) with fewer than two windows long enough to tell.
    pub fn rate_error(&self, now: Instant, waits: u64) -> f64 {
        if self.gaps == 0 {
            return 0.0;
        }
        let mut intervals = self.intervals.clone();
        if let Some(since) = self.open_since {
            let secs = now.saturating_duration_since(since);
            intervals.push((waits.saturating_sub(self.waits_at_open), secs.as_secs_f64()));
        }
        let rates: Vec<f64> = intervals
            .iter()
            .filter(|(_, s)| *s >= MIN_INTERVAL.as_secs_f64())
            .map(|&(w, s)| w as f64 / s)
            .collect();
        let n = rates.len() as f64;
        let mean = rates.iter().sum::<f64>() / n;
        if rates.len() < 2 || mean <= 0.0 {
            return 1.0;
        }
        let var = rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0);
        let gaps = 1.0 - 1.0 / self.factor(now);
        (var.sqrt() / mean / n.sqrt() * gaps).min(1.0)
    }
}

/// Scales a kernel aggregate seen in windows to the session (`factor`
/// from [`HookWindows::factor`]); the longest wait stays what it was.
pub fn scale(c: &mut Contention, factor: f64) {
    if factor == 1.0 {
        return;
    }
    let x = |v: &mut u64| *v = (*v as f64 * factor).round() as u64;
    x(&mut c.count);
    x(&mut c.total_ns);
    x(&mut c.woken);
    x(&mut c.caused_ns);
    x(&mut c.caused_waits);
    c.buckets.iter_mut().for_each(x);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn aggregates_scale_but_for_the_longest_wait() {
        let mut c = Contention {
            count: 10,
            total_ns: 1000,
            max_ns: 300,
            caused_waits: 3,
            ..Contention::default()
        };
        c.buckets[4] = 10;
        let exact = c;
        scale(&mut c, 1.0);
        assert_eq!(c.count, exact.count);
        scale(&mut c, 2.5);
        assert_eq!((c.count, c.total_ns, c.max_ns), (25, 2500, 300));
        assert_eq!((c.caused_waits, c.buckets[4]), (8, 25));
    }

    #[test]
    fn a_cheap_hook_stays_attached_and_exact() {
        let t0 = Instant::now();
        let mut w = HookWindows::new(t0);
        assert_eq!(w.next_switch(1), None);
        assert_eq!(w.step(t0 + ms(5000), 1, 1000), None);
        assert!(w.open());
        assert_eq!(w.factor(t0 + ms(6000)), 1.0);
        assert_eq!(w.rate_error(t0 + ms(6000), 1200), 0.0);
        assert_eq!(w.attached_s(t0 + ms(6000)), 6.0);
    }

    #[test]
    fn windows_follow_the_scale_and_scale_the_session() {
        let w_ms = WINDOW.as_millis() as u64;
        let t0 = Instant::now();
        let mut w = HookWindows::new(t0);
        // The governor asks for 1 in 5 after a second attached (10 k
        // waits): detach at once (the first window was long), for 4.
        let t1 = t0 + ms(1000);
        assert_eq!(w.step(t1, 5, 10_000), Some(Switch::Detach));
        assert_eq!(w.next_switch(5), Some(t1 + ms(4 * w_ms)));
        assert_eq!(w.step(t1 + ms(2 * w_ms), 5, 10_000), None);
        assert_eq!(w.step(t1 + ms(4 * w_ms), 5, 10_000), Some(Switch::Attach));
        assert_eq!(w.next_switch(5), Some(t1 + ms(5 * w_ms)));
        // 10 waits a millisecond in each window, as in the first.
        let seen = 10_000 + 10 * w_ms;
        assert_eq!(w.step(t1 + ms(5 * w_ms), 5, seen), Some(Switch::Detach));
        assert_eq!(w.step(t1 + ms(9 * w_ms), 5, seen), Some(Switch::Attach));
        let seen = seen + 10 * w_ms;
        assert_eq!(w.step(t1 + ms(10 * w_ms), 5, seen), Some(Switch::Detach));
        assert_eq!(w.gaps(), 3);
        // Ends in a gap, half a gap on.
        let end = t1 + ms(12 * w_ms);
        w.end(end);
        let attached = 1.0 + 2.0 * w_ms as f64 / 1e3;
        assert!((w.attached_s(end) - attached).abs() < 1e-9);
        let session = 1.0 + 12.0 * w_ms as f64 / 1e3;
        assert!((w.factor(end + ms(900)) - session / attached).abs() < 1e-9);
        // A steady rate: no spread.
        assert!(w.rate_error(end, seen) < 1e-9);
        // The scale back to 1 while detached: attach at once, for good.
        let mut v = HookWindows::new(t0);
        v.step(t1, 5, 0);
        assert_eq!(v.step(t1 + ms(1), 1, 0), Some(Switch::Attach));
        assert_eq!(v.next_switch(1), None);
    }

    #[test]
    fn an_unsteady_rate_or_too_few_windows_claim_more() {
        let w_ms = WINDOW.as_millis() as u64;
        let t0 = Instant::now();
        let mut w = HookWindows::new(t0);
        let t1 = t0 + ms(1000);
        w.step(t1, 5, 10_000);
        // One window only: unknown.
        assert_eq!(w.rate_error(t1 + ms(1), 10_000), 1.0);
        w.step(t1 + ms(4 * w_ms), 5, 10_000);
        // Half the rate in the second window (5 waits a millisecond).
        let end = t1 + ms(5 * w_ms);
        w.step(end, 5, 10_000 + 5 * w_ms);
        let e = w.rate_error(end, 10_000 + 5 * w_ms);
        // Rates 10 and 5: sd 3.536, mean 7.5, over √2, for the share of
        // the session in gaps.
        let session = 1.0 + 5.0 * w_ms as f64 / 1e3;
        let attached = 1.0 + w_ms as f64 / 1e3;
        let want = 3.5355339 / 7.5 / 2f64.sqrt() * (1.0 - attached / session);
        assert!((e - want).abs() < 1e-6, "{e} vs {want}");
    }
}
