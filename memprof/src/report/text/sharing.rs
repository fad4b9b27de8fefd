//! The "False sharing" section.

use std::fmt::Write as _;

use memprof_common::sharing::WORD_BYTES;

use super::{wrap_into, WIDTH};
use crate::report::{
    format::{ellipsize, group},
    model::{inlined_label, source_label, CodeRef, Report, SharingEntry, WordEntry},
};

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

/// Where a heap object was allocated: the call, its inline chain, the
/// wrapper passed over, and `starts` (where the object begins).
fn alloc_site_text(site: &CodeRef, starts: &str) -> String {
    let via = site
        .via
        .as_ref()
        .map(|w| format!(" via {w}"))
        .unwrap_or_default();
    format!(
        "{} {}{}{via}{starts}",
        site.function,
        source_label(site.file.as_deref(), site.line, "?"),
        inlined_label(&site.inlined_into),
    )
}

/// The "False sharing" section: contended lines, most costly first, with
/// the object, who touches which bytes, the code, and the fix.
pub(super) fn write_false_sharing(out: &mut String, report: &Report) {
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
        if let Some(g) = &e.predicted_gain {
            let _ = writeln!(
                out,
                "     if fixed: the threads' work ~{:.1}-{:.1}x faster (predicted)",
                g.low, g.high
            );
        }
        let starts = o
            .starts_in_line()
            .map(|b| format!(" (starts at byte {b} of the line)"))
            .unwrap_or_default();
        if let Some(site) = &o.alloc_site {
            // Wrapped, not cut: the inline chain and the start offset
            // both matter.
            wrap_into(out, "     allocated in ", &alloc_site_text(site, &starts));
        } else if let Some(b) = o.starts_in_line() {
            let _ = writeln!(out, "     the object starts at byte {b} of the line");
        }
        wrap_into(out, "     threads: ", &thread_list(e));
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

/// The line's threads: `12, 13`, or `pid:tid` when several processes
/// touch it (`100:101, 200:200`).
fn thread_list(e: &SharingEntry) -> String {
    let threads: Vec<String> = if e.processes.is_empty() {
        e.threads.iter().map(u32::to_string).collect()
    } else {
        e.processes
            .iter()
            .flat_map(|p| p.threads.iter().map(move |t| format!("{}:{t}", p.pid)))
            .collect()
    };
    threads.join(", ")
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

#[cfg(test)]
mod tests {
    use crate::report::{
        fixtures::{report_with_sharing, sample_report},
        model::{DismissReason, DismissedLine, ObjectKind, ProcessThreads},
        text::{render, WIDTH},
    };

    #[test]
    fn no_finding_names_the_lines_checked() {
        let mut r = sample_report();
        r.false_sharing.clear();
        r.false_sharing_dismissed = vec![DismissedLine {
            line: "0x1000".into(),
            object: "g_padded+64".into(),
            object_kind: ObjectKind::Global,
            samples: 10,
            writes: 10,
            shared: false,
            reason: DismissReason::OneThread,
        }];
        let text = render(&r);
        assert!(
            text.contains("busiest lines checked: g_padded+64 (one thread)"),
            "{text}"
        );
    }

    #[test]
    fn lines_shared_by_processes_list_pid_and_tid_and_the_mapping() {
        let mut r = report_with_sharing();
        let e = &mut r.false_sharing[0];
        e.object.kind = ObjectKind::Shared;
        e.object.name = "/dev/shm/box".into();
        e.object.size = None;
        e.object.alloc_site = None;
        e.processes = vec![
            ProcessThreads {
                pid: 300,
                threads: vec![15027],
            },
            ProcessThreads {
                pid: 301,
                threads: vec![15028],
            },
        ];
        let text = render(&r);
        assert!(
            text.contains("false sharing: /dev/shm/box (shared)"),
            "{text}"
        );
        assert!(text.contains("threads: 300:15027, 301:15028"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        let entry = &json["false_sharing"][0];
        assert_eq!(entry["processes"][1]["pid"], 301);
        assert_eq!(entry["processes"][1]["threads"][0], 15028);
        assert_eq!(entry["object"]["kind"], "shared");
        assert_eq!(entry["threads"][1], 15028, "threads kept as they were");
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

    /// An allocation made in a helper inlined into its caller says so:
    /// the helper's line first, then each function it was inlined into.
    #[test]
    fn an_inlined_allocation_site_names_its_callers() {
        use crate::report::model::CallerRef;
        let mut r = report_with_sharing();
        let site = r.false_sharing[0].object.alloc_site.as_mut().unwrap();
        site.function = "make_accums".into();
        site.file = Some("/src/fs.c".into());
        site.line = Some(11);
        site.inlined_into = vec![CallerRef {
            function: "main".into(),
            file: Some("/src/fs.c".into()),
            line: Some(25),
        }];
        let text = render(&r);
        assert!(
            text.contains("\n     allocated in make_accums fs.c:11, inlined into main fs.c:25\n"),
            "{text}"
        );
        // With the start offset too, the row wraps rather than losing it.
        r.false_sharing[0].object.offset = -32;
        let text = render(&r);
        assert!(text.contains("(starts at byte"), "{text}");
        assert!(text.lines().all(|l| l.chars().count() <= WIDTH), "{text}");
    }
}
