//! The heap block under an address when the heap did not see it
//! allocated: from glibc's chunk headers.

use super::HeapBlock;
use crate::process::{
    chunks::{self, ProcMemory, Region},
    state::Process,
};

impl HeapBlock {
    /// The [`HeapBlock::site`] of a block the heap did not see allocated,
    /// found from its glibc chunk header ([`chunks`]): its `size` is then
    /// its usable size.
    pub const UNSEEN: u64 = 0;

    /// The glibc block holding `addr` (in heap or anonymous memory of the
    /// main process), from the allocator's own chunk headers.
    pub fn from_chunk(process: &Process, mem: &ProcMemory, addr: u64) -> Option<Self> {
        let c = chunks::chunk_at(mem, Region::of(process.maps(), addr)?, addr)?;
        Some(Self {
            start: c.start,
            size: c.usable,
            site: Self::UNSEEN,
        })
    }
}
