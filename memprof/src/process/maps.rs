//! The target's memory map (`/proc/PID/maps`), kept as a snapshot.
//!
//! Sampled addresses are turned into (object file, file offset) as soon as
//! they arrive, while the process is alive; symbolization of those pairs can
//! then happen any time later, even after the target has exited.

use std::{path::Path, sync::Arc};

/// The address of the call instruction that returns to `return_address`,
/// as close as an address in it can be told without decoding: the byte
/// before. Stack frames and the callers the probes see are return
/// addresses; places and symbols are looked up here.
pub fn call_of(return_address: u64) -> u64 {
    return_address.saturating_sub(1)
}

/// Whether an object's file name (see [`short_name`]) is the C library's.
pub fn is_libc(name: &str) -> bool {
    name.starts_with("libc.so") || name.starts_with("libc-")
}

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    pub readable: bool,
    pub writable: bool,
    pub executable: bool,
    /// `MAP_SHARED` (flag `s`).
    pub shared: bool,
    /// Device (major << 32 | minor) and inode of the backing object (0
    /// for private anonymous memory).
    pub dev: u64,
    pub inode: u64,
    /// `/path/to/file`, `[heap]`, `[stack]`, `[vdso]`, ... or empty.
    pub name: Arc<str>,
}

impl Mapping {
    /// Backed by a file on disk (not anonymous, not a `[pseudo]` region).
    pub fn is_file(&self) -> bool {
        self.name.starts_with('/')
    }
}

/// Where an address lies in the target's memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Place {
    /// Inside a file mapping: which file and at what offset in it.
    File { path: Arc<str>, file_offset: u64 },
    /// Inside a named pseudo-region (`[heap]`, `[stack]`, `[vdso]`, ...).
    Region { name: Arc<str>, address: u64 },
    /// In anonymous memory (JIT code, `mmap`ed heap arenas, ...).
    Anonymous { address: u64 },
    /// Not mapped in the last snapshot we have.
    Unmapped { address: u64 },
}

/// A parsed snapshot of a process's memory map, sorted by address.
#[derive(Debug, Clone, Default)]
pub struct ProcMaps {
    mappings: Vec<Mapping>,
}

impl ProcMaps {
    /// Reads `/proc/PID/maps`, its files named as we know them (see
    /// [`super::objects`]).
    pub fn read(pid: u32) -> std::io::Result<Self> {
        let mut maps = Self::parse(&String::from_utf8_lossy(&super::procfs::read_proc(
            pid, "maps",
        )?));
        super::objects::name_mappings(pid, &mut maps.mappings);
        Ok(maps)
    }

    /// Parses the text of a maps file; malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut mappings: Vec<Mapping> = text.lines().filter_map(parse_line).collect();
        mappings.sort_by_key(|m| m.start);
        Self { mappings }
    }

    pub fn mappings(&self) -> &[Mapping] {
        &self.mappings
    }

    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty()
    }

    /// The mapping containing `addr`.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        let i = self.mappings.partition_point(|m| m.start <= addr);
        let m = self.mappings.get(i.checked_sub(1)?)?;
        (addr < m.end).then_some(m)
    }

    /// Classifies an address (see [`Place`]).
    pub fn place(&self, addr: u64) -> Place {
        match self.find(addr) {
            Some(m) if m.is_file() => Place::File {
                path: m.name.clone(),
                file_offset: addr - m.start + m.offset,
            },
            Some(m) if !m.name.is_empty() => Place::Region {
                name: m.name.clone(),
                address: addr,
            },
            Some(_) => Place::Anonymous { address: addr },
            None => Place::Unmapped { address: addr },
        }
    }

    /// The address at which file offset 0 of `path` is (or would be)
    /// mapped: `start - offset` of its lowest mapping. ELF virtual addresses
    /// of the file are relative to this base plus the first segment's
    /// `p_vaddr`.
    pub fn file_base(&self, path: &str) -> Option<u64> {
        self.mappings
            .iter()
            .filter(|m| &*m.name == path)
            .map(|m| m.start.wrapping_sub(m.offset))
            .min()
    }

    /// For a data address, the object file whose image holds it, with the
    /// file's base: a file mapping, or the anonymous mapping right after a
    /// writable file mapping (the part of `.bss` beyond the file's last page).
    pub fn data_owner(&self, addr: u64) -> Option<(Arc<str>, u64)> {
        let i = self
            .mappings
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)?;
        let m = &self.mappings[i];
        if addr >= m.end {
            return None;
        }
        let owner = if m.is_file() {
            m
        } else if self.extends_file_data(i) {
            &self.mappings[i - 1]
        } else {
            return None;
        };
        Some((owner.name.clone(), self.file_base(&owner.name)?))
    }

    /// Whether mapping `i` is anonymous and right after a writable file
    /// mapping: the part of that file's `.bss` beyond its last page.
    fn extends_file_data(&self, i: usize) -> bool {
        let m = &self.mappings[i];
        let Some(prev) = i.checked_sub(1).map(|p| &self.mappings[p]) else {
            return false;
        };
        m.name.is_empty() && prev.is_file() && prev.writable && prev.end == m.start
    }

    /// The object files' writable data (`.data`, `.bss`): private writable
    /// file mappings and the anonymous mappings that extend them, as
    /// (start, end) in address order.
    pub fn data_images(&self) -> Vec<(u64, u64)> {
        (0..self.mappings.len())
            .filter(|&i| {
                let m = &self.mappings[i];
                m.writable && !m.shared && (m.is_file() || self.extends_file_data(i))
            })
            .map(|i| (self.mappings[i].start, self.mappings[i].end))
            .collect()
    }

    /// Whether `addr` is in what looks like a thread's stack: an anonymous
    /// read-write mapping of 128 KiB or more right above a small
    /// inaccessible one (glibc puts the guard pages below a thread's
    /// stack; a malloc arena's inaccessible reserve is large and lies
    /// above its part in use).
    pub fn in_thread_stack(&self, addr: u64) -> bool {
        let Some(i) = self
            .mappings
            .partition_point(|m| m.start <= addr)
            .checked_sub(1)
        else {
            return false;
        };
        let m = &self.mappings[i];
        let inaccessible =
            |g: &Mapping| !g.readable && !g.writable && !g.executable && g.name.is_empty();
        addr < m.end
            && m.name.is_empty()
            && m.writable
            && m.end - m.start >= 128 << 10
            && i > 0
            && inaccessible(&self.mappings[i - 1])
            && self.mappings[i - 1].end == m.start
            && self.mappings[i - 1].end - self.mappings[i - 1].start <= 64 << 10
    }

    /// Distinct file paths that are mapped executable.
    pub fn code_files(&self) -> Vec<Arc<str>> {
        let mut files: Vec<Arc<str>> = self
            .mappings
            .iter()
            .filter(|m| m.executable && m.is_file())
            .map(|m| m.name.clone())
            .collect();
        files.sort();
        files.dedup();
        files
    }
}

fn parse_line(line: &str) -> Option<Mapping> {
    // start-end perms offset dev inode [name, which may contain spaces]
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?.as_bytes();
    let offset = u64::from_str_radix(fields.next()?, 16).ok()?;
    let dev = parse_dev(fields.next()?)?;
    let inode = fields.next()?.parse().ok()?;
    let name = fields.next().unwrap_or("").trim_start();
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    let (start, end) = range.split_once('-')?;
    if perms.len() < 4 {
        return None;
    }
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    // Not empty, and its file offsets do not wrap: then `addr - start +
    // offset` is exact for every address of the mapping.
    if start >= end || offset.checked_add(end - start).is_none() {
        return None;
    }
    Some(Mapping {
        start,
        end,
        offset,
        readable: perms[0] == b'r',
        writable: perms[1] == b'w',
        executable: perms[2] == b'x',
        shared: perms[3] == b's',
        dev,
        inode,
        name: Arc::from(name),
    })
}

/// `fe:01` (hex major:minor) as major << 32 | minor.
fn parse_dev(text: &str) -> Option<u64> {
    let (major, minor) = text.split_once(':')?;
    Some(u64::from_str_radix(major, 16).ok()? << 32 | u64::from_str_radix(minor, 16).ok()?)
}

/// The file name part of a path, for display (`/usr/lib/libc.so.6` →
/// `libc.so.6`).
pub fn short_name(path: &str) -> &str {
    Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(path)
}

/// A place at `offset` in `/bin/prog`: the unit tests' code address.
#[cfg(test)]
pub fn prog_place(offset: u64) -> Place {
    Place::File {
        path: std::sync::Arc::from("/bin/prog"),
        file_offset: offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 fe:01 123 /tmp/work load
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 123 /tmp/work load
55d0c8a03000-55d0c8a04000 rw-p 00002000 fe:01 123 /tmp/work load
55d0c8a04000-55d0c8a06000 rw-p 00000000 00:00 0 
55d0c9000000-55d0c9021000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 r-xp 00000000 00:00 0 
7f1000028000-7f10001bd000 r-xp 00028000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6
7f10001bd000-7f1000215000 r--p 001bd000 fe:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6 (deleted)
7ffd1000f000-7ffd10011000 r-xp 00000000 00:00 0                          [vdso]
garbage line
";

    #[test]
    fn thread_stacks_are_told_from_malloc_arenas() {
        let maps = ProcMaps::parse(
            "7f0000000000-7f0000001000 ---p 00000000 00:00 0 \n\
             7f0000001000-7f0000801000 rw-p 00000000 00:00 0 \n\
             7f1000000000-7f1000021000 rw-p 00000000 00:00 0 \n\
             7f1000021000-7f1004000000 ---p 00000000 00:00 0 \n\
             7f1004000000-7f1004021000 rw-p 00000000 00:00 0 \n",
        );
        assert!(maps.in_thread_stack(0x7f0000700000));
        assert!(!maps.in_thread_stack(0x7f0000000800), "the guard itself");
        assert!(!maps.in_thread_stack(0x7f1000001000), "an arena in use");
        assert!(
            !maps.in_thread_stack(0x7f1004001000),
            "above a large reserve: the next arena"
        );
        assert!(!maps.in_thread_stack(0x10));
    }

    #[test]
    fn parses_and_finds() {
        let maps = ProcMaps::parse(MAPS);
        assert_eq!(maps.mappings().len(), 9);
        let m = maps.find(0x55d0c8a01010).unwrap();
        assert_eq!(&*m.name, "/tmp/work load");
        assert!(m.executable && !m.writable);
        assert!(maps.find(0x55d0c8a02000).is_none(), "hole between mappings");
        assert!(maps.find(0).is_none());
        assert!(maps.find(u64::MAX).is_none());
        assert_eq!(
            &*maps.find(0x7f10001bd000).unwrap().name,
            "/usr/lib/x86_64-linux-gnu/libc.so.6"
        );
    }

    #[test]
    fn places() {
        let maps = ProcMaps::parse(MAPS);
        assert_eq!(
            maps.place(0x7f1000028010),
            Place::File {
                path: "/usr/lib/x86_64-linux-gnu/libc.so.6".into(),
                file_offset: 0x28010
            }
        );
        assert_eq!(
            maps.place(0x7ffd1000f010),
            Place::Region {
                name: "[vdso]".into(),
                address: 0x7ffd1000f010
            }
        );
        assert_eq!(
            maps.place(0x7f0000000010),
            Place::Anonymous {
                address: 0x7f0000000010
            }
        );
        assert_eq!(maps.place(0x10), Place::Unmapped { address: 0x10 });
    }

    #[test]
    fn data_owner_covers_the_bss_tail() {
        let maps = ProcMaps::parse(MAPS);
        let base = 0x55d0c8a00000;
        assert_eq!(
            maps.data_owner(0x55d0c8a03010),
            Some(("/tmp/work load".into(), base))
        );
        assert_eq!(
            maps.data_owner(0x55d0c8a05000),
            Some(("/tmp/work load".into(), base))
        );
        assert_eq!(
            maps.data_owner(0x55d0c9000010),
            None,
            "heap is not a file's image"
        );
        assert_eq!(
            maps.data_owner(0x7f0000000010),
            None,
            "anon after a non-file mapping"
        );
    }

    #[test]
    fn code_files_and_short_names() {
        let maps = ProcMaps::parse(MAPS);
        assert_eq!(maps.code_files().len(), 2);
        assert_eq!(
            short_name("/usr/lib/x86_64-linux-gnu/libc.so.6"),
            "libc.so.6"
        );
        assert_eq!(short_name("[vdso]"), "[vdso]");
    }

    /// Found by fuzzing: an offset near 2^64 made `place` overflow.
    #[test]
    fn impossible_ranges_and_offsets_are_skipped() {
        let maps = ProcMaps::parse(
            "1000-2000 r-xp ffffffffffffffff 00:00 0 /wraps\n\
             3000-3000 r-xp 00000000 00:00 0 /empty\n\
             5000-4000 r-xp 00000000 00:00 0 /backwards\n\
             6000-7000 r-xp fffffffffffff000 00:00 0 /ends-at-2^64\n\
             8000-9000 r-xp ffffffffffffe000 00:00 0 /below-2^64\n",
        );
        assert_eq!(maps.mappings().len(), 1, "{maps:?}");
        assert_eq!(maps.place(0x1fff), Place::Unmapped { address: 0x1fff });
        assert_eq!(
            maps.place(0x8fff),
            Place::File {
                path: "/below-2^64".into(),
                file_offset: u64::MAX - 0x1000
            }
        );
    }

    #[test]
    fn empty_input() {
        let maps = ProcMaps::parse("");
        assert!(maps.is_empty());
        assert!(maps.find(1).is_none());
        assert_eq!(maps.place(1), Place::Unmapped { address: 1 });
        assert!(maps.data_owner(1).is_none());
    }
}
