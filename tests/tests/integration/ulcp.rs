//! Unnecessary lock contention (PerfPlay's classes): on a workload with
//! one contended lock per class (tests/workloads/ulcp.c: null-lock,
//! read-read, disjoint-write, benign, true), each lock's
//! `unnecessary` entry names the right class, the data behind it and the
//! section's source line, and the lock whose waits are needed is never
//! called unnecessary. The classes rest on the data addresses the CPU
//! sampler recovers inside the critical sections the lock uprobes see.

use memprof::report::{
    model::{ContentionClass, LockEntry, Unnecessary},
    Report,
};
use memprof_tests::*;

/// The workload's locks, the class each must get, and the marker of its
/// lock call.
const LOCKS: [(&str, ContentionClass, &str); 5] = [
    ("g_null_lock", ContentionClass::Null, "LOCK_NULL"),
    ("g_table_lock", ContentionClass::ReadRead, "LOCK_TABLE"),
    ("g_slots_lock", ContentionClass::DisjointWrite, "LOCK_SLOTS"),
    ("g_flag_lock", ContentionClass::Benign, "LOCK_FLAG"),
    ("g_counter_lock", ContentionClass::True, "LOCK_COUNTER"),
];

/// The confidence a claim of a lock traced in full for 5 s must reach
/// (measured 0.87–1.0 at -O0, -O1, -O2; 0.5 is where the report calls a claim
/// weak).
const MIN_CONFIDENCE: f64 = 0.5;

fn lock<'a>(report: &'a Report, name: &str) -> &'a LockEntry {
    report
        .locks
        .iter()
        .find(|l| l.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("no lock {name} in {:#?}", report.locks))
}

fn verdict<'a>(report: &'a Report, name: &str) -> &'a Unnecessary {
    let l = lock(report, name);
    l.unnecessary
        .as_ref()
        .unwrap_or_else(|| panic!("{name} has no unnecessary-contention verdict: {l:#?}"))
}

/// The shared words named in the evidence of a verdict.
fn words(u: &Unnecessary) -> Vec<String> {
    u.evidence
        .iter()
        .flat_map(|e| e.shared_words.iter().cloned())
        .collect()
}

/// The section of a verdict's first evidence ("" when there is none).
fn first_section(u: &Unnecessary) -> &str {
    u.evidence.first().map_or("", |e| e.section.as_str())
}

/// Launches `ulcp 5 4 MODE` built as `variant` with every lock call
/// traced (allocator off: the workload allocates once per thread).
fn launch(test: &str, variant: Variant, mode: &str) -> Report {
    let w = build_workload("ulcp", variant).expect("building ulcp");
    // The verdicts' confidence grows with the sampled accesses inside
    // each lock's sections, and how many land in the read-only table's
    // short sections depends on the CPU: on a Xeon of this machine kind
    // (AVX-512, 2 vCPUs) 999 Hz gave 26 of them (4 on the less sampled
    // side, confidence 0.18-0.22, "weak"), where earlier machines gave
    // enough; 9999 Hz gave 0.87-0.94 at -O0 and -O2, nothing lost.
    let args = [
        "--no-tui",
        "--alloc-mode",
        "off",
        "--lock-mode",
        "full",
        "--sample-freq",
        "9999",
        "--",
        w.to_str().expect("UTF-8"),
        "5",
        "4",
        mode,
    ];
    let (_, report) = trace(test, &args);
    assert_no_programs_left();
    typed(&report)
}

/// Every lock of the workload has its class, with the evidence that
/// makes it: the right shared words, none for the null lock, the lock
/// call's source line, and a confident claim.
fn assert_classes(report: &Report) {
    for (name, class, marker) in LOCKS {
        // Every wait named: a site hint that hashed a caller's data made
        // each call a new site, and those no sample named ("[unmapped]",
        // and the lock then taken for a bare futex with no verdict).
        let waiters = &lock(report, name).waiters;
        let unnamed: u64 = waiters
            .iter()
            .filter(|w| w.line.is_none())
            .map(|w| w.count)
            .sum();
        assert_eq!(unnamed, 0, "{name}: waits at unnamed sites: {waiters:#?}");
        let u = verdict(report, name);
        assert_eq!(u.class, class, "{name}: {u:#?}");
        let confidence = u.confidence;
        assert!(confidence >= MIN_CONFIDENCE, "{name}: weak claim {u:#?}");
        let line = format!("ulcp.c:{}", marked_line("ulcp", marker));
        let section = first_section(u);
        assert!(
            section.contains(&line),
            "{name}: section {section} is not at {line}"
        );
        let words = words(u);
        let wasted = u.wasted_wait_ns;
        match class {
            ContentionClass::Null => assert!(words.is_empty(), "{name} touched shared {words:?}"),
            ContentionClass::True => {
                assert_eq!(wasted, 0, "{name}: {u:#?}");
                assert!(words.iter().any(|w| w == "g_counter"), "{name}: {words:?}");
            }
            _ => {
                let data = match class {
                    ContentionClass::ReadRead => "g_table",
                    ContentionClass::Benign => "g_flag",
                    _ => "g_slots",
                };
                assert!(
                    !words.is_empty() && words.iter().all(|w| w.starts_with(data)),
                    "{name}: shared words {words:?}, not {data}'s"
                );
                assert!(wasted > 0, "{name}: no waste in {u:#?}");
            }
        }
        if class != ContentionClass::True {
            let share = u.wasted_share;
            assert!(
                share > 0.9,
                "{name}: only {share} of the waits unnecessary: {u:#?}"
            );
        }
    }
}

/// The five locks at -O1, each traced in full.
#[test]
fn each_lock_gets_its_class() {
    if !require_root("each_lock_gets_its_class") {
        return;
    }
    let report = launch("ulcp-classes", Variant::Debug, "all");
    assert_classes(&report);
}

/// The same classes when the sections' code keeps every variable in
/// memory (-O0: stack accesses inside the sections, which are private)
/// and when registers carry values across statements (-O2).
#[test]
fn classes_hold_at_o0_and_o2() {
    if !require_root("classes_hold_at_o0_and_o2") {
        return;
    }
    for (variant, test) in [
        (Variant::Unoptimized, "ulcp-classes-O0"),
        (Variant::Optimized, "ulcp-classes-O2"),
    ] {
        let report = launch(test, variant, "all");
        assert_classes(&report);
    }
}

/// Only the lock whose sections conflict is taken: it is contended, its
/// waits are needed, and nothing is called unnecessary.
#[test]
fn needed_contention_is_not_called_unnecessary() {
    if !require_root("needed_contention_is_not_called_unnecessary") {
        return;
    }
    let report = launch("ulcp-true", Variant::Debug, "true");
    let u = verdict(&report, "g_counter_lock");
    assert_eq!(u.class, ContentionClass::True, "{u:#?}");
    assert_eq!(u.wasted_wait_ns, 0, "{u:#?}");
    for l in &report.locks {
        assert!(
            l.unnecessary
                .as_ref()
                .is_none_or(|u| u.class == ContentionClass::True),
            "{:?} called unnecessary: {l:#?}",
            l.name
        );
    }
}

/// Attached in the default mode for 20 s (#33's bar): at least 4 of the 5
/// locks get their class, from the futex waits that show their holders'
/// sections and the lock calls traced in windows (1.5% of the time).
/// Few samples fall in each section, so a verdict may rest on a handful
/// and then says it is weak: a wrong one must say so. Where futex waits
/// are traced at the syscalls (no waker's thread, so no holder's
/// section), verdicts need `--lock-mode full`: then at least a note says
/// why they are missing. Measured by hand (session 55, once an owner's
/// release to a waiter not yet asleep was counted): 5 of 5 in 9 runs.
#[test]
fn attached_default_mode_gets_the_classes() {
    const TEST: &str = "attached_default_mode_gets_the_classes";
    if !require_root(TEST) {
        return;
    }
    let w = build_workload("ulcp", Variant::Debug).expect("building ulcp");
    let run = attach_gated("ulcp-attached", &[], &w, &["20", "4"], &[]);
    let report = typed(&run.report);
    let mut verdicts = 0;
    let mut right = Vec::new();
    for (name, class, _) in LOCKS {
        let Some(u) = &lock(&report, name).unnecessary else {
            continue;
        };
        verdicts += 1;
        if u.class == class {
            right.push(name);
            continue;
        }
        assert!(
            u.confidence < MIN_CONFIDENCE && u.confidence_basis.starts_with("weak"),
            "{name}: confidently wrong: {u:#?}"
        );
    }
    let hooks = report.lock_contention.as_ref().map(|c| c.hooks.as_str());
    if hooks == Some("sched") {
        assert!(
            right.len() >= 4,
            "only {right:?} got their class: {:#?}",
            report.locks
        );
        return;
    }
    eprintln!(
        "SKIP part of {TEST}: futex waits traced at the syscalls here ({hooks:?}), which show \
         no holder's section; checking only that verdicts come or a note says why"
    );
    assert!(
        verdicts >= 2
            || report
                .notes
                .iter()
                .any(|n| n.contains("no unnecessary-contention verdict")),
        "no verdict and no note saying why: {:#?}",
        report.locks
    );
}

/// With no lock call traced (`--lock-mode off`: no lock uprobe at all),
/// the futex waits alone show the holders' sections: a waiter's sleep
/// names the lock's owner (glibc's `__owner`), and when that owner's
/// wake ends the wait with no other release in between, its CPU samples
/// in the wait fell in its section. 20 s of the five locks: at least 4
/// of 5 get their class from that evidence, and the lock whose waits are
/// needed is never called unnecessary, and the sections are named by the
/// line that released the lock (before: "the holders' sections while
/// others slept on the lock", which says nothing of where they are). Run
/// without the lock uprobes so that a pass cannot come from the windowed
/// lock calls.
#[test]
fn futex_waits_alone_give_the_classes() {
    if !require_root("futex_waits_alone_give_the_classes") {
        return;
    }
    let w = build_workload("ulcp", Variant::Debug).expect("building ulcp");
    let args = [
        "--no-tui",
        "--alloc-mode",
        "off",
        "--lock-mode",
        "off",
        "--",
        w.to_str().expect("UTF-8"),
        "20",
        "4",
    ];
    let (_, report) = trace("ulcp-futex-waits", &args);
    assert_no_programs_left();
    let report = typed(&report);
    let contention = match &report.lock_contention {
        Some(c) if c.hooks == "sched" => c,
        other => {
            eprintln!(
                "SKIP futex_waits_alone_give_the_classes: futex waits are traced at the syscalls \
                 here ({:?}), which do not see the waker's thread: {:#?}",
                report
                    .loader
                    .futex_hooks
                    .as_ref()
                    .and_then(|h| h.why.as_deref()),
                other
            );
            return;
        }
    };
    assert!(
        contention.waits_as_sections > 0,
        "no wait was given as its holder's section: {contention:#?}"
    );
    let mut right = Vec::new();
    for (name, class, _) in LOCKS {
        let Some(u) = &lock(&report, name).unnecessary else {
            continue;
        };
        let section = first_section(u);
        assert!(
            section.contains("futex waits"),
            "{name}: evidence not from the waits: {u:#?}"
        );
        // Named by where the holders released the lock, in the source.
        assert!(
            section.starts_with("the holders' sections (the lock's top release: ")
                && section.contains("ulcp.c:"),
            "{name}: the sections are not named by their release: {u:#?}"
        );
        if name == "g_counter_lock" {
            assert_eq!(
                u.class,
                ContentionClass::True,
                "needed waits called unnecessary: {u:#?}"
            );
        }
        if u.class == class {
            right.push(name);
        }
    }
    assert!(
        right.len() >= 4,
        "only {right:?} got their class: {:#?}",
        report.locks
    );
}
