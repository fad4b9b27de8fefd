//! The Cache use tab (the report section's tab, numbered after the
//! built-in ones): objects that use little of each cache line they
//! bring in (↑/↓ select one), and for the selected one its element as a
//! strip of byte cells coloured by how often each field was accessed,
//! the fields, and the fix.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Style, Stylize},
    text::{Line, Span},
    widgets::{Paragraph, Row, Table},
    Frame,
};

use super::section::CacheUseEntry;
use crate::report::{
    model::Report,
    text::{ellipsize, group},
};
use crate::tui::{
    layout::{render_master_detail, DetailView, Lines, Selection},
    widgets::{render_lines, wrap_words},
};

const TITLE: &str = " Cache use ";
/// Bytes of the element each cell of the strip stands for.
const BYTES_PER_CELL: u64 = 2;

pub fn render(
    entries: &[CacheUseEntry],
    report: &Report,
    frame: &mut Frame,
    area: Rect,
    selection: Selection,
) {
    if entries.is_empty() {
        render_lines(frame, area, TITLE, empty_lines(report));
        return;
    }
    render_master_detail(
        frame,
        area,
        entries,
        selection,
        |_| objects_table(entries),
        Detail::new,
    );
}

fn empty_lines(report: &Report) -> Vec<Line<'static>> {
    let a = &report.sampling.addresses;
    vec![
        Line::from("no object with poorly used cache lines found yet").bold(),
        Line::from(""),
        Line::from(format!(
            "{} sampled data addresses: objects using less than half of each line they",
            group(a.with_address)
        )),
        Line::from("bring in, with 20 samples and 2% of all at least, are listed here"),
    ]
}

fn objects_table(entries: &[CacheUseEntry]) -> Table<'static> {
    let rows: Vec<Row> = entries
        .iter()
        .map(|e| {
            Row::new(vec![
                ellipsize(&e.object, 44),
                e.object_kind.to_string(),
                format!("{:.1}%", e.line_use * 100.0),
                group(e.accesses),
                format!("{} B", e.element_size),
            ])
        })
        .collect();
    Table::new(
        rows,
        [
            Constraint::Fill(1),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Length(8),
        ],
    )
    .header(Row::new(["object", "kind", "line use", "samples", "element"]).bold())
    .block(ratatui::widgets::Block::bordered().title(TITLE))
}

/// The selected object's element, fields and fix, for a width.
struct Detail<'a> {
    entry: &'a CacheUseEntry,
    width: usize,
}

struct Fit {
    strip: u16,
    fields: u16,
    advice: u16,
}

impl Lines for Fit {
    fn lines(&self) -> u16 {
        self.strip + self.fields + self.advice
    }
}

impl<'a> Detail<'a> {
    fn new(entry: &'a CacheUseEntry, width: u16) -> Self {
        Self {
            entry,
            width: usize::from(width),
        }
    }

    /// The element as cells of [`BYTES_PER_CELL`] bytes, a line of 64
    /// bytes per row: a field's cells are red by its share of the
    /// accesses, cold fields dim.
    fn strip(&self) -> Vec<Line<'static>> {
        let e = self.entry;
        let most = e
            .fields
            .iter()
            .map(|f| f.accesses)
            .max()
            .unwrap_or(1)
            .max(1);
        let cell = |byte: u64| -> Span<'static> {
            let field = e
                .fields
                .iter()
                .find(|f| f.offset <= byte && byte < f.offset + f.size);
            match field {
                Some(f) if f.accesses > 0 => {
                    let heat = 80 + (175 * f.accesses / most) as u8;
                    Span::styled("█", Style::new().fg(Color::Rgb(heat, 40, 40)))
                }
                Some(_) => Span::from("░").dim(),
                None => Span::from("·").dim(),
            }
        };
        let per_row = 64 / BYTES_PER_CELL;
        let cells = e.element_size.div_ceil(BYTES_PER_CELL);
        (0..cells.div_ceil(per_row))
            .map(|row| {
                let mut spans = vec![Span::from(format!("{:>5} ", row * 64)).dim()];
                for c in row * per_row..((row + 1) * per_row).min(cells) {
                    spans.push(cell(c * BYTES_PER_CELL));
                }
                Line::from(spans)
            })
            .collect()
    }

    fn fields(&self) -> Vec<Line<'static>> {
        let mut fields: Vec<_> = self.entry.fields.iter().collect();
        fields.sort_by_key(|f| std::cmp::Reverse(f.accesses));
        let text: Vec<String> = fields
            .iter()
            .map(|f| match f.accesses {
                0 => format!("{} +{} ({} B) cold", f.name, f.offset, f.size),
                n => format!("{} +{} ({} B) {}", f.name, f.offset, f.size, group(n)),
            })
            .collect();
        wrap_words(&text.join(" · "), self.width)
            .into_iter()
            .map(Line::from)
            .collect()
    }

    fn advice(&self) -> Vec<Line<'static>> {
        wrap_words(&format!("fix: {}", self.entry.advice), self.width)
            .into_iter()
            .map(|l| Line::from(l).yellow())
            .collect()
    }
}

impl DetailView for Detail<'_> {
    type Fit = Fit;

    fn title(&self) -> String {
        let e = self.entry;
        format!(
            " {}: {:.1}% of each line used, {} of {} lines per element needed ",
            e.object,
            e.line_use * 100.0,
            e.packed_lines,
            e.lines_per_element
        )
    }

    fn fit(&self, height: u16) -> Fit {
        let n = |v: Vec<Line>| u16::try_from(v.len()).unwrap_or(u16::MAX);
        let mut left = height;
        let mut take = |want: u16| {
            let got = if want <= left { want } else { 0 };
            left -= got;
            got
        };
        let strip = take(n(self.strip()));
        let advice = take(n(self.advice()));
        let fields = take(n(self.fields()));
        Fit {
            strip,
            fields,
            advice,
        }
    }

    fn render(&self, fit: &Fit, frame: &mut Frame, area: Rect) {
        let [strip, fields, advice] = Layout::vertical([
            Constraint::Length(fit.strip),
            Constraint::Length(fit.fields),
            Constraint::Length(fit.advice),
        ])
        .areas(area);
        frame.render_widget(Paragraph::new(self.strip()), strip);
        frame.render_widget(Paragraph::new(self.fields()), fields);
        frame.render_widget(Paragraph::new(self.advice()), advice);
    }
}

#[cfg(test)]
mod tests {
    use crate::report::fixtures::{full_report, sample_report};
    use crate::tui::{app_on, assert_centred, assert_fits, assert_shows, screen_at, Tab};

    #[test]
    fn the_tab_shows_the_objects_and_the_selected_ones_element() {
        let app = app_on(Tab::Section(0), full_report());
        let text = screen_at(&app, 100, 30);
        assert_shows(
            &text,
            &[
                "g_records",
                "12.5%",
                "64 B",
                "key +0 (8 B) 1,200",
                "payload +8 (56 B) cold",
                "fix: only 12% of each cache line",
            ],
        );
        assert!(text.contains('█') && text.contains('░'), "{text}");
        assert_fits(&screen_at(&app, 60, 20), 60);
    }

    #[test]
    fn without_findings_the_tab_says_what_it_looks_for() {
        let app = app_on(Tab::Section(0), sample_report());
        let text = screen_at(&app, 100, 30);
        assert_centred(&text, "no object with poorly used cache lines found yet");
    }
}
