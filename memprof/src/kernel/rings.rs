//! The ring buffers the programs write records into: registering them with
//! the runtime, waiting for them, draining them, and the sizes of those
//! that fill only in windows.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use aya::maps::{MapData, RingBuf};
use memprof_common::{locks::HOLD_RING_BYTES, maps, ALLOC_RING_BYTES};
use tokio::io::unix::AsyncFd;

use super::cputime::online_cpus;
use crate::error::Result;

/// Ring bytes per CPU for the allocator's windows: a 100 ms window at
/// one traced call per ~3 µs on each CPU is 2.4 MB a CPU (72-byte
/// records), and the loader drains the ring every
/// [`DRAIN_INTERVAL_MS`](memprof_common::DRAIN_INTERVAL_MS) and at its
/// wake-up mark.
const ALLOC_WINDOW_RING_PER_CPU: u32 = 4 << 20;
/// As [`ALLOC_WINDOW_RING_PER_CPU`] for the lock sections: a section per
/// ~4 µs, 64 bytes each, is 1.6 MB a CPU per 100 ms window.
const HOLD_WINDOW_RING_PER_CPU: u32 = 2 << 20;

/// The size of a ring whose records come only in windows: `per_cpu`
/// bytes for each of `cpus`, a power of two (as the kernel wants), at
/// least twice the programs' wake-up mark (a quarter of `full`: past
/// half a ring the loader is woken), at most `full`, the object's size
/// for tracing every call. The consumer
/// maps a ring's data twice (so a record never wraps), so its whole size
/// counts twice in the loader's resident memory: the 16 MiB allocator
/// ring and the 8 MiB section ring were 48 MiB of its ~95 MiB.
fn windowed_ring_bytes(per_cpu: u32, cpus: u32, full: u32) -> u32 {
    per_cpu
        .saturating_mul(cpus.max(1))
        .checked_next_power_of_two()
        .unwrap_or(full)
        .clamp(full / 2, full)
}

/// The rings loaded smaller than the object says, and their sizes: the
/// allocator's when its calls are traced in windows (`alloc_windowed`),
/// the lock sections' likewise (`lock_windowed`).
pub fn windowed_sizes(alloc_windowed: bool, lock_windowed: bool) -> Vec<(&'static str, u32)> {
    let cpus = online_cpus() as u32;
    let mut sizes = Vec::new();
    if alloc_windowed {
        let bytes = windowed_ring_bytes(ALLOC_WINDOW_RING_PER_CPU, cpus, ALLOC_RING_BYTES);
        sizes.push((maps::ALLOC_EVENTS, bytes));
    }
    if lock_windowed {
        let bytes = windowed_ring_bytes(HOLD_WINDOW_RING_PER_CPU, cpus, HOLD_RING_BYTES);
        sizes.push((maps::HOLD_EVENTS, bytes));
    }
    sizes
}

/// A ring buffer taken out of the object, and the count of records read
/// from it (shared with [`RingCounts`], for the profiler's own cost).
pub struct RingMap {
    buf: RingBuf<MapData>,
    events: Arc<AtomicU64>,
}

impl AsRawFd for RingMap {
    fn as_raw_fd(&self) -> RawFd {
        self.buf.as_raw_fd()
    }
}

/// A ring buffer registered with the runtime.
pub type Ring = AsyncFd<RingMap>;

/// The records read from each ring taken out of the object, by name (the
/// map's, in lower case: `lock_events`).
#[derive(Default)]
pub struct RingCounts(Vec<(String, Arc<AtomicU64>)>);

impl RingCounts {
    /// `buf`, the map `name`, counting the records read from it.
    pub fn counted(&mut self, name: &str, buf: RingBuf<MapData>) -> RingMap {
        let events = Arc::new(AtomicU64::new(0));
        self.0
            .push((name.to_ascii_lowercase(), Arc::clone(&events)));
        RingMap { buf, events }
    }

    /// Records read so far from each ring, in the order they were taken.
    pub fn snapshot(&self) -> Vec<(String, u64)> {
        self.0
            .iter()
            .map(|(name, n)| (name.clone(), n.load(Ordering::Relaxed)))
            .collect()
    }
}

/// Registers a file descriptor owner with tokio for readability.
pub fn readable<T: std::os::fd::AsRawFd>(inner: T, what: &str) -> Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor (an OwnedFd or a RingMap's aya
    // map) and keeps it open, unchanged, for as long as the AsyncFd holds
    // it.
    unsafe { AsyncFd::register_with_interest(inner, tokio::io::Interest::READABLE) }.map_err(|e| {
        anyhow::anyhow!("registering {what} with the runtime: {}", e.into_parts().1).into()
    })
}

/// Ready when `ring` has records; the readiness is consumed: the caller
/// drains the ring next.
pub fn poll_ring(ring: &mut Ring, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
    ring.poll_read_ready_mut(cx)
        .map_ok(|mut guard| guard.clear_ready())
}

/// Records a feature's ring hands on before the thread records are read
/// again: a ring written as fast as it is read would otherwise be drained
/// in one pass, and a thread created meanwhile would be seen only after
/// the records of its first calls.
pub const BATCH: usize = 4096;

/// Hands every record waiting in `ring` to `handle`.
pub fn drain(ring: &mut Ring, mut handle: impl FnMut(&[u8])) {
    let ring = ring.get_mut();
    let mut n = 0;
    while let Some(item) = ring.buf.next() {
        handle(&item);
        n += 1;
    }
    ring.events.fetch_add(n, Ordering::Relaxed);
}

/// Hands up to [`BATCH`] records waiting in `ring` to `handle`; true when
/// it stopped there (more may wait).
pub fn drain_batch(ring: &mut Ring, mut handle: impl FnMut(&[u8])) -> bool {
    let ring = ring.get_mut();
    let mut n = 0;
    let more = loop {
        if n == BATCH as u64 {
            break true;
        }
        let Some(item) = ring.buf.next() else {
            break false;
        };
        handle(&item);
        n += 1;
    };
    ring.events.fetch_add(n, Ordering::Relaxed);
    more
}

/// A fixed-size record decoded, or a warning that it was short.
pub fn decoded<T>(bytes: &[u8], what: &str, decode: fn(&[u8]) -> Option<T>) -> Option<T> {
    let ev = decode(bytes);
    if ev.is_none() {
        tracing::warn!("short {what} record ({} bytes)", bytes.len());
    }
    ev
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windowed_rings_scale_with_the_cpus_up_to_the_full_size() {
        let full = 16 << 20;
        assert_eq!(windowed_ring_bytes(4 << 20, 2, full), 8 << 20);
        assert_eq!(windowed_ring_bytes(4 << 20, 3, full), 16 << 20);
        assert_eq!(windowed_ring_bytes(4 << 20, 64, full), full);
        // The wake-up mark is a quarter of the full size: never above
        // half the ring.
        assert_eq!(windowed_ring_bytes(4 << 20, 0, full), 8 << 20);
        assert_eq!(windowed_ring_bytes(4 << 20, 1, full), 8 << 20);
        assert_eq!(windowed_ring_bytes(u32::MAX, 2, full), full);
        for cpus in 1..200 {
            let n = windowed_ring_bytes(2 << 20, cpus, 8 << 20);
            assert!(n.is_power_of_two() && n >= 4 << 20, "{cpus}: {n}");
        }
    }
}
