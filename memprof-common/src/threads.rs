//! Following the target: the record of a thread's creation or exit, or of
//! an `execve`.

use crate::record::records;

/// Byte size of the task-event ring buffer.
pub const TASK_RING_BYTES: u32 = 256 << 10;

/// A new thread was created in the target.
pub const TASK_NEW_THREAD: u32 = 1;
/// A thread of the target exited (the process ends when all have).
pub const TASK_EXIT: u32 = 2;
/// The target replaced its program image with `execve`.
pub const TASK_EXEC: u32 = 3;

/// A traced process forked a child that is followed too (`tid` and
/// `tgid`: the child; `parent_tid`: the forking thread).
pub const TASK_NEW_PROCESS: u32 = 4;

/// A change in the target's set of threads or program image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskEvent {
    /// `bpf_ktime_get_ns()` at the event.
    pub time_ns: u64,
    /// `TASK_*` kind.
    pub kind: u32,
    /// The thread concerned (the new thread for [`TASK_NEW_THREAD`]).
    pub tid: u32,
    /// Its thread group (process id).
    pub tgid: u32,
    /// For [`TASK_NEW_THREAD`], the creating thread; otherwise 0.
    pub parent_tid: u32,
    /// For [`TASK_EXIT`], the thread's final name (NUL-padded), so threads
    /// that live too briefly to be looked up in /proc are still named.
    pub comm: [u8; 16],
}

impl TaskEvent {
    /// The `comm` field as text (empty when not set).
    pub fn comm_str(&self) -> &str {
        let len = self
            .comm
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.comm.len());
        core::str::from_utf8(&self.comm[..len]).unwrap_or("")
    }
}

// The kernel writes this record and userspace reads it; a change in size is
// a layout change both sides must see.
const _: () = assert!(core::mem::size_of::<TaskEvent>() == 40);

// SAFETY: `#[repr(C)]`, integers and a byte array only, 8+4*4+16 = 40
// bytes (asserted above), no padding; any bit pattern is a valid value.
records!(TaskEvent);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comm_stops_at_the_first_nul() {
        let mut ev = TaskEvent::default();
        assert_eq!(ev.comm_str(), "");
        ev.comm[..6].copy_from_slice(b"worker");
        assert_eq!(ev.comm_str(), "worker");
        ev.comm = *b"sixteen-bytes-xx";
        assert_eq!(ev.comm_str(), "sixteen-bytes-xx");
    }
}
