//! The allocator's share of the target's CPU time, from the CPU samples
//! the session takes anyway (no probe, no extra cost): every mode, also
//! when the allocator's probes are in windows or off.
//!
//! A sample is the allocator's when the instruction it landed on is
//! allocator code: any function of the allocator's own object
//! (jemalloc, tcmalloc, mimalloc), or, inside glibc, a function of its
//! `malloc/` sources (by debug info) or named as one. Samples in the
//! kernel (the allocator's syscalls and page faults, and the probes' own
//! traps) are not counted: the syscalls are reported apart.
//!
//! Pure: over the report's hot functions.

use memprof_common::alloc_op;

use super::allocator::AllocatorKind;
use crate::report::model::{AllocOp, AllocatorCpu, AllocatorFunctionCpu, HotFunctionEntry};

/// glibc's internal allocator functions, for a libc without debug info
/// (the entry points themselves are known by [`entry_op`]): whole
/// families by prefix, and single functions.
const GLIBC_MALLOC_PREFIXES: [&str; 2] = ["_int_", "tcache_"];
const GLIBC_MALLOC_INTERNALS: [&str; 4] = [
    "malloc_consolidate",
    "sysmalloc",
    "unlink_chunk",
    "arena_get",
];

/// The allocator's CPU share among `hot` (the report's hottest
/// functions), for an allocator of `kind` defined in `module`.
pub fn cpu_share(
    hot: &[HotFunctionEntry],
    kind: AllocatorKind,
    module: &str,
    samples: u64,
) -> Option<AllocatorCpu> {
    if samples == 0 {
        return None;
    }
    let functions: Vec<AllocatorFunctionCpu> = hot
        .iter()
        .filter(|h| {
            h.samples > 0
                && h.module == module
                && is_allocator_code(&h.function, h.file.as_deref(), kind)
        })
        .map(|h| AllocatorFunctionCpu {
            function: h.function.clone(),
            op: entry_op(&h.function).map(AllocOp::from_code),
            samples: h.samples,
            share: h.samples as f64 / samples as f64,
        })
        .collect();
    let in_allocator: u64 = functions.iter().map(|f| f.samples).sum();
    Some(AllocatorCpu {
        samples: in_allocator,
        share: in_allocator as f64 / samples as f64,
        functions,
        ..AllocatorCpu::default()
    })
}

/// Whether `function` (of source `file`) in the allocator's object is
/// allocator code.
pub fn is_allocator_code(name: &str, file: Option<&str>, kind: AllocatorKind) -> bool {
    if kind != AllocatorKind::Glibc {
        return true; // the whole object is the allocator
    }
    let in_malloc_sources = file.is_some_and(|f| f.contains("/malloc/"));
    in_malloc_sources
        || entry_op(name).is_some()
        || GLIBC_MALLOC_PREFIXES.iter().any(|p| name.starts_with(p))
        || GLIBC_MALLOC_INTERNALS.contains(&name)
}

/// The operation a function is the entry point of (glibc's internal
/// names of them included).
fn entry_op(function: &str) -> Option<u32> {
    let name = ["__GI___libc_", "__libc_"]
        .iter()
        .find_map(|p| function.strip_prefix(p))
        .unwrap_or(function);
    alloc_op::of_symbol(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot(function: &str, file: Option<&str>, module: &str, samples: u64) -> HotFunctionEntry {
        HotFunctionEntry {
            function: function.into(),
            file: file.map(Into::into),
            line: None,
            module: module.into(),
            samples,
            share: 0.0,
            total_samples: samples,
            total_share: 0.0,
        }
    }

    #[test]
    fn jemalloc_is_its_whole_object() {
        let hot = [
            hot("malloc", None, "libjemalloc.so.2", 229),
            hot("dictFind", None, "redis-server", 198),
            hot("free", None, "libjemalloc.so.2", 99),
            hot("je_arena_ralloc", None, "libjemalloc.so.2", 10),
            hot("memcpy", None, "libc.so.6", 35),
        ];
        let cpu = cpu_share(&hot, AllocatorKind::Jemalloc, "libjemalloc.so.2", 1000).unwrap();
        assert_eq!(cpu.samples, 338);
        assert!((cpu.share - 0.338).abs() < 1e-9);
        let ops: Vec<_> = cpu.functions.iter().map(|f| f.op).collect();
        assert_eq!(ops, [Some(AllocOp::Malloc), Some(AllocOp::Free), None]);
    }

    #[test]
    fn in_glibc_only_its_malloc_code() {
        let hot = [
            hot(
                "__GI___libc_malloc",
                Some("./malloc/malloc.c"),
                "libc.so.6",
                4,
            ),
            hot("_int_free", None, "libc.so.6", 2),
            hot(
                "__memcpy_avx_unaligned_erms",
                Some("./string/memmove.S"),
                "libc.so.6",
                35,
            ),
            hot(
                "__libc_start_call_main",
                Some("./csu/main.h"),
                "libc.so.6",
                3,
            ),
            hot("main", Some("alloc.c"), "alloc", 5),
        ];
        let cpu = cpu_share(&hot, AllocatorKind::Glibc, "libc.so.6", 100).unwrap();
        let names: Vec<_> = cpu.functions.iter().map(|f| f.function.as_str()).collect();
        assert_eq!(names, ["__GI___libc_malloc", "_int_free"]);
        assert_eq!(cpu.functions[0].op, Some(AllocOp::Malloc));
        assert_eq!(cpu.samples, 6);
    }

    #[test]
    fn nothing_in_the_allocator_is_zero_and_no_samples_unknown() {
        let hot = [hot("spin", Some("spin.c"), "spin", 900)];
        let cpu = cpu_share(&hot, AllocatorKind::Glibc, "libc.so.6", 1000).unwrap();
        assert_eq!((cpu.samples, cpu.share), (0, 0.0));
        assert!(cpu_share(&hot, AllocatorKind::Glibc, "libc.so.6", 0).is_none());
    }
}
