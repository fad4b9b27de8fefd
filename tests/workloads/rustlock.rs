//! rustlock: two threads contending on a `std::sync::Mutex`, for
//! memprof-ebpf's lock tests. Rust's Mutex is a futex word of its own (no
//! pthread): a contended lock() spins briefly, then calls futex(FUTEX_WAIT)
//! through libc's syscall(); unlock() calls futex(FUTEX_WAKE) when a waiter
//! was seen.
//!
//!   rustlock SECONDS    prints "ready", then 2 threads (started together)
//!                       loop for SECONDS in contend(): lock COUNTER_LOCK
//!                       (line marked RUSTWAIT), ~20 us of busy work inside,
//!                       unlock (RUSTRELEASE), ~5 us of work outside; prints
//!                       "acquisitions N" on stderr at the end, and to the
//!                       file named by WORKLOAD_TRUTH (ground truth)
//!
//! Built by the tests with `rustc -g -C force-frame-pointers=yes -O`. The
//! lock is a static with a distinctive name: the profiler names a lock by the
//! symbol that contains its address (`rustlock::COUNTER_LOCK`, mangled).

use std::{
    hint::black_box,
    io::Write,
    sync::{Barrier, Mutex},
    time::{Duration, Instant},
};

static COUNTER_LOCK: Mutex<u64> = Mutex::new(0);

const THREADS: usize = 2;
const HOLD: Duration = Duration::from_micros(20);
const OUTSIDE: Duration = Duration::from_micros(5);

/// Busy work for about `d`.
#[inline(never)]
fn busy(d: Duration) {
    let start = Instant::now();
    let mut acc = 0u64;
    while start.elapsed() < d {
        for i in 0..16 {
            acc = black_box(acc.wrapping_add(i));
        }
    }
    black_box(acc);
}

/// Takes COUNTER_LOCK until `until`; returns the number of acquisitions.
#[inline(never)]
fn contend(until: Instant) -> u64 {
    let mut done = 0;
    while Instant::now() < until {
        let mut counter = COUNTER_LOCK.lock().unwrap(); // RUSTWAIT
        busy(HOLD); // RUSTHOLD
        *counter += 1;
        drop(counter); // RUSTRELEASE
        done += 1;
        busy(OUTSIDE);
    }
    done
}

fn main() {
    let seconds: f64 = match std::env::args().nth(1).map(|s| s.parse()) {
        Some(Ok(s)) if s > 0.0 && s <= 3600.0 => s,
        _ => {
            eprintln!("usage: rustlock SECONDS");
            std::process::exit(2);
        }
    };
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready").unwrap();
    stdout.flush().unwrap();

    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let start_line = Barrier::new(THREADS);
    let total: u64 = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    start_line.wait();
                    contend(until)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).sum()
    });
    let counter = *COUNTER_LOCK.lock().unwrap();
    if counter != total {
        eprintln!("counter {counter} != acquisitions {total}");
        std::process::exit(1);
    }
    eprintln!("acquisitions {total}");
    // Ground truth for the tests, as tests/workloads/truth.h writes it.
    if let Some(path) = std::env::var_os("WORKLOAD_TRUTH") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        writeln!(f, "acquisitions {total}").unwrap();
    }
}
