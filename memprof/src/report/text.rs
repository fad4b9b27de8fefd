//! The text summary printed at the end of a session: ranked, with units,
//! readable in 80 columns.

use std::fmt::Write as _;

use super::model::Report;

/// Width the summary is laid out for.
pub const WIDTH: usize = 80;
/// Hot functions listed in the summary.
const TOP: usize = 15;

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
    let _ = writeln!(out, "False sharing: not analysed by this version");
    let _ = writeln!(out, "Allocator:     not analysed by this version");
    let _ = writeln!(out, "Locks:         not analysed by this version");
    out
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
mod tests {
    use super::*;
    use crate::report::model::tests::sample_report;

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
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(20 << 20), "20.0 MiB");
        assert_eq!(ellipsize("abcdef", 4), "abc…");
        assert_eq!(ellipsize("abc", 4), "abc");
    }
}
