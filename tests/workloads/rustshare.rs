//! rustshare: per-thread counters in one global array of atomics, the Rust
//! version of `sharing array` (false sharing), for memprof-ebpf's tests.
//!
//!   rustshare THREADS SECONDS
//!
//! Thread i keeps incrementing `COUNTERS.0[i]` (a relaxed load and store,
//! as a plain `+= 1` on a per-thread counter compiles to), on the line
//! marked with a comment; the eight counters share one cache line. Prints
//! "ready" once the threads run and "iterations N" on stderr at the end.

use std::{
    io::Write,
    sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
    time::Duration,
};

/// One cache line of counters, starting on a line boundary.
#[repr(align(64))]
pub struct Counters(pub [AtomicU64; 8]);

pub static COUNTERS: Counters = Counters([const { AtomicU64::new(0) }; 8]);
static STOP: AtomicBool = AtomicBool::new(false);

#[inline(never)]
fn count(slot: &AtomicU64) -> u64 {
    let mut n = 0;
    loop {
        for _ in 0..1024 {
            slot.store(slot.load(Relaxed) + 1, Relaxed); // RUST_WRITE
        }
        n += 1024;
        if STOP.load(Relaxed) {
            return n;
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(threads), Some(seconds)) = (
        args.get(1).and_then(|a| a.parse::<usize>().ok()),
        args.get(2).and_then(|a| a.parse::<f64>().ok()),
    ) else {
        eprintln!("usage: rustshare THREADS SECONDS");
        std::process::exit(2);
    };
    if threads == 0 || threads > 8 || seconds <= 0.0 {
        eprintln!("usage: rustshare THREADS(1-8) SECONDS");
        std::process::exit(2);
    }
    let workers: Vec<_> = (0..threads)
        .map(|i| std::thread::spawn(move || count(&COUNTERS.0[i])))
        .collect();
    println!("ready");
    let _ = std::io::stdout().flush();
    std::thread::sleep(Duration::from_secs_f64(seconds));
    STOP.store(true, Relaxed);
    let total: u64 = workers.into_iter().map(|w| w.join().unwrap_or(0)).sum();
    eprintln!("iterations {total}");
}
