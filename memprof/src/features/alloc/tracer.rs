//! Tracing the allocator: which entry points to probe and where. The
//! probes are attached in windows by [`Windowed`] (`kernel::windows`),
//! shared with the lock probes.

use iced_x86::Register;
use std::time::Duration;

use super::allocator::{Allocator, AllocatorKind};
pub use crate::kernel::windows::{ktime_ns, Detaching};
use crate::{
    cli::AllocMode,
    features::alloc::analysis::{LargeRule, ProbeCost, ProbeKind},
    options::AllocSettings,
};
use crate::{
    kernel::{
        uprobes::{Family, ProbePoint},
        windows::{Mode, WindowSettings, Windowed, CALIBRATED_COST_ERROR},
    },
    object::x86::prologue,
};
use memprof_common::alloc_op;

/// Cost of one traced call whose probes the kernel emulates: entry trap
/// plus return trap: the model's starting point, raised when a window
/// measures more system time per call.
const TRAP_COST_S: f64 = 2.5e-6;
/// Extra cost when the probed instruction must be single-stepped (a
/// second trap).
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

/// The cost of one traced call for the budget: the calibrated cost of
/// malloc's probe kind when there is one, else the model's.
pub fn calibrated_trap_cost(cost: &ProbeCost, emulated: &[bool]) -> Option<f64> {
    let malloc_emulated = emulated
        .get(alloc_op::MALLOC as usize)
        .copied()
        .unwrap_or(true);
    let kind = cost.kind(ProbeKind::of(malloc_emulated, false))?;
    // Entry and return traps are both in the calibrated wall time.
    (kind.cpu_ns > 0).then_some(kind.cpu_ns as f64 * 1e-9)
}

/// The registers the entry probe of `op` reads (`mp_alloc_enter`): the
/// stack pointer, the arguments it takes the size and block from, and,
/// for what allocates, the frame pointer its walk past wrappers starts
/// from (frees walk nothing).
fn registers_read(op: u32) -> &'static [Register] {
    use Register::{RBP, RDI, RDX, RSI, RSP};
    match op {
        op if alloc_op::is_free(op) => &[RSP, RDI],
        alloc_op::CALLOC => &[RSP, RBP, RDI, RSI],
        op if alloc_op::is_resize(op) => &[RSP, RBP, RDI, RSI],
        alloc_op::REALLOCARRAY => &[RSP, RBP, RDI, RSI, RDX],
        alloc_op::POSIX_MEMALIGN => &[RSP, RBP, RDI, RDX],
        alloc_op::ALIGNED_ALLOC | alloc_op::MEMALIGN => &[RSP, RBP, RSI],
        _ => &[RSP, RBP, RDI],
    }
}

/// Where to probe each entry point of `allocator`, and whether the kernel
/// emulates the probed instruction, by operation code (true for those not
/// probed).
pub fn probe_points(allocator: &Allocator) -> (Vec<ProbePoint>, Vec<bool>) {
    let mut emulated_by_op = vec![true; alloc_op::COUNT as usize];
    let points = allocator
        .entries
        .iter()
        .filter_map(|entry| {
            let op = entry
                .names
                .iter()
                .find_map(|name| alloc_op::of_symbol(name))? as usize;
            // Enough for early-exit branches to be followed to their `ret`.
            let code = prologue::read_code(&allocator.path, entry.file_offset).unwrap_or_default();
            let (offset, emulated) = prologue::probe_site(&code, registers_read(op as u32));
            emulated_by_op[op] = emulated;
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
    (points, emulated_by_op)
}

/// How long the probes stay attached per window. Detaching adds about
/// 75 ms of tracing (two `uprobe_multi` links, a grace period each, partly
/// overlapping). Shorter windows buy more of them under the budget, but
/// their rates spread more, and the claimed error follows the spread: with
/// 50 ms windows a moderate load attached for 15 s got 16 windows and
/// ±32% (unknown counts), with 100 ms ±16-19%.
const WINDOW: Duration = Duration::from_millis(100);
/// The share of the budget aimed at. Measured (`cargo xtask bench --only
/// allocator`, 5% budget): aiming at 80% of it, a 30 s malloc loop ran
/// 1.079x and the moderate load 1.046x; at 50%, 1.011x and 1.028-1.030x
/// (the probes slow a loop this hot far more than the calibrated per-call
/// cost says, and the session's fixed costs, its tracepoints and CPU
/// sampler, take about a point: 1.2% on the moderate load with the
/// allocator off). At 40%, with gaps that prepay the next window (see
/// `kernel::budget`): 3 s loop 1.023x, 30 s loop 1.047x, moderate 1.026x.
const AIM_AT_SHARE_OF_BUDGET: f64 = 0.4;
/// The first window: a hot allocator traps on every call while its rate
/// is not yet known, so this one is short.
const FIRST_WINDOW: Duration = Duration::from_millis(20);
/// Longest gap between windows. A window of a hot allocator costs about
/// 0.13 s of tracing (window + detach) at a slowdown of several times, so
/// keeping a 5% budget needs gaps of a few seconds, up to 10 s for the
/// hottest loops; a shorter cap would break the budget.
const MAX_GAP: Duration = Duration::from_secs(10);

/// The allocator probes of one session: the allocator, and its entry
/// points attached in windows (the code shared with the lock probes).
pub struct AllocTracer {
    pub allocator: Allocator,
    pub settings: AllocSettings,
    windowed: Windowed,
}

impl std::ops::Deref for AllocTracer {
    type Target = Windowed;
    fn deref(&self) -> &Windowed {
        &self.windowed
    }
}

impl std::ops::DerefMut for AllocTracer {
    fn deref_mut(&mut self) -> &mut Windowed {
        &mut self.windowed
    }
}

impl AllocTracer {
    /// `calibrated_trap_s`: what a traced call costs, as measured at start
    /// (else the model's figure).
    pub fn new(
        allocator: Allocator,
        settings: AllocSettings,
        pid: u32,
        calibrated_trap_s: Option<f64>,
    ) -> Self {
        let (mut probes, emulated_by_op) = probe_points(&allocator);
        let emulated = emulated_by_op[alloc_op::MALLOC as usize];
        // For experiments and benchmarks: probe only the named operations.
        if let Some(only) = settings.only_ops {
            probes.retain(|p| only & (1 << p.op) != 0);
        }
        let trap_cost_s = calibrated_trap_s
            .unwrap_or(TRAP_COST_S + if emulated { 0.0 } else { SINGLE_STEP_COST_S });
        tracing::info!(
            "allocator {} at {}: {} entry points; trap cost {:.2} µs per call",
            allocator.label(),
            allocator.path,
            probes.len(),
            trap_cost_s * 1e6
        );
        let mode = match settings.mode {
            AllocMode::Full | AllocMode::Off => Mode::Full,
            AllocMode::Sampled => Mode::Sampled,
            AllocMode::Floor => Mode::Floor,
        };
        let mut windowed = Windowed::new(
            Family::Alloc,
            allocator.path.clone(),
            probes,
            WindowSettings {
                mode,
                budget: settings.budget,
                aim: AIM_AT_SHARE_OF_BUDGET,
                trap_cost_s,
                trap_cost_error: if calibrated_trap_s.is_some() {
                    CALIBRATED_COST_ERROR
                } else {
                    1.0
                },
                // The floor was measured on lock workloads.
                floor_holds_slowdown: false,
                window: WINDOW,
                first_window: FIRST_WINDOW,
                max_gap: MAX_GAP,
            },
            pid,
        );
        if mode == Mode::Sampled {
            windowed.trace_serial_start_up();
        }
        Self {
            allocator,
            settings,
            windowed,
        }
    }
}

/// The kernel's table of each process's allocator code, where CPU samples
/// also send their stack ([`super::cpu_sites`]): written once the
/// allocator is in the process's memory map.
pub struct AllocText {
    map: aya::maps::HashMap<aya::maps::MapData, u32, memprof_common::TextRange>,
    written: crate::features::FastSet<u32>,
    /// The allocator file's inode (0: unknown), once looked up.
    inode: Option<u64>,
}

impl AllocText {
    pub fn take(probes: &mut crate::kernel::loader::Probes) -> anyhow::Result<Self> {
        let map = probes.take_map(memprof_common::maps::ALLOC_TEXT)?;
        Ok(Self {
            map: aya::maps::HashMap::try_from(map)?,
            written: Default::default(),
            inode: None,
        })
    }

    /// Writes the range of `allocator`'s executable mappings in `process`
    /// if not done yet and they are mapped.
    pub fn update(&mut self, process: &crate::process::state::Process, allocator: &str) {
        use crate::process::maps::short_name;
        let pid = process.pid();
        if self.written.contains(&pid) || process.awaiting_exec() {
            return;
        }
        // By name or by inode: the allocator's path may be a symbolic
        // link (`libtcmalloc_minimal.so.4`) to the file mapped.
        let name = short_name(allocator);
        let inode = *self.inode.get_or_insert_with(|| {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(allocator).map_or(0, |m| m.ino())
        });
        let code = process.maps().mappings().iter().filter(|m| {
            m.executable
                && m.is_file()
                && (short_name(&m.name) == name || (inode != 0 && m.inode == inode))
        });
        let (start, end) = code.fold((u64::MAX, 0), |(s, e), m| (s.min(m.start), e.max(m.end)));
        if start >= end {
            return; // not mapped yet
        }
        let range = memprof_common::TextRange { start, end };
        if let Err(e) = self.map.insert(pid, range, 0) {
            tracing::debug!("allocator code range of {pid} not written: {e}");
        }
        self.written.insert(pid);
    }

    /// Forgets the range of process `pid`, which ran `exec` (the thread
    /// that calls it becomes its leader: `pid` is its tid): the next
    /// [`Self::update`] writes that of the new image.
    pub fn forget(&mut self, pid: u32) {
        if self.written.remove(&pid) {
            if let Err(e) = self.map.remove(&pid) {
                tracing::debug!("allocator code range of {pid} not removed: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let (points, emulated) = probe_points(&allocator);
        assert!(emulated[memprof_common::alloc_op::MALLOC as usize]);
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
