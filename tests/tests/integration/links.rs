//! How the hot uprobes (allocator and lock functions) are linked: one
//! `uprobe_multi` link per program on kernels that have them (6.6+), so
//! that a window's detach costs one grace period per program instead of
//! one per probed function; single links otherwise, or when asked, with
//! the same findings.
//!
//! Each test runs the real tool on the `alloc` workload, watches what the
//! kernel has attached with bpftool while it runs, and checks the report
//! and that nothing is left loaded.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memprof::report::{model::AllocOp, Report};
use memprof_tests::*;
use workloads::{build_workload, Variant};

/// Our hot uprobe programs: the allocator's and the lock functions'.
const HOT: [&str; 5] = [
    "mp_alloc_enter",
    "mp_alloc_exit",
    "mp_lock_enter",
    "mp_lock_exit",
    "mp_unlock",
];

/// Whether this kernel has `uprobe_multi` links (6.6 and later).
fn kernel_has_uprobe_multi() -> Option<bool> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next()?.parse().ok()?;
    Some((major, minor) >= (6, 6))
}

/// Runs the tool on `alloc hold 10` in full allocator and lock modes for
/// 3 s with `env`, and returns the report and every attachment of our hot
/// programs seen while it ran, one list per look.
fn watch(name: &str, env: &[(&str, &str)]) -> (Report, Vec<Vec<Attached>>) {
    let alloc = build_workload("alloc", Variant::Debug).expect("building alloc");
    let json = report_path(name);
    let tool = Command::new(tool())
        .args([
            "--alloc-mode",
            "full",
            "--lock-mode",
            "full",
            "--no-tui",
            "--duration",
            "3s",
            "--json",
        ])
        .arg(&json)
        .arg("--")
        .arg(&alloc)
        .args(["hold", "10"])
        // The calibration's links (on the tool's own code) stay until the
        // end in full mode: only the session's are counted here.
        .env("MEMPROF_ALLOC_CALIBRATION", "off")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting memprof-ebpf");
    let (start, tool_pid) = (Instant::now(), tool.id());
    let mut looks = Vec::new();
    while_running(tool_pid, Duration::from_secs(30), || {
        let hot: Vec<Attached> = attached_programs(tool_pid)
            .into_iter()
            .filter(|a| HOT.contains(&a.name.as_str()))
            .collect();
        looks.push(hot);
    });
    let run = finish(tool, start, Duration::from_secs(60));
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    (read_typed(&json), looks)
}

fn malloc_traced(report: &Report) -> u64 {
    report
        .allocator
        .ops
        .iter()
        .filter(|o| o.op == AllocOp::Malloc)
        .map(|o| o.traced)
        .sum()
}

/// Proves the hot probes are one `uprobe_multi` link per program: while
/// the allocator's nine entry points and the twenty lock probe points are
/// attached, bpftool sees at most five links of ours (two allocator, three
/// lock programs), all of that type, and the report says so.
#[test]
fn hot_probes_are_one_uprobe_multi_link_per_program() {
    let test = "hot_probes_are_one_uprobe_multi_link_per_program";
    if !require_root(test) {
        return;
    }
    match kernel_has_uprobe_multi() {
        Some(true) => {}
        Some(false) => {
            return skip(test, "the kernel is older than 6.6: no uprobe_multi links");
        }
        None => return skip(test, "cannot read the kernel's release"),
    }
    let (report, looks) = watch("links-multi", &[]);
    let all: Vec<&Attached> = looks.iter().flatten().collect();
    assert!(
        all.iter().any(|a| a.name == "mp_alloc_enter") && all.iter().any(|a| a.name == "mp_unlock"),
        "the hot programs were never seen attached, so this check sees nothing: {all:?}"
    );
    let other: Vec<_> = all
        .iter()
        .filter(|a| a.how != "link uprobe_multi")
        .collect();
    assert!(
        other.is_empty(),
        "hot probes not linked by uprobe_multi: {other:?}"
    );
    let most = looks.iter().map(Vec::len).max().unwrap_or(0);
    assert!(
        most <= HOT.len(),
        "{most} links at once for {} programs: {looks:?}",
        HOT.len()
    );
    assert_eq!(
        report.loader.uprobe_links.as_ref().map(|l| l.kind.as_str()),
        Some("uprobe_multi"),
        "{:#?}",
        report.loader
    );
    assert!(malloc_traced(&report) > 1000, "{:#?}", report.allocator);
    assert_no_programs_left();
}

/// Proves the fallback: with `MEMPROF_UPROBE_LINKS=single` (what kernels
/// before 6.6 get) every probe point is a link of its own, the report says
/// why, and the allocator is still traced.
#[test]
fn single_links_are_the_fallback() {
    if !require_root("single_links_are_the_fallback") {
        return;
    }
    let (report, looks) = watch("links-single", &[("MEMPROF_UPROBE_LINKS", "single")]);
    let all: Vec<&Attached> = looks.iter().flatten().collect();
    assert!(
        all.iter().any(|a| a.name == "mp_alloc_enter"),
        "the allocator's programs were never seen attached: {all:?}"
    );
    assert!(
        all.iter().all(|a| a.how != "link uprobe_multi"),
        "uprobe_multi links although single links were asked for: {all:?}"
    );
    // One link per probe point: far more than one per program.
    let most = looks.iter().map(Vec::len).max().unwrap_or(0);
    assert!(most > HOT.len(), "only {most} links at once: {looks:?}");
    let links = report.loader.uprobe_links.as_ref();
    assert_eq!(links.map(|l| l.kind.as_str()), Some("single"), "{links:#?}");
    assert!(
        links
            .and_then(|l| l.why.as_deref())
            .is_some_and(|w| w.contains("MEMPROF_UPROBE_LINKS")),
        "{links:#?}"
    );
    assert!(malloc_traced(&report) > 1000, "{:#?}", report.allocator);
    assert_no_programs_left();
}
