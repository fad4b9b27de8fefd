//! The Locks tab's site tables: where threads waited for the selected
//! lock, the code that released them, and the critical sections that
//! held it, as text in columns that line up across the tables.

use ratatui::{
    layout::{Constraint, Rect},
    style::Stylize,
    text::Line,
    widgets::{Cell, Row, Table},
    Frame,
};

use super::{NUMBER, RELEASED};
use crate::report::{
    model::{source_label, LockEntry},
    text::{ellipsize, format_ns},
};
use crate::tui::widgets::{count_label, ellipsize_line};

/// The detail's site tables as text, with the widths of their columns,
/// which line up across the tables.
pub(super) struct Sites {
    pub(super) waiters: Vec<[String; 4]>,
    pub(super) holders: Vec<[String; 4]>,
    /// Function, source, where the lock was released, two numbers.
    pub(super) sections: Vec<[String; 5]>,
    pub(super) widths: [u16; 4],
    pub(super) section_widths: [u16; 5],
}

impl Sites {
    /// `l`'s sites in `width` columns; the critical sections take part in
    /// the widths only when shown (`sections_shown`).
    pub(super) fn new(l: &LockEntry, sections_shown: bool, width: u16) -> Self {
        let waiters = site_rows(&l.waiters, |w| {
            let numbers = [count_label(w.count), format_ns(w.wait_ns)];
            (&w.function, w.file.as_deref(), w.line, &w.module, numbers)
        });
        let holders = site_rows(&l.holders, |h| {
            let numbers = [count_label(h.count), format_ns(h.delay_caused_ns)];
            (&h.function, h.file.as_deref(), h.line, &h.module, numbers)
        });
        let sections = site_rows(&l.sections, |s| {
            let numbers = [count_label(s.count), format_ns(s.hold_ns)];
            (&s.function, s.file.as_deref(), s.line, &s.module, numbers)
        });
        let sections: Vec<[String; 5]> = sections
            .into_iter()
            .zip(&l.sections)
            .map(|([function, source, count, hold], s)| {
                let released = s.released_at.clone().unwrap_or_else(|| "-".into());
                [function, source, released, count, hold]
            })
            .collect();
        let longest_released = longest(&sections, 2, RELEASED);
        let section_source = longest(&sections, 1, "source");
        // The critical sections' source and release share the source column.
        let longest_section = if sections_shown && !sections.is_empty() {
            section_source + 1 + longest_released
        } else {
            0
        };
        let longest_source = longest(&waiters, 1, "")
            .max(longest(&holders, 1, ""))
            .max(longest_section);
        let longest_function = longest(&waiters, 0, "released by")
            .max(longest(&holders, 0, ""))
            .max(longest(&sections, 0, ""));
        let widths = site_widths(width, longest_function, longest_source);
        Self {
            section_widths: section_widths(widths, section_source, longest_released),
            widths,
            waiters,
            holders,
            sections,
        }
    }
}

/// The characters of the longest text in `column` of `rows`, or of
/// `least` when longer.
fn longest<const N: usize>(rows: &[[String; N]], column: usize, least: &str) -> usize {
    let longest = rows.iter().map(|row| row[column].chars().count()).max();
    longest.unwrap_or(0).max(least.chars().count())
}

/// Widths of the site tables' columns (function, source, two numbers) in
/// `width`, shared by the site tables so that they line up: the source
/// gets what its longest label needs, up to half, or up to what the
/// longest function leaves.
pub(super) fn site_widths(width: u16, longest_function: usize, longest_source: usize) -> [u16; 4] {
    let rest = width.saturating_sub(2 * NUMBER + 3);
    let to_u16 = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
    let longest = to_u16(longest_source.max("source".len()));
    let beside_functions = rest.saturating_sub(to_u16(longest_function));
    let source = longest.min((rest / 2).max(beside_functions));
    [rest - source, source, NUMBER, NUMBER]
}

/// Widths of the critical sections' columns (function, source, release,
/// two numbers), lined up with the other site tables' `widths`: the
/// source and the release share their source column; the release gets
/// what its longest label needs (`longest_released`), leaving the source
/// what its longest label needs (`longest_source`) or at least half.
pub(super) fn section_widths(
    widths: [u16; 4],
    longest_source: usize,
    longest_released: usize,
) -> [u16; 5] {
    let [function, shared, first, second] = widths;
    let room = shared.saturating_sub(1);
    let to_u16 = |n: usize| u16::try_from(n).unwrap_or(u16::MAX);
    let source = to_u16(longest_source).min(room / 2);
    let release = to_u16(longest_released).min(room - source);
    [function, room - release, release, first, second]
}

/// The rows of a site table (function, source, two numbers) for `sites`;
/// `parts` gives a site's function, file, line, module and two numbers.
fn site_rows<S>(
    sites: &[S],
    parts: impl Fn(&S) -> (&str, Option<&str>, Option<u32>, &str, [String; 2]),
) -> Vec<[String; 4]> {
    sites
        .iter()
        .map(|site| {
            let (function, file, line, module, [first, second]) = parts(site);
            [
                function.into(),
                source_label(file, line, module),
                first,
                second,
            ]
        })
        .collect()
}

/// A table of sites (text columns, then two numbers) under a bold header,
/// or `none` when there are no sites.
pub(super) fn render_sites<const N: usize>(
    frame: &mut Frame,
    area: Rect,
    header: [&'static str; N],
    sites: impl Iterator<Item = [String; N]>,
    widths: [u16; N],
    none: &'static str,
) {
    let cell = |i: usize, text: String| {
        let text = ellipsize(&text, usize::from(widths[i]));
        if i + 2 < N {
            Cell::from(text)
        } else {
            Cell::from(Line::from(text).right_aligned())
        }
    };
    let rows: Vec<Row> = sites
        .map(|site| {
            site.into_iter()
                .enumerate()
                .map(|(i, t)| cell(i, t))
                .collect()
        })
        .collect();
    if rows.is_empty() {
        let line = ellipsize_line(Line::from(none).dim(), usize::from(area.width));
        frame.render_widget(line, area);
        return;
    }
    let header: Row = header
        .into_iter()
        .enumerate()
        .map(|(i, t)| cell(i, t.to_string()))
        .collect::<Row>()
        .bold();
    let table = Table::new(rows, widths.map(Constraint::Length)).header(header);
    frame.render_widget(table, area);
}
