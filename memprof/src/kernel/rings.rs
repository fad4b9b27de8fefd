//! The ring buffers the programs write records into: registering them with
//! the runtime, waiting for them, and draining them.

use std::{
    os::fd::{AsRawFd, RawFd},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    task::{Context, Poll},
};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::error::Result;

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
