//! Hot uprobes attached in windows: the allocator's and the locks' probes
//! share this code.
//!
//! In `full` mode the probes stay attached. In `sampled` mode a
//! [`DutyCycle`] decides, from the call rate seen in each window and the
//! cost of a traced call, how long to stay detached so that the target
//! loses at most the budget; counts are then scaled by the fraction of time
//! traced. Dropping a uprobe link blocks for 100–250 ms (the kernel waits
//! for a grace period) although the target keeps trapping until it is
//! gone, so links are dropped on short-lived threads, never on the event
//! loop, and the detach time counts as traced time.

use std::{
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

mod cpu;
mod first;
mod resident;
mod stime;

use super::detach::detach;
pub use super::detach::Detaching;

use super::{
    budget::{BudgetConfig, DutyCycle},
    calls::CallCounter,
    loader::Probes,
    uprobes::{Family, HotLink, ProbePoint},
};
use crate::error::Result;

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns`.
pub fn ktime_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Calls a second over `seen` calls since `opened`.
fn rate_since(seen: u64, opened: Instant) -> f64 {
    seen as f64 / opened.elapsed().as_secs_f64().max(1e-3)
}

/// Traced calls in a window below which its system time says too little
/// about the cost of a call.
pub(super) const MIN_CALLS_TO_MEASURE: u64 = 1000;
/// How often to check whether a window's probes are gone.
const DETACH_POLL: Duration = Duration::from_millis(5);
/// An operation whose traced calls cost less than this share of the
/// budget stays attached all the time: windows only for the hot ones,
/// because every link detached costs the kernel a grace period, and the
/// target keeps trapping until the last one is gone (measured: 0.3 s for
/// malloc+free, 1.4 s for all nine entry points of glibc).
pub(super) const RESIDENT_SHARE_OF_BUDGET: f64 = 0.1;

/// How the probes of one family are attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Attached all the time.
    Full,
    /// In windows, under the budget.
    Sampled,
    /// Do-nothing programs attached all the time (benchmarks' trap floor).
    Floor,
}

/// What a family's windows look like.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowSettings {
    pub mode: Mode,
    /// Allowed slowdown as a fraction (0.05 = 5%).
    pub budget: f64,
    /// The share of the budget the controller aims at: its cost of a call
    /// is an estimate, and a window's detach costs the target more than
    /// the window itself shows, so aiming at the budget itself overshoots.
    pub aim: f64,
    /// Model cost of one traced call (all its traps), in seconds.
    pub trap_cost_s: f64,
    /// How far `trap_cost_s` may be off, relatively, as the cost the
    /// target pays per call: 1 for a model figure, less when measured on
    /// this machine at start (see [`CALIBRATED_COST_ERROR`]), more where
    /// the target's pace under the probes strays further (a contended
    /// lock's convoy).
    pub trap_cost_error: f64,
    /// Whether the call estimate's few-windows floor stands for the
    /// slowdown correction's error too (see
    /// `CallCounter::floor_holds_slowdown`).
    pub floor_holds_slowdown: bool,
    /// How long the probes stay attached per window.
    pub window: Duration,
    /// How long the first window (and each of its quiet stretches) lasts:
    /// short, because nothing is known yet of the calls' rate and a hot
    /// function traps on every call meanwhile.
    pub first_window: Duration,
    /// Longest gap between windows.
    pub max_gap: Duration,
}

/// How far a calibrated per-call cost may be from what the target pays:
/// the calibration's own run-to-run spread (about 10% here), the CPUs
/// the target is taken to use (read over a second, else all online), and
/// a target that waits more than it computes, which the traps slow less.
pub const CALIBRATED_COST_ERROR: f64 = 0.35;

/// Links of one window, each with the operations it probes.
pub(super) type Links = Vec<HotLink>;

/// What the windowed probes are doing.
enum State {
    /// Attached since `opened`.
    Attached {
        links: Links,
        opened: Instant,
        calls_at_open: u64,
    },
    /// Being detached: the target traps until every drop has finished.
    Detaching {
        handles: Vec<JoinHandle<()>>,
        opened: Instant,
        /// How long the probes trapped: until the detach began.
        trapping: Duration,
        calls_at_open: u64,
    },
    /// Detached until `until`.
    Gap { since: Instant, until: Instant },
    /// Never attached, or finished.
    Idle,
}

/// One probed function and how it is traced.
struct Point {
    probe: ProbePoint,
    /// Attached for good (cold operation) since then.
    resident: Option<Instant>,
}

/// The windowed probes of one family in one session.
pub struct Windowed {
    family: Family,
    /// The object file probed.
    pub path: Arc<str>,
    pub settings: WindowSettings,
    points: Vec<Point>,
    pid: u32,
    cycle: DutyCycle,
    state: State,
    resident_links: Links,
    /// Resident operations whose probes went with a window's link (one
    /// `uprobe_multi` link holds hot and cold operations): attach them
    /// again, on their own, when it is gone.
    reattach_resident: bool,
    first_window: bool,
    /// The first window has had its first look (or needs none; see
    /// [`first`]).
    looked: bool,
    /// The first window saw a quiet stretch: the load began since, maybe
    /// in the middle of the last stretch.
    quiet_before: bool,
    /// Trap time (s) the first window may still spend on the target's
    /// serial start-up; `None`: not traced through it (see [`first`]).
    start_up_left: Option<f64>,
    generation: u64,
    /// Threads dropping links that nothing waits for yet.
    detaching: Vec<JoinHandle<()>>,
    /// Links to drop in the next gap (see [`Self::detach_later`]).
    later: Links,
    /// Windows opened so far.
    pub windows: u64,
    /// The calls the kernel counted, per window.
    counter: CallCounter,
    /// The target's CPU time when first attached, and last read.
    cpu: Option<[(Instant, f64); 2]>,
    /// Its system time, for the cost of a traced call.
    stime: stime::OwnSystemTime,
    /// When its CPU clock was last read for the call estimate.
    cpu_polled: Option<Instant>,
}

impl Windowed {
    pub fn new(
        family: Family,
        path: Arc<str>,
        points: Vec<ProbePoint>,
        settings: WindowSettings,
        pid: u32,
    ) -> Self {
        let cycle = DutyCycle::new(BudgetConfig {
            budget: settings.budget * settings.aim,
            trap_cost_s: settings.trap_cost_s,
            window: settings.window,
            max_gap: settings.max_gap,
            ..Default::default()
        });
        Self {
            family,
            path,
            settings,
            points: points
                .into_iter()
                .map(|probe| Point {
                    probe,
                    resident: None,
                })
                .collect(),
            pid,
            cycle,
            state: State::Idle,
            resident_links: Vec::new(),
            reattach_resident: false,
            first_window: true,
            looked: settings.first_window <= first::FIRST_LOOK,
            quiet_before: false,
            start_up_left: None,
            generation: 0,
            detaching: Vec::new(),
            later: Vec::new(),
            windows: 0,
            counter: {
                let c = CallCounter::new(family.counters().1 as usize, settings.trap_cost_error);
                if settings.floor_holds_slowdown {
                    c.floor_holds_slowdown()
                } else {
                    c
                }
            },
            cpu: None,
            stime: stime::OwnSystemTime::new(pid),
            cpu_polled: None,
        }
    }

    /// The operations probed.
    pub fn ops(&self) -> Vec<u32> {
        self.points.iter().map(|p| p.probe.op).collect()
    }

    /// Sets what the target loses per second the windows are attached
    /// besides the probes' traps (hooks attached with them), a fraction of
    /// its time.
    pub fn set_extra_cost(&mut self, per_second: f64) {
        self.cycle.set_extra_cost(per_second);
    }

    /// The cost of one traced call in use (model, or measured if higher).
    pub fn trap_cost(&self) -> f64 {
        self.cycle.trap_cost()
    }

    /// Opens a window: attaches every point that is not resident.
    /// Returns the ktime at which tracing started.
    pub fn open(&mut self, probes: &mut Probes) -> Result<u64> {
        self.generation += 1;
        probes.set_generation(self.family, self.generation);
        let calls_at_open = probes.calls(self.family);
        let windowed: Vec<ProbePoint> = self
            .points
            .iter()
            .filter(|p| p.resident.is_none())
            .map(|p| p.probe)
            .collect();
        let floor = self.settings.mode == Mode::Floor;
        let links = probes.attach_points(self.family, &self.path, &windowed, self.pid, floor)?;
        self.count_attached(probes);
        self.read_cpu();
        self.windows += 1;
        self.stime.window_opened();
        self.state = State::Attached {
            links,
            opened: Instant::now(),
            calls_at_open,
        };
        Ok(ktime_ns())
    }

    /// When the controller must act next (None: never, e.g. full mode).
    pub fn deadline(&self) -> Option<Instant> {
        if self.settings.mode != Mode::Sampled {
            return None;
        }
        match &self.state {
            State::Attached { opened, .. } if self.first_window && !self.looked => {
                Some(*opened + first::FIRST_LOOK)
            }
            State::Attached { opened, .. } if self.first_window => {
                Some(*opened + self.settings.first_window)
            }
            State::Attached { opened, .. } => Some(*opened + self.cycle.next().window),
            State::Detaching { .. } => Some(Instant::now() + DETACH_POLL),
            State::Gap { until, .. } => Some(*until),
            State::Idle => None,
        }
    }

    /// Acts at the deadline: ends a window (detaching, unless the budget
    /// allows tracing on), sees a detach through, or ends a gap
    /// (attaching). Returns `Some(true)` when a window opened,
    /// `Some(false)` when its probes are all gone.
    pub fn on_deadline(&mut self, probes: &mut Probes) -> Result<Option<bool>> {
        if self.first_look_waits(probes) {
            return Ok(None);
        }
        self.act(probes)
    }

    /// [`Self::on_deadline`] past the first window's first look.
    fn act(&mut self, probes: &mut Probes) -> Result<Option<bool>> {
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Attached {
                links,
                opened,
                calls_at_open,
            } => {
                let calls = probes.calls(self.family);
                let seen = calls.saturating_sub(calls_at_open);
                let rate = rate_since(seen, opened);
                if self.first_window {
                    if self.first_window_waits(seen, rate) {
                        self.new_stretch(probes);
                        self.stay_attached(links, opened, calls_at_open, calls);
                        return Ok(None);
                    }
                    self.first_window = false;
                    self.make_cold_ops_resident(probes, opened.elapsed());
                }
                if self.cycle.duty(rate) >= 1.0 {
                    // Cheap enough to stay attached.
                    self.new_stretch(probes);
                    self.stay_attached(links, opened, calls_at_open, calls);
                    return Ok(None);
                }
                let links = self.without_resident(links);
                let resident = self.resident_by_op();
                self.count_detaching(probes, &resident);
                self.read_cpu();
                self.state = State::Detaching {
                    handles: detach(links),
                    opened,
                    trapping: opened.elapsed(),
                    calls_at_open,
                };
                Ok(None)
            }
            State::Detaching {
                mut handles,
                opened,
                trapping,
                calls_at_open,
            } => {
                if handles.iter().any(|h| !h.is_finished()) {
                    self.state = State::Detaching {
                        handles,
                        opened,
                        trapping,
                        calls_at_open,
                    };
                    return Ok(None);
                }
                for h in handles.drain(..) {
                    let _ = h.join();
                }
                self.reattach_resident(probes)?;
                self.window_ended(probes, opened, trapping, calls_at_open);
                Ok(Some(false))
            }
            State::Gap { since, .. } => {
                self.cycle.observe(0, Duration::ZERO, since.elapsed());
                self.open(probes)?;
                Ok(Some(true))
            }
            State::Idle => Ok(None),
        }
    }

    /// Whether the first window goes on (a stretch with `seen` calls at
    /// `rate` just ended). Too quiet to tell hot from cold (a launched
    /// command starting up, a program without locks): probes that fire
    /// this rarely cost less than the budget, so stay attached and look
    /// again a stretch later; a busy stretch decides even with few calls (a
    /// short window on a loaded machine). After quiet stretches the load
    /// may have begun in the middle of this one, whose rate, extrapolated
    /// over the gap, would be low: one whole busy stretch more.
    fn first_window_waits(&mut self, seen: u64, rate: f64) -> bool {
        let quiet = first::too_quiet_to_decide(seen, rate, &self.cycle);
        if self.in_serial_start_up(seen, rate) {
            // A quiet start-up stretch is a quiet stretch all the same:
            // the load may begin in the middle of the one that ends it.
            self.quiet_before |= quiet;
            return true;
        }
        let just_woke = !quiet && std::mem::replace(&mut self.quiet_before, false);
        self.quiet_before |= quiet;
        quiet || just_woke
    }

    /// The window's probes are gone: learn the trap cost and the call rate
    /// from it, and wait for the gap the budget allows.
    fn window_ended(
        &mut self,
        probes: &Probes,
        opened: Instant,
        trapping: Duration,
        calls_at_open: u64,
    ) {
        // The target trapped until now: all of it was traced time.
        let len = opened.elapsed();
        let traced = probes.calls(self.family).saturating_sub(calls_at_open);
        if let Some(cost) = self.stime.window_closed(len, traced) {
            self.cycle
                .measured_trap_cost(cost, self.settings.trap_cost_s);
        }
        self.cycle.observe_window(traced, trapping, len);
        let gap = self.cycle.gap_after(traced, len).max(DETACH_POLL);
        tracing::debug!(
            "{:?} window {}: attached {len:?} (trapping {trapping:?}), {traced} calls, \
             {:.0} calls/s, {:.2} µs per call, {:.1} ms spent, next gap {gap:?}",
            self.family,
            self.windows,
            self.cycle.rate().unwrap_or(0.0),
            self.cycle.trap_cost() * 1e6,
            self.cycle.spent() * 1e3,
        );
        let later = std::mem::take(&mut self.later);
        self.detaching.extend(detach(later));
        let now = Instant::now();
        self.state = State::Gap {
            since: now,
            until: now + gap,
        };
    }

    /// Ends a window without detaching: a new one starts now (so the next
    /// deadline is a window away).
    fn stay_attached(&mut self, links: Links, opened: Instant, calls_at_open: u64, calls: u64) {
        self.cycle.observe(
            calls.saturating_sub(calls_at_open),
            opened.elapsed(),
            Duration::ZERO,
        );
        self.state = State::Attached {
            links,
            opened: Instant::now(),
            calls_at_open: calls,
        };
        self.stime.window_restarted();
    }

    /// Whether the windowed probes are attached now.
    pub fn attached(&self) -> bool {
        matches!(self.state, State::Attached { .. } | State::Detaching { .. })
    }

    /// Whether the window's links are being dropped (some operations'
    /// probes may already be gone).
    pub fn detaching(&self) -> bool {
        matches!(self.state, State::Detaching { .. })
    }

    /// Ends tracing: accounts for the last window or gap and starts
    /// detaching everything; [`Windowed::wait_detached`] waits for it
    /// (about 0.2 s per link: the kernel takes a grace period per link,
    /// one after the other).
    pub fn finish(&mut self, probes: &Probes) {
        self.count_end(probes);
        self.read_cpu();
        let calls = probes.calls(self.family);
        let mut handles = detach(std::mem::take(&mut self.resident_links));
        let window = match std::mem::replace(&mut self.state, State::Idle) {
            State::Attached {
                links,
                opened,
                calls_at_open,
                ..
            } => {
                handles.extend(detach(links));
                Some((opened, calls_at_open))
            }
            State::Detaching {
                handles: h,
                opened,
                calls_at_open,
                ..
            } => {
                handles.extend(h);
                Some((opened, calls_at_open))
            }
            State::Gap { since, .. } => {
                self.cycle.observe(0, Duration::ZERO, since.elapsed());
                None
            }
            State::Idle => None,
        };
        if let Some((opened, calls_at_open)) = window {
            self.cycle.observe(
                calls.saturating_sub(calls_at_open),
                opened.elapsed(),
                Duration::ZERO,
            );
        }
        self.detaching.append(&mut handles);
    }

    /// Waits until every probe [`Windowed::finish`] detached is gone.
    pub fn wait_detached(&mut self) {
        self.take_detaching().wait();
    }

    /// Detaches `links` (the family's, attached elsewhere, e.g. for a
    /// calibration) in the next gap, or at the end: the kernel removes
    /// links one grace period at a time, and these must not lengthen a
    /// window's detach, which the target pays for. They are dropped on
    /// threads started then, after the session dropped its capabilities
    /// (capabilities are per thread: a thread started before would keep
    /// them all; in full mode that is at the end).
    pub fn detach_later(&mut self, links: Vec<HotLink>) {
        self.later.extend(links);
    }

    /// The detaches still running, to be waited for later.
    pub fn take_detaching(&mut self) -> Detaching {
        let later = std::mem::take(&mut self.later);
        self.detaching.extend(detach(later));
        Detaching::new(std::mem::take(&mut self.detaching))
    }

    /// Fraction of the session the hot (windowed) probes were attached.
    pub fn traced_fraction(&self) -> f64 {
        match self.settings.mode {
            Mode::Full | Mode::Floor => 1.0,
            Mode::Sampled => self.cycle.traced_fraction(),
        }
    }
}
