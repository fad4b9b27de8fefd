//! The timing helper's side of [`super::untraced`]: our own binary,
//! started with [`LOOP_ENV`] set, times the allocator it was given in a
//! loop and prints a line per run, until the tool is gone.
//!
//! Each run, on the CPU of the target's busiest thread
//! ([`super::follow`]): malloc(64)-free pairs in rounds of [`PAIRS`],
//! half of them alone and half beside a kept block of their size, then
//! `malloc`, `free` and `calloc` in rounds of [`ROUND`]; then the
//! clock's own cost. Why each is timed so is in [`super::untraced`].

use std::{
    hint::black_box,
    time::{Duration, Instant},
};

use super::{
    follow,
    untraced::{LOOP_ENV, SIZE},
};

/// Calls per timed round of each operation (glibc's tcache holds 7
/// blocks of a size). The pointers go through `black_box`: the compiler
/// knows `malloc` and `free`, and removes a pair whose block is not used.
const ROUND: usize = 6;
/// Malloc-free pairs per timed round: enough that the clock's reads are
/// a small part of a round.
const PAIRS: usize = 60;
/// Fewest rounds of pairs in each half of a run: few, as a round of a
/// slow allocator's pairs is long (240 us at 4 us a pair); a fast one's
/// fill the time with hundreds.
const MIN_PAIR_ROUNDS: usize = 5;
/// How long a run of the helper times rounds, and at most how many.
const RUN_TIME: Duration = Duration::from_millis(1);
/// Between runs: the helper takes 1.5% of one CPU (with the warm-up). Many
/// short runs follow the pace the target meets better than a few long
/// ones: it flips between two speeds 2x apart every few hundred ms on
/// these VMs, idle or not, and five runs of a 2 s session fell all in
/// one of them now and then (the count then off by 40%, its claim 30%).
const INTERVAL: Duration = Duration::from_millis(100);
const MAX_ROUNDS: usize = 200_000;
/// Rounds not recorded at first: they warm the caches, the allocator's
/// own, and the vCPU (the first milliseconds ran at half speed here).
const WARM_UP: Duration = Duration::from_millis(5);
/// The same at each later run, after the helper slept.
const RUN_WARM_UP: Duration = Duration::from_micros(500);
/// The helper: times the calls for [`RUN_TIME`], prints a line, sleeps
/// [`INTERVAL`], again, until its parent is gone or stops reading.
/// Called by `main` when [`LOOP_ENV`] is set; never returns.
pub fn run_loop() -> ! {
    use std::io::Write;
    // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number: no memory
    // is passed; the helper is killed when the tool dies.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    let parent = std::os::unix::process::parent_id();
    // The allocator timed must be the one asked for: a preload the
    // loader refused (a path only the target's mount namespace has, a
    // secure-mode binary) would leave glibc's malloc in place, silently.
    if let Ok(expected) = std::env::var(LOOP_ENV) {
        if let Some(why) = wrong_malloc(&expected) {
            println!("error: {why}");
            std::process::exit(0);
        }
    }
    // Nothing more on stderr (an allocator told to print statistics
    // would fill the pipe, which is read only at the end).
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 of two open descriptors; fd 2 is replaced.
        unsafe { libc::dup2(null.as_raw_fd(), 2) };
    }
    // Preallocated: the loop itself allocates nothing.
    let mut runs = Rounds::with_capacity(MAX_ROUNDS);
    let mut first = true;
    let mut target = std::env::var(follow::FOLLOW_ENV)
        .ok()
        .and_then(|p| p.parse().ok())
        .map(follow::Follower::new);
    loop {
        if let Some(cpu) = target.as_mut().and_then(follow::Follower::cpu) {
            follow::pin(cpu);
        }
        runs.clear();
        runs.time(if first { WARM_UP } else { RUN_WARM_UP });
        first = false;
        let line = runs.line();
        let mut out = std::io::stdout().lock();
        if writeln!(out, "{line}").and_then(|_| out.flush()).is_err()
            || std::os::unix::process::parent_id() != parent
        {
            std::process::exit(0);
        }
        drop(out);
        std::thread::sleep(INTERVAL);
    }
}

/// The times of a run's rounds, in ns: of [`ROUND`] calls of each
/// operation, and of [`PAIRS`] pairs, alone and beside a kept block.
struct Rounds {
    malloc: Vec<f64>,
    free: Vec<f64>,
    calloc: Vec<f64>,
    pair: Vec<f64>,
    kept: Vec<f64>,
    /// What reading the clock twice cost in this run (taken off each
    /// round).
    timer: f64,
}

impl Rounds {
    fn with_capacity(n: usize) -> Self {
        Self {
            malloc: Vec::with_capacity(n),
            free: Vec::with_capacity(n),
            calloc: Vec::with_capacity(n),
            pair: Vec::with_capacity(n),
            kept: Vec::with_capacity(n),
            timer: 0.0,
        }
    }

    fn clear(&mut self) {
        self.malloc.clear();
        self.free.clear();
        self.calloc.clear();
        self.pair.clear();
        self.kept.clear();
    }

    /// Times pairs for half of [`RUN_TIME`] after `warm_up` (unrecorded):
    /// alone, then beside a block of their size; then the calls for the
    /// other half (at least 100 rounds),
    /// then the clock's own cost: at this run's pace, which is not the
    /// last run's (a clock read costs as much as a round of calls; taken
    /// once at start, a slow start made every later call look nearly
    /// free).
    fn time(&mut self, warm_up: Duration) {
        let half = RUN_TIME / 2;
        let start = Instant::now();
        let warm = start + warm_up;
        while Instant::now() < warm {
            time_pairs();
        }
        time_for(&mut self.pair, half / 2);
        // SAFETY: malloc of a small size, freed after the rounds.
        let kept = black_box(unsafe { libc::malloc(black_box(SIZE)) });
        time_for(&mut self.kept, half / 2);
        // SAFETY: the block from malloc above, freed once.
        unsafe { libc::free(kept) };
        let until = Instant::now() + half;
        let mut blocks = [std::ptr::null_mut::<libc::c_void>(); ROUND];
        while self.malloc.len() < MAX_ROUNDS && (self.malloc.len() < 100 || Instant::now() < until)
        {
            let t0 = Instant::now();
            for b in blocks.iter_mut() {
                // SAFETY: malloc of a small size; the block is freed below.
                *b = black_box(unsafe { libc::malloc(black_box(SIZE)) });
            }
            let t1 = Instant::now();
            for b in blocks.iter() {
                // SAFETY: each block came from malloc above, freed once.
                unsafe { libc::free(black_box(*b)) };
            }
            let t2 = Instant::now();
            for b in blocks.iter_mut() {
                // SAFETY: calloc of a small size; the block is freed below.
                *b = black_box(unsafe { libc::calloc(1, black_box(SIZE)) });
            }
            let t3 = Instant::now();
            for b in blocks.iter() {
                // SAFETY: each block came from calloc above, freed once.
                unsafe { libc::free(black_box(*b)) };
            }
            self.malloc.push(ns(t1 - t0));
            self.free.push(ns(t2 - t1));
            self.calloc.push(ns(t3 - t2));
        }
        self.timer = timer_overhead();
    }

    /// `malloc_ns free_ns calloc_ns pair_ns rounds heap_spread`: the
    /// calls scaled to the pairs' level, split as the short rounds split
    /// them.
    fn line(&mut self) -> String {
        let n = self.malloc.len() + self.pair.len() + self.kept.len();
        let timer = self.timer;
        let per_call = |v: &mut [f64], calls: usize| (typical(v) - timer).max(0.0) / calls as f64;
        let (alone, kept) = (
            per_call(&mut self.pair, PAIRS),
            per_call(&mut self.kept, PAIRS),
        );
        let pair = (alone + kept) / 2.0;
        let spread = match pair > 0.0 {
            true => (alone - kept) / (alone + kept),
            false => 0.0,
        };
        let [malloc, free, calloc] =
            [&mut self.malloc, &mut self.free, &mut self.calloc].map(|v| per_call(v, ROUND));
        let (malloc, free, calloc) = split(pair, malloc, free, calloc);
        format!("{malloc:.1} {free:.1} {calloc:.1} {pair:.1} {n} {spread:.3}")
    }
}

/// Times rounds of pairs into `rounds` for `time` (at least
/// [`MIN_PAIR_ROUNDS`]).
fn time_for(rounds: &mut Vec<f64>, time: Duration) {
    let until = Instant::now() + time;
    while rounds.len() < MAX_ROUNDS && (rounds.len() < MIN_PAIR_ROUNDS || Instant::now() < until) {
        rounds.push(time_pairs());
    }
}

/// One round of [`PAIRS`] malloc-free pairs, in ns.
fn time_pairs() -> f64 {
    let t0 = Instant::now();
    for _ in 0..PAIRS {
        // SAFETY: a small block, freed at once.
        unsafe { libc::free(black_box(libc::malloc(black_box(SIZE)))) };
    }
    ns(Instant::now() - t0)
}

fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

/// Malloc's, free's and calloc's costs from the short rounds' `malloc`,
/// `free` and `calloc`, scaled so that malloc and free make `pair`; an
/// even split when the short rounds timed nothing.
fn split(pair: f64, malloc: f64, free: f64, calloc: f64) -> (f64, f64, f64) {
    match malloc + free > 0.0 {
        true => {
            let scale = pair / (malloc + free);
            (malloc * scale, free * scale, calloc * scale)
        }
        false => (pair / 2.0, pair / 2.0, calloc.max(pair / 2.0)),
    }
}

/// Why the `malloc` this process calls is not `expected`'s (a path, or
/// "1" for glibc: nothing to check), or None when it is.
fn wrong_malloc(expected: &str) -> Option<String> {
    if !expected.starts_with('/') {
        return None;
    }
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    let malloc: unsafe extern "C" fn(usize) -> *mut libc::c_void = libc::malloc;
    // SAFETY: dladdr reads the address and fills `info`, whose strings
    // point into the loader's own memory (read at once below).
    let found = unsafe { libc::dladdr(malloc as *const libc::c_void, info.as_mut_ptr()) };
    // SAFETY: zeroed, then filled by dladdr when it returned non-zero.
    let info = unsafe { info.assume_init() };
    if found == 0 || info.dli_fname.is_null() {
        return Some("cannot tell which object defines malloc".into());
    }
    // SAFETY: a NUL-terminated string of the loader's.
    let file = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) }.to_string_lossy();
    let real = |p: &str| std::fs::canonicalize(p).unwrap_or_else(|_| p.into());
    (real(&file) != real(expected))
        .then(|| format!("malloc is {file}'s, not {expected}'s: the preload was refused"))
}

/// What reading the clock twice costs, in ns (taken off each round).
fn timer_overhead() -> f64 {
    let mut d: Vec<f64> = (0..1000)
        .map(|_| {
            let t = Instant::now();
            (Instant::now() - t).as_nanos() as f64
        })
        .collect();
    median(&mut d)
}

/// Rounds more than this many times the median were interrupted: the
/// helper shares the target's CPU, which takes it back for a slice of
/// 1-3 ms, against 30-600 us for a round of a slow allocator's pairs.
const INTERRUPTED: f64 = 3.0;

/// The mean of the fastest 90% of the rounds not [`INTERRUPTED`]: the
/// clock's ticks are coarser than a call, so a median would round to
/// them; the slowest rounds were interrupted. A slow allocator's run
/// has 5-10 rounds of pairs, of which the fastest 90% are all: one
/// round that waited for the target's slice made a run of a 200 ns shim
/// 1.6x its level, and a CI run's median 64% high (stop 54).
fn typical(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let cap = v[v.len() / 2] * INTERRUPTED;
    let whole = v.partition_point(|&r| r <= cap);
    let kept = &v[..(whole * 9).div_ceil(10)];
    kept.iter().sum::<f64>() / kept.len() as f64
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calls_take_the_pairs_level() {
        // Short rounds of 2 + 3 ns for pairs of 10 ns: the split kept,
        // calloc scaled alike.
        assert_eq!(split(10.0, 2.0, 3.0, 4.0), (4.0, 6.0, 8.0));
        // Short rounds that timed nothing (the clock's cost took it all).
        assert_eq!(split(10.0, 0.0, 0.0, 0.0), (5.0, 5.0, 5.0));
    }

    #[test]
    fn an_interrupted_round_is_left_out() {
        // Nine rounds of 29 us of pairs, one of which waited 1.5 ms.
        let mut rounds = vec![29_000.0; 8];
        rounds.push(1_529_000.0);
        assert_eq!(typical(&mut rounds), 29_000.0);
        // Twenty rounds: the slowest 10% go, as before.
        let mut rounds: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(typical(&mut rounds), 9.5);
        assert_eq!(typical(&mut []), 0.0);
    }
}
