//! Tracing the allocator: which entry points to probe and where, and the
//! windows in which the probes are attached.
//!
//! In `full` mode the probes stay attached. In `sampled` mode a
//! [`DutyCycle`] decides, from the call rate seen in each window and the
//! cost of a traced call, how long to stay detached so that the target
//! loses at most the budget; counts are then scaled by the fraction of time
//! traced. Dropping a uprobe link blocks for 100–250 ms (the kernel waits
//! for a grace period) although the target stops trapping at once, so links
//! are dropped on short-lived threads, never on the event loop.

use std::{
    io::{Read, Seek, SeekFrom},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::programs::uprobe::UProbeLink;

use super::{
    allocator::{Allocator, AllocatorKind},
    budget::{BudgetConfig, DutyCycle},
    probes::{ProbePoint, Probes},
    prologue,
};
use crate::{
    analysis::alloc::{op_name, AllocProfile, LargeRule},
    cli::AllocMode,
    error::Result,
    report::model::{
        AllocatorReport, KernelThreadEntry, MemoryReport, OpStats, SiteEntry, SyscallStats,
    },
    symbolize::Frame,
};
use memprof_common::{syscall, KernelStats};

/// Settings from the command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AllocSettings {
    pub mode: AllocMode,
    /// `--alloc-large-threshold`.
    pub large_threshold: Option<u64>,
    /// Allowed slowdown as a fraction (0.05 = 5%).
    pub budget: f64,
}

impl Default for AllocSettings {
    fn default() -> Self {
        Self {
            mode: AllocMode::Sampled,
            large_threshold: None,
            budget: 0.05,
        }
    }
}

/// Cost of one traced call whose probes the kernel emulates: entry trap
/// plus return trap (measured here: +2.5 µs for malloc).
const TRAP_COST_S: f64 = 2.5e-6;
/// Extra cost when the probed instruction must be single-stepped (a second
/// trap; measured: +3.3 µs).
const SINGLE_STEP_COST_S: f64 = 3.3e-6;

/// The "large" rule of an allocator, unless the user gave one.
pub fn large_rule(kind: AllocatorKind, flag: Option<u64>) -> LargeRule {
    match (flag, kind) {
        (Some(n), _) => LargeRule::Above(n),
        (None, AllocatorKind::Glibc) => LargeRule::GlibcChunk,
        // jemalloc's largest small size class (4 KiB pages).
        (None, AllocatorKind::Jemalloc) => LargeRule::Above(14 << 10),
        // tcmalloc's kMaxSize: larger requests go to the page heap.
        (None, AllocatorKind::Tcmalloc) => LargeRule::Above(256 << 10),
        // mimalloc's medium-object limit, and glibc's initial threshold.
        (None, AllocatorKind::Mimalloc | AllocatorKind::Other) => LargeRule::Above(128 << 10),
    }
}

/// Where to probe each entry point of `allocator`, and whether the hottest
/// one (malloc) is emulated by the kernel.
pub fn probe_points(allocator: &Allocator) -> (Vec<ProbePoint>, bool) {
    let mut malloc_emulated = true;
    let points = allocator
        .entries
        .iter()
        .filter_map(|entry| {
            let op = memprof_common::alloc_op::SYMBOLS
                .iter()
                .position(|s| entry.names.first().is_some_and(|n| n == s))?;
            // Enough for early-exit branches to be followed to their `ret`.
            let code = read_at(&allocator.path, entry.file_offset, 512).unwrap_or_default();
            let (offset, emulated) = prologue::probe_site(&code);
            if op as u32 == memprof_common::alloc_op::MALLOC {
                malloc_emulated = emulated;
            }
            tracing::debug!(
                "probing {} at {:#x}+{offset} (kernel-emulated: {emulated})",
                entry.names.join("="),
                entry.file_offset
            );
            Some(ProbePoint {
                op: op as u32,
                file_offset: entry.file_offset + offset,
            })
        })
        .collect();
    (points, malloc_emulated)
}

fn read_at(path: &str, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0; len];
    let n = file.read(&mut buf)?;
    buf.truncate(n);
    Ok(buf)
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns`.
pub fn ktime_ns() -> u64 {
    // SAFETY: an all-zero timespec is valid for clock_gettime to fill.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The controller aims below the budget: its cost of a call is an estimate
/// (the benchmark measured the default mode 6% slower with a 5% budget
/// before this margin).
const AIM_AT_SHARE_OF_BUDGET: f64 = 0.8;

/// How long the probes stay attached per window. Detaching adds about
/// 0.35 s of tracing (the kernel's grace periods), so longer windows would
/// buy little precision at a high price.
const WINDOW: Duration = Duration::from_millis(100);
/// Longest gap between windows. A window of a hot allocator costs about
/// 0.45 s of the target's time (window + detach), so keeping a 5% budget
/// needs gaps of about 10 s, and up to 30 s for the hottest loops; a
/// shorter cap would break the budget.
const MAX_GAP: Duration = Duration::from_secs(30);

/// Traced calls in a window below which its system time says too little
/// about the cost of a call.
const MIN_CALLS_TO_MEASURE: u64 = 1000;
/// How often to check whether a window's probes are gone.
const DETACH_POLL: Duration = Duration::from_millis(20);
/// An operation whose traced calls cost less than this share of the
/// budget stays attached all the time: windows only for the hot ones,
/// because every link detached costs the kernel a grace period, and the
/// target keeps trapping until the last one is gone (measured: 0.3 s for
/// malloc+free, 1.4 s for all nine entry points of glibc).
const RESIDENT_SHARE_OF_BUDGET: f64 = 0.1;

/// System CPU seconds of process `pid` (all threads, past and present).
fn system_time(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces and parens).
    let rest = &stat[stat.rfind(')')? + 2..];
    let stime: f64 = rest.split(' ').nth(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (hz > 0).then(|| stime / hz as f64)
}

/// What the windowed probes are doing.
enum State {
    /// Attached since `opened`.
    Attached {
        links: Vec<UProbeLink>,
        /// The operations attached, in the order of `links` (which has
        /// an exit and an entry link per operation: exits first).
        ops: Vec<u32>,
        opened: Instant,
        calls_at_open: u64,
        stime_at_open: Option<f64>,
    },
    /// Being detached: the target traps until every drop has finished.
    Detaching {
        handles: Vec<JoinHandle<()>>,
        opened: Instant,
        calls_at_open: u64,
        stime_at_open: Option<f64>,
    },
    /// Detached until `until`.
    Gap { since: Instant, until: Instant },
    /// Never attached, or finished.
    Idle,
}

/// One entry point and how it is traced.
struct Point {
    probe: ProbePoint,
    /// Attached for good (cold operation) since then.
    resident: Option<Instant>,
}

/// The allocator probes of one session.
pub struct AllocTracer {
    pub allocator: Allocator,
    pub settings: AllocSettings,
    points: Vec<Point>,
    pid: u32,
    cycle: DutyCycle,
    state: State,
    resident_links: Vec<UProbeLink>,
    /// Calls per operation when the first window closed (to find cold ones).
    first_window: bool,
    generation: u64,
    /// Threads dropping links that nothing waits for yet.
    detaching: Vec<JoinHandle<()>>,
    /// Windows opened so far.
    pub windows: u64,
    /// The cost model of one traced call (a floor for measurements).
    model_cost_s: f64,
}

impl AllocTracer {
    pub fn new(allocator: Allocator, settings: AllocSettings, pid: u32) -> Self {
        let (mut probes, emulated) = probe_points(&allocator);
        // For experiments and benchmarks: probe only the named operations.
        if let Ok(only) = std::env::var("MEMPROF_ALLOC_OPS") {
            probes.retain(|p| {
                only.split(',')
                    .any(|name| memprof_common::alloc_op::SYMBOLS[p.op as usize] == name)
            });
        }
        let trap_cost_s = TRAP_COST_S + if emulated { 0.0 } else { SINGLE_STEP_COST_S };
        tracing::info!(
            "allocator {} at {}: {} entry points; trap cost model {:.1} µs per call",
            allocator.label(),
            allocator.path,
            probes.len(),
            trap_cost_s * 1e6
        );
        let cycle = DutyCycle::new(BudgetConfig {
            budget: settings.budget * AIM_AT_SHARE_OF_BUDGET,
            trap_cost_s,
            window: WINDOW,
            max_gap: MAX_GAP,
            ..Default::default()
        });
        Self {
            allocator,
            settings,
            points: probes
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
            first_window: true,
            generation: 0,
            detaching: Vec::new(),
            windows: 0,
            model_cost_s: trap_cost_s,
        }
    }

    /// The cost of one traced call in use (model, or measured if higher).
    pub fn trap_cost(&self) -> f64 {
        self.cycle.trap_cost()
    }

    /// Operations attached for good (cold ones, in sampled mode).
    pub fn resident_ops(&self) -> Vec<u32> {
        self.points
            .iter()
            .filter(|p| p.resident.is_some())
            .map(|p| p.probe.op)
            .collect()
    }

    /// Opens a window: attaches every entry point that is not resident.
    /// Returns the ktime at which tracing started.
    pub fn open(&mut self, probes: &mut Probes) -> Result<u64> {
        if let State::Gap { since, .. } = self.state {
            self.cycle.observe(0, Duration::ZERO, since.elapsed());
        }
        self.generation += 1;
        probes.set_alloc_generation(self.generation);
        let calls_at_open = probes.counters().alloc_calls;
        let floor = self.settings.mode == AllocMode::Floor;
        let windowed: Vec<ProbePoint> = self
            .points
            .iter()
            .filter(|p| p.resident.is_none())
            .map(|p| p.probe)
            .collect();
        let links = probes.attach_alloc(&self.allocator.path, &windowed, self.pid, floor)?;
        self.windows += 1;
        self.state = State::Attached {
            links,
            ops: windowed.iter().map(|p| p.op).collect(),
            opened: Instant::now(),
            calls_at_open,
            stime_at_open: system_time(self.pid),
        };
        Ok(ktime_ns())
    }

    /// When the controller must act next (None: never, e.g. full mode).
    pub fn deadline(&self) -> Option<Instant> {
        if self.settings.mode != AllocMode::Sampled {
            return None;
        }
        match &self.state {
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
        match std::mem::replace(&mut self.state, State::Idle) {
            State::Attached {
                links,
                ops,
                opened,
                calls_at_open,
                stime_at_open,
            } => {
                if self.first_window {
                    self.first_window = false;
                    self.make_cold_ops_resident(probes, opened.elapsed());
                }
                let calls = probes.counters().alloc_calls;
                let rate = calls.saturating_sub(calls_at_open) as f64
                    / opened.elapsed().as_secs_f64().max(1e-3);
                if self.cycle.duty(rate) >= 1.0 {
                    // Cheap enough to stay attached.
                    self.state = State::Attached {
                        links,
                        ops,
                        opened,
                        calls_at_open,
                        stime_at_open,
                    };
                    self.cycle.observe(
                        calls.saturating_sub(calls_at_open),
                        opened.elapsed(),
                        Duration::ZERO,
                    );
                    return Ok(None);
                }
                let links = self.without_resident(links, &ops);
                self.state = State::Detaching {
                    handles: detach(links),
                    opened,
                    calls_at_open,
                    stime_at_open,
                };
                Ok(None)
            }
            State::Detaching {
                mut handles,
                opened,
                calls_at_open,
                stime_at_open,
            } => {
                if handles.iter().any(|h| !h.is_finished()) {
                    self.state = State::Detaching {
                        handles,
                        opened,
                        calls_at_open,
                        stime_at_open,
                    };
                    return Ok(None);
                }
                for h in handles.drain(..) {
                    let _ = h.join();
                }
                // The target trapped until now: all of it was traced time.
                let len = opened.elapsed();
                let traced = probes.counters().alloc_calls.saturating_sub(calls_at_open);
                if let (Some(before), Some(after)) = (stime_at_open, system_time(self.pid)) {
                    if traced >= MIN_CALLS_TO_MEASURE {
                        self.cycle.measured_trap_cost(
                            (after - before) / traced as f64,
                            self.model_cost_s,
                        );
                    }
                }
                self.cycle.observe(traced, len, Duration::ZERO);
                let gap = self.cycle.gap_after(len).max(DETACH_POLL);
                tracing::debug!(
                    "allocator window {}: attached {len:?}, {traced} calls, {:.0} calls/s, \
                     {:.2} µs per call, next gap {gap:?}",
                    self.windows,
                    self.cycle.rate().unwrap_or(0.0),
                    self.cycle.trap_cost() * 1e6
                );
                let now = Instant::now();
                self.state = State::Gap {
                    since: now,
                    until: now + gap,
                };
                Ok(Some(false))
            }
            State::Gap { .. } => {
                self.open(probes)?;
                Ok(Some(true))
            }
            State::Idle => Ok(None),
        }
    }

    /// After the first window, operations called so rarely that tracing
    /// them costs a small part of the budget stay attached for good.
    fn make_cold_ops_resident(&mut self, probes: &Probes, window: Duration) {
        let per_op = probes.op_calls();
        let now = Instant::now();
        let limit = self.settings.budget * RESIDENT_SHARE_OF_BUDGET;
        for p in &mut self.points {
            let calls = per_op.get(p.probe.op as usize).copied().unwrap_or(0);
            let rate = calls as f64 / window.as_secs_f64().max(1e-3);
            if rate * self.cycle.trap_cost() < limit {
                p.resident = Some(now);
            }
        }
    }

    /// Moves the links of resident operations out of `links` (kept
    /// attached); returns the rest.
    fn without_resident(&mut self, links: Vec<UProbeLink>, ops: &[u32]) -> Vec<UProbeLink> {
        let resident = self.resident_ops();
        let n = ops.len();
        if n == 0 {
            return links;
        }
        let mut rest = Vec::new();
        // One link per (program, operation), operations in `ops` order.
        for (i, link) in links.into_iter().enumerate() {
            if !resident.contains(&ops[i % n]) {
                rest.push(link);
            } else {
                self.resident_links.push(link);
            }
        }
        rest
    }

    /// Whether the windowed probes are attached now.
    pub fn attached(&self) -> bool {
        matches!(self.state, State::Attached { .. } | State::Detaching { .. })
    }

    /// Ends tracing: accounts for the last window or gap and starts
    /// detaching everything; [`AllocTracer::wait_detached`] waits for it
    /// (about a second and a half for glibc's 18 links: the kernel takes a
    /// grace period per link, one after the other).
    pub fn finish(&mut self, probes: &Probes) {
        let calls = probes.counters().alloc_calls;
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

    /// Waits until every probe [`AllocTracer::finish`] detached is gone.
    pub fn wait_detached(&mut self) {
        self.take_detaching().wait();
    }

    /// The detaches still running, to be waited for later.
    pub fn take_detaching(&mut self) -> Detaching {
        Detaching(std::mem::take(&mut self.detaching))
    }

    /// Fraction of the session the hot (windowed) probes were attached.
    pub fn traced_fraction(&self) -> f64 {
        match self.settings.mode {
            AllocMode::Full | AllocMode::Floor => 1.0,
            _ => self.cycle.traced_fraction(),
        }
    }

    /// Fraction of the session operation `op` was traced: 1 for resident
    /// operations (attached all the time), else that of the windows.
    pub fn op_fraction(&self, op: u32) -> f64 {
        let resident = self
            .points
            .iter()
            .any(|p| p.probe.op == op && p.resident.is_some());
        if resident {
            1.0
        } else {
            self.traced_fraction()
        }
    }
}

/// Probes being removed by the kernel (about 0.2 s each, one after the
/// other: the kernel serialises their grace periods). The process must not
/// end before they are gone, but the report need not wait for them.
#[derive(Default)]
pub struct Detaching(Vec<JoinHandle<()>>);

impl Detaching {
    /// Links still being detached.
    pub fn len(&self) -> usize {
        self.0.iter().filter(|h| !h.is_finished()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until all are gone.
    pub fn wait(self) {
        for h in self.0 {
            let _ = h.join();
        }
    }
}

/// Drops links on threads of their own: each drop blocks for a grace
/// period, and in parallel they overlap.
fn detach(links: Vec<UProbeLink>) -> Vec<JoinHandle<()>> {
    links
        .into_iter()
        .map(|link| std::thread::spawn(move || drop(link)))
        .collect()
}

/// Builds the report's allocator section.
pub fn report(
    tracer: Option<&AllocTracer>,
    profile: Option<&AllocProfile>,
    mode: AllocMode,
    lost: u64,
    kernel: &[(u32, KernelStats)],
    mut symbolize: impl FnMut(&crate::collect::procmaps::Place) -> Frame,
) -> AllocatorReport {
    let (Some(tracer), Some(profile)) = (tracer, profile) else {
        return AllocatorReport {
            mode: mode.name().into(),
            traced_fraction: 0.0,
            ..Default::default()
        };
    };
    let fraction = tracer.traced_fraction();
    let sampled = mode == AllocMode::Sampled && fraction < 0.999;
    let scale_by = |n: u64, f: f64| -> u64 {
        if sampled && f > 0.0 {
            (n as f64 / f).round() as u64
        } else {
            n
        }
    };
    // Sites are mostly malloc's calls: scale them like malloc.
    let malloc_fraction = tracer.op_fraction(memprof_common::alloc_op::MALLOC);
    let scale = |n: u64| scale_by(n, malloc_fraction);
    let ops = profile
        .splits()
        .into_iter()
        .map(|(key, stats)| {
            let h = &stats.histogram;
            OpStats {
                op: op_name(key.op).into(),
                class: key.class.name().into(),
                origin: key.origin.map(|o| o.name().into()),
                phase: key.phase.name().into(),
                count: scale_by(h.len(), tracer.op_fraction(key.op)),
                traced: h.len(),
                mean_ns: h.mean().round() as u64,
                p50_ns: h.value_at_quantile(0.5),
                p99_ns: h.value_at_quantile(0.99),
                max_ns: h.max(),
                histogram: stats
                    .log2
                    .iter()
                    .enumerate()
                    .filter(|(_, &n)| n > 0)
                    .map(|(i, &n)| (1u64 << (i + 1), n))
                    .collect(),
            }
        })
        .collect();
    let syscalls = profile
        .syscalls()
        .into_iter()
        .map(|((nr, inside, traced), s)| SyscallStats {
            name: syscall::NAMES
                .get(nr as usize)
                .copied()
                .unwrap_or("?")
                .into(),
            inside: inside.map(|op| op_name(op).into()),
            traced,
            count: s.count,
            total_ns: s.total_ns,
            bytes: s.bytes,
        })
        .collect();
    let memory = (mode == AllocMode::Full).then(|| {
        let peak = profile.memory_at_peak();
        MemoryReport {
            requested_peak: profile.requested_peak(),
            requested_at_peak: peak.requested,
            usable_peak: peak.usable,
            internal_fragmentation: peak.internal_fragmentation(),
            blowup: peak.blowup,
            external_fragmentation: peak.external_fragmentation(),
            mapped_peak: peak.mapped,
            requested_end: profile.memory_now().requested,
            usable_known: profile.usable_known(),
        }
    });
    AllocatorReport {
        library: Some(tracer.allocator.label()),
        path: Some(tracer.allocator.path.to_string()),
        mode: mode.name().into(),
        traced_fraction: fraction,
        sampled,
        large_rule: profile.rule().describe(),
        calls_traced: profile.calls(),
        lost,
        ops,
        syscalls,
        memory,
        sites: sites(profile, &scale, &mut symbolize),
        always_traced: if sampled {
            tracer
                .resident_ops()
                .into_iter()
                .map(|op| op_name(op).into())
                .collect()
        } else {
            Vec::new()
        },
        kernel: kernel
            .iter()
            .map(|(tid, k)| KernelThreadEntry {
                tid: *tid,
                page_faults: k.page_faults,
                page_faults_in_allocator: k.page_faults_in_alloc,
                mmap_lock_waits: k.mmap_lock_waits,
                mmap_lock_wait_ns: k.mmap_lock_wait_ns,
            })
            .collect(),
    }
}

/// Sites kept per ranking.
const SITES_PER_RANKING: usize = 10;

/// The top sites by bytes, by count and by live bytes, each once.
fn sites(
    profile: &AllocProfile,
    scale: &impl Fn(u64) -> u64,
    symbolize: &mut impl FnMut(&crate::collect::procmaps::Place) -> Frame,
) -> Vec<SiteEntry> {
    let all: Vec<_> = profile.sites().collect();
    let mut chosen: Vec<usize> = Vec::new();
    let rankings: [&dyn Fn(&crate::analysis::alloc::SiteStats) -> u64; 3] =
        [&|s| s.bytes, &|s| s.count, &|s| s.live_bytes];
    for key in rankings {
        let mut order: Vec<usize> = (0..all.len()).filter(|&i| key(all[i].1) > 0).collect();
        order.sort_by(|&a, &b| key(all[b].1).cmp(&key(all[a].1)));
        for i in order.into_iter().take(SITES_PER_RANKING) {
            if !chosen.contains(&i) {
                chosen.push(i);
            }
        }
    }
    chosen
        .into_iter()
        .map(|i| {
            let (place, s) = &all[i];
            let frame = symbolize(place);
            SiteEntry {
                function: frame.function,
                file: frame.file,
                line: frame.line,
                module: frame.module,
                count: scale(s.count),
                bytes: scale(s.bytes),
                live_bytes: s.live_bytes,
                live_blocks: s.live_blocks,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_time_of_this_process_is_readable() {
        let t = system_time(std::process::id()).unwrap();
        assert!(t >= 0.0);
        assert_eq!(system_time(0), None);
    }

    #[test]
    fn large_rules_follow_the_allocator_unless_overridden() {
        assert_eq!(
            large_rule(AllocatorKind::Glibc, None),
            LargeRule::GlibcChunk
        );
        assert_eq!(
            large_rule(AllocatorKind::Glibc, Some(4096)),
            LargeRule::Above(4096)
        );
        assert_eq!(
            large_rule(AllocatorKind::Tcmalloc, None),
            LargeRule::Above(256 << 10)
        );
    }

    /// glibc's free starts with `test %rdi,%rdi; je <ret>`: its probe goes
    /// to the first push; malloc starts with one.
    #[test]
    fn glibc_probe_points_skip_the_free_null_check() {
        let allocator = super::super::allocator::find(std::process::id())
            .unwrap()
            .expect("this test binary uses glibc");
        let (points, malloc_emulated) = probe_points(&allocator);
        assert!(malloc_emulated);
        let free = allocator.entry("free").unwrap();
        let point = points
            .iter()
            .find(|p| p.op == memprof_common::alloc_op::FREE)
            .unwrap();
        assert!(point.file_offset >= free.file_offset);
        assert!(point.file_offset < free.file_offset + 32);
        assert_eq!(points.len(), allocator.entries.len());
    }
}
