//! The False sharing tab: the cache lines threads contend for, most costly
//! first, and the selected line's detail: the object on it, which thread
//! touches which of its 64 bytes (a grid of sixteen 4-byte words coloured
//! by thread), the fix, and the code touching it. A footer says how many
//! samples yielded a data address, so that the profiler is seen at work
//! before any line is found.
//!
//! On a small terminal the table keeps a few rows (it scrolls to the
//! selection), the footer goes, and the detail drops, in this order: the
//! dependences, the code rows after the first, the legend lines after the
//! first, the allocation site, the offsets above the grid, the advice
//! after its first line, the code, the advice, the grid. The grid's words
//! narrow before the grid goes.

mod grid;

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Paragraph, Table},
    Frame,
};

use grid::Grid;

use crate::tui::{
    layout::{render_master_detail, DetailView, LineBudget, Lines, Selection},
    widgets::{
        column_width, count_label, ellipsize_line, first_width, render_lines, render_message,
        styled_table, table, wrap_words, Column,
    },
    App,
};

use crate::report::{
    model::{inlined_label, source_label, AddressSampling, SharingCode, SharingEntry},
    text::{ellipsize, format_bytes, group},
};

/// The tab's frame title, for its messages.
const TITLE: &str = " False sharing ";
/// The footer is shown from this tab height.
const FOOTER_FROM: u16 = 6;
/// Width of the tab's count columns ("9,999,999").
const NUMBER: u16 = 9;
/// Width of the code table's source column.
const SOURCE: u16 = 18;
/// Width of the code table's threads column: two thread ids.
const THREADS: u16 = 11;

/// The tab's own state: which line is selected. A new report keeps the
/// same line selected ([`Selection::follow`] with [`same_line`]).
pub type SharingState = Selection;

/// Whether two entries of successive reports are the same cache line.
pub fn same_line(a: &SharingEntry, b: &SharingEntry) -> bool {
    a.line == b.line
}

/// Draws the tab.
pub fn render(app: &App, frame: &mut Frame, area: Rect) {
    let Some(report) = &app.report else {
        render_message(frame, area, TITLE, "waiting for the first report…");
        return;
    };
    let addresses = &report.sampling.addresses;
    let entries = &report.false_sharing;
    if entries.is_empty() {
        render_lines(frame, area, TITLE, empty_lines(addresses));
        return;
    }
    let footer = u16::from(area.height >= FOOTER_FROM);
    let [main, footer_area] =
        Layout::vertical([Constraint::Fill(1), Constraint::Length(footer)]).areas(area);
    render_master_detail(
        frame,
        main,
        entries,
        app.sharing,
        |area| lines_table(entries, area),
        Detail::new,
    );
    if footer > 0 {
        frame.render_widget(
            footer_line(addresses, usize::from(footer_area.width)),
            footer_area,
        );
    }
}

/// No line found yet: say so, and show that addresses are being sampled.
fn empty_lines(a: &AddressSampling) -> Vec<Line<'static>> {
    vec![
        Line::from("no contended cache line found yet").bold(),
        Line::from(""),
        Line::from(format!(
            "{} of {} user samples yielded a data address ({:.0}%)",
            group(a.with_address),
            group(a.user_samples),
            a.address_share * 100.0
        )),
        Line::from(format!("mode {} · {}", a.mode, lines_tracked(a))),
        Line::from(""),
        Line::from("a line shows here once threads write it while others use it").dim(),
    ]
}

/// `12 lines tracked`, with the lines evicted when there were some.
fn lines_tracked(a: &AddressSampling) -> String {
    let mut text = format!("{} lines tracked", group(a.lines_tracked));
    if a.lines_evicted > 0 {
        text.push_str(&format!(", {} evicted", group(a.lines_evicted)));
    }
    text
}

/// `addresses 970 of 1,000 user samples (97%, decoded) · 12 lines tracked`.
fn footer_line(a: &AddressSampling, width: usize) -> Line<'static> {
    let line = Line::from(vec![
        " addresses ".dim(),
        format!(
            "{} of {} user samples ({:.0}%, {})",
            group(a.with_address),
            group(a.user_samples),
            a.address_share * 100.0,
            a.mode
        )
        .into(),
        " · ".dim(),
        lines_tracked(a).into(),
    ]);
    ellipsize_line(line, width)
}

/// The lines table's columns; on a narrow pane threads, samples, kind,
/// rank and invalidations go, in that order.
const LINE_COLUMNS: [Column; 7] = [
    Column::number("#", 3, 3),
    Column::number("cost", 6, 0),
    Column::text("kind", 5, 4),
    Column::text("object", 12, 0).fill(),
    Column::number("invalidations", 13, 2),
    Column::number("samples", NUMBER, 5),
    Column::number("threads", 7, 6),
];
/// The object column, which takes what the others leave.
const OBJECT_COLUMN: usize = 3;

/// The ranked lines for `area`.
fn lines_table(entries: &[SharingEntry], area: Rect) -> Table<'static> {
    // Too low for borders, a header and a row: the rows go unframed.
    let block = if area.height >= 4 {
        Block::bordered().title(" Contended cache lines (most costly first; ↑/↓ select) ")
    } else {
        Block::new()
    };
    let width = block.inner(area).width;
    let object_width = usize::from(column_width(&LINE_COLUMNS, OBJECT_COLUMN, width));
    let rows = entries.iter().enumerate().map(|(i, e)| {
        let cells = vec![
            (i + 1).to_string(),
            format!("{:.1}%", e.cost_share * 100.0),
            e.kind.to_string(),
            ellipsize(&e.object.label(), object_width),
            count_label(e.invalidations),
            count_label(e.samples),
            group(e.threads.len() as u64),
        ];
        (cells, Style::new())
    });
    styled_table(&LINE_COLUMNS, rows, width).block(block)
}

/// ` line 0x5555deadbe40 · false sharing · 3,753 invalidations (99% of
/// accesses) `.
fn line_title(e: &SharingEntry) -> String {
    format!(
        " line {} · {} sharing · {} invalidations ({:.0}% of accesses) ",
        e.line,
        e.kind,
        group(e.invalidations),
        e.invalidation_rate * 100.0
    )
}

/// The selected line's detail, laid out for a width; [`Detail::fit`]
/// chooses what of it a height shows.
struct Detail {
    title: String,
    object: Line<'static>,
    alloc: Option<Line<'static>>,
    /// Byte offsets above the words, when the words are wide enough.
    offsets: Option<Line<'static>>,
    words: Line<'static>,
    legend: Vec<Line<'static>>,
    advice: Vec<String>,
    code: Vec<Vec<String>>,
    dependences: Option<Line<'static>>,
    width: u16,
}

/// What of the detail is shown: flags for one-line parts, and lines (or
/// rows) of the others; `code: None` drops the code, `Some(0)` is its
/// "none seen" line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DetailFit {
    object: bool,
    alloc: bool,
    offsets: bool,
    /// The words, with at least the first legend line.
    grid: bool,
    legend: usize,
    advice: usize,
    code: Option<usize>,
    dependences: bool,
}

impl Lines for DetailFit {
    /// Lines used.
    fn lines(&self) -> u16 {
        let total = usize::from(self.object)
            + usize::from(self.alloc)
            + usize::from(self.offsets)
            + usize::from(self.grid)
            + self.legend
            + self.advice
            + self.code.map_or(0, |n| 1 + n)
            + usize::from(self.dependences);
        u16::try_from(total).unwrap_or(u16::MAX)
    }
}

/// The advice's lead, and the indent of its other lines.
const FIX: &str = "fix ";

impl Detail {
    fn new(e: &SharingEntry, width: u16) -> Self {
        let room = usize::from(width);
        let o = &e.object;
        let mut what = vec![o.kind.to_string()];
        what.extend(o.size.map(format_bytes));
        what.extend(
            o.starts_in_line()
                .map(|b| format!("starts at byte {b} of the line")),
        );
        let object = Line::from(vec![
            "object ".dim(),
            o.label().bold(),
            format!(" ({})", what.join(", ")).into(),
        ]);
        let alloc = o.alloc_site.as_ref().map(|site| {
            let mut spans = vec!["allocated in ".dim(), site.function.clone().into()];
            if site.file.is_some() {
                let source = source_label(site.file.as_deref(), site.line, "");
                spans.push(format!(" {source}").into());
            }
            let inlined = inlined_label(&site.inlined_into);
            if !inlined.is_empty() {
                spans.push(inlined.dim());
            }
            ellipsize_line(Line::from(spans), room)
        });
        let Grid {
            offsets,
            words,
            legend,
        } = Grid::new(e, width);
        let advice = wrap_words(&e.advice, room.saturating_sub(FIX.len()));
        let code = code_rows(&e.code, width);
        let d = e.dependences;
        let dependences =
            (d.read_after_write + d.write_after_write + d.write_after_read > 0).then(|| {
                let text = format!(
                    "{} read-after-write · {} write-after-write · {} write-after-read",
                    group(d.read_after_write),
                    group(d.write_after_write),
                    group(d.write_after_read)
                );
                ellipsize_line(
                    Line::from(vec!["between threads ".dim(), text.into()]),
                    room,
                )
            });
        Self {
            title: line_title(e),
            object: ellipsize_line(object, room),
            alloc,
            offsets,
            words,
            legend,
            advice,
            code,
            dependences,
            width,
        }
    }

    /// The advice lines shown (`shown` of them), led by `fix`; a cut
    /// advice ends with `…`.
    fn advice_lines(&self, shown: usize) -> Vec<Line<'static>> {
        let room = usize::from(self.width).saturating_sub(FIX.len());
        self.advice
            .iter()
            .take(shown)
            .enumerate()
            .map(|(i, text)| {
                let lead = if i == 0 {
                    FIX.dim()
                } else {
                    Span::raw(" ".repeat(FIX.len()))
                };
                let text = if i + 1 == shown && shown < self.advice.len() {
                    ellipsize(&format!("{text} …"), room)
                } else {
                    text.clone()
                };
                Line::from(vec![lead, text.into()])
            })
            .collect()
    }
}

/// The code table's columns; on a narrow pane the byte, the source, the
/// reads and the threads go, in that order.
const CODE_COLUMNS: [Column; 6] = [
    Column::text("code", 12, 0).fill(),
    Column::text("source", SOURCE, 4),
    Column::number("byte", 4, 5),
    Column::number("reads", NUMBER, 3),
    Column::number("writes", NUMBER, 1),
    Column::text("threads", THREADS, 2),
];

/// The code touching the line, one row each.
fn code_rows(code: &[SharingCode], width: u16) -> Vec<Vec<String>> {
    let function = usize::from(first_width(&CODE_COLUMNS, width));
    code.iter()
        .map(|c| {
            vec![
                ellipsize(&c.function, function),
                ellipsize(
                    &source_label(c.file.as_deref(), c.line, &c.module),
                    usize::from(SOURCE),
                ),
                c.offset.to_string(),
                count_label(c.reads),
                count_label(c.writes),
                threads_label(&c.threads),
            ]
        })
        .collect()
}

/// `15027,15028`, or `12 threads` when the ids do not fit.
fn threads_label(threads: &[u32]) -> String {
    let ids: Vec<String> = threads.iter().map(u32::to_string).collect();
    let ids = ids.join(",");
    if ids.chars().count() <= usize::from(THREADS) {
        ids
    } else {
        format!("{} threads", group(threads.len() as u64))
    }
}

/// The selected line: object, allocation site, the word grid and its
/// legend, the advice, the code and the dependences.
impl DetailView for Detail {
    type Fit = DetailFit;

    fn title(&self) -> String {
        self.title.clone()
    }

    /// The parts that fit in `height` lines, the most important first: the
    /// object, the words with the first legend line, the first line of
    /// advice, the first code row, the rest of the advice, the offsets,
    /// the allocation site, the rest of the legend, the other code rows,
    /// the dependences. Nothing is shown without the object.
    fn fit(&self, height: u16) -> DetailFit {
        let mut budget = LineBudget::new(height);
        let mut fit = DetailFit::default();
        if !budget.take(1) {
            return fit;
        }
        fit.object = true;
        if !budget.take(2) {
            return fit;
        }
        fit.grid = true;
        fit.legend = 1;
        if !self.advice.is_empty() && budget.take(1) {
            fit.advice = 1;
        }
        let code = self.code.len();
        if budget.take(1 + code.min(1)) {
            fit.code = Some(code.min(1));
        }
        while fit.advice > 0 && fit.advice < self.advice.len() && budget.take(1) {
            fit.advice += 1;
        }
        fit.offsets = self.offsets.is_some() && budget.take(1);
        fit.alloc = self.alloc.is_some() && budget.take(1);
        while fit.legend < self.legend.len() && budget.take(1) {
            fit.legend += 1;
        }
        if let Some(shown) = &mut fit.code {
            while *shown < code && budget.take(1) {
                *shown += 1;
            }
        }
        fit.dependences = self.dependences.is_some() && budget.take(1);
        fit
    }

    fn render(&self, fit: &DetailFit, frame: &mut Frame, inner: Rect) {
        let length = |n: usize| Constraint::Length(u16::try_from(n).unwrap_or(u16::MAX));
        let [object, alloc, offsets, words, legend, advice, code, dependences] =
            Layout::vertical([
                length(usize::from(fit.object)),
                length(usize::from(fit.alloc)),
                length(usize::from(fit.offsets)),
                length(usize::from(fit.grid)),
                length(fit.legend),
                length(fit.advice),
                length(fit.code.map_or(0, |n| 1 + n)),
                length(usize::from(fit.dependences)),
            ])
            .areas(inner);
        if fit.object {
            frame.render_widget(self.object.clone(), object);
        }
        if let (true, Some(line)) = (fit.alloc, &self.alloc) {
            frame.render_widget(line.clone(), alloc);
        }
        if let (true, Some(line)) = (fit.offsets, &self.offsets) {
            frame.render_widget(line.clone(), offsets);
        }
        if fit.grid {
            frame.render_widget(self.words.clone(), words);
            let lines: Vec<Line> = self.legend.iter().take(fit.legend).cloned().collect();
            frame.render_widget(Paragraph::new(lines), legend);
        }
        frame.render_widget(Paragraph::new(self.advice_lines(fit.advice)), advice);
        match fit.code {
            Some(0) => {
                frame.render_widget(Line::from("no code seen touching the line").dim(), code)
            }
            Some(rows) => {
                let rows = self.code.iter().take(rows).cloned().collect();
                frame.render_widget(table(&CODE_COLUMNS, rows, inner.width), code);
            }
            None => {}
        }
        if let (true, Some(line)) = (fit.dependences, &self.dependences) {
            frame.render_widget(line.clone(), dependences);
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ratatui::{
        backend::TestBackend,
        buffer::Buffer,
        style::{Color, Modifier},
        Terminal,
    };

    use super::*;
    use crate::{
        report::{
            model::{tests::sample_report, CallerRef, CodeRef, Dependences, SharedObject},
            Report,
        },
        tui::{
            app::tests::{app_on, assert_centred, assert_fits, assert_shows, screen_at as screen},
            tabs::sharing::grid::{grid_geometry, GRID_LABEL},
            widgets::shown,
            Action, Tab,
        },
    };

    use crate::report::model::tests::{fixture_code as code, fixture_word as word};

    /// Threads 15027 and 15028 write bytes 0-7 and 8-15 of a heap block.
    fn false_entry() -> SharingEntry {
        crate::report::model::tests::false_sharing_entry()
    }

    /// Three threads write a counter of a global; one also reads the next
    /// word.
    fn true_entry() -> SharingEntry {
        SharingEntry {
            line: "0x5555aaaa0080".into(),
            kind: crate::report::model::SharingKind::True,
            invalidations: 120,
            invalidation_rate: 0.5,
            samples: 240,
            cost_share: 0.02,
            cost_samples: 240,
            predicted_gain: None,
            threads: vec![15027, 15028, 15029],
            processes: Vec::new(),
            object: SharedObject {
                kind: crate::report::model::ObjectKind::Global,
                name: "g_counter".into(),
                offset: 64,
                size: Some(256),
                alloc_site: None,
                type_name: None,
            },
            words: vec![
                word(0, 10, 110, &[15027, 15028, 15029]),
                word(4, 120, 0, &[15029]),
            ],
            code: vec![
                code("bump", 42, 0, 110, &[15027, 15028, 15029]),
                code("peek", 50, 130, 0, &[15029]),
            ],
            dependences: Dependences {
                read_after_write: 12,
                write_after_write: 30,
                write_after_read: 2,
            },
            advice: "Threads update the same word: share it less often.".into(),
        }
    }

    pub(crate) fn report_with(entries: Vec<SharingEntry>) -> Report {
        let mut r = sample_report();
        let a = &mut r.sampling.addresses;
        a.mode = crate::report::model::AddressMode::Decoded;
        a.user_samples = 1000;
        a.with_address = 970;
        a.address_share = 0.97;
        a.lines_tracked = 12;
        r.false_sharing = entries;
        r
    }

    pub(crate) fn report_with_sharing() -> Report {
        report_with(vec![false_entry(), true_entry()])
    }

    fn buffer_of(app: &crate::tui::App, width: u16, height: u16) -> Buffer {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| app.render(f)).unwrap();
        terminal.backend().buffer().clone()
    }

    /// Row and column (in characters) of the first `needle` on screen.
    fn find(text: &str, needle: &str) -> (u16, u16) {
        let (y, line) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle}:\n{text}"));
        let x = line[..line.find(needle).unwrap_or(0)].chars().count();
        (x as u16, y as u16)
    }

    #[test]
    fn shows_the_ranked_lines_and_the_selected_line() {
        let text = screen(&app_on(Tab::FalseSharing, report_with_sharing()), 100, 30);
        assert_shows(
            &text,
            &[
                // The table.
                "Contended cache lines",
                "invalidations",
                "95.1%",
                "false",
                "64-byte heap block from sharing.c:120",
                "3,753",
                "3,779",
                "2.0%",
                "g_counter+64",
                // The detail.
                "line 0x5555deadbe40 · false sharing · 3,753 invalidations (99% of accesses)",
                "object 64-byte heap block from sharing.c:120 (heap, 64 B)",
                "allocated in main sharing.c:120",
                "byte 0   4   8   12  16  20  24  28  32  36  40  44  48  52  56  60",
                " W   W   W   W   ·   ·   ·",
                "15027",
                "15028",
                "W written",
                "R read only",
                "· untouched",
                "fix Threads write different parts of this line",
                "align the per-thread element to 64 bytes.",
                "worker",
                "sharing.c:80",
                "15027,15028",
                // The footer.
                "addresses 970 of 1,000 user samples (97%, decoded) · 12 lines tracked",
                "↑/↓ select",
            ],
        );
        assert!(!text.contains("several threads"), "no shared word:\n{text}");
        let row = |s: &str| find(&text, s).1;
        assert!(row("64-byte heap block") < row("g_counter+64"));
    }

    #[test]
    fn fits_80x24() {
        let text = screen(&app_on(Tab::FalseSharing, report_with_sharing()), 80, 24);
        assert_shows(
            &text,
            &[
                "95.1%",
                "64-byte heap block",
                "g_counter+64",
                "3,753",
                "threads",
                "allocated in main sharing.c:120",
                "byte 0   4   8",
                "15027",
                "W written",
                "fix Threads write different parts",
                "per-thread element to 64 bytes.",
                "worker",
                "sharing.c:80",
                "970 of 1,000 user samples",
            ],
        );
        assert_fits(&text, 80);
    }

    #[test]
    fn words_take_their_thread_colour_and_the_legend_says_whose() {
        let app = app_on(Tab::FalseSharing, report_with_sharing());
        let buffer = buffer_of(&app, 80, 24);
        let text = screen(&app, 80, 24);
        let (x, y) = find(&text, "byte 0");
        let word_at = |i: u16| &buffer[(x + GRID_LABEL + 4 * i + 1, y + 1)];
        let (first, third, fifth) = (word_at(0), word_at(2), word_at(4));
        assert_eq!(first.symbol(), "W");
        assert_eq!(fifth.symbol(), "·");
        assert_ne!(first.bg, third.bg, "two threads, two colours");
        assert_eq!(word_at(1).bg, first.bg, "bytes 0-7 are one thread's");
        assert_eq!(word_at(3).bg, third.bg);
        assert_eq!(fifth.bg, Color::Reset, "untouched");
        // The legend swatch before each thread id has its words' colour.
        let (x, y) = find(&text, " 15027  ");
        assert_eq!(buffer[(x - 1, y)].bg, first.bg);
        let (x, y) = find(&text, " 15028  ");
        assert_eq!(buffer[(x - 1, y)].bg, third.bg);
    }

    #[test]
    fn a_word_of_several_threads_is_marked_shared() {
        let mut app = app_on(Tab::FalseSharing, report_with_sharing());
        app.handle(Action::Down);
        let buffer = buffer_of(&app, 80, 24);
        let text = screen(&app, 80, 24);
        let (x, y) = find(&text, "byte 0");
        let word_at = |i: u16| &buffer[(x + GRID_LABEL + 4 * i + 1, y + 1)];
        assert_eq!(word_at(0).symbol(), "W");
        assert_eq!(word_at(0).bg, Color::Red);
        assert!(word_at(0).modifier.contains(Modifier::BOLD));
        assert_eq!(word_at(1).symbol(), "R");
        assert_ne!(word_at(1).bg, Color::Red);
        assert_shows(&text, &["several threads", "15029", "bump", "peek"]);
    }

    #[test]
    fn arrows_move_the_selection_and_it_survives_a_refresh() {
        let mut app = app_on(Tab::FalseSharing, report_with_sharing());
        app.handle(Action::Up);
        assert!(screen(&app, 100, 30).contains("allocated in main"));
        app.handle(Action::Down);
        assert_eq!(app.scroll, 0, "the selection moves, not the scroll");
        let text = screen(&app, 100, 30);
        assert_shows(
            &text,
            &[
                "line 0x5555aaaa0080 · true sharing",
                "object g_counter+64 (global, 256 B)",
                "Threads update the same word",
                "between threads 12 read-after-write · 30 write-after-write · 2 write-after-read",
            ],
        );
        assert!(!text.contains("allocated in"), "{text}");
        app.handle(Action::Down);
        assert_eq!(app.sharing.selected(2), Some(1), "clamped to the last");
        // The next report ranks the counter first: it stays selected.
        app.set_report(report_with(vec![true_entry(), false_entry()]));
        assert_eq!(app.sharing.selected(2), Some(0));
        assert!(screen(&app, 100, 30).contains("line 0x5555aaaa0080"));
        app.handle(Action::Down);
        assert!(screen(&app, 100, 30).contains("line 0x5555deadbe40"));
    }

    #[test]
    fn the_selection_follows_its_line_across_reports() {
        let old = vec![false_entry(), true_entry()];
        let mut new = vec![true_entry(), false_entry()];
        new[1].samples += 100;
        let mut s = SharingState::default();
        s.follow(&old, &new, same_line);
        assert_eq!(s.selected(2), Some(1), "still the heap block");
        s.follow(&new, &new[1..], same_line);
        assert_eq!(s.selected(1), Some(0));
        assert!(same_line(&old[0], &new[1]) && !same_line(&old[0], &old[1]));
    }

    #[test]
    fn no_line_yet_shows_that_addresses_are_sampled() {
        let text = screen(&app_on(Tab::FalseSharing, report_with(vec![])), 80, 24);
        assert_centred(&text, "no contended cache line found yet");
        assert_centred(
            &text,
            "970 of 1,000 user samples yielded a data address (97%)",
        );
        assert_centred(&text, "mode decoded · 12 lines tracked");
        assert!(!text.contains("Contended cache lines"));
        let mut report = report_with(vec![]);
        report.sampling.addresses.lines_evicted = 3;
        let text = screen(&app_on(Tab::FalseSharing, report), 80, 24);
        assert!(text.contains("12 lines tracked, 3 evicted"), "{text}");
    }

    #[test]
    fn odd_data_and_tiny_terminals_never_panic() {
        let mut odd = false_entry();
        odd.object.name = "x".repeat(300);
        odd.object.offset = -24;
        odd.object.size = None;
        odd.object.alloc_site = Some(CodeRef {
            function: "f".repeat(300),
            file: None,
            line: None,
            inlined_into: vec![CallerRef {
                function: "g".repeat(300),
                file: None,
                line: None,
            }],
            via: Some("h".repeat(300)),
        });
        odd.words.push(word(64, 1, 1, &[1]));
        odd.words.push(word(u32::MAX, 1, 1, &[1]));
        odd.words.push(word(20, 5, 0, &[]));
        odd.threads = (1..40).collect();
        odd.cost_share = f64::NAN;
        odd.invalidations = u64::MAX;
        odd.code.clear();
        odd.advice = "y".repeat(500);
        let mut empty_advice = true_entry();
        empty_advice.advice.clear();
        let reports = [
            report_with_sharing(),
            report_with(vec![odd, empty_advice]),
            report_with(vec![]),
            sample_report(),
        ];
        for report in reports {
            let mut app = app_on(Tab::FalseSharing, report);
            for (w, h) in [
                (1, 1),
                (10, 3),
                (20, 5),
                (30, 8),
                (40, 12),
                (80, 24),
                (200, 60),
            ] {
                screen(&app, w, h);
                app.handle(Action::Down);
                screen(&app, w, h);
                app.handle(Action::Up);
            }
        }
        let mut app = app_on(Tab::FalseSharing, report_with_sharing());
        app.report = None;
        assert!(screen(&app, 80, 24).contains("waiting for the first report"));
    }

    #[test]
    fn a_20x5_terminal_keeps_the_table() {
        let text = screen(&app_on(Tab::FalseSharing, report_with_sharing()), 20, 5);
        assert_eq!(text.lines().count(), 5);
        assert!(text.contains("95.1%") && text.contains("2.0%"), "{text}");
        let text = screen(&app_on(Tab::FalseSharing, report_with(vec![])), 20, 5);
        assert!(text.contains("no contended"), "{text}");
    }

    #[test]
    fn the_detail_drops_its_least_important_parts_first() {
        let e = false_entry();
        let detail = Detail::new(&e, 78);
        assert_eq!(detail.advice.len(), 3);
        let all = detail.fit(u16::MAX);
        assert_eq!(
            all,
            DetailFit {
                object: true,
                alloc: true,
                offsets: true,
                grid: true,
                legend: 1,
                advice: 3,
                code: Some(1),
                dependences: false,
            }
        );
        assert_eq!(all.lines(), 10);
        assert_eq!(detail.fit(10), all);
        // The allocation site, then the offsets, then the advice.
        assert_eq!(
            detail.fit(9),
            DetailFit {
                alloc: false,
                ..all
            }
        );
        let bare = DetailFit {
            alloc: false,
            offsets: false,
            ..all
        };
        assert_eq!(detail.fit(8), bare);
        assert_eq!(detail.fit(6), DetailFit { advice: 1, ..bare });
        assert_eq!(
            detail.fit(4),
            DetailFit {
                advice: 1,
                code: None,
                ..bare
            }
        );
        assert_eq!(
            detail.fit(3),
            DetailFit {
                object: true,
                grid: true,
                legend: 1,
                ..DetailFit::default()
            }
        );
        assert_eq!(
            detail.fit(2),
            DetailFit {
                object: true,
                ..DetailFit::default()
            }
        );
        assert_eq!(detail.fit(0), DetailFit::default());
        // Cut advice ends with an ellipsis.
        let cut = detail.advice_lines(1);
        assert!(cut[0].to_string().ends_with('…'), "{}", cut[0]);
        // No code: one line says so.
        let mut silent = e.clone();
        silent.code.clear();
        assert_eq!(Detail::new(&silent, 78).fit(u16::MAX).code, Some(0));
        // Many threads: the legend wraps, and its other lines come late.
        let mut many = true_entry();
        many.threads = (100_000..100_012).collect();
        let detail = Detail::new(&many, 78);
        assert!(detail.legend.len() > 1);
        let all = detail.fit(u16::MAX);
        assert_eq!(all.legend, detail.legend.len());
        assert!(all.dependences);
        let less = detail.fit(all.lines() - 2);
        assert!(!less.dependences && less.code == Some(1) && less.legend == all.legend);
    }

    #[test]
    fn words_narrow_before_the_grid_goes() {
        assert_eq!(grid_geometry(78), (GRID_LABEL, 4));
        assert_eq!(grid_geometry(69), (GRID_LABEL, 4));
        assert_eq!(grid_geometry(68), (GRID_LABEL, 3));
        assert_eq!(grid_geometry(37), (GRID_LABEL, 2));
        assert_eq!(grid_geometry(20), (0, 1));
        assert_eq!(grid_geometry(3), (0, 1));
        // Narrow words lose the offsets above them.
        let e = false_entry();
        assert!(Detail::new(&e, 68).offsets.is_some());
        assert!(Detail::new(&e, 40).offsets.is_none());
        let words = Detail::new(&e, 16).words.to_string();
        assert_eq!(words, "WWWW············");
    }

    #[test]
    fn narrow_tables_drop_columns_instead_of_cutting_numbers() {
        let kept = |columns: &[Column], width| -> Vec<&str> {
            columns
                .iter()
                .zip(shown(columns, width))
                .filter(|(_, k)| *k)
                .map(|(c, _)| c.header)
                .collect()
        };
        assert_eq!(kept(&LINE_COLUMNS, 78).len(), 7);
        assert_eq!(
            kept(&LINE_COLUMNS, 50),
            ["#", "cost", "kind", "object", "invalidations"]
        );
        assert_eq!(kept(&LINE_COLUMNS, 30), ["cost", "object"]);
        assert_eq!(kept(&CODE_COLUMNS, 78).len(), 6);
        assert_eq!(
            kept(&CODE_COLUMNS, 50),
            ["code", "reads", "writes", "threads"]
        );
        assert_eq!(threads_label(&[15027, 15028]), "15027,15028");
        assert_eq!(threads_label(&[1, 2, 3, 4, 5, 6, 7]), "7 threads");
    }
}
