//! Cache use (hot and cold fields): on workloads whose use of each cache
//! line is known (tests/workloads/cacheuse.c), the `cache_utilization`
//! array of the report names the object, the share of each line used,
//! the element, the hot and cold fields and the fix, and reports nothing
//! when whole lines are used. The addresses come from the same sampling
//! as the false-sharing detector's (timer samples decoded here, or PEBS
//! and IBS where there are).

use memprof::{
    features::cache::section::{CacheUse, CacheUseEntry},
    report::{model::ObjectKind, Report},
};
use memprof_tests::*;

/// The report's cache-use section (the analysis always writes one, empty
/// when it found nothing).
fn cache_use(report: &Report) -> &[CacheUseEntry] {
    let section = report.sections.find::<CacheUse>();
    &section.expect("a cache_utilization section").0
}

/// How far the share of each line used may be from the truth (the
/// issue's target: ±5 points).
const LINE_USE_TOLERANCE: f64 = 0.05;

/// Launches `cacheuse MODE 3` under the tool (allocator and locks off:
/// the workload has neither) and returns the report.
fn launch(test: &str, mode: &str) -> Report {
    launch_alloc(test, "off", mode)
}

/// As [`launch`], with the allocator traced in `alloc_mode`.
fn launch_alloc(test: &str, alloc_mode: &str, mode: &str) -> Report {
    let w = build_workload("cacheuse", Variant::Debug).expect("building cacheuse");
    let args = [
        "--no-tui",
        "--alloc-mode",
        alloc_mode,
        "--lock-mode",
        "off",
        "--",
        w.to_str().expect("UTF-8"),
        mode,
        "3",
    ];
    let (_, report) = trace(test, &args);
    assert_no_programs_left();
    typed(&report)
}

fn finding<'a>(report: &'a Report, object: &str) -> &'a CacheUseEntry {
    let findings = cache_use(report);
    findings
        .iter()
        .find(|f| f.object == object)
        .unwrap_or_else(|| panic!("no finding on {object}: {findings:#?}"))
}

/// The fields of a finding with sampled accesses, most first.
fn hot_fields(f: &CacheUseEntry) -> Vec<&str> {
    let mut hot: Vec<_> = f.fields.iter().filter(|x| x.accesses > 0).collect();
    hot.sort_by_key(|x| std::cmp::Reverse(x.accesses));
    hot.iter().map(|x| x.name.as_str()).collect()
}

fn assert_line_use(got: f64, truth: f64, f: &CacheUseEntry) {
    assert!(
        (got - truth).abs() <= LINE_USE_TOLERANCE,
        "line use {got} against {truth}: {f:#?}"
    );
}

/// A scan reading the 8-byte key of 64-byte records uses 12.5% of each
/// line: the records are named, the key is the hot field, the payload
/// cold, and the fix moves the payload out.
#[test]
fn a_key_scan_uses_an_eighth_of_each_line() {
    if !require_root("a_key_scan_uses_an_eighth_of_each_line") {
        return;
    }
    let report = launch("cache-records", "records");
    let f = finding(&report, "g_records");
    assert_eq!(f.object_kind, ObjectKind::Global, "{f:#?}");
    assert_eq!(f.element_size, 64, "{f:#?}");
    assert_line_use(f.line_use, 0.125, f);
    assert_eq!(hot_fields(f), ["key"], "{f:#?}");
    assert!(f.accesses >= 100, "{f:#?}");
    // The scan is the same every second: so is each window's line use.
    assert!(f.windows.len() >= 2, "{f:#?}");
    for w in &f.windows {
        assert_line_use(w.line_use, 0.125, f);
    }
    assert!(
        f.advice.contains("payload") && f.advice.contains("separate"),
        "{}",
        f.advice
    );
}

/// The same scan on a malloc'd array: the object is the heap blocks of
/// its allocation line, and the element and its fields come from the
/// pointer declared on that line (`struct record *block = malloc(...)`:
/// its pointee in the debug info).
#[test]
fn a_key_scan_on_the_heap_finds_its_element() {
    if !require_root("a_key_scan_on_the_heap_finds_its_element") {
        return;
    }
    let report = launch_alloc("cache-heap", "full", "heap");
    let findings = cache_use(&report);
    let f = findings
        .iter()
        .find(|f| f.object_kind == ObjectKind::Heap)
        .unwrap_or_else(|| panic!("no heap finding: {findings:#?}"));
    let line = marked_line("cacheuse", "// HEAP_RECORDS");
    assert!(
        f.object
            .starts_with("2097152-byte heap blocks from cacheuse.c:")
            && f.object.ends_with(&format!(":{line}")),
        "{f:#?}"
    );
    assert_eq!(f.element_size, 64, "{f:#?}");
    assert_line_use(f.line_use, 0.125, f);
    assert_eq!(hot_fields(f), ["key"], "{f:#?}");
    let fields: Vec<&str> = f.fields.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(fields, ["key", "payload"], "{f:#?}");
}

/// The same keys in their own array use whole lines: nothing to report.
#[test]
fn keys_in_their_own_array_are_no_finding() {
    if !require_root("keys_in_their_own_array_are_no_finding") {
        return;
    }
    let report = launch("cache-split", "split");
    let findings = cache_use(&report);
    assert!(findings.is_empty(), "whole lines are used: {findings:#?}");
    // Not because nothing was sampled: the keys' loads gave addresses.
    let sampling = &report.sampling;
    assert!(sampling.addresses.with_address >= 100, "{sampling:#?}");
}

/// Two hot fields 56 bytes apart in a 128-byte struct, cold fields
/// around them: 16 of 128 bytes used, on two lines where one would do;
/// the fix puts them together.
#[test]
fn hot_fields_apart_are_moved_together() {
    if !require_root("hot_fields_apart_are_moved_together") {
        return;
    }
    let report = launch("cache-pair", "pair");
    let f = finding(&report, "g_pairs");
    assert_eq!(f.element_size, 128, "{f:#?}");
    assert_line_use(f.line_use, 16.0 / 128.0, f);
    let mut hot = hot_fields(f);
    hot.sort_unstable();
    assert_eq!(hot, ["hot_a", "hot_b"], "{f:#?}");
    assert_eq!((f.lines_per_element, f.packed_lines), (2, 1), "{f:#?}");
    assert!(
        f.affinity
            .iter()
            .any(|(a, b, times)| a == "hot_a" && b == "hot_b" && *times > 0),
        "the two hot fields are accessed together: {f:#?}"
    );
    assert!(
        f.advice.contains("together") && f.advice.contains("instead of 2"),
        "{}",
        f.advice
    );
}
