//! The text summary printed at the end of a session: ranked, with units,
//! readable in 80 columns.

use std::fmt::Write as _;

use memprof_common::sharing::WORD_BYTES;

use super::model::{
    source_label, AllocOp, AllocatorReport, BlockOrigin, LockEntry, LockTracing, MemoryReport,
    OpStats, Report, SiteEntry, SyscallStats, TraceMode, WordEntry,
};

/// Width the summary is laid out for.
pub const WIDTH: usize = 80;
/// Hot functions listed in the summary.
const TOP: usize = 15;
/// Allocator splits (op, class, origin, phase) listed in the summary.
const TOP_OPS: usize = 8;
/// Syscall rows listed in the summary.
const TOP_SYSCALLS: usize = 6;
/// Allocation sites listed in the summary.
const TOP_SITES: usize = 5;

/// Renders the summary.
pub fn render(report: &Report) -> String {
    fit(&render_wide(report), WIDTH)
}

fn render_wide(report: &Report) -> String {
    let mut out = String::new();
    let t = &report.target;
    let s = &report.sampling;
    let _ = writeln!(
        out,
        "memprof-ebpf summary: pid {} ({})",
        t.pid,
        ellipsize(&t.command, WIDTH - 30)
    );
    let _ = writeln!(
        out,
        "  traced {} · {} thread{} seen{}",
        format_duration(report.duration_s),
        t.threads_seen,
        if t.threads_seen == 1 { "" } else { "s" },
        if t.exited { " · target exited" } else { "" },
    );
    let _ = writeln!(
        out,
        "  {} samples at {} Hz ({}) · {} lost · {:.1}% in kernel",
        group(s.samples),
        s.frequency_hz,
        s.source,
        group(s.lost),
        percent(s.kernel_samples, s.samples),
    );
    let l = &report.loader;
    let _ = writeln!(
        out,
        "  profiler: {:.2} s CPU ({:.1}% of a core), {} peak memory",
        l.cpu_s,
        l.cpu_share * 100.0,
        format_bytes(l.peak_rss_bytes),
    );
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out.push('\n');

    let _ = writeln!(out, "Hot functions (self time)");
    if report.hot_functions.is_empty() {
        let _ = writeln!(
            out,
            "  no samples: the target did not run on a CPU while traced"
        );
    } else {
        let _ = writeln!(
            out,
            "  {:>6} {:>6} {:>7}  {:<26} source (module)",
            "self", "total", "samples", "function"
        );
        for h in report.hot_functions.iter().take(TOP) {
            let line = format!(
                "  {:>5.1}% {:>5.1}% {:>7}  {:<26} {}",
                h.share * 100.0,
                h.total_share * 100.0,
                group(h.samples),
                ellipsize(&h.function, 26),
                h.source_label()
            );
            let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
        }
    }
    out.push('\n');
    write_false_sharing(&mut out, report);
    out.push('\n');
    write_allocator(&mut out, &report.allocator);
    out.push('\n');
    write_locks(&mut out, &report.locks, report.lock_tracing.as_ref());
    out
}

/// Shared lines shown in the summary.
const TOP_LINES: usize = 5;

/// The busiest lines that were checked and cleared, with the reason.
fn write_dismissed(out: &mut String, report: &Report) {
    let checked: Vec<String> = report
        .false_sharing_dismissed
        .iter()
        .take(4)
        .map(|d| format!("{} ({})", d.object, d.reason))
        .collect();
    if !checked.is_empty() {
        let _ = writeln!(out, "  busiest lines checked: {}", checked.join(", "));
    }
}

/// The "False sharing" section: contended lines, most costly first, with
/// the object, who touches which bytes, the code, and the fix.
fn write_false_sharing(out: &mut String, report: &Report) {
    let a = &report.sampling.addresses;
    let basis = format!(
        "{} of {} user samples had a data address ({:.0}%, {})",
        group(a.with_address),
        group(a.user_samples),
        a.address_share * 100.0,
        a.mode
    );
    if report.false_sharing.is_empty() {
        let _ = writeln!(
            out,
            "False sharing: no contended cache line found\n  {basis}"
        );
        write_dismissed(out, report);
        return;
    }
    let _ = writeln!(
        out,
        "False sharing (contended cache lines, most costly first)"
    );
    let _ = writeln!(out, "  {basis}");
    for (i, e) in report.false_sharing.iter().take(TOP_LINES).enumerate() {
        let o = &e.object;
        let at = o.label();
        let size = o.size.map(|s| format!(", {s} B")).unwrap_or_default();
        let head = format!("  {}. {} sharing: {at} ({}{size})", i + 1, e.kind, o.kind);
        let _ = writeln!(out, "{}", ellipsize(&head, WIDTH));
        let _ = writeln!(
            out,
            "     line {}: ~{:.1}% of sampled time, {} invalidations ({:.0}%)",
            e.line,
            e.cost_share * 100.0,
            group(e.invalidations),
            e.invalidation_rate * 100.0,
        );
        let starts = o
            .starts_in_line()
            .map(|b| format!(" (starts at byte {b} of the line)"))
            .unwrap_or_default();
        if let Some(site) = &o.alloc_site {
            let line = format!(
                "     allocated in {} {}{starts}",
                site.function,
                source_label(site.file.as_deref(), site.line, "?")
            );
            let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
        } else if let Some(b) = o.starts_in_line() {
            let _ = writeln!(out, "     the object starts at byte {b} of the line");
        }
        let threads: Vec<String> = e.threads.iter().map(u32::to_string).collect();
        wrap_into(out, "     threads: ", &threads.join(", "));
        wrap_into(out, "     bytes: ", &word_ranges(&e.words));
        for c in e.code.iter().take(3) {
            let line = format!(
                "     code: {} {} ({} reads, {} writes, {} threads)",
                c.function,
                source_label(c.file.as_deref(), c.line, &c.module),
                group(c.reads),
                group(c.writes),
                c.threads.len()
            );
            let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
        }
        wrap_into(out, "     fix: ", &e.advice);
    }
}

/// Writes `text` after `lead`, wrapped at [`WIDTH`] with continuation
/// lines indented like the text.
fn wrap_into(out: &mut String, lead: &str, text: &str) {
    let indent = " ".repeat(lead.chars().count());
    let mut line = lead.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        let fits = line.chars().count() + 1 + word.chars().count() <= WIDTH;
        if !empty && !fits {
            let _ = writeln!(out, "{line}");
            line = indent.clone();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(&ellipsize(word, WIDTH - indent.len()));
        empty = false;
    }
    let _ = writeln!(out, "{line}");
}

/// `0-7 thread 12 (W), 8-15 threads 12,13 (R)`: runs of words with the
/// same threads and access.
pub fn word_ranges(words: &[WordEntry]) -> String {
    let mut runs: Vec<(u32, u32, &[u32], &str)> = Vec::new();
    for w in words {
        let written = match (w.reads > 0, w.writes > 0) {
            (true, true) => "RW",
            (false, true) => "W",
            _ => "R",
        };
        match runs.last_mut() {
            Some(r) if r.1 == w.offset && r.2 == w.threads.as_slice() && r.3 == written => {
                r.1 = w.offset + WORD_BYTES;
            }
            _ => runs.push((w.offset, w.offset + WORD_BYTES, &w.threads, written)),
        }
    }
    runs.iter()
        .map(|(a, b, t, written)| {
            let who: Vec<String> = t.iter().map(u32::to_string).collect();
            format!(
                "{a}-{} thread{} {} ({})",
                b - 1,
                if t.len() == 1 { "" } else { "s" },
                who.join(","),
                written
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Lock entries shown in the summary.
const TOP_LOCKS: usize = 6;

/// The "Locks" section: the contended locks (then other waits), with the
/// code that waited and the code that released.
fn write_locks(out: &mut String, locks: &[LockEntry], tracing: Option<&LockTracing>) {
    if locks.is_empty() {
        let _ = writeln!(out, "Locks: no thread waited for a lock");
        return;
    }
    let _ = writeln!(
        out,
        "Locks (waits seen from the kernel; lock contention first, then other waits)"
    );
    match tracing {
        Some(t) if t.estimates() => {
            let _ = writeln!(
                out,
                "  lock calls traced {:.1}% of the time: acquisitions are estimates",
                t.traced_fraction * 100.0
            );
        }
        Some(_) => {
            let _ = writeln!(out, "  lock calls: every call traced");
        }
        None => {}
    }
    let _ = writeln!(
        out,
        "    {:<20} {:<9} {:>8} {:>9} {:>9} {:>9}",
        "lock", "kind", "waits", "total", "p99", "max"
    );
    for l in locks.iter().take(TOP_LOCKS) {
        let name = l.name.clone().unwrap_or_else(|| l.address.clone());
        let _ = writeln!(
            out,
            "    {:<20} {:<9} {:>8} {:>9} {:>9} {:>9}",
            ellipsize(&name, 20),
            ellipsize(l.kind.name(), 9),
            group(l.contentions),
            format_ns(l.wait_total_ns),
            format_ns(l.wait_p99_ns),
            format_ns(l.wait_max_ns)
        );
        if let Some(w) = l.waiters.first() {
            let at = source_label(w.file.as_deref(), w.line, &w.module);
            let line = format!("      waited in {} {at}", w.function);
            let _ = writeln!(out, "{line}");
        }
        if let Some(h) = l.holders.first() {
            let at = source_label(h.file.as_deref(), h.line, &h.module);
            let line = format!(
                "      released by {} {at} ({} wakes)",
                h.function,
                group(h.count)
            );
            let _ = writeln!(out, "{line}");
        }
        if l.owner_seen {
            let owners: Vec<String> = l.owners.iter().map(|o| o.tid.to_string()).collect();
            let line = format!("      held by thread(s) {}", owners.join(", "));
            let _ = writeln!(out, "{line}");
        }
        write_lock_holds(out, l);
    }
}

/// What the lock uprobes add: acquisitions, contention rate, hold times
/// and the critical section holding it longest.
fn write_lock_holds(out: &mut String, l: &LockEntry) {
    let Some(acquisitions) = l.acquisitions else {
        return;
    };
    let mut line = format!("      {} acquisitions", group(acquisitions));
    if let Some(rate) = l.contention_rate {
        let _ = write!(line, ", {:.0}% contended", (rate * 100.0).min(100.0));
    }
    if let (Some(mean), Some(p99), Some(max)) = (l.hold_mean_ns, l.hold_p99_ns, l.hold_max_ns) {
        let _ = write!(
            line,
            "; held mean {} p99 {} max {}",
            format_ns(mean),
            format_ns(p99),
            format_ns(max)
        );
    }
    let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    if let Some(s) = l.sections.first() {
        let at = source_label(s.file.as_deref(), s.line, &s.module);
        let released = s
            .released_at
            .as_deref()
            .map(|r| format!(" → {r}"))
            .unwrap_or_default();
        let line = format!(
            "      held in {} {at}{released} ({}, {} total)",
            s.function,
            group(s.count),
            format_ns(s.hold_ns)
        );
        let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    }
}

/// The "Allocator" section: library and mode, latency per split,
/// syscalls, memory composition, top sites and kernel-side cost.
fn write_allocator(out: &mut String, a: &AllocatorReport) {
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
    write_ops(out, &a.ops);
    write_syscalls(out, &a.syscalls);
    write_memory(out, a.memory.as_ref());
    write_sites(out, &a.sites);
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
fn write_ops(out: &mut String, ops: &[OpStats]) {
    if ops.is_empty() {
        let _ = writeln!(out, "  no allocator calls traced");
        return;
    }
    let _ = writeln!(
        out,
        "    {:<17} {:<7} {:<6} {:<8} {:>9} {:>7} {:>7} {:>7}",
        "op", "class", "origin", "phase", "count", "mean", "p99", "max"
    );
    let mut by_count: Vec<&OpStats> = ops.iter().collect();
    by_count.sort_by_key(|op| std::cmp::Reverse(op.count));
    for op in by_count.iter().take(TOP_OPS) {
        let _ = writeln!(
            out,
            "    {:<17} {:<7} {:<6} {:<8} {:>9} {:>7} {:>7} {:>7}",
            ellipsize(op.op.name(), 17),
            ellipsize(op.class.name(), 7),
            ellipsize(op.origin.map_or("-", BlockOrigin::name), 6),
            ellipsize(op.phase.name(), 8),
            group(op.count),
            format_ns(op.mean_ns),
            format_ns(op.p99_ns),
            format_ns(op.max_ns),
        );
    }
    if ops.len() > TOP_OPS {
        let _ = writeln!(out, "    … {} more in the JSON report", ops.len() - TOP_OPS);
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
        "  memory at the mapped peak {:>21} {:>9}",
        "bytes", "of mapped"
    );
    let rows = [
        ("requested", m.requested_at_peak),
        ("internal fragmentation", m.internal_fragmentation),
        ("blowup (freed, not reused)", m.blowup),
        ("external frag. + metadata", m.external_fragmentation),
        ("mapped peak", m.mapped_peak),
    ];
    for (label, bytes) in rows {
        let _ = writeln!(
            out,
            "    {label:<28} {:>16} {:>8.1}%",
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
        let _ = writeln!(
            out,
            "    {:<24} {:<18} {:>9} {:>10} {:>10}",
            ellipsize(&site.function, 24),
            ellipsize(&site.source_label(), 18),
            group(site.count),
            format_bytes(site.bytes),
            live_label(site),
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

/// Cuts every line of `text` to `width` characters.
fn fit(text: &str, width: usize) -> String {
    text.lines().map(|l| ellipsize(l, width) + "\n").collect()
}

/// `1234567` → `1,234,567`.
pub fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `part` as a percentage of `whole`; 0 when `whole` is 0.
pub fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// `3.25` → `3.2 s`, `125.0` → `2m05s`.
pub fn format_duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".into();
    }
    if secs < 60.0 {
        format!("{secs:.1} s")
    } else {
        let whole = secs.round() as u64;
        format!("{}m{:02}s", whole / 60, whole % 60)
    }
}

/// Nanoseconds with a unit, three significant digits: `850 ns`,
/// `1.23 µs`, `45.6 ms`, `2.00 s`.
pub fn format_ns(ns: u64) -> String {
    const UNITS: [(f64, &str); 3] = [(1e3, "µs"), (1e6, "ms"), (1e9, "s")];
    if ns < 1000 {
        return format!("{ns} ns");
    }
    let ns = ns as f64;
    let (scale, unit) = UNITS
        .iter()
        .rev()
        .find(|(scale, _)| ns >= *scale * 0.9995)
        .copied()
        .unwrap_or(UNITS[0]);
    let value = ns / scale;
    if value < 9.995 {
        format!("{value:.2} {unit}")
    } else if value < 99.95 {
        format!("{value:.1} {unit}")
    } else {
        format!("{value:.0} {unit}")
    }
}

/// Bytes with a binary unit.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Cuts `s` to at most `max` characters, ending with `…` when cut.
pub fn ellipsize(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::report::model::{
        tests::sample_report, BlockOrigin::*, HolderSite, KernelThreadEntry, LockKind, OwnerEntry,
        SectionEntry, SizeClass, SizeClass::*, Syscall, ThreadPhase, WaiterSite,
    };

    /// One split of the latency table.
    fn op(
        op: AllocOp,
        class: SizeClass,
        origin: Option<BlockOrigin>,
        count: u64,
        mean_ns: u64,
    ) -> OpStats {
        OpStats {
            op,
            class,
            origin,
            phase: ThreadPhase::Parallel,
            count,
            traced: count,
            mean_ns,
            p50_ns: mean_ns / 10 * 8,
            p99_ns: mean_ns.saturating_mul(6),
            max_ns: mean_ns.saturating_mul(40),
            histogram: vec![
                (64, count / 4),
                (128, count / 2),
                (512, count / 4),
                (4096, 3),
            ],
        }
    }

    /// A site in `work.c`.
    fn site(function: &str, line: u32, bytes: u64, live_bytes: u64) -> SiteEntry {
        SiteEntry {
            function: function.into(),
            file: Some("/src/work.c".into()),
            line: Some(line),
            module: "work".into(),
            count: bytes / 64,
            bytes,
            live_bytes,
            live_blocks: live_bytes / 64,
        }
    }

    /// An allocator profile in full mode with every part filled.
    pub(crate) fn sample_allocator() -> AllocatorReport {
        AllocatorReport {
            library: Some("glibc 2.36".into()),
            path: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
            mode: TraceMode::Full,
            traced_fraction: 1.0,
            sampled: false,
            large_rule: "glibc mmapped chunk".into(),
            calls_traced: 123_456,
            always_traced: vec![],
            lost: 0,
            ops: vec![
                op(AllocOp::Malloc, Small, Some(Reused), 60_000, 45),
                op(AllocOp::Free, Small, Some(Reused), 59_000, 30),
                op(AllocOp::Malloc, Large, Some(New), 120, 12_500),
                op(AllocOp::Free, Large, Some(New), 118, 9_000),
                op(AllocOp::Realloc, Small, None, 900, 210),
            ],
            syscalls: vec![
                SyscallStats {
                    name: Syscall::Mmap,
                    inside: Some(AllocOp::Malloc),
                    traced: true,
                    count: 120,
                    total_ns: 1_500_000,
                    bytes: 120 << 20,
                },
                SyscallStats {
                    name: Syscall::Munmap,
                    inside: None,
                    traced: true,
                    count: 4,
                    total_ns: 80_000,
                    bytes: 4 << 20,
                },
                SyscallStats {
                    name: Syscall::Madvise,
                    inside: None,
                    traced: false,
                    count: 2,
                    total_ns: 9_000,
                    bytes: 1 << 20,
                },
            ],
            memory: Some(MemoryReport {
                requested_peak: 40 << 20,
                requested_at_peak: 30 << 20,
                usable_peak: 34 << 20,
                internal_fragmentation: 4 << 20,
                blowup: 10 << 20,
                external_fragmentation: 20 << 20,
                mapped_peak: 64 << 20,
                requested_end: 2 << 20,
                usable_known: true,
            }),
            sites: vec![
                site("make_buffer", 30, 96 << 20, 0),
                site("cache_insert", 77, 8 << 20, 2 << 20),
                site("parse_line", 12, 1 << 20, 0),
            ],
            kernel: vec![
                KernelThreadEntry {
                    tid: 42,
                    page_faults: 1000,
                    page_faults_in_allocator: 300,
                    mmap_lock_waits: 7,
                    mmap_lock_wait_ns: 2_000_000,
                },
                KernelThreadEntry {
                    tid: 43,
                    page_faults: 234,
                    page_faults_in_allocator: 0,
                    mmap_lock_waits: 5,
                    mmap_lock_wait_ns: 1_400_000,
                },
            ],
        }
    }

    /// The sample report with [`sample_allocator`] in it.
    pub(crate) fn report_with_allocator() -> Report {
        let mut r = sample_report();
        r.allocator = sample_allocator();
        r
    }

    /// A waiting site in locks.c (no source file without a line).
    fn waiter(function: &str, line: Option<u32>, count: u64, wait_ns: u64) -> WaiterSite {
        WaiterSite {
            function: function.into(),
            file: line.map(|_| "/src/locks.c".into()),
            line,
            module: "locks".into(),
            count,
            wait_ns,
        }
    }

    /// A releasing site in locks.c that woke all but 3 of its `count`.
    fn holder(function: &str, line: u32, count: u64) -> HolderSite {
        HolderSite {
            function: function.into(),
            file: Some("/src/locks.c".into()),
            line: Some(line),
            module: "locks".into(),
            count,
            woken: count - 3,
        }
    }

    /// A glibc mutex with its owners, a kernel lock, then a condvar, in
    /// report order.
    pub(crate) fn report_with_locks() -> Report {
        let mut r = sample_report();
        let mutex = LockEntry {
            address: "0x5555aaaa0040".into(),
            name: Some("g_hot_lock".into()),
            kind: LockKind::Mutex,
            acquisitions: None,
            contentions: 43_683,
            wait_total_ns: 1_810_000_000,
            wait_mean_ns: 41_000,
            wait_p99_ns: 35_500,
            wait_max_ns: 5_370_000,
            hold_p99_ns: None,
            threads: 2,
            owner_seen: true,
            owners: vec![
                OwnerEntry {
                    tid: 24692,
                    count: 9,
                },
                OwnerEntry {
                    tid: 24700,
                    count: 3,
                },
            ],
            waiters: vec![
                waiter("contend_hot", Some(166), 43_000, 1_800_000_000),
                waiter("contend_cold", Some(180), 683, 10_000_000),
            ],
            holders: vec![holder("release_hot", 169, 43_693)],
            ..LockEntry::default()
        };
        let kernel = LockEntry {
            address: "kernel".into(),
            name: Some("kernel rwsem (read)".into()),
            kind: LockKind::Kernel,
            contentions: 12,
            wait_total_ns: 3_400_000,
            wait_mean_ns: 283_000,
            wait_p99_ns: 900_000,
            wait_max_ns: 1_000_000,
            threads: 0,
            owner_seen: false,
            owners: vec![],
            waiters: vec![WaiterSite {
                module: "[kernel]".into(),
                ..waiter("do_user_addr_fault", None, 12, 3_400_000)
            }],
            holders: vec![],
            ..mutex.clone()
        };
        let condvar = LockEntry {
            address: "0x7f00deadbe00".into(),
            name: None,
            kind: LockKind::Condvar,
            contentions: 40,
            wait_total_ns: 9_000_000_000,
            wait_mean_ns: 225_000_000,
            wait_p99_ns: 800_000_000,
            wait_max_ns: 900_000_000,
            threads: 4,
            owner_seen: false,
            owners: vec![],
            waiters: vec![waiter("wait_for_work", Some(210), 40, 9_000_000_000)],
            holders: vec![holder("post_work", 230, 41)],
            ..mutex.clone()
        };
        r.locks = vec![mutex, kernel, condvar];
        r
    }

    /// Every part of the report filled: the allocator's, the locks' (one
    /// traced in sampled mode), a false-sharing finding and a dismissed line.
    pub(crate) fn full_report() -> Report {
        let mut r = report_with_allocator();
        r.locks = report_with_locks().locks;
        let hot = &mut r.locks[0];
        hot.acquisitions = Some(65_880);
        hot.contention_rate = Some(0.6);
        hot.hold_mean_ns = Some(21_800);
        hot.hold_p99_ns = Some(28_500);
        hot.hold_max_ns = Some(4_400_000);
        hot.sections = vec![SectionEntry {
            function: "contend_hot".into(),
            file: Some("/src/locks.c".into()),
            line: Some(166),
            module: "locks".into(),
            released_at: Some("locks.c:169".into()),
            count: 65_880,
            hold_ns: 1_435_000_000,
            hold_max_ns: 4_400_000,
        }];
        r.lock_tracing = Some(LockTracing {
            mode: TraceMode::Sampled,
            library: "/lib/libc.so.6".into(),
            traced_fraction: 0.25,
            windows: 7,
            functions: vec!["pthread_mutex_lock".into()],
            always_traced: vec!["pthread_cond_wait".into()],
            sections_lost: 1,
            unmatched_unlocks: 2,
            held_overflow: 3,
        });
        let sharing = report_with_sharing();
        r.sampling.addresses = sharing.sampling.addresses;
        r.false_sharing = sharing.false_sharing;
        r.false_sharing_dismissed = vec![crate::report::model::DismissedLine {
            line: "0x1000".into(),
            object: "g_padded+64".into(),
            object_kind: crate::report::model::ObjectKind::Global,
            samples: 10,
            writes: 10,
            shared: false,
            reason: crate::report::model::DismissReason::OneThread,
        }];
        r.allocator.always_traced = vec![AllocOp::Calloc];
        r.notes.push("a note".into());
        r
    }

    /// The JSON form of [`full_report`], byte for byte as the schema has it.
    #[test]
    fn json_of_the_full_report_is_unchanged() {
        let json = full_report().to_json();
        assert_eq!(json, include_str!("testdata/report.json"));
    }

    /// The summary of [`full_report`], byte for byte.
    #[test]
    fn summary_of_the_full_report_is_unchanged() {
        assert_eq!(render(&full_report()), include_str!("testdata/summary.txt"));
    }

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
            malloc.contains("60,000") && malloc.contains("45 ns"),
            "{malloc}"
        );
        assert!(section.contains("12.5 µs"), "{section}");
        // Syscalls: inside an op, outside, untraced.
        assert!(section.contains("mmap      malloc"), "{section}");
        assert!(section.contains("outside") && section.contains("untraced"));
        // Memory composition with shares of the mapped peak.
        assert!(section.contains("30.0 MiB     46.9%"), "{section}");
        assert!(section.contains("blowup (freed, not reused)"));
        assert!(section.contains("64.0 MiB    100.0%"), "{section}");
        assert!(section.contains("requested peak 40.0 MiB"));
        // Sites by bytes; the leak candidate shows its live bytes.
        let sites: Vec<&str> = section.lines().filter(|l| l.contains("work.c:")).collect();
        assert_eq!(sites.len(), 3, "{section}");
        assert!(sites[0].contains("make_buffer") && sites[0].ends_with('-'));
        assert!(sites[1].contains("cache_insert") && sites[1].ends_with("2.0 MiB"));
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
        let sites = section.iter().filter(|l| l.contains("work.c:")).count();
        assert_eq!(sites, TOP_SITES);
        // The normal sample fits too.
        for line in render(&report_with_allocator()).lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line}");
        }
    }

    #[test]
    fn locks_section_shows_acquisitions_holds_and_sections_when_traced() {
        let mut r = report_with_locks();
        let hot = &mut r.locks[0];
        hot.acquisitions = Some(65_880);
        hot.contention_rate = Some(0.6);
        hot.hold_mean_ns = Some(21_800);
        hot.hold_p99_ns = Some(28_500);
        hot.hold_max_ns = Some(4_400_000);
        hot.sections = vec![SectionEntry {
            function: "contend_hot".into(),
            file: Some("/src/locks.c".into()),
            line: Some(166),
            module: "locks".into(),
            released_at: Some("locks.c:169".into()),
            count: 65_880,
            hold_ns: 1_435_000_000,
            hold_max_ns: 4_400_000,
        }];
        r.lock_tracing = Some(LockTracing {
            mode: TraceMode::Full,
            library: "/lib/libc.so.6".into(),
            traced_fraction: 1.0,
            windows: 1,
            functions: vec![],
            always_traced: vec![],
            sections_lost: 0,
            unmatched_unlocks: 0,
            held_overflow: 0,
        });
        let text = render(&r);
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Locks"))
            .collect();
        assert!(section[1].contains("every call traced"), "{}", section[1]);
        let holds = section.iter().find(|l| l.contains("acquisitions")).unwrap();
        assert!(
            holds.contains("65,880 acquisitions, 60% contended"),
            "{holds}"
        );
        assert!(holds.contains("p99 28.5 µs"), "{holds}");
        let held = section.iter().find(|l| l.contains("held in")).unwrap();
        assert!(
            held.contains("contend_hot locks.c:166 → locks.c:169"),
            "{held}"
        );
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH));
    }

    #[test]
    fn locks_section_names_the_lock_its_waiters_releasers_and_owners() {
        let mut r = sample_report();
        assert!(render(&r).contains("Locks: no thread waited for a lock"));
        r.locks = report_with_locks().locks;
        let text = render(&r);
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("Locks"))
            .collect();
        assert!(section[2].contains("g_hot_lock") && section[2].contains("43,683"));
        assert!(section[2].contains("1.81 s"), "{}", section[2]);
        assert!(section[3].contains("waited in contend_hot locks.c:166"));
        assert!(section[4].contains("released by release_hot locks.c:169"));
        assert!(section[5].contains("24692"));
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH));
    }

    pub fn report_with_sharing() -> Report {
        let mut r = sample_report();
        r.sampling.addresses.mode = crate::report::model::AddressMode::Decoded;
        r.sampling.addresses.user_samples = 1000;
        r.sampling.addresses.with_address = 970;
        r.sampling.addresses.address_share = 0.97;
        r.false_sharing = vec![crate::report::model::tests::false_sharing_entry()];
        r
    }

    #[test]
    fn no_finding_names_the_lines_checked() {
        let mut r = sample_report();
        r.false_sharing.clear();
        r.false_sharing_dismissed = vec![crate::report::model::DismissedLine {
            line: "0x1000".into(),
            object: "g_padded+64".into(),
            object_kind: crate::report::model::ObjectKind::Global,
            samples: 10,
            writes: 10,
            shared: false,
            reason: crate::report::model::DismissReason::OneThread,
        }];
        let text = render(&r);
        assert!(
            text.contains("busiest lines checked: g_padded+64 (one thread)"),
            "{text}"
        );
    }

    #[test]
    fn false_sharing_section_names_object_bytes_code_and_fix() {
        let r = sample_report();
        assert!(render(&r).contains("False sharing: no contended cache line found"));
        let text = render(&report_with_sharing());
        let section: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("False sharing"))
            .take_while(|l| !l.is_empty())
            .collect();
        assert!(
            section[1].contains("970 of 1,000 user samples had a data address (97%, decoded)"),
            "{}",
            section[1]
        );
        assert!(section[2].contains("1. false sharing: 64-byte heap block from sharing.c:120"));
        assert!(section[3].contains("~95.1% of sampled time, 3,753 invalidations (99%)"));
        assert!(section[4].contains("allocated in main sharing.c:120"));
        assert!(section[5].contains("15027, 15028"));
        assert!(
            section[6].contains("0-7 thread 15027 (W), 8-15 thread 15028 (W)"),
            "{}",
            section[6]
        );
        assert!(section[7].contains("code: worker sharing.c:80 (0 reads, 3,779 writes"));
        assert!(section[8].starts_with("     fix: Threads write different parts"));
        assert!(
            section[9].starts_with("          "),
            "wrapped: {}",
            section[9]
        );
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
    }

    /// A heap block that starts inside the line: the offset is said on the
    /// allocation row, never glued to the name ("sharing.c:120-32" reads as a
    /// range of source lines); a line starting inside a global keeps "+N".
    #[test]
    fn object_offsets_read_as_offsets() {
        let mut r = report_with_sharing();
        r.false_sharing[0].object.offset = -32;
        let text = render(&r);
        assert!(!text.contains("sharing.c:120-32"), "{text}");
        assert!(
            text.contains("allocated in main sharing.c:120 (starts at byte 32 of the line)"),
            "{text}"
        );
        r.false_sharing[0].object.alloc_site = None;
        assert!(
            render(&r).contains("\n     the object starts at byte 32 of the line\n"),
            "without an allocation row, a row of its own says it"
        );
        r.false_sharing[0].object.name = "g_counters".into();
        r.false_sharing[0].object.offset = 64;
        assert!(render(&r).contains("1. false sharing: g_counters+64 ("));
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

    #[test]
    fn summary_fits_80_columns_and_ranks() {
        let mut r = sample_report();
        r.hot_functions[0].function =
            "a_very_long_function_name_that_goes_on_and_on_and_on".repeat(3);
        r.notes.push("target exited after 1.0 s".into());
        let text = render(&r);
        for line in text.lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line}");
        }
        assert!(text.contains("work.c:12"));
        assert!(
            text.contains("90.0%  95.0%"),
            "self and total shares:\n{text}"
        );
        assert!(text.contains("1,000 samples at 999 Hz (cpu-clock)"));
        assert!(text.contains("note: target exited"));
    }

    #[test]
    fn long_commands_and_big_pids_still_fit() {
        let mut r = sample_report();
        r.target.pid = 4_194_304;
        r.target.command = "x".repeat(300);
        r.notes.push("n".repeat(200));
        for line in render(&r).lines() {
            assert!(line.chars().count() <= WIDTH, "too wide: {line}");
        }
    }

    #[test]
    fn empty_report_says_so() {
        let mut r = sample_report();
        r.hot_functions.clear();
        r.sampling.samples = 0;
        let text = render(&r);
        assert!(text.contains("no samples"));
        assert!(text.contains("0.0% in kernel"));
    }

    #[test]
    fn formatting_helpers() {
        assert_eq!(group(0), "0");
        assert_eq!(group(999), "999");
        assert_eq!(group(1000), "1,000");
        assert_eq!(group(1234567), "1,234,567");
        assert_eq!(percent(1, 0), 0.0);
        assert_eq!(percent(1, 4), 25.0);
        assert_eq!(format_duration(3.25), "3.2 s");
        assert_eq!(format_duration(125.0), "2m05s");
        assert_eq!(format_duration(f64::NAN), "?");
        assert_eq!(format_ns(0), "0 ns");
        assert_eq!(format_ns(999), "999 ns");
        assert_eq!(format_ns(1000), "1.00 µs");
        assert_eq!(format_ns(1234), "1.23 µs");
        assert_eq!(format_ns(12_345), "12.3 µs");
        assert_eq!(format_ns(123_456), "123 µs");
        assert_eq!(format_ns(999_400), "999 µs");
        assert_eq!(format_ns(999_600), "1.00 ms");
        assert_eq!(format_ns(45_600_000), "45.6 ms");
        assert_eq!(format_ns(2_000_000_000), "2.00 s");
        assert_eq!(format_ns(u64::MAX), "18446744074 s");
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(20 << 20), "20.0 MiB");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
        assert_eq!(ellipsize("abc", 4), "abc");
    }
}
