//! The summary's head: the target, the sampling and the profiler's own
//! cost, then the hot functions.

use std::fmt::Write as _;

use super::WIDTH;
use crate::report::{
    format::{ellipsize, format_bytes, format_duration, group, percent},
    model::Report,
};

/// Hot functions listed in the summary.
const TOP: usize = 15;

/// The target, how it was sampled, the profiler's cost and the notes.
pub(super) fn write_header(out: &mut String, report: &Report) {
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
}

/// The "Hot functions" section: self and total time, most self time
/// first.
pub(super) fn write_hot_functions(out: &mut String, report: &Report) {
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
}

#[cfg(test)]
mod tests {
    use crate::report::{
        fixtures::sample_report,
        text::{render, WIDTH},
    };

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
}
