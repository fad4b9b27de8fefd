//! The summary's head: the target, the sampling and the profiler's own
//! cost, then the hot functions.

use std::fmt::Write as _;

use super::{wrap_into, WIDTH};
use crate::report::{
    format::{ellipsize, format_bytes, format_duration, format_ns, group, percent},
    model::{Loader, Report},
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
    write_processes(out, report);
    let _ = writeln!(
        out,
        "  {} samples at {} Hz {} ({}) · {} lost · {:.1}% in kernel",
        group(s.samples),
        s.frequency_hz,
        s.scope.per(),
        s.source,
        group(s.lost),
        percent(s.kernel_samples, s.samples),
    );
    if let Some(rate) = s.switches_per_s {
        let _ = writeln!(
            out,
            "  start: {} switches/s, so sampled {} (per CPU above {})",
            group(rate as u64),
            s.scope.per(),
            group(crate::kernel::sampler::SWITCHY_PER_S as u64),
        );
    }
    if let (Some(ns), Some(share)) = (s.interrupt_ns, s.interrupt_share) {
        let pct = share * 100.0;
        let _ = writeln!(
            out,
            "  sampler interrupt: {:.1} µs (estimate, this boot), {pct:.*}% of each {}",
            ns / 1e3,
            if pct < 1.0 { 2 } else { 1 },
            s.scope.whose(),
        );
    }
    let l = &report.loader;
    let _ = writeln!(
        out,
        "  profiler: {:.2} s CPU ({:.1}% of a core), {} peak memory",
        l.cpu_s,
        l.cpu_share * 100.0,
        format_bytes(l.peak_rss_bytes),
    );
    write_kernel_cost(out, l);
    for note in &report.notes {
        let _ = writeln!(out, "  note: {note}");
    }
}

/// The traced processes, when there are several or the one is in another
/// pid namespace: each with its threads and samples.
fn write_processes(out: &mut String, report: &Report) {
    let processes = &report.target.processes;
    if processes.len() < 2 && processes.iter().all(|p| p.ns_pid.is_none()) {
        return;
    }
    match processes.len() {
        1 => out.push_str("  process:\n"),
        n => {
            let _ = writeln!(out, "  {n} processes:");
        }
    }
    for p in processes {
        let command = if p.command.is_empty() {
            "(exited)"
        } else {
            p.command.as_str()
        };
        let line = format!(
            "    pid {} · {} thread{} · {} samples · {command}",
            p.pid_label(),
            p.threads,
            if p.threads == 1 { "" } else { "s" },
            group(p.samples),
        );
        let _ = writeln!(out, "{}", ellipsize(&line, WIDTH));
    }
}

/// What the profiler's programs cost: their run time and the records they
/// sent through the rings.
fn write_kernel_cost(out: &mut String, l: &Loader) {
    match (l.bpf_run_ns, l.bpf_runs) {
        (Some(ns), Some(runs)) => {
            let busiest: Vec<String> = l
                .programs
                .iter()
                .take(3)
                .filter(|p| p.run_ns > 0)
                .map(|p| format!("{} {}", p.name, format_ns(p.run_ns)))
                .collect();
            let text = format!(
                "{} run time ({}), {} runs ({}/s){}{}",
                format_ns(ns),
                share_of_a_core(l.bpf_run_share),
                group(runs),
                group(l.bpf_runs_per_s.unwrap_or(0.0).round() as u64),
                if busiest.is_empty() { "" } else { "; most: " },
                busiest.join(", "),
            );
            wrap_into(out, "  BPF programs: ", &text);
        }
        _ => wrap_into(
            out,
            "  BPF programs: ",
            &format!("run time not measured (bpf_stats {})", l.bpf_stats),
        ),
    }
    let mut rings: Vec<_> = l.rings.iter().filter(|r| r.events > 0).collect();
    rings.sort_by_key(|r| std::cmp::Reverse(r.events));
    let each: Vec<String> = rings
        .iter()
        .map(|r| format!("{} {}", r.name, group(r.events)))
        .collect();
    let text = format!(
        "{} ({}/s){}{}",
        group(l.ring_events),
        group(l.ring_events_per_s.round() as u64),
        if each.is_empty() { "" } else { ": " },
        each.join(", "),
    );
    wrap_into(out, "  ring records read: ", &text);
}

/// `66.8% of a core` (two decimals under 1%), or `unknown`.
pub fn share_of_a_core(share: Option<f64>) -> String {
    match share {
        Some(s) if s < 0.01 => format!("{:.2}% of a core", s * 100.0),
        Some(s) => format!("{:.1}% of a core", s * 100.0),
        None => "unknown".into(),
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
        assert!(text.contains("1,000 samples at 999 Hz per thread (cpu-clock)"));
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

    /// The summary with its lines and indents run together.
    fn flat(text: &str) -> String {
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn the_programs_cost_is_in_the_header() {
        let text = flat(&render(&sample_report()));
        assert!(
            text.contains(
                "BPF programs: 25.0 ms run time (1.0% of a core), 65,000 runs (26,000/s); \
                 most: futex_exit 21.0 ms, cpu_sample 4.00 ms ring records read: 52,500 \
                 (21,000/s): lock_events 50,000, samples 2,500"
            ),
            "{text}"
        );
    }

    #[test]
    fn unmeasured_run_time_says_why() {
        let mut r = sample_report();
        r.loader.bpf_stats = "unavailable: the kernel refused".into();
        (r.loader.bpf_run_ns, r.loader.bpf_runs) = (None, None);
        let text = flat(&render(&r));
        assert!(
            text.contains(
                "BPF programs: run time not measured (bpf_stats unavailable: the kernel refused)"
            ),
            "{text}"
        );
    }

    #[test]
    fn shares_of_a_core() {
        use super::share_of_a_core;
        assert_eq!(share_of_a_core(Some(0.668)), "66.8% of a core");
        assert_eq!(share_of_a_core(Some(0.00015)), "0.01% of a core");
        assert_eq!(share_of_a_core(None), "unknown");
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
