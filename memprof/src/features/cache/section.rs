//! The cache-use section of the report, `cache_utilization` in the JSON:
//! objects whose accesses use little of each cache line they bring in
//! (hot fields interleaved with cold ones), most lines wasted first. Its
//! summary lines are in [`super::text`], its dashboard tab in
//! [`super::tab`].

use ratatui::{layout::Rect, Frame};
use serde::{Deserialize, Serialize};

use crate::report::{
    model::{CodeRef, ObjectKind},
    section::{Section, SectionKind},
    Report,
};
use crate::tui::Selection;

/// The section's key in the JSON report.
pub const KEY: &str = "cache_utilization";

/// How the report reads the section back.
pub const KIND: SectionKind = SectionKind::of::<CacheUse>(KEY);

/// The objects with poorly used lines, most lines wasted first.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CacheUse(pub Vec<CacheUseEntry>);

impl Section for CacheUse {
    fn key(&self) -> &str {
        KEY
    }

    fn to_json(&self) -> serde_json::Value {
        // Plain structs of strings and numbers: a non-finite float is null.
        serde_json::to_value(self).unwrap_or_default()
    }

    fn write_text(&self, out: &mut String) {
        super::text::write_cache_use(out, &self.0);
    }

    fn tab_title(&self) -> Option<&str> {
        Some("Cache use")
    }

    fn tab_rows(&self) -> usize {
        self.0.len()
    }

    fn render_tab(&self, report: &Report, frame: &mut Frame, area: Rect, selection: Selection) {
        super::tab::render(&self.0, report, frame, area, selection);
    }

    fn clone_box(&self) -> Box<dyn Section> {
        Box::new(self.clone())
    }
}

/// One object whose lines are poorly used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheUseEntry {
    /// As in `false_sharing`: the global's name, or the heap blocks'
    /// size and allocation site.
    pub object: String,
    pub object_kind: ObjectKind,
    /// Heap objects: where the blocks are allocated.
    pub alloc_site: Option<CodeRef>,
    /// Sampled accesses to the object, and their share of all sampled
    /// data accesses.
    pub accesses: u64,
    pub share: f64,
    /// The element accesses fold onto (an array's struct; the debug info's
    /// when there is some, else inferred from the access pattern).
    pub element_size: u64,
    /// Bytes of an element accessed at all over the bytes of the lines
    /// they lie in (0-1): the share of every line brought in that is used.
    pub line_use: f64,
    /// Lines of an element that hold accessed bytes, and how many the
    /// accessed bytes would need packed together.
    pub lines_per_element: u64,
    pub packed_lines: u64,
    /// The element's fields by offset (the debug info's, cold ones too;
    /// else the runs of accessed bytes, named `+OFFSET`).
    pub fields: Vec<FieldUse>,
    /// Fields one thread accessed close together (consecutive samples
    /// within 2 ms, in any elements): [field, field, times].
    pub affinity: Vec<(String, String, u64)>,
    /// Line use per second, for the latest minute's windows with enough
    /// samples of the object (a phase that uses the lines differently
    /// shows here, where the whole session's figure averages it out).
    pub windows: Vec<WindowUse>,
    pub advice: String,
}

/// The line use of one window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowUse {
    /// Seconds from the session's first sampled access.
    pub start_s: f64,
    pub accesses: u64,
    pub line_use: f64,
}

/// One field of the element.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldUse {
    pub name: String,
    pub offset: u64,
    pub size: u64,
    /// Sampled accesses (0: a cold field).
    pub accesses: u64,
}
