//! The "Cache use" section: objects whose accesses use little of each
//! line they bring in.

use std::fmt::Write as _;

use super::section::CacheUseEntry;
use crate::report::{
    format::{ellipsize, group},
    text::wrap_into,
};

/// Objects shown in the summary.
const TOP_OBJECTS: usize = 3;
/// Fields listed per object.
const TOP_FIELDS: usize = 6;
/// Windows' line use this far apart is shown.
const WINDOW_SPREAD: f64 = 0.05;

/// The "Cache use" section, one paragraph per object, most lines wasted
/// first; one line when nothing was found.
pub(super) fn write_cache_use(out: &mut String, entries: &[CacheUseEntry]) {
    if entries.is_empty() {
        let _ = writeln!(
            out,
            "Cache use: no object with poorly used cache lines among the sampled accesses"
        );
        return;
    }
    let _ = writeln!(
        out,
        "Cache use: objects using little of each line they bring in"
    );
    for e in entries.iter().take(TOP_OBJECTS) {
        write_object(out, e);
    }
    let more = entries.len().saturating_sub(TOP_OBJECTS);
    if more > 0 {
        let _ = writeln!(out, "  … {more} more in the JSON report");
    }
}

fn write_object(out: &mut String, e: &CacheUseEntry) {
    let _ = writeln!(
        out,
        "  {} ({}): {:.1}% of each line used · {} samples ({:.0}% of all)",
        ellipsize(&e.object, 40),
        e.object_kind,
        e.line_use * 100.0,
        group(e.accesses),
        e.share * 100.0
    );
    let mut fields: Vec<_> = e.fields.iter().collect();
    fields.sort_by(|a, b| b.accesses.cmp(&a.accesses).then(a.offset.cmp(&b.offset)));
    let list: Vec<String> = fields
        .iter()
        .take(TOP_FIELDS)
        .map(|f| match f.accesses {
            0 => format!("{} (+{}, {} B) cold", f.name, f.offset, f.size),
            n => format!("{} (+{}, {} B) {}", f.name, f.offset, f.size, group(n)),
        })
        .collect();
    let lead = format!("    {}-byte element: ", e.element_size);
    wrap_into(out, &lead, &list.join(", "));
    write_windows(out, e);
    wrap_into(out, "    fix: ", &e.advice);
}

/// `line use per second: 12.5%–50.0% (2 windows)` when the windows
/// differ by more than a few points (a phase the session figure hides).
fn write_windows(out: &mut String, e: &CacheUseEntry) {
    let uses = e.windows.iter().map(|w| w.line_use);
    let (lo, hi) = uses.fold((f64::MAX, f64::MIN), |(lo, hi), u| (lo.min(u), hi.max(u)));
    if e.windows.len() < 2 || hi - lo < WINDOW_SPREAD {
        return;
    }
    let _ = writeln!(
        out,
        "    line use per second: {:.1}%–{:.1}% ({} windows)",
        lo * 100.0,
        hi * 100.0,
        e.windows.len()
    );
}
