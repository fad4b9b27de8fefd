//! The ring buffers the programs write records into: registering them with
//! the runtime, waiting for them, and draining them.

use std::task::{Context, Poll};

use aya::maps::{MapData, RingBuf};
use tokio::io::unix::AsyncFd;

use crate::error::Result;

/// A ring buffer registered with the runtime.
pub type Ring = AsyncFd<RingBuf<MapData>>;

/// Registers a file descriptor owner with tokio for readability.
pub fn readable<T: std::os::fd::AsRawFd>(inner: T, what: &str) -> Result<AsyncFd<T>> {
    // SAFETY: `inner` owns its descriptor (an OwnedFd or an aya map) and
    // keeps it open, unchanged, for as long as the AsyncFd holds it.
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
    while let Some(item) = ring.next() {
        handle(&item);
    }
}

/// Hands up to [`BATCH`] records waiting in `ring` to `handle`; true when
/// it stopped there (more may wait).
pub fn drain_batch(ring: &mut Ring, mut handle: impl FnMut(&[u8])) -> bool {
    let ring = ring.get_mut();
    for _ in 0..BATCH {
        let Some(item) = ring.next() else {
            return false;
        };
        handle(&item);
    }
    true
}

/// A fixed-size record decoded, or a warning that it was short.
pub fn decoded<T>(bytes: &[u8], what: &str, decode: fn(&[u8]) -> Option<T>) -> Option<T> {
    let ev = decode(bytes);
    if ev.is_none() {
        tracing::warn!("short {what} record ({} bytes)", bytes.len());
    }
    ev
}
