//! The text summary printed at the end of a session: ranked, with units,
//! readable in 80 columns. One file per section, in the order printed.

mod allocator;
mod locks;
mod overview;
mod sharing;

use std::fmt::Write as _;

pub use super::format::{
    ellipsize, format_bytes, format_duration, format_ns, group, percent, share_percent,
};
use super::model::Report;
pub use allocator::{
    allocator_off, by_time, from_loop, library_label, live_label, sites_by_bytes, syscall_origin,
};
pub use overview::share_of_a_core;
pub use sharing::word_ranges;

/// Width the summary is laid out for.
pub const WIDTH: usize = 80;

/// Renders the summary.
pub fn render(report: &Report) -> String {
    fit(&render_wide(report), WIDTH)
}

fn render_wide(report: &Report) -> String {
    let mut out = String::new();
    overview::write_header(&mut out, report);
    out.push('\n');
    overview::write_hot_functions(&mut out, report);
    out.push('\n');
    sharing::write_false_sharing(&mut out, report);
    out.push('\n');
    allocator::write_allocator(&mut out, &report.allocator);
    out.push('\n');
    locks::write_locks(&mut out, &report.locks, report.lock_tracing.as_ref());
    for section in report.sections.iter() {
        out.push('\n');
        section.write_text(&mut out);
    }
    out
}

/// Cuts every line of `text` to `width` characters.
fn fit(text: &str, width: usize) -> String {
    text.lines().map(|l| ellipsize(l, width) + "\n").collect()
}

/// Writes `text` after `lead`, wrapped at [`WIDTH`] with continuation
/// lines indented like the text.
pub fn wrap_into(out: &mut String, lead: &str, text: &str) {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    /// The fixtures the dashboard's tests take from here.
    pub(crate) use crate::report::fixtures::{report_with_allocator, report_with_locks};

    /// The summary of the fully filled fixture report, byte for byte.
    #[test]
    fn summary_of_the_full_report_is_unchanged() {
        let text = render(&crate::report::fixtures::full_report());
        if std::env::var_os("MEMPROF_UPDATE_SNAPSHOTS").is_some() {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/report/testdata/summary.txt"
            );
            std::fs::write(path, &text).expect("fixture writable");
            return;
        }
        assert_eq!(text, include_str!("../testdata/summary.txt"));
    }
}
