//! Findings named in the terms of the program's code: a heap block is
//! named by the line that calls the allocation wrapper, never by the
//! wrapper's own allocation line (tests/workloads/wrapper.c: an
//! out-of-line wrapper that adds a 64-byte header; wrapper.h: a `static
//! inline` helper, out of line at -O0 and inlined at -O2). In the default
//! mode, launched and attached.

use memprof::report::{
    model::{ObjectKind, SharingEntry, SharingKind, TraceMode},
    Report,
};
use memprof_tests::*;

/// The workload's own allocation lines, which must name nothing.
fn wrapper_lines() -> [(&'static str, u32); 2] {
    let header = workload_source("wrapper").with_file_name("wrapper.h");
    [
        ("wrapper.c", marked_line("wrapper", "/* WRAPPER_MALLOC */")),
        ("wrapper.h", marked_line_in(&header, "/* HEADER_CALLOC */")),
    ]
}

/// Every place the report names code by file and line, outside call
/// chains (a chain lists the wrapper's frame as what it is: a frame) and
/// the CPU profile (`hot_functions` names each function by its own
/// hottest line: the wrapper, when a sample's stack passes through it,
/// by its malloc call, as happened once in four attached runs here).
fn named_places(v: &serde_json::Value, key: &str, out: &mut Vec<(String, u64)>) {
    match v {
        serde_json::Value::Object(map) => {
            if let (Some(file), Some(line)) = (
                map.get("file").and_then(|f| f.as_str()),
                map.get("line").and_then(|l| l.as_u64()),
            ) {
                out.push((file.to_string(), line));
            }
            for (k, x) in map {
                if k != "chain" && k != "hot_functions" {
                    named_places(x, k, out);
                }
            }
        }
        serde_json::Value::Array(items) if key != "chain" => {
            for x in items {
                named_places(x, key, out);
            }
        }
        _ => {}
    }
}

/// No finding, site or lock of the report or the summary is named by
/// the wrappers' own allocation lines.
fn assert_no_wrapper_line(report: &serde_json::Value, summary: &str) {
    let mut places = Vec::new();
    named_places(report, "", &mut places);
    assert!(!places.is_empty(), "the report names no code at all");
    let text = report.to_string();
    for (file, line) in wrapper_lines() {
        let named: Vec<_> = places
            .iter()
            .filter(|(f, l)| f.ends_with(file) && *l == u64::from(line))
            .collect();
        assert!(named.is_empty(), "named by {file}:{line}: {named:?}");
        let label = format!("{file}:{line}");
        assert!(!text.contains(&label), "the JSON says {label}");
        assert!(
            !findings_of(summary).contains(&label),
            "the summary says {label}:\n{summary}"
        );
    }
}

/// The summary without its hot-functions table (see [`named_places`]).
fn findings_of(summary: &str) -> String {
    let mut in_hot = false;
    let mut out = String::new();
    for line in summary.lines() {
        if line.starts_with("Hot functions") {
            in_hot = true;
        } else if line.is_empty() {
            in_hot = false;
        }
        if !in_hot {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The false-sharing finding on the counters and the allocator's sites
/// are named by the line marked `calls` in main, through `via`; the
/// scratch buffer's line (`scratch`) calls the same wrapper and is a site
/// of its own.
fn assert_named_by_caller(report: &Report, calls: &str, scratch: &str, via: &str) {
    let line = marked_line("wrapper", calls);
    let heap: Vec<&SharingEntry> = report
        .false_sharing
        .iter()
        .filter(|e| e.object.kind == ObjectKind::Heap)
        .collect();
    let found = heap
        .iter()
        .find(|e| e.object.alloc_site.as_ref().and_then(|s| s.line) == Some(line))
        .unwrap_or_else(|| {
            panic!(
                "no heap finding named by wrapper.c:{line}: {:#?}",
                report.false_sharing
            )
        });
    let object = &found.object;
    let alloc_site = object.alloc_site.as_ref();
    assert_eq!(found.kind, SharingKind::False, "{found:#?}");
    assert_eq!(
        alloc_site.map(|s| s.function.as_str()),
        Some("main"),
        "{object:#?}"
    );
    assert_eq!(
        alloc_site.and_then(|s| s.via.as_deref()),
        Some(via),
        "{object:#?}"
    );
    let name = object.name.as_str();
    assert!(
        name.contains(&format!("wrapper.c:{line} via {via}")),
        "{name}"
    );
    // Typed from the pointer the threads write through (`c->hits++`),
    // a variable declared in the worker and assigned from a global set
    // on another line.
    assert_eq!(
        object.type_name.as_deref(),
        Some("struct counters"),
        "{object:#?}"
    );
    assert!(
        name.contains("heap block of struct counters from"),
        "{name}"
    );
    let written: Vec<_> = found.words.iter().filter(|w| w.writes > 0).collect();
    assert!(written.len() >= 2, "both threads' words: {found:#?}");
    for w in written {
        assert_eq!(w.field.as_deref(), Some("hits"), "{found:#?}");
    }
    let sites = &report.allocator.sites;
    for marker in [calls, scratch] {
        let at = marked_line("wrapper", marker);
        let site = sites
            .iter()
            .find(|s| {
                s.line == Some(at) && s.file.as_deref().is_some_and(|f| f.ends_with("wrapper.c"))
            })
            .unwrap_or_else(|| panic!("no allocator site at wrapper.c:{at}: {sites:#?}"));
        assert_eq!(site.function, "main", "{site:#?}");
        assert_eq!(site.via.as_deref(), Some(via), "{site:#?}");
    }
}

/// The report of the run, typed and as the JSON it was written (for
/// [`assert_no_wrapper_line`]), and the summary.
fn launch(test: &str, variant: Variant, mode: &str) -> (Report, serde_json::Value, String) {
    let w = build_workload("wrapper", variant).expect("building wrapper");
    let args = ["--no-tui", "--", w.to_str().expect("UTF-8"), mode, "3"];
    let (run, report) = trace(test, &args);
    assert_no_programs_left();
    (typed(&report), report, run.stdout)
}

/// An out-of-line wrapper that returns its block 64 bytes past a header,
/// at -O0: the kernel passes its frame from the call-frame information.
#[test]
fn a_block_through_a_header_adding_wrapper_is_named_by_its_caller() {
    if !require_root("a_block_through_a_header_adding_wrapper_is_named_by_its_caller") {
        return;
    }
    let (report, json, summary) = launch("naming-header-O0", Variant::Unoptimized, "header");
    assert_eq!(
        report.allocator.mode,
        TraceMode::Sampled,
        "the default mode"
    );
    assert_named_by_caller(
        &report,
        "/* HEADER_CALLS_WRAPPER */",
        "/* SCRATCH_CALLS_WRAPPER */",
        "xalloc_hdr",
    );
    assert_no_wrapper_line(&json, &summary);
}

/// The same, attached with `-p` to the running program before it
/// allocates.
#[test]
fn attached_a_block_through_a_wrapper_is_named_by_its_caller() {
    if !require_root("attached_a_block_through_a_wrapper_is_named_by_its_caller") {
        return;
    }
    let w = build_workload("wrapper", Variant::Unoptimized).expect("building wrapper");
    let run = attach_gated("naming-attached", &[], &w, &["header", "3"], &[]);
    assert!(run.truth.get("iterations") > 0);
    assert_named_by_caller(
        &typed(&run.report),
        "/* HEADER_CALLS_WRAPPER */",
        "/* SCRATCH_CALLS_WRAPPER */",
        "xalloc_hdr",
    );
    assert_no_wrapper_line(&run.report, &run.run.stdout);
    assert_no_programs_left();
}

/// A `static inline` helper in a header: a function of its own at -O0
/// (passed in the kernel), inlined at -O2 (passed over in its inline
/// chain).
#[test]
fn a_static_inline_helper_in_a_header_is_passed_over_at_o0_and_o2() {
    if !require_root("a_static_inline_helper_in_a_header_is_passed_over_at_o0_and_o2") {
        return;
    }
    for (variant, name) in [
        (Variant::Unoptimized, "naming-inline-O0"),
        (Variant::Optimized, "naming-inline-O2"),
    ] {
        let (report, json, summary) = launch(name, variant, "inline");
        assert_named_by_caller(
            &report,
            "/* INLINE_CALLS_WRAPPER */",
            "/* SCRATCH_CALLS_HELPER */",
            "CALLOC",
        );
        assert_no_wrapper_line(&json, &summary);
    }
}

/// A loop calling `malloc` and `free` through its PLT: the samples in the
/// stubs are named `malloc@plt` and `free@plt`, in the program's module.
/// They have no symbol, and were named after the one before them,
/// `_init` (`.init` ends where `.plt` begins): 15% of the samples of this
/// loop under jemalloc on an Intel Xeon VM.
#[test]
fn plt_stubs_are_named_after_the_function_they_call() {
    if !require_root("plt_stubs_are_named_after_the_function_they_call") {
        return;
    }
    let program = build_workload("alloc", Variant::Debug).expect("building alloc");
    let args = [
        "--alloc-mode",
        "off",
        "--lock-mode",
        "off",
        "--no-tui",
        "--",
        program.to_str().expect("UTF-8 path"),
        "loop",
        "100000000",
    ];
    let (_, report) = trace("plt-stubs", &args);
    let report = typed(&report);
    assert!(
        hot_function(&report, "_init").is_none(),
        "PLT samples named after the symbol before them: {:#?}",
        report.hot_functions
    );
    let stubs: Vec<_> = report
        .hot_functions
        .iter()
        .filter(|h| h.function == "malloc@plt" || h.function == "free@plt")
        .collect();
    assert!(
        stubs.iter().map(|h| h.samples).sum::<u64>() > 0,
        "no sample named after a stub: {:#?}",
        report.hot_functions
    );
    assert!(stubs.iter().all(|h| h.module == "alloc"), "{stubs:#?}");
    assert_no_programs_left();
}

/// A program started by a symbolic link beside its file is named by the
/// link, as `ps` and `top` name it: Debian's `redis-server` is a link to
/// `redis-check-rdb`, and every frame of an attached server read
/// `(redis-check-rdb)`. Here `spin`, copied and started through a link
/// of another name in the same directory, is attached to.
#[test]
fn a_program_started_by_a_link_is_named_by_the_link() {
    if !require_root("a_program_started_by_a_link_is_named_by_the_link") {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let (real, link) = (
        workload_dir().join("spin-linked-file"),
        workload_dir().join("spin-by-link"),
    );
    let _ = std::fs::remove_file(&link);
    std::fs::copy(&spin, &real).expect("copying spin");
    std::os::unix::fs::symlink("spin-linked-file", &link).expect("linking");
    let mut target = TestProcess::spawn(&link, &["time", "2", "20"]);
    target.wait_ready();
    let (run, report) = attach_for("started-by-link", &target.pid().to_string(), "2s");
    let hot = hot_function(&report, "spin_worker")
        .unwrap_or_else(|| panic!("spin_worker is named: {:#?}", report.hot_functions));
    assert_eq!(hot.module, "spin-by-link", "{hot:#?}");
    assert!(
        hot.file.as_deref().is_some_and(|f| f.ends_with("spin.c")) && hot.line.is_some(),
        "with its source line: {hot:#?}"
    );
    assert!(!run.stdout.contains("spin-linked-file"), "{}", run.stdout);
    assert_no_programs_left();
}
