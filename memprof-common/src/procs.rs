//! Several traced processes: which processes the sampler follows, how a
//! recipe is told apart between processes whose code differs, and how an
//! address in a `MAP_SHARED` mapping becomes a key that every process
//! mapping the same memory agrees on.
//!
//! The rules are here, used by the kernel (line table) and by the loader
//! (the samples it aggregates), so both key a shared line the same way.

use crate::record::records;

/// Processes traced at once (the main one, `-p` pids, forked children).
pub const TRACED_CAPACITY: u32 = 4096;
/// Cgroups in [`crate::maps::TRACED_CGROUPS`] (the `--cgroup` one and
/// those below it).
pub const TRACED_CGROUPS_CAPACITY: u32 = 4096;

/// The value of [`crate::maps::TRACED`] for a process whose code layout is
/// not known yet (a child after `exec`): no recipe is installed under it,
/// so its samples yield no address until the loader gives it a layout.
pub const LAYOUT_UNKNOWN: u32 = 127;
/// Bits of a recipe key above the instruction address that hold the
/// layout: user addresses stay below 2^57 even with 5-level paging.
const LAYOUT_SHIFT: u32 = 57;

/// The key of [`crate::maps::RECIPES`] for the instruction at `ip` in a
/// process of code layout `layout` (0: the main process's and its forked
/// children's; the key is then `ip` itself). Processes whose code at the
/// same address differs have different layouts, so a recipe decoded in
/// one is never applied to the other.
#[inline(always)]
pub const fn recipe_key(layout: u32, ip: u64) -> u64 {
    ip | ((layout as u64 & 0x7f) << LAYOUT_SHIFT)
}

/// The instruction address and the layout of a recipe key.
pub const fn split_recipe_key(key: u64) -> (u32, u64) {
    (
        (key >> LAYOUT_SHIFT) as u32,
        key & ((1u64 << LAYOUT_SHIFT) - 1),
    )
}

/// Shared mappings translated per process (the first ones in the map; the
/// sampler walks at most this many).
pub const SHARED_RANGES_PER_PROCESS: u32 = 16;
/// Entries of [`crate::maps::SHARED_RANGES`].
pub const SHARED_RANGES_CAPACITY: u32 = 4096;

/// Keys of shared memory have this bit set; no user address has it.
pub const SHARED_KEY_BIT: u64 = 1 << 63;
/// Bits of the offset in the object (512 GiB).
const OFFSET_BITS: u32 = 39;
const OFFSET_MASK: u64 = (1 << OFFSET_BITS) - 1;
/// Bits of the object's (device, inode) hash.
const OBJECT_BITS: u32 = 24;

/// Key of [`crate::maps::SHARED_RANGES`]: slot `slot` of process `tgid`.
#[inline(always)]
pub const fn shared_slot(tgid: u32, slot: u32) -> u64 {
    ((tgid as u64) << 32) | slot as u64
}

/// Which object (file, shmem segment) a shared key belongs to: a hash of
/// its device and inode.
pub const fn shared_object(dev: u64, inode: u64) -> u64 {
    // splitmix64's finaliser over both numbers: distinct files spread over
    // the 24 bits, so two objects of one program rarely meet.
    let mut x = dev.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ inode;
    x ^= x >> 30;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 27;
    x = x.wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    x & ((1 << OBJECT_BITS) - 1)
}

/// The canonical key of byte `offset` of object (`dev`, `inode`).
pub const fn shared_key(dev: u64, inode: u64, offset: u64) -> u64 {
    SHARED_KEY_BIT | (shared_object(dev, inode) << OFFSET_BITS) | (offset & OFFSET_MASK)
}

/// Whether `key` is a shared-memory key rather than a virtual address.
pub const fn is_shared_key(key: u64) -> bool {
    key & SHARED_KEY_BIT != 0
}

/// A key's object hash and offset.
pub const fn split_shared_key(key: u64) -> (u64, u64) {
    (
        (key >> OFFSET_BITS) & ((1 << OBJECT_BITS) - 1),
        key & OFFSET_MASK,
    )
}

/// One `MAP_SHARED` mapping of one process: `[start, end)` holds the
/// object's bytes from the one keyed `key_base` on.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedRange {
    pub start: u64,
    pub end: u64,
    pub key_base: u64,
}

impl SharedRange {
    /// The range for a mapping of `[start, end)` at file offset `offset`
    /// of object (`dev`, `inode`).
    pub const fn new(start: u64, end: u64, dev: u64, inode: u64, offset: u64) -> Self {
        Self {
            start,
            end,
            key_base: shared_key(dev, inode, offset),
        }
    }

    /// The key of `addr` if the range holds it. Keys keep the address's
    /// position in its line: mappings and their offsets are page-aligned.
    #[inline(always)]
    pub fn key(&self, addr: u64) -> Option<u64> {
        if addr >= self.start && addr < self.end {
            Some(self.key_base.wrapping_add(addr - self.start))
        } else {
            None
        }
    }
}

/// The key of `addr` under `ranges` (the process's shared mappings), or
/// the address itself: the rule the sampler applies in the kernel.
pub fn translate(ranges: &[SharedRange], addr: u64) -> u64 {
    ranges.iter().find_map(|r| r.key(addr)).unwrap_or(addr)
}

const _: () = assert!(core::mem::size_of::<SharedRange>() == 24);

// SAFETY: `#[repr(C)]`, three u64 (size asserted above): no padding, any
// bit pattern is a valid value.
records!(SharedRange);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sharing::LINE_BYTES;

    #[test]
    fn two_mappings_of_one_object_meet_on_the_same_key() {
        // Process A maps the object at 0x7f00_0000_0000, process B at
        // another address, both from offset 0.
        let a = SharedRange::new(0x7f00_0000_0000, 0x7f00_0000_2000, 0x1, 42, 0);
        let b = SharedRange::new(0x5555_0000_0000, 0x5555_0000_2000, 0x1, 42, 0);
        assert_eq!(a.key(0x7f00_0000_0048), b.key(0x5555_0000_0048));
        let k = a.key(0x7f00_0000_0048).unwrap();
        assert!(is_shared_key(k));
        assert_eq!(k % LINE_BYTES, 0x48 % LINE_BYTES, "same place in its line");
        assert_eq!(split_shared_key(k), (shared_object(1, 42), 0x48));
    }

    #[test]
    fn the_file_offset_counts() {
        // B maps the object's second page only.
        let a = SharedRange::new(0x1000_0000, 0x1000_2000, 3, 7, 0);
        let b = SharedRange::new(0x2000_0000, 0x2000_1000, 3, 7, 0x1000);
        assert_eq!(a.key(0x1000_1010), b.key(0x2000_0010));
        assert_ne!(a.key(0x1000_0010), b.key(0x2000_0010));
    }

    #[test]
    fn other_objects_and_outside_addresses_do_not_meet() {
        let a = SharedRange::new(0x1000_0000, 0x1000_1000, 3, 7, 0);
        let b = SharedRange::new(0x1000_0000, 0x1000_1000, 3, 8, 0);
        assert_ne!(a.key(0x1000_0000), b.key(0x1000_0000));
        assert_eq!(a.key(0x0fff_ffff), None);
        assert_eq!(a.key(0x1000_1000), None, "end is exclusive");
        assert_eq!(translate(&[a], 0x4000), 0x4000, "not shared: the address");
        assert_eq!(translate(&[b, a], 0x1000_0008), b.key(0x1000_0008).unwrap());
    }

    #[test]
    fn keys_never_collide_with_user_addresses() {
        // The highest user address with 5-level paging.
        let top = (1u64 << 56) - 1;
        assert!(!is_shared_key(top));
        assert!(is_shared_key(shared_key(0, 0, 0)));
        assert!(is_shared_key(shared_key(u64::MAX, u64::MAX, OFFSET_MASK)));
    }

    #[test]
    fn recipe_keys_separate_layouts_and_keep_layout_zero_as_is() {
        let ip = 0x5555_5555_1234;
        assert_eq!(recipe_key(0, ip), ip);
        assert_ne!(recipe_key(1, ip), ip);
        assert_eq!(split_recipe_key(recipe_key(5, ip)), (5, ip));
        let top = (1u64 << 56) - 1;
        assert_eq!(
            split_recipe_key(recipe_key(LAYOUT_UNKNOWN, top)),
            (LAYOUT_UNKNOWN, top)
        );
    }

    #[test]
    fn slots_are_per_process() {
        assert_ne!(shared_slot(1, 2), shared_slot(2, 1));
        assert_eq!(shared_slot(7, 3) >> 32, 7);
    }
}
