//! The fuzzing engine: a deterministic PRNG, byte-level mutations of real
//! seed inputs, a small corpus grown by new outputs, and the checks for
//! panics, slow inputs (hangs) and huge allocations.
//!
//! It runs on stable Rust with no instrumentation: instead of coverage, a
//! target returns a hash of what it observed (its "signature"), and inputs
//! with a signature not seen before join the corpus to be mutated further.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    collections::HashSet,
    io::Write as _,
    ops::Range,
    panic::AssertUnwindSafe,
    path::PathBuf,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
    time::{Duration, Instant},
};

// ---------------------------------------------------------------------------
// Allocation accounting.

/// A single allocation above this is a finding (unbounded allocation):
/// inputs are at most 1 MiB, and no parse of one needs this much at once.
pub const HUGE_ALLOC: usize = 256 << 20;
/// Above this the allocator refuses (returns null) instead of passing the
/// request on: the system could not satisfy it anyway.
const REFUSE_ALLOC: usize = 16 << 30;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Largest single allocation since the last reset.
static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Largest allocation above [`HUGE_ALLOC`] since the last reset, or 0.
static HUGE: AtomicUsize = AtomicUsize::new(0);

/// The system allocator, counting live bytes and flagging huge requests.
pub struct CountingAlloc;

impl CountingAlloc {
    /// Whether a request of `size` bytes may go to the system allocator.
    fn admit(size: usize) -> bool {
        LARGEST.fetch_max(size, Ordering::Relaxed);
        if size > HUGE_ALLOC {
            HUGE.fetch_max(size, Ordering::Relaxed);
            huge_alloc_message(size);
        }
        size <= REFUSE_ALLOC
    }

    fn added(size: usize) {
        let live = LIVE.fetch_add(size, Ordering::Relaxed) + size;
        PEAK.fetch_max(live, Ordering::Relaxed);
    }

    fn removed(size: usize) {
        LIVE.fetch_sub(size, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's own pointer
// and layout (or returns null, which the contract allows), so `System`'s
// guarantees carry over; the bookkeeping only touches atomics.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            Self::added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Self::admit(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc_zeroed` requires.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            Self::added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        Self::removed(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Self::admit(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`;
        // the caller guarantees `new_size` is valid for it.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            Self::removed(layout.size());
            Self::added(new_size);
        }
        p
    }
}

/// Says on stderr, without allocating, that a huge allocation was asked
/// for (if the process then aborts, this is the explanation).
fn huge_alloc_message(size: usize) {
    let mut buf = [0u8; 96];
    let prefix = b"fuzz: allocation of ";
    let suffix = b" bytes requested\n";
    let mut n = 0;
    buf[..prefix.len()].copy_from_slice(prefix);
    n += prefix.len();
    let mut digits = [0u8; 20];
    let mut d = 0;
    let mut v = size;
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in (0..d).rev() {
        buf[n] = digits[i];
        n += 1;
    }
    buf[n..n + suffix.len()].copy_from_slice(suffix);
    n += suffix.len();
    // SAFETY: writes `n` initialised bytes of `buf` to file descriptor 2;
    // a failed write is ignored.
    unsafe {
        libc::write(2, buf.as_ptr().cast(), n);
    }
}

fn reset_alloc_stats() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    LARGEST.store(0, Ordering::Relaxed);
    HUGE.store(0, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------
// Configuration.

/// Seconds per target (`MEMPROF_FUZZ_SECS`, default 2).
pub fn seconds() -> f64 {
    std::env::var("MEMPROF_FUZZ_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(2.0)
}

/// The base seed (`MEMPROF_FUZZ_SEED`, decimal or 0x-hex), else a fixed one.
pub fn base_seed() -> u64 {
    let parse = |s: &str| {
        let s = s.trim();
        match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).ok(),
            None => s.parse().ok(),
        }
    };
    std::env::var("MEMPROF_FUZZ_SEED")
        .ok()
        .and_then(|s| parse(&s))
        .unwrap_or(0x6d65_6d70_726f_6621)
}

/// An input slower than this is a hang (`MEMPROF_FUZZ_HANG_SECS`, default 2).
fn hang_limit() -> Duration {
    let secs = std::env::var("MEMPROF_FUZZ_HANG_SECS")
        .ok()
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(2.0);
    Duration::from_secs_f64(secs)
}

/// Where crashing inputs go: `target/fuzz-crashes/`.
pub fn crash_dir() -> PathBuf {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(&tmp).join("fuzz-crashes")
}

/// Writes a line to the real stderr, past libtest's output capture, so the
/// summary shows in every run.
pub fn say(line: &str) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{line}");
}

// ---------------------------------------------------------------------------
// Randomness.

/// xorshift64*: small, fast, deterministic.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that nearby seeds diverge; never 0.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// FNV-1a, for signatures and input-derived choices.
pub fn hash(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

/// Folds values into a signature.
#[derive(Debug, Default, Clone, Copy)]
pub struct Sig(pub u64);

impl Sig {
    pub fn add(&mut self, v: u64) {
        self.0 = (self.0 ^ v)
            .wrapping_mul(0x0100_0000_01b3)
            .rotate_left(23)
            .wrapping_add(0x9e37_79b9);
    }
}

// ---------------------------------------------------------------------------
// Mutation.

/// A seed input: real data, with the byte ranges worth mutating most (the
/// headers and tables a parser reads first) and an origin index the target
/// uses for its per-seed query list.
#[derive(Debug, Clone)]
pub struct Seed {
    pub data: Vec<u8>,
    pub hot: Vec<Range<usize>>,
    pub origin: usize,
}

/// Integers worth writing: boundaries, huge lengths and counts.
const INTERESTING: &[u64] = &[
    0,
    1,
    2,
    7,
    8,
    0x10,
    0x38,
    0x40,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x1000,
    0x7fff,
    0x8000,
    0xffff,
    0x1_0000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_fff0,
    0xffff_ffff,
    0x1_0000_0000,
    0x4000_0000,
    0x1000_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX - 1,
    u64::MAX,
];

const RUN_BYTES: [u8; 4] = [0x00, 0xff, 0x7f, 0x80];

/// A mutated copy of `seed`: 1 to 16 mutations (most often few), each at
/// a hot range with probability 3/4. `other` is another input to splice
/// from; `dict` holds tokens of the input's format.
pub fn mutate(rng: &mut Rng, seed: &Seed, other: &[u8], dict: &[&[u8]], max_len: usize) -> Vec<u8> {
    let mut data = seed.data.clone();
    let rounds = 1 + (rng.below(16) >> rng.below(4)).min(15);
    for _ in 0..rounds {
        mutate_once(rng, &mut data, &seed.hot, other, dict);
        data.truncate(max_len);
    }
    data
}

fn position(rng: &mut Rng, len: usize, hot: &[Range<usize>]) -> usize {
    if len == 0 {
        return 0;
    }
    if !hot.is_empty() && !rng.one_in(4) {
        let r = rng.pick(hot);
        let (start, end) = (r.start.min(len), r.end.min(len));
        if start < end {
            return start + rng.below(end - start);
        }
    }
    rng.below(len)
}

fn mutate_once(
    rng: &mut Rng,
    data: &mut Vec<u8>,
    hot: &[Range<usize>],
    other: &[u8],
    dict: &[&[u8]],
) {
    let len = data.len();
    let at = position(rng, len, hot);
    match rng.below(13) {
        // Bit flip.
        0 | 1 => {
            if let Some(b) = data.get_mut(at) {
                *b ^= 1 << rng.below(8);
            }
        }
        // Random byte.
        2 => {
            if let Some(b) = data.get_mut(at) {
                *b = rng.next() as u8;
            }
        }
        // Run of 0x00 / 0xff / 0x7f / 0x80.
        3 => {
            let byte = *rng.pick(&RUN_BYTES);
            let n = 1 + rng.below(16);
            for b in data.iter_mut().skip(at).take(n) {
                *b = byte;
            }
        }
        // Truncation (rare: it loses most of the input).
        4 => {
            if rng.one_in(4) {
                data.truncate(at);
            } else if let Some(b) = data.get_mut(at) {
                *b = b.wrapping_add(1);
            }
        }
        // Chunk duplication: copy a chunk and insert it elsewhere.
        5 => {
            if len > 0 {
                let from = rng.below(len);
                let n = (1 + rng.below(64)).min(len - from);
                let chunk = data[from..from + n].to_vec();
                let to = at.min(data.len());
                data.splice(to..to, chunk);
            }
        }
        // Splice: overwrite with a chunk of another input.
        6 => {
            if !other.is_empty() && len > 0 {
                let from = rng.below(other.len());
                let n = (1 + rng.below(64)).min(other.len() - from).min(len - at);
                data[at..at + n].copy_from_slice(&other[from..from + n]);
            }
        }
        // Interesting integer, 1, 2, 4 or 8 bytes, little or big endian.
        7..=9 => {
            let mut v = *rng.pick(INTERESTING);
            if rng.one_in(4) {
                v = v.wrapping_add(rng.below(9) as u64).wrapping_sub(4);
            }
            let width = 1 << rng.below(4);
            let bytes = if rng.one_in(8) {
                v.to_be_bytes()[8 - width..].to_vec()
            } else {
                v.to_le_bytes()[..width].to_vec()
            };
            for (i, b) in bytes.into_iter().enumerate() {
                if let Some(d) = data.get_mut(at + i) {
                    *d = b;
                }
            }
        }
        // Small arithmetic on a 32-bit little-endian value.
        10 => {
            if let Some(w) = data.get_mut(at..at + 4) {
                let v = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                let delta = rng.below(33) as u32;
                let v = if rng.one_in(2) {
                    v.wrapping_add(delta)
                } else {
                    v.wrapping_sub(delta)
                };
                w.copy_from_slice(&v.to_le_bytes());
            }
        }
        // Dictionary token, inserted or overwriting.
        11 => {
            if !dict.is_empty() {
                let token = *rng.pick(dict);
                if rng.one_in(2) {
                    let to = at.min(data.len());
                    data.splice(to..to, token.iter().copied());
                } else {
                    for (i, &b) in token.iter().enumerate() {
                        if let Some(d) = data.get_mut(at + i) {
                            *d = b;
                        }
                    }
                }
            }
        }
        // Chunk deletion.
        _ => {
            if len > 0 {
                let n = (1 + rng.below(32)).min(len - at);
                data.drain(at..at + n);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// The loop.

/// What the watchdog knows of the input being run.
struct Running {
    target: &'static str,
    seed: u64,
    iteration: u64,
    started: Instant,
    input: Arc<Vec<u8>>,
}

static RUNNING: Mutex<Option<Running>> = Mutex::new(None);
static WATCHDOG: OnceLock<()> = OnceLock::new();

/// A thread that ends the process when one input runs far past the hang
/// limit (a real infinite loop never returns to be measured), after saving
/// the input.
fn start_watchdog() {
    WATCHDOG.get_or_init(|| {
        let abort_after = (hang_limit() * 5).max(Duration::from_secs(10));
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(200));
            let guard = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = guard.as_ref() {
                if r.started.elapsed() > abort_after {
                    let path = save_crash(r.target, "hang", &r.input);
                    say(&format!(
                        "fuzz {}: HANG: iteration {} (seed {:#x}) still running after {:?}; \
                         input saved to {}",
                        r.target,
                        r.iteration,
                        r.seed,
                        r.started.elapsed(),
                        path.display()
                    ));
                    std::process::exit(101);
                }
            }
        });
    });
}

fn save_crash(target: &str, tag: &str, input: &[u8]) -> PathBuf {
    let dir = crash_dir();
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join(format!("{target}-{tag}.bin"));
    if let Err(e) = std::fs::write(&path, input) {
        say(&format!("fuzz: cannot write {}: {e}", path.display()));
    }
    path
}

// ---------------------------------------------------------------------------
// Panics.

thread_local! {
    /// Whether this thread is running a target (its panics are ours to
    /// report, not the default hook's to print).
    static IN_TARGET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Where the target's panics of the current input happened.
    static PANICKED_AT: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Installs (once) a panic hook that records where a target panicked,
/// quietly, and leaves other panics to the default hook.
fn install_panic_hook() {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_TARGET.with(|t| t.get()) {
                let at = info.location().map_or_else(
                    || "an unknown place".to_string(),
                    |l| format!("{}:{}:{}", short_path(l.file()), l.line(), l.column()),
                );
                PANICKED_AT.with(|p| p.borrow_mut().push(at));
            } else {
                default(info);
            }
        }));
    });
}

/// A source path without the registry's prefix (`gimli-0.34.0/src/...`).
fn short_path(path: &str) -> &str {
    match path.find("/registry/src/") {
        Some(i) => {
            let rest = &path[i + "/registry/src/".len()..];
            rest.split_once('/')
                .map_or(rest, |(_, crate_path)| crate_path)
        }
        None => path,
    }
}

/// Serialises the fuzz tests: they share the allocation counters and the
/// CPUs.
static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the other fuzz tests off while one builds its seeds and runs.
pub fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Stop a target after this many crashes (they are mostly the same bug).
const MAX_CRASHES: usize = 8;
/// Inputs kept in the corpus besides the seeds.
const CORPUS_CAP: usize = 512;
/// Signatures remembered (then forgotten, to bound the memory of long runs).
const MAX_SIGNATURES: usize = 1 << 20;

/// Fuzzes `run` for [`seconds`] (the caller holds [`exclusive`]): `run(input, origin)` must not panic,
/// take longer than the hang limit or allocate more than [`HUGE_ALLOC`] at
/// once; it returns a signature of what it saw. Panics (failing the test)
/// when any input did one of those, after printing the seed, the iteration
/// and where the input was saved.
pub fn fuzz(
    name: &'static str,
    seeds: Vec<Seed>,
    dict: &[&[u8]],
    max_len: usize,
    run: &mut dyn FnMut(&[u8], usize) -> u64,
) {
    assert!(!seeds.is_empty(), "{name}: no seed inputs");
    if let Some(path) = std::env::var_os("MEMPROF_FUZZ_REPLAY") {
        return replay(name, &seeds, &PathBuf::from(path), run);
    }
    start_watchdog();
    let seed = base_seed() ^ hash(name.as_bytes());
    let mut rng = Rng::new(seed);
    let hang = hang_limit();
    let secs = seconds();
    say(&format!(
        "fuzz {name}: seed {:#x} (MEMPROF_FUZZ_SEED={:#x}), {} seed inputs ({} bytes), {secs} s",
        seed,
        base_seed(),
        seeds.len(),
        seeds.iter().map(|s| s.data.len()).sum::<usize>()
    ));

    let mut corpus: Vec<(Arc<Vec<u8>>, usize)> = Vec::new();
    let mut seen = HashSet::new();
    let mut signatures = 0u64;
    let mut caught = std::collections::BTreeMap::new();
    install_panic_hook();
    let mut crashes = Vec::new();
    let mut execs = 0u64;
    let mut slowest = Duration::ZERO;
    // The most any one input made the target hold at once.
    let mut peak = 0usize;
    let mut largest = 0usize;
    reset_alloc_stats();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);

    // The seeds themselves first, unmutated; then mutants until the deadline.
    let mut iteration = 0u64;
    loop {
        let (input, origin) = if (iteration as usize) < seeds.len() {
            let s = &seeds[iteration as usize];
            (Arc::new(s.data.clone()), s.origin)
        } else {
            if Instant::now() >= deadline {
                break;
            }
            let parent = if corpus.is_empty() || rng.one_in(2) {
                rng.pick(&seeds).clone()
            } else {
                let (data, origin) = rng.pick(&corpus);
                let s = seeds
                    .iter()
                    .find(|s| s.origin == *origin)
                    .unwrap_or(&seeds[0]);
                Seed {
                    data: data.to_vec(),
                    hot: s.hot.clone(),
                    origin: *origin,
                }
            };
            let other = &rng.pick(&seeds).data;
            let data = mutate(&mut rng, &parent, other, dict, max_len);
            (Arc::new(data), parent.origin)
        };
        iteration += 1;

        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = Some(Running {
            target: name,
            seed,
            iteration,
            started: Instant::now(),
            input: input.clone(),
        });
        HUGE.store(0, Ordering::Relaxed);
        let live_before = LIVE.load(Ordering::Relaxed);
        PEAK.store(live_before, Ordering::Relaxed);
        LARGEST.store(0, Ordering::Relaxed);
        let t = Instant::now();
        IN_TARGET.with(|f| f.set(true));
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| run(&input, origin)));
        IN_TARGET.with(|f| f.set(false));
        let took = t.elapsed();
        let mut panicked_at = PANICKED_AT.with(|p| std::mem::take(&mut *p.borrow_mut()));
        peak = peak.max(PEAK.load(Ordering::Relaxed).saturating_sub(live_before));
        largest = largest.max(LARGEST.load(Ordering::Relaxed));
        *RUNNING.lock().unwrap_or_else(|e| e.into_inner()) = None;
        execs += 1;
        slowest = slowest.max(took);

        let huge = HUGE.swap(0, Ordering::Relaxed);
        let problem = match &result {
            Err(panic) => Some(format!(
                "panic at {}: {}",
                panicked_at.pop().unwrap_or_default(),
                panic_message(panic.as_ref())
            )),
            Ok(_) if took > hang => Some(format!("slow input: {took:?} (limit {hang:?})")),
            Ok(_) if huge > 0 => Some(format!("allocation of {huge} bytes at once")),
            Ok(_) => None,
        };
        if let Some(problem) = problem {
            let path = save_crash(name, &crashes.len().to_string(), &input);
            let line = format!(
                "fuzz {name}: CRASH at iteration {iteration} (seed {seed:#x}, origin {origin}): \
                 {problem}; input saved to {}",
                path.display()
            );
            say(&line);
            crashes.push(line);
            if crashes.len() >= MAX_CRASHES {
                break;
            }
            continue;
        }
        // Panics the code under test caught itself (it does around
        // blazesym): not failures, but worth knowing.
        for at in panicked_at {
            *caught.entry(at).or_insert(0u64) += 1;
        }
        if let Ok(sig) = result {
            if seen.len() >= MAX_SIGNATURES {
                seen.clear();
            }
            if seen.insert(sig) {
                signatures += 1;
                if corpus.len() < CORPUS_CAP {
                    corpus.push((input, origin));
                } else {
                    // Full: a new behaviour replaces a random input.
                    let i = rng.below(CORPUS_CAP);
                    corpus[i] = (input, origin);
                }
            }
        }
    }

    let elapsed = start.elapsed().as_secs_f64();
    say(&format!(
        "fuzz {name}: {execs} execs in {elapsed:.1} s ({:.0}/s), peak alloc {:.2} MiB, {} crashes",
        execs as f64 / elapsed.max(1e-9),
        peak as f64 / (1 << 20) as f64,
        crashes.len()
    ));
    say(&format!(
        "fuzz {name}:   corpus {} inputs ({signatures} new signatures), largest single \
         allocation {:.2} MiB, slowest input {:.1} ms",
        corpus.len(),
        largest as f64 / (1 << 20) as f64,
        slowest.as_secs_f64() * 1e3
    ));
    for (at, n) in &caught {
        say(&format!(
            "fuzz {name}:   {n} panics caught inside the code under test, at {at}"
        ));
    }
    assert!(
        crashes.is_empty(),
        "fuzz {name}: {} crashing inputs (replay one with MEMPROF_FUZZ_REPLAY=<file>):\n{}",
        crashes.len(),
        crashes.join("\n")
    );
    assert!(execs > 0);
}

/// Runs one saved input (for every seed origin) and fails like the loop
/// would.
fn replay(
    name: &'static str,
    seeds: &[Seed],
    path: &PathBuf,
    run: &mut dyn FnMut(&[u8], usize) -> u64,
) {
    let file = path.file_name().and_then(|f| f.to_str()).unwrap_or("");
    if !file.starts_with(&format!("{name}-")) {
        say(&format!(
            "fuzz {name}: replay of {file} is for another target"
        ));
        return;
    }
    let input = std::fs::read(path).expect("reading the replayed input");
    let mut origins: Vec<usize> = seeds.iter().map(|s| s.origin).collect();
    origins.dedup();
    for origin in origins {
        say(&format!(
            "fuzz {name}: replaying {} (origin {origin})",
            path.display()
        ));
        HUGE.store(0, Ordering::Relaxed);
        let t = Instant::now();
        run(&input, origin);
        let took = t.elapsed();
        let huge = HUGE.swap(0, Ordering::Relaxed);
        assert!(took <= hang_limit(), "slow input: {took:?}");
        assert_eq!(huge, 0, "allocation of {huge} bytes at once");
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(non-string panic)".to_string()
    }
}

/// Whether one saved input is being replayed (`MEMPROF_FUZZ_REPLAY`):
/// targets then skip the sanity checks on their seeds.
pub fn replaying() -> bool {
    std::env::var_os("MEMPROF_FUZZ_REPLAY").is_some()
}
