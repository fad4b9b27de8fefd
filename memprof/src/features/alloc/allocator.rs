//! Which allocator the target really uses, and where its entry points are.
//!
//! The `malloc` family may live in the executable itself (static binaries),
//! in a preloaded or directly linked allocator (jemalloc, tcmalloc,
//! mimalloc), or in libc. Probing "libc" by name would attach happily and
//! then see nothing in the first two cases, so we look for the object that
//! *defines* `malloc`, the way the dynamic linker resolves it
//! ([`crate::object::symbols`]): the executable first, then other objects,
//! libc last.
//!
//! Names that share an address (`malloc` = `__libc_malloc` = `tc_malloc`,
//! `free` = `_ZdlPv` in mimalloc) are one entry point: probing both would
//! count every call twice.

use std::sync::Arc;

use blazesym::inspect::Inspector;

use crate::{
    object::symbols::{elf_source, entry_points, objects_for_command, objects_of, EntryPoint},
    process::{command::FinalCommand, objects::open_path},
};

/// Allocation functions we look for, by their C names (and the C++
/// operators, which preloaded allocators define themselves): each
/// operation's own symbol (`memprof_common::alloc_op::SYMBOLS`), then
/// its variants (`VARIANTS`).
pub fn entry_point_names() -> Vec<&'static str> {
    use memprof_common::alloc_op::{SYMBOLS, VARIANTS};
    SYMBOLS
        .iter()
        .copied()
        .chain(VARIANTS.iter().map(|&(name, _)| name))
        .collect()
}

/// The allocator implementations we recognize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AllocatorKind {
    Glibc,
    Jemalloc,
    Tcmalloc,
    Mimalloc,
    /// Defines `malloc`, but is none of the above.
    Other,
}

impl AllocatorKind {
    pub fn name(self) -> &'static str {
        match self {
            AllocatorKind::Glibc => "glibc",
            AllocatorKind::Jemalloc => "jemalloc",
            AllocatorKind::Tcmalloc => "tcmalloc",
            AllocatorKind::Mimalloc => "mimalloc",
            AllocatorKind::Other => "unknown",
        }
    }
}

/// The target's allocator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocator {
    /// The object file that defines `malloc`.
    pub path: Arc<str>,
    pub kind: AllocatorKind,
    /// Version, when the file says it.
    pub version: Option<String>,
    /// Entry points, one per distinct address.
    pub entries: Vec<EntryPoint>,
}

impl Allocator {
    /// `glibc 2.36`, `jemalloc 5.3.0`, ...
    pub fn label(&self) -> String {
        match &self.version {
            Some(v) => format!("{} {v}", self.kind.name()),
            None => self.kind.name().to_string(),
        }
    }

    /// The entry point that implements `name`, if the allocator has it.
    pub fn entry(&self, name: &str) -> Option<&EntryPoint> {
        self.entries
            .iter()
            .find(|e| e.names.iter().any(|n| n == name))
    }
}

/// Finds the allocator of process `pid`. `Ok(None)` when no mapped object
/// defines `malloc` (e.g. a program with its own allocator under another
/// name).
pub fn find(pid: u32) -> anyhow::Result<Option<Allocator>> {
    let inspector = Inspector::new();
    for path in objects_of(pid)? {
        if let Some(allocator) = inspect(&inspector, &path)? {
            return Ok(Some(allocator));
        }
    }
    Ok(None)
}

/// Finds the allocator a command will use before it runs (for a launched
/// command, whose process is still our launch gate).
pub fn find_for_command(command: &FinalCommand) -> anyhow::Result<Option<Allocator>> {
    let inspector = Inspector::new();
    for path in objects_for_command(command) {
        if let Some(allocator) = inspect(&inspector, &path)? {
            return Ok(Some(allocator));
        }
    }
    Ok(None)
}

/// The allocator defined in `path`, if it defines `malloc`.
fn inspect(inspector: &Inspector, path: &str) -> anyhow::Result<Option<Allocator>> {
    let Some(entries) = entry_points(inspector, path, &entry_point_names()) else {
        return Ok(None);
    };
    let src = elf_source(path);
    if !entries
        .iter()
        .any(|e| e.names.iter().any(|n| n == "malloc"))
    {
        return Ok(None);
    }
    let markers = inspector
        .lookup(&src, &MARKERS.map(|(name, _)| name))
        .unwrap_or_default();
    let kind = MARKERS
        .iter()
        .zip(&markers)
        .find(|(_, hits)| !hits.is_empty())
        .map_or(AllocatorKind::Other, |((_, kind), _)| *kind);
    let version = version_of(kind, path).or_else(|| {
        // Static glibc has no banner, but keeps the version string in
        // `__nptl_version` (when the binary is not stripped).
        let hits = inspector.lookup(&src, &["__nptl_version"]).ok()?;
        let offset = hits.first()?.iter().find_map(|s| s.file_offset)?;
        read_c_string(path, offset).filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
    });
    Ok(Some(Allocator {
        path: Arc::from(path),
        kind,
        version,
        entries,
    }))
}

/// A NUL-terminated string (at most 64 bytes) at `offset` in `path`.
fn read_c_string(path: &str, offset: u64) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(open_path(path)).ok()?;
    file.seek(SeekFrom::Start(offset)).ok()?;
    let mut buf = [0u8; 64];
    let n = file.read(&mut buf).ok()?;
    let end = buf[..n].iter().position(|&b| b == 0)?;
    String::from_utf8(buf[..end].to_vec()).ok()
}

/// A symbol only each implementation defines.
const MARKERS: [(&str, AllocatorKind); 4] = [
    ("mallctl", AllocatorKind::Jemalloc),
    ("tc_malloc", AllocatorKind::Tcmalloc),
    ("mi_malloc", AllocatorKind::Mimalloc),
    ("__libc_malloc", AllocatorKind::Glibc),
];

/// The version, from what the file says about itself.
fn version_of(kind: AllocatorKind, path: &str) -> Option<String> {
    match kind {
        // The soname carries it: libmimalloc.so.2.0.
        AllocatorKind::Mimalloc => {
            // A mapped file's name has its links resolved (in the target's
            // namespace); a path given for a launch may be a link.
            let given = std::path::Path::new(path);
            let real = if open_path(path) == given {
                std::fs::canonicalize(given).ok()?
            } else {
                given.to_path_buf()
            };
            let name = real.file_name()?.to_str()?;
            name.split_once(".so.").map(|(_, v)| v.to_string())
        }
        AllocatorKind::Glibc | AllocatorKind::Jemalloc | AllocatorKind::Tcmalloc => {
            version_in_text(kind, &std::fs::read(open_path(path)).ok()?)
        }
        AllocatorKind::Other => None,
    }
}

/// Finds the version string an implementation embeds in its binary.
pub fn version_in_text(kind: AllocatorKind, bytes: &[u8]) -> Option<String> {
    let after = |marker: &[u8]| -> Option<&[u8]> {
        let at = bytes.windows(marker.len()).position(|w| w == marker)?;
        Some(&bytes[at + marker.len()..])
    };
    let leading_version = |rest: &[u8]| -> Option<String> {
        let end = rest
            .iter()
            .position(|b| !(b.is_ascii_digit() || *b == b'.'))
            .unwrap_or(rest.len());
        let v = std::str::from_utf8(&rest[..end])
            .ok()?
            .trim_end_matches('.');
        (v.contains('.') && v.starts_with(|c: char| c.is_ascii_digit())).then(|| v.to_string())
    };
    match kind {
        // "... stable release version 2.36."
        AllocatorKind::Glibc => leading_version(after(b"release version ")?),
        // "gperftools 2.10"
        AllocatorKind::Tcmalloc => leading_version(after(b"gperftools ")?),
        // "5.3.0-0-g54eaed1d..." (git describe, as JEMALLOC_VERSION)
        AllocatorKind::Jemalloc => jemalloc_version(bytes),
        AllocatorKind::Mimalloc | AllocatorKind::Other => None,
    }
}

/// jemalloc's version string looks like `5.3.0-0-g<40 hex digits>`
/// (`git describe`): find a `-g` followed by 40 hex digits, preceded by
/// `-N` and a three-part version.
fn jemalloc_version(bytes: &[u8]) -> Option<String> {
    bytes.windows(2).enumerate().find_map(|(at, w)| {
        if w != b"-g" {
            return None;
        }
        let hex = bytes[at + 2..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if hex != 40 {
            return None;
        }
        let head = &bytes[..at];
        let dash = head.iter().rposition(|&b| b == b'-')?;
        if dash + 1 == at || !head[dash + 1..].iter().all(u8::is_ascii_digit) {
            return None;
        }
        let start = head[..dash]
            .iter()
            .rposition(|b| !(b.is_ascii_digit() || *b == b'.'))
            .map_or(0, |p| p + 1);
        let version = std::str::from_utf8(&head[start..dash]).ok()?;
        (version.split('.').count() == 3 && version.split('.').all(|p| !p.is_empty()))
            .then(|| version.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::maps;

    #[test]
    fn versions_from_embedded_text() {
        let glibc =
            b"xx\0GNU C Library (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36.\n\0";
        assert_eq!(
            version_in_text(AllocatorKind::Glibc, glibc).as_deref(),
            Some("2.36")
        );
        assert_eq!(
            version_in_text(AllocatorKind::Tcmalloc, b"\0gperftools 2.10\0").as_deref(),
            Some("2.10")
        );
        let je = b"\0\x015.3.0-0-g54eaed1d8b56b1aa528be3bdd1877e59c56fa90c\0";
        assert_eq!(
            version_in_text(AllocatorKind::Jemalloc, je).as_deref(),
            Some("5.3.0")
        );
        assert_eq!(
            version_in_text(AllocatorKind::Jemalloc, b"1.2-g00\0").as_deref(),
            None
        );
        assert_eq!(version_in_text(AllocatorKind::Glibc, b"nothing here"), None);
        assert_eq!(version_in_text(AllocatorKind::Other, glibc), None);
    }

    /// This test binary links glibc dynamically: its allocator is glibc's,
    /// found in libc, with malloc and free at different offsets.
    #[test]
    fn finds_glibc_in_this_process() {
        let a = find(std::process::id()).unwrap().expect("an allocator");
        assert_eq!(a.kind, AllocatorKind::Glibc, "{a:?}");
        assert!(
            maps::short_name(&a.path).starts_with("libc.so"),
            "{}",
            a.path
        );
        assert!(
            a.version.as_deref().is_some_and(|v| v.starts_with("2.")),
            "{a:?}"
        );
        let (malloc, free) = (a.entry("malloc").unwrap(), a.entry("free").unwrap());
        assert_ne!(malloc.file_offset, free.file_offset);
        let mut offsets: Vec<u64> = a.entries.iter().map(|e| e.file_offset).collect();
        offsets.dedup();
        assert_eq!(offsets.len(), a.entries.len(), "one entry per address");
    }
}
