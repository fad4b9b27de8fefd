//! Measures, at start, what the allocator probes add to a traced call on
//! this machine (see `analysis::probe_cost` for why and how it is used).
//!
//! Four functions of our own, whose bodies cost a nanosecond, start with
//! the two kinds of instruction the allocator's probes sit on: a `push`
//! (the kernel emulates it) and a `mov` (single-stepped out of line, a
//! second trap). The allocator's entry and return programs are attached to
//! them — as an allocating operation and as a free, which read different
//! things — for our own process only, and each is called a thousand
//! times: the durations the return program records are the probes' added
//! latency, and the wall time of the calls with and without the probes is
//! what a traced call costs the program. The traced calls are made in
//! four rounds 25 ms apart: a VM's vCPU runs the probes slower in
//! stretches of 50–100 ms, and the calibration is the quiet calls (see
//! `ProbeCost::from_samples`). About 125 ms in all; the links are dropped
//! on a thread of their own.

use std::{arch::global_asm, hint::black_box, time::Instant};

use anyhow::{Context, Result};
use memprof_common::{alloc_op, record_kind, AllocEvent, EVENT_ALLOC, EVENT_ALLOC_STACK};

use super::analysis::{Calibration, ProbeCost, ProbeKind};
use crate::{
    kernel::{
        loader::Probes,
        rings::{drain, Ring},
        uprobes::{Family, ProbePoint},
    },
    process::maps::ProcMaps,
};

/// Calls per kind.
const CALLS: usize = 1000;
/// Rounds the traced calls are made in, and the pause between them.
const ROUNDS: usize = 4;
const ROUND_GAP: std::time::Duration = std::time::Duration::from_millis(25);

// The calibration functions: each returns its argument (a heap block, so
// that the return program reads a real chunk header, as for malloc). The
// first instruction decides how the kernel handles the probe on it. The
// body does what an allocator's fast path does in a few nanoseconds —
// nested calls and returns, loads from a few cache lines of the block —
// because that is what the traps slow down besides themselves: on return
// from the kernel the return-stack buffer is refilled and branch history
// is gone (AMD's Safe RET here), and a body of plain `mov`s saw none of it
// (slowalloc's 1 us free was then reported 17% high, its 3 us malloc 6%).
global_asm!(
    ".pushsection .text.memprof_calibration,\"ax\",@progbits",
    ".p2align 4",
    ".globl memprof_calib_emulated_alloc",
    "memprof_calib_emulated_alloc:",
    "push rbp",
    "call 5f",
    "pop rbp",
    "ret",
    ".p2align 4",
    ".globl memprof_calib_emulated_free",
    "memprof_calib_emulated_free:",
    "push rbx",
    "call 5f",
    "pop rbx",
    "ret",
    ".p2align 4",
    ".globl memprof_calib_stepped_alloc",
    "memprof_calib_stepped_alloc:",
    "mov rax, rdi",
    "call 5f",
    "ret",
    ".p2align 4",
    ".globl memprof_calib_stepped_free",
    "memprof_calib_stepped_free:",
    "mov rax, rdi",
    "nop",
    "call 5f",
    "ret",
    // The body: two leaf calls, each loading four lines; returns rdi.
    ".p2align 4",
    "5:",
    "call 6f",
    "call 6f",
    "mov rax, rdi",
    "ret",
    ".p2align 4",
    "6:",
    "mov rcx, [rdi]",
    "add rcx, [rdi + 64]",
    "add rcx, [rdi + 128]",
    "add rcx, [rdi + 192]",
    "ret",
    ".popsection",
);

unsafe extern "C" {
    fn memprof_calib_emulated_alloc(p: *mut u8) -> *mut u8;
    fn memprof_calib_emulated_free(p: *mut u8) -> *mut u8;
    fn memprof_calib_stepped_alloc(p: *mut u8) -> *mut u8;
    fn memprof_calib_stepped_free(p: *mut u8) -> *mut u8;
}

type CalibFn = unsafe extern "C" fn(*mut u8) -> *mut u8;

/// Each kind's function and the operation its probe is attached as (the
/// attach cookie; the events say which function ran).
const FUNCTIONS: [(ProbeKind, u32, CalibFn); 4] = [
    (
        ProbeKind::EmulatedAlloc,
        alloc_op::MALLOC,
        memprof_calib_emulated_alloc,
    ),
    (
        ProbeKind::EmulatedFree,
        alloc_op::FREE,
        memprof_calib_emulated_free,
    ),
    (
        ProbeKind::SteppedAlloc,
        alloc_op::CALLOC,
        memprof_calib_stepped_alloc,
    ),
    (
        ProbeKind::SteppedFree,
        alloc_op::DELETE,
        memprof_calib_stepped_free,
    ),
];

/// Runs the calibration. Records of the target found in `ring` meanwhile
/// (its syscalls) are kept in `held`, in order, for the collector. Returns
/// the cost and the calibration's links, for the caller to detach once it
/// may block (a grace period per link: not on the way in).
pub fn run(
    probes: &mut Probes,
    ring: &mut Ring,
    held: &mut Vec<Vec<u8>>,
) -> Result<(ProbeCost, Links)> {
    let started = Instant::now();
    let (path, points) = probe_points()?;
    // SAFETY: calloc has no preconditions; the block is freed below.
    let block = unsafe { libc::calloc(1, 256) }.cast::<u8>();
    anyhow::ensure!(!block.is_null(), "no memory for the calibration block");
    let plain: Vec<f64> = FUNCTIONS
        .iter()
        .map(|f| ns_per_call(f.2, block, CALLS))
        .collect();
    let links = probes.attach_points(Family::Alloc, &path, &points, std::process::id(), false);
    let traced = if links.is_ok() {
        traced_rounds(block)
    } else {
        Vec::new()
    };
    // SAFETY: `block` came from malloc above and is not used again.
    unsafe { libc::free(block.cast()) };
    let links = links.context("attaching the calibration probes")?;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let mut durations: Vec<Vec<(u64, u32)>> = vec![Vec::new(); FUNCTIONS.len()];
    drain(ring, |b| {
        // A sampled call of ours comes with its stack.
        let ours = matches!(record_kind(b), Some(EVENT_ALLOC | EVENT_ALLOC_STACK))
            .then(|| AllocEvent::from_bytes(b))
            .flatten()
            .filter(|ev| ev.tid == tid)
            .and_then(|ev| {
                let i = FUNCTIONS.iter().position(|f| f.1 == ev.op)?;
                Some((i, (ev.duration_ns, ev.pace_ns)))
            });
        match ours {
            Some((i, call)) => durations[i].push(call),
            None => held.push(b.to_vec()),
        }
    });
    let samples: Vec<Calibration> = FUNCTIONS
        .iter()
        .zip(durations)
        .enumerate()
        .map(|(i, (f, mut calls))| {
            // The body's own time is not the probes': taken off.
            let body = plain[i].round() as u64;
            calls
                .iter_mut()
                .for_each(|(d, _)| *d = d.saturating_sub(body));
            Calibration {
                kind: f.0,
                calls,
                cpu_ns: (traced[i] - plain[i]).max(0.0).round() as u64,
            }
        })
        .collect();
    let cost = ProbeCost::from_samples(&samples);
    tracing::info!("allocator probes calibrated in {:?}", started.elapsed());
    log(&cost);
    Ok((cost, links))
}

/// Where the calibration functions are, as probe points in our own
/// executable.
fn probe_points() -> Result<(std::sync::Arc<str>, Vec<ProbePoint>)> {
    let maps = ProcMaps::read(std::process::id()).context("reading our own mappings")?;
    let mut points = Vec::new();
    let mut path = None;
    for (_, op, f) in FUNCTIONS {
        let addr = f as usize as u64;
        let m = maps
            .find(addr)
            .filter(|m| m.is_file())
            .context("the calibration code is not in a mapped file")?;
        path.get_or_insert_with(|| m.name.clone());
        points.push(ProbePoint {
            op,
            file_offset: addr - m.start + m.offset,
        });
    }
    Ok((path.context("no calibration function")?, points))
}

/// Logs each kind's calibration.
fn log(cost: &ProbeCost) {
    for kind in ProbeKind::ALL {
        if let Some(k) = cost.kind(kind) {
            tracing::info!(
                "allocator probe cost ({}): +{} ns latency (spread {} ns), {} ns per call, {} calls, \
                 pace {} ns ({}-{})",
                kind.name(),
                k.added_ns,
                k.spread_ns,
                k.cpu_ns,
                k.calls,
                k.pace_ns,
                k.pace_range_ns.0,
                k.pace_range_ns.1
            );
        }
    }
}

/// Links attached for the calibration, each with its operation.
pub type Links = Vec<crate::kernel::uprobes::HotLink>;

/// Wall time per traced call of each function, over [`ROUNDS`] rounds
/// [`ROUND_GAP`] apart.
fn traced_rounds(block: *mut u8) -> Vec<f64> {
    let mut sum = vec![0.0; FUNCTIONS.len()];
    for round in 0..ROUNDS {
        if round > 0 {
            std::thread::sleep(ROUND_GAP);
        }
        for (s, f) in sum.iter_mut().zip(FUNCTIONS) {
            *s += ns_per_call(f.2, block, CALLS / ROUNDS);
        }
    }
    sum.into_iter().map(|s| s / ROUNDS as f64).collect()
}

/// Wall time per call of `f`, over `calls` calls.
fn ns_per_call(f: CalibFn, block: *mut u8, calls: usize) -> f64 {
    let start = Instant::now();
    for _ in 0..calls {
        // SAFETY: the calibration functions read the first 256 bytes of
        // their argument (a zeroed block of that size) and return it.
        black_box(unsafe { f(black_box(block)) });
    }
    start.elapsed().as_nanos() as f64 / calls as f64
}
