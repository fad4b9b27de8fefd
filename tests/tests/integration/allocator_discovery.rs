//! Finding the target's allocator: the object that really defines
//! `malloc`, its kind and version, and its entry points (one per address).
//! Needs no root: it reads /proc and the ELF files.

use memprof::features::alloc::allocator::{self, Allocator, AllocatorKind};
use memprof_tests::*;

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The allocator of `spin` built as `variant`, with `preload` (a library
/// file name in LIBDIR) in LD_PRELOAD.
fn allocator_of(variant: Variant, preload: Option<&str>) -> Allocator {
    let spin = build_workload("spin", variant).unwrap();
    let preload = preload.map(|lib| format!("{LIBDIR}/{lib}"));
    let env: Vec<(&str, &str)> = preload.iter().map(|p| ("LD_PRELOAD", p.as_str())).collect();
    let mut target = TestProcess::spawn_env(&spin, &["time", "1", "5"], &env);
    target.wait_ready();
    allocator::find(target.pid())
        .unwrap()
        .expect("an object defining malloc")
}

/// Checks what every allocator must have, and returns its version.
fn check(a: &Allocator, kind: AllocatorKind, file: &str) -> String {
    assert_eq!(a.kind, kind, "{a:#?}");
    // The maps name the real file (libmimalloc.so.2.0 for libmimalloc.so.2).
    assert!(a.path.contains(file), "path {} should name {file}", a.path);
    let (malloc, free) = (
        a.entry("malloc").expect("malloc"),
        a.entry("free").expect("free"),
    );
    assert_ne!(malloc.file_offset, free.file_offset);
    let mut offsets: Vec<u64> = a.entries.iter().map(|e| e.file_offset).collect();
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(
        offsets.len(),
        a.entries.len(),
        "aliases must share one entry: {a:#?}"
    );
    let version = a
        .version
        .clone()
        .unwrap_or_else(|| panic!("no version for {a:#?}"));
    assert!(
        version.split('.').count() >= 2 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "version {version:?}"
    );
    version
}

#[test]
fn glibc_by_default() {
    let a = allocator_of(Variant::Debug, None);
    check(&a, AllocatorKind::Glibc, "libc.so.6");
    assert!(a.entry("calloc").is_some() && a.entry("realloc").is_some());
    // libstdc++'s operator new calls malloc; it is not glibc's to define.
    assert!(a.entry("_Znwm").is_none());
}

#[test]
fn preloaded_jemalloc_wins_over_libc() {
    let a = allocator_of(Variant::Debug, Some("libjemalloc.so.2"));
    let v = check(&a, AllocatorKind::Jemalloc, "libjemalloc.so.2");
    assert!(v.starts_with("5."), "jemalloc {v}");
}

#[test]
fn preloaded_tcmalloc_wins_over_libc() {
    let a = allocator_of(Variant::Debug, Some("libtcmalloc_minimal.so.4"));
    check(&a, AllocatorKind::Tcmalloc, "libtcmalloc_minimal.so.4");
    // tcmalloc defines the C++ operators itself: they must be probed too.
    assert!(a.entry("_Znwm").is_some(), "{a:#?}");
}

#[test]
fn preloaded_mimalloc_wins_over_libc_and_groups_aliases() {
    let a = allocator_of(Variant::Debug, Some("libmimalloc.so.2"));
    check(&a, AllocatorKind::Mimalloc, "libmimalloc.so.2");
    // mimalloc's operator delete is its free: one entry, both names.
    let free = a.entry("free").unwrap();
    assert!(free.names.iter().any(|n| n == "_ZdlPv"), "{free:?}");
}

#[test]
fn a_static_binary_is_its_own_allocator() {
    let a = allocator_of(Variant::Static, None);
    check(&a, AllocatorKind::Glibc, "spin-static");
}
