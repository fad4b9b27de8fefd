//! The "Allocator" section, and the helpers the dashboard's Allocator
//! tab shares with it.

use std::fmt::Write as _;

use crate::report::{
    format::{
        ellipsize, format_bytes, format_measured, format_median, format_ns, group, maybe, percent,
    },
    model::source_label,
    model::{
        AllocOp, AllocatorCpu, AllocatorReport, BlockOrigin, HeapProfileReport, LatencyBasis,
        MemoryReport, OpStats, SiteEntry, SyscallStats, TraceMode, UntracedCostReport,
    },
};

/// Allocator splits (op, class, origin, phase) listed in the summary.
const TOP_OPS: usize = 8;
/// Syscall rows listed in the summary.
const TOP_SYSCALLS: usize = 6;
/// Allocation sites listed in the summary.
const TOP_SITES: usize = 5;

/// The "Allocator" section: library and mode, latency per split,
/// syscalls, memory composition, top sites and kernel-side cost.
pub(super) fn write_allocator(out: &mut String, a: &AllocatorReport) {
    if allocator_off(a) {
        let _ = writeln!(out, "Allocator: not traced (--alloc-mode off)");
        return;
    }
    if a.library.is_none() {
        let _ = writeln!(out, "Allocator: no allocator found in the target");
        return;
    }
    let _ = writeln!(out, "Allocator: {}", library_label(a));
    write_allocator_mode(out, a);
    write_cpu(out, a.cpu.as_ref());
    write_untraced(out, a.untraced_ns.as_ref());
    write_ops(
        out,
        &a.ops,
        a.probe_cost_ns.as_ref().map(|c| c.resolution_ns),
    );
    write_syscalls(out, &a.syscalls);
    write_kernel_work(out, &a.ops);
    write_memory(out, a.memory.as_ref());
    write_sites(out, &a.sites);
    write_heap_sites(out, a.heap_profile.as_ref());
    write_kernel(out, a);
}

/// How the allocator was traced, and how much was traced and lost.
fn write_allocator_mode(out: &mut String, a: &AllocatorReport) {
    let mode = match a.mode {
        TraceMode::Full => "full: every call traced".to_string(),
        TraceMode::Sampled => format!(
            "sampled: probes attached {:.1}% of the time",
            a.traced_fraction * 100.0
        ),
        other => other.name().to_string(),
    };
    let estimates = if a.sampled {
        "; counts are estimates"
    } else {
        ""
    };
    let _ = writeln!(out, "  mode {mode}{estimates}");
    if a.sampled && !a.always_traced.is_empty() {
        let _ = writeln!(
            out,
            "  always traced (rare, exact counts): {}",
            names(&a.always_traced)
        );
    }
    let mut line = format!(
        "  {} calls traced · {} lost",
        group(a.calls_traced),
        group(a.lost)
    );
    if !a.large_rule.is_empty() {
        let _ = write!(line, " · large = {}", a.large_rule);
    }
    let _ = writeln!(out, "{line}");
}

/// Latency of the busiest splits.
/// The allocator's share of the CPU samples, with its hottest functions.
fn write_cpu(out: &mut String, cpu: Option<&AllocatorCpu>) {
    let Some(cpu) = cpu else { return };
    let top: Vec<String> = cpu
        .functions
        .iter()
        .take(2)
        .map(|f| format!("{} {:.1}%", f.function, f.share * 100.0))
        .collect();
    let _ = writeln!(
        out,
        "  CPU in its code: {:.1}% of samples ({}){}",
        cpu.share * 100.0,
        group(cpu.samples),
        if top.is_empty() {
            String::new()
        } else {
            format!(": {}", top.join(", "))
        }
    );
    if cpu.site_samples == 0 {
        return;
    }
    let sites: Vec<String> = cpu
        .sites
        .iter()
        .take(3)
        .map(|s| {
            let at = source_label(s.site.file.as_deref(), s.site.line, &s.site.function);
            let via = s
                .site
                .via
                .as_ref()
                .map(|v| format!(" via {v}"))
                .unwrap_or_default();
            format!("{at}{via} {:.0}%", s.share * 100.0)
        })
        .collect();
    let unknown = cpu.sites_unknown as f64 / cpu.site_samples as f64;
    let _ = writeln!(
        out,
        "    for the calls at: {}{}",
        if sites.is_empty() {
            "no site found".to_string()
        } else {
            sites.join(", ")
        },
        if unknown >= 0.005 {
            format!(" (not unwound {:.0}%)", unknown * 100.0)
        } else {
            String::new()
        }
    );
}

/// The allocator's cost per call without probes.
fn write_untraced(out: &mut String, u: Option<&UntracedCostReport>) {
    let Some(u) = u else { return };
    let _ = writeln!(
        out,
        "  untraced cost (timed loop, {} B): malloc {:.0} ns · free {:.0} ns · calloc {:.0} ns \
         · malloc+free pair {:.0} ns",
        u.size, u.malloc_ns, u.free_ns, u.calloc_ns, u.pair_ns
    );
}

/// The latency table: the median (`~N` when it is the untraced loop's),
/// p99 and max of each split, busiest first. The mean is in the JSON and
/// the dashboard (80 columns leave room for three).
fn write_ops(out: &mut String, ops: &[OpStats], resolution: Option<u64>) {
    if ops.is_empty() {
        let _ = writeln!(out, "  no allocator calls traced");
        return;
    }
    let _ = writeln!(
        out,
        "    {:<17} {:<7} {:<6} {:<8} {:>9} {:>7} {:>7} {:>7}",
        "op", "class", "origin", "phase", "count", "p50", "p99", "max"
    );
    let mut by_count: Vec<&OpStats> = ops.iter().collect();
    by_count.sort_by_key(|op| std::cmp::Reverse((op.count, op.traced)));
    for op in by_count.iter().take(TOP_OPS) {
        let _ = writeln!(
            out,
            "    {} {:>9} {:>7} {:>7} {:>7}",
            split_label(op),
            maybe(op.count, group),
            format_median(op.p50_ns, from_loop(op), resolution),
            format_measured(op.p99_ns, resolution),
            format_measured(op.max_ns, resolution),
        );
    }
    if ops.len() > TOP_OPS {
        let _ = writeln!(out, "    … {} more in the JSON report", ops.len() - TOP_OPS);
    }
}

/// Whether the split's median is the untraced loop's.
pub fn from_loop(op: &OpStats) -> bool {
    op.p50_basis == Some(LatencyBasis::UntracedLoop)
}

/// A split's operation, class, origin and phase, in the tables' columns.
fn split_label(o: &OpStats) -> String {
    format!(
        "{:<17} {:<7} {:<6} {:<8}",
        ellipsize(o.op.name(), 17),
        ellipsize(o.class.name(), 7),
        ellipsize(o.origin.map_or("-", BlockOrigin::name), 6),
        ellipsize(o.phase.name(), 8),
    )
}

/// Rows of the kernel work inside calls listed in the summary.
const TOP_KERNEL_SPLITS: usize = 4;

/// The syscalls and page faults inside the traced calls, by latency split
/// (the research design's keys), the most syscall time first.
fn write_kernel_work(out: &mut String, ops: &[OpStats]) {
    let mut rows: Vec<&OpStats> = ops
        .iter()
        .filter(|o| o.syscalls > 0 || o.page_faults > 0)
        .collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by_key(|o| std::cmp::Reverse((o.syscall_ns, o.page_faults)));
    let _ = writeln!(
        out,
        "    {:<17} {:<7} {:<6} {:<8} {:>9} {:>9} {:>9}",
        "inside", "class", "origin", "phase", "syscalls", "time", "faults"
    );
    for o in rows.iter().take(TOP_KERNEL_SPLITS) {
        let _ = writeln!(
            out,
            "    {} {:>9} {:>9} {:>9}",
            split_label(o),
            group(o.syscalls),
            format_ns(o.syscall_ns),
            group(o.page_faults),
        );
    }
}

/// The allocator's mapping syscalls, costliest first.
fn write_syscalls(out: &mut String, syscalls: &[SyscallStats]) {
    if syscalls.is_empty() {
        let _ = writeln!(out, "  syscalls: none seen");
        return;
    }
    let _ = writeln!(
        out,
        "    {:<9} {:<14} {:>9} {:>9} {:>10}",
        "syscall", "inside", "count", "time", "bytes"
    );
    for s in by_time(syscalls).iter().take(TOP_SYSCALLS) {
        let _ = writeln!(
            out,
            "    {:<9} {:<14} {:>9} {:>9} {:>10}",
            ellipsize(s.name.name(), 9),
            ellipsize(syscall_origin(s), 14),
            group(s.count),
            format_ns(s.total_ns),
            format_bytes(s.bytes),
        );
    }
}

/// Where the memory went at the peak of mapped memory, as shares of it.
fn write_memory(out: &mut String, memory: Option<&MemoryReport>) {
    let Some(m) = memory else {
        let _ = writeln!(out, "  memory composition needs --alloc-mode full");
        return;
    };
    let _ = writeln!(
        out,
        "  memory at the mapped peak {:>25} {:>9}",
        "bytes", "of mapped"
    );
    let rows = [
        ("requested", m.requested_at_peak),
        ("internal fragmentation", m.internal_fragmentation),
        ("blowup (freed while class grew)", m.blowup),
        ("external frag. + metadata", m.external_fragmentation),
        ("mapped peak", m.mapped_peak),
    ];
    for (label, bytes) in rows {
        let _ = writeln!(
            out,
            "    {label:<32} {:>16} {:>8.1}%",
            format_bytes(bytes),
            percent(bytes, m.mapped_peak)
        );
    }
    let _ = writeln!(
        out,
        "    usable {} · requested peak {} · at end {}",
        format_bytes(m.usable_peak),
        format_bytes(m.requested_peak),
        format_bytes(m.requested_end),
    );
    if !m.usable_known {
        let _ = writeln!(
            out,
            "    block sizes unknown for this allocator: internal fragmentation not seen"
        );
    }
}

/// The sites that requested the most bytes, with what they left live.
fn write_sites(out: &mut String, sites: &[SiteEntry]) {
    if sites.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  top sites by bytes (live: not freed when tracing ended, leak candidates)"
    );
    let _ = writeln!(
        out,
        "    {:<24} {:<18} {:>9} {:>10} {:>10}",
        "function", "source", "count", "bytes", "live"
    );
    for site in sites_by_bytes(sites).iter().take(TOP_SITES) {
        // The wrapper passed over, after the caller that names the site.
        let function = match &site.via {
            Some(via) => format!("{} via {via}", site.function),
            None => site.function.clone(),
        };
        let _ = writeln!(
            out,
            "    {:<24} {:<18} {:>9} {:>10} {:>10}",
            ellipsize(&function, 24),
            ellipsize(&site.source_label(), 18),
            maybe(site.count, group),
            maybe(site.bytes, format_bytes),
            live_label(site),
        );
    }
}

/// The heap profile's sites: past the allocation wrappers, with the
/// estimated bytes allocated and still in use.
fn write_heap_sites(out: &mut String, heap: Option<&HeapProfileReport>) {
    let Some(heap) = heap.filter(|h| !h.sites.is_empty()) else {
        return;
    };
    let _ = writeln!(
        out,
        "  call chains: {} allocations sampled, one per {} allocated (estimates)",
        group(heap.samples),
        format_bytes(heap.sample_mean_bytes),
    );
    let _ = writeln!(
        out,
        "    {:<20} {:<16} {:>9} {:>9}  calling",
        "site", "source", "allocated", "in use"
    );
    for site in heap.sites.iter().take(TOP_SITES) {
        // The wrapper the site called (the others are in the JSON chain).
        let calling = site.wrappers.last().map_or("-", String::as_str);
        let _ = writeln!(
            out,
            "    {:<20} {:<16} {:>9} {:>9}  {}",
            ellipsize(&site.function, 20),
            ellipsize(
                &source_label(site.file.as_deref(), site.line, &site.module),
                16
            ),
            // Unknown totals: the share, which is known.
            site.alloc_space
                .map_or_else(|| format!("{:.1}%", site.alloc_share * 100.0), format_bytes),
            maybe(site.inuse_space, |b| match b {
                0 => "-".to_string(),
                b => format_bytes(b),
            }),
            ellipsize(calling, 17),
        );
    }
}

/// Page faults and `mmap_lock` waits over all threads, when there were any.
fn write_kernel(out: &mut String, a: &AllocatorReport) {
    let faults: u64 = a.kernel.iter().map(|k| k.page_faults).sum();
    let in_alloc: u64 = a.kernel.iter().map(|k| k.page_faults_in_allocator).sum();
    let waits: u64 = a.kernel.iter().map(|k| k.mmap_lock_waits).sum();
    let wait_ns: u64 = a.kernel.iter().map(|k| k.mmap_lock_wait_ns).sum();
    if faults == 0 && waits == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "  kernel: {} page faults, {} of them in the allocator",
        group(faults),
        group(in_alloc),
    );
    let _ = writeln!(
        out,
        "  kernel: {} mmap_lock waits, {} waiting",
        group(waits),
        format_ns(wait_ns),
    );
}

/// Whether the allocator was not traced (mode off, also the default of a
/// report made without the allocator profiler).
pub fn allocator_off(a: &AllocatorReport) -> bool {
    a.mode == TraceMode::Off
}

/// `glibc 2.36 (libc.so.6)`: the library and the short name of its file.
pub fn library_label(a: &AllocatorReport) -> String {
    use crate::process::maps::short_name;
    let library = a.library.as_deref().unwrap_or("unknown allocator");
    match &a.path {
        Some(path) => format!("{library} ({})", short_name(path)),
        None => library.to_string(),
    }
}

/// The allocator operation a syscall ran inside, or `outside` (traced, no
/// allocator call in progress) or `untraced` (probes were detached).
pub fn syscall_origin(s: &SyscallStats) -> &str {
    match (&s.inside, s.traced) {
        (Some(op), _) => op.name(),
        (None, true) => "outside",
        (None, false) => "untraced",
    }
}

/// `malloc, calloc`: the operations' names, comma-separated.
fn names(ops: &[AllocOp]) -> String {
    let names: Vec<&str> = ops.iter().map(|op| op.name()).collect();
    names.join(", ")
}

/// Syscall rows, the most time first.
pub fn by_time(syscalls: &[SyscallStats]) -> Vec<&SyscallStats> {
    let mut rows: Vec<&SyscallStats> = syscalls.iter().collect();
    rows.sort_by(|x, y| y.total_ns.cmp(&x.total_ns).then(y.count.cmp(&x.count)));
    rows
}

/// Sites, the most bytes requested first.
pub fn sites_by_bytes(sites: &[SiteEntry]) -> Vec<&SiteEntry> {
    let mut rows: Vec<&SiteEntry> = sites.iter().collect();
    rows.sort_by(|x, y| y.bytes.cmp(&x.bytes).then(y.live_bytes.cmp(&x.live_bytes)));
    rows
}

/// Live bytes of a site (a leak candidate), or `-` when it freed all.
pub fn live_label(site: &SiteEntry) -> String {
    if site.live_bytes == 0 {
        "-".into()
    } else {
        format_bytes(site.live_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{
        fixtures::{op, report_with_allocator, sample_allocator, sample_report, site},
        model::{BlockOrigin::Reused, ProbeCostReport, Report, SizeClass::Unknown, Syscall},
        text::{render, WIDTH},
    };

    /// The lines of the summary's Allocator section.
    fn allocator_section(r: &Report) -> Vec<String> {
        render(r)
            .lines()
            .skip_while(|l| !l.starts_with("Allocator"))
            .take_while(|l| !l.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn allocator_section_lists_ops_syscalls_memory_sites_and_kernel() {
        let text = render(&report_with_allocator());
        let section = allocator_section(&report_with_allocator()).join("\n");
        assert!(
            section.starts_with("Allocator: glibc 2.36 (libc.so.6)"),
            "{text}"
        );
        assert!(
            section.contains("mode full: every call traced"),
            "{section}"
        );
        assert!(
            section.contains("123,456 calls traced · 0 lost"),
            "{section}"
        );
        // Busiest split first, with humanized durations.
        let malloc = section
            .lines()
            .find(|l| l.contains("malloc") && l.contains("small"))
            .unwrap_or_default();
        assert!(
            malloc.contains("60,000") && malloc.contains("32 ns"),
            "{malloc}"
        );
        assert!(section.contains("10.0 µs"), "{section}");
        // Syscalls: inside an op, outside, untraced.
        assert!(section.contains("mmap      malloc"), "{section}");
        assert!(section.contains("outside") && section.contains("untraced"));
        // The kernel work inside calls, by split.
        assert!(
            section.contains(
                "malloc            large   new    parallel       120   1.50 ms     3,840"
            ),
            "{section}"
        );
        // Memory composition with shares of the mapped peak.
        assert!(section.contains("30.0 MiB     46.9%"), "{section}");
        assert!(section.contains("blowup (freed while class grew)"));
        assert!(section.contains("64.0 MiB    100.0%"), "{section}");
        assert!(section.contains("requested peak 40.0 MiB"));
        // Sites by bytes; the leak candidate shows its live bytes.
        let (sites, chains) = section.split_once("call chains").unwrap();
        let sites: Vec<&str> = sites.lines().filter(|l| l.contains("work.c:")).collect();
        assert_eq!(sites.len(), 3, "{section}");
        // The heap profile's sites, past the wrappers.
        let chains: Vec<&str> = chains.lines().filter(|l| l.contains("work.c:")).collect();
        assert_eq!(chains.len(), 2, "{section}");
        assert!(chains[0].contains("make_buffer") && chains[0].ends_with("-  buffer_new"));
        assert!(chains[1].contains("8.0 MiB") && chains[1].ends_with("2.0 MiB  -"));
        assert!(sites[0].contains("make_buffer") && sites[0].ends_with('-'));
        assert!(sites[1].contains("cache_insert") && sites[1].ends_with("2.0 MiB"));
        assert!(sites[2].contains("parse_line via xmalloc"), "{section}");
        assert!(
            section.contains("kernel: 1,234 page faults, 300 of them in the allocator"),
            "{section}"
        );
        assert!(section.contains("kernel: 12 mmap_lock waits, 3.40 ms waiting"));
        // In the dashboard's tab order.
        let hot = text.find("Hot functions").unwrap_or(usize::MAX);
        let alloc = text.find("Allocator:").unwrap_or(0);
        let fs = text.find("False sharing").unwrap_or(usize::MAX);
        assert!(hot < fs && fs < alloc, "{text}");
    }

    #[test]
    fn a_median_from_the_untraced_loop_is_marked_as_an_estimate() {
        let mut r = report_with_allocator();
        let a = &mut r.allocator;
        a.probe_cost_ns = Some(ProbeCostReport {
            resolution_ns: 300,
            ..ProbeCostReport::default()
        });
        a.ops[0].p50_ns = Some(7);
        a.ops[0].p50_basis = Some(LatencyBasis::UntracedLoop);
        a.ops[1].p50_ns = None;
        a.ops[1].p50_basis = None;
        let section = allocator_section(&r).join("\n");
        let row = |op: &str| {
            section
                .lines()
                .find(|l| l.trim_start().starts_with(op) && l.contains("small"))
                .unwrap_or_default()
                .to_string()
        };
        assert!(row("malloc").contains(" ~7 ns "), "{section}");
        assert!(row("free").contains(" <300 ns "), "{section}");
    }

    #[test]
    fn allocator_section_fits_80_columns_and_caps_rows() {
        let mut r = report_with_allocator();
        let a = &mut r.allocator;
        a.library = Some("a very long allocator name ".repeat(5));
        a.path = Some(format!("/opt/{}/libmalloc.so", "x".repeat(100)));
        a.large_rule = "> 131072 bytes".repeat(8);
        a.lost = 12;
        let long = "operator new[](unsigned long, std::align_val_t)".to_string();
        a.ops = (0..20)
            .map(|i| {
                let longest = AllocOp::DeleteArray;
                op(longest, Unknown, Some(Reused), 1 << 40 | i, u64::MAX / 2)
            })
            .collect();
        a.syscalls = (0..10).map(|_| a.syscalls[0].clone()).collect();
        for s in &mut a.syscalls {
            s.name = Syscall::Mprotect;
            s.inside = Some(AllocOp::DeleteArray);
            s.count = u64::MAX;
            s.bytes = u64::MAX;
            s.total_ns = u64::MAX;
        }
        a.sites = (0..9)
            .map(|i| site(&long.repeat(2), 4_000_000_000 + i, u64::MAX, u64::MAX))
            .collect();
        let text = render(&r);
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line}");
        }
        let section = allocator_section(&r);
        let ops = section
            .iter()
            .filter(|l| l.contains("operator delete[]") && l.contains("unknown"))
            .count();
        assert_eq!(ops, TOP_OPS, "{section:?}");
        assert!(section
            .iter()
            .any(|l| l.contains("12 more in the JSON report")));
        let syscalls = section
            .iter()
            .filter(|l| l.contains("mprotect  operator dele…"))
            .count();
        assert_eq!(syscalls, TOP_SYSCALLS);
        let sites = section
            .iter()
            .take_while(|l| !l.contains("call chains"))
            .filter(|l| l.contains("work.c:"))
            .count();
        assert_eq!(sites, TOP_SITES);
        // The normal sample fits too.
        for line in render(&report_with_allocator()).lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line}");
        }
    }

    #[test]
    fn heap_sites_show_their_share_when_the_totals_are_unknown() {
        let mut r = report_with_allocator();
        let heap = r.allocator.heap_profile.as_mut().unwrap();
        for s in &mut heap.sites {
            s.alloc_space = None;
            s.inuse_space = None;
        }
        let section = allocator_section(&r).join("\n");
        let (_, chains) = section.split_once("call chains").unwrap();
        assert!(
            chains.contains("make_buffer") && chains.contains("92.3%"),
            "{chains}"
        );
        assert!(chains.contains("7.7%         ?  -"), "{chains}");
    }

    #[test]
    fn allocator_off_is_one_line() {
        let mut r = report_with_allocator();
        r.allocator = AllocatorReport {
            mode: TraceMode::Off,
            ..Default::default()
        };
        let section = allocator_section(&r);
        assert_eq!(section, ["Allocator: not traced (--alloc-mode off)"]);
        // A report built without the allocator profiler reads the same.
        assert_eq!(
            allocator_section(&sample_report()),
            ["Allocator: not traced (--alloc-mode off)"]
        );
    }

    #[test]
    fn no_allocator_found_says_so() {
        let mut r = report_with_allocator();
        r.allocator.library = None;
        assert_eq!(
            allocator_section(&r),
            ["Allocator: no allocator found in the target"]
        );
    }

    #[test]
    fn sampled_allocator_says_counts_are_estimates() {
        let mut r = report_with_allocator();
        let a = &mut r.allocator;
        a.mode = TraceMode::Sampled;
        a.sampled = true;
        a.traced_fraction = 0.048;
        a.memory = None;
        a.kernel.clear();
        a.sites.clear();
        let section = allocator_section(&r).join("\n");
        assert!(
            section
                .contains("mode sampled: probes attached 4.8% of the time; counts are estimates"),
            "{section}"
        );
        assert!(section.contains("memory composition needs --alloc-mode full"));
        assert!(!section.contains("kernel:") && !section.contains("top sites"));
    }

    #[test]
    fn allocator_with_nothing_traced_yet() {
        let mut r = report_with_allocator();
        let a = &mut r.allocator;
        a.ops.clear();
        a.syscalls.clear();
        a.sites.clear();
        a.kernel.clear();
        a.memory = Some(MemoryReport::default());
        a.large_rule.clear();
        let section = allocator_section(&r).join("\n");
        assert!(section.contains("no allocator calls traced"));
        assert!(section.contains("syscalls: none seen"));
        assert!(section.contains("0 B      0.0%"), "{section}");
        assert!(!section.contains("large ="));
    }

    #[test]
    fn allocator_helpers() {
        let a = sample_allocator();
        assert_eq!(library_label(&a), "glibc 2.36 (libc.so.6)");
        let origins: Vec<&str> = a.syscalls.iter().map(syscall_origin).collect();
        assert_eq!(origins, ["malloc", "outside", "untraced"]);
        let names: Vec<&str> = sites_by_bytes(&a.sites)
            .iter()
            .map(|s| s.function.as_str())
            .collect();
        assert_eq!(names, ["make_buffer", "cache_insert", "parse_line"]);
        assert_eq!(live_label(&a.sites[0]), "-");
        assert_eq!(live_label(&a.sites[1]), "2.0 MiB");
        assert!(!allocator_off(&a));
        assert!(allocator_off(&AllocatorReport::default()));
    }
}
