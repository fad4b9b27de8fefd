//! The Locks tab: the locks threads waited for, ranked (lock contention
//! first, then other waits such as condvars and joins, dimmed), and the
//! selected lock's detail: where threads waited, the code that released
//! them, the critical sections that held the lock, the owner threads
//! seen, acquisitions and hold times (from the lock uprobes), and the
//! wait and hold histograms.
//!
//! On a small terminal the table keeps a few rows (it scrolls to the
//! selection) and the detail drops, in this order: the histograms' bar
//! charts (then their one-line sparklines), an untraced lock's note, the
//! critical sections, releasing sites and waiting sites after the first,
//! the first critical section, a traced lock's acquisitions and hold
//! times, the owners, the first releasing site.

mod sites;

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Paragraph, Table},
    Frame,
};

use sites::{render_sites, Sites};

use crate::report::{
    model::{ContentionClass, LockEntry, LockKind},
    text::{ellipsize, format_ns, group, percent, share_percent},
};
use crate::tui::{
    layout::{render_master_detail, DetailView, LineBudget, Lines, Selection},
    widgets::{
        count_label, ellipsize_line, first_width, has_counts, histogram_spans, pack_groups,
        render_histogram, render_message, styled_table, Column,
    },
    App,
};

/// The tab's frame title, for its one-line messages.
const TITLE: &str = " Locks ";
/// Width of the tab's number columns: a count ("9,999,999"), a duration,
/// or the header "wait time".
const NUMBER: u16 = 9;

/// The tab's own state: which lock is selected. A new report keeps the
/// same lock selected ([`Selection::follow`] with [`same_lock`]).
pub type LocksState = Selection;

/// Whether two entries of successive reports are the same lock. Named
/// entries merge every futex word of that name, and the address shown is
/// whichever came first, so the name is what stays.
pub fn same_lock(a: &LockEntry, b: &LockEntry) -> bool {
    a.kind == b.kind && a.label() == b.label()
}

/// Draws the tab.
pub fn render(app: &App, frame: &mut Frame, area: Rect) {
    let Some(report) = &app.report else {
        render_message(frame, area, TITLE, "waiting for the first report…");
        return;
    };
    let locks = &report.locks;
    if locks.is_empty() {
        render_message(frame, area, TITLE, "no thread waited for a lock");
        return;
    }
    let estimates = report.lock_tracing.as_ref().is_some_and(|t| t.estimates());
    render_master_detail(
        frame,
        area,
        locks,
        app.locks,
        |area| locks_table(locks, area),
        |lock, width| LockDetail {
            lock,
            estimates,
            width,
        },
    );
}

/// The locks table's columns; on a narrow pane threads, p99, waits, kind
/// and max go, in that order.
const LOCK_COLUMNS: [Column; 7] = [
    Column::text("lock", 12, 0).fill(),
    Column::text("kind", 9, 3),
    Column::number("waits", NUMBER, 4),
    Column::number("total", NUMBER, 1),
    Column::number("p99", NUMBER, 5),
    Column::number("max", NUMBER, 2),
    Column::number("threads", 7, 6),
];

/// The ranked locks for `area`, other waits dimmed.
fn locks_table(locks: &[LockEntry], area: Rect) -> Table<'static> {
    let block =
        Block::bordered().title(" Locks (contention first, other waits dimmed; ↑/↓ select) ");
    let width = block.inner(area).width;
    // The name column takes what the others leave.
    let name_width = usize::from(first_width(&LOCK_COLUMNS, width));
    let rows = locks.iter().map(|l| {
        let cells = vec![
            ellipsize(&l.label(), name_width),
            l.kind.to_string(),
            count_label(l.contentions),
            format_ns(l.wait_total_ns),
            format_ns(l.wait_p99_ns),
            format_ns(l.wait_max_ns),
            threads_label(l.threads),
        ];
        let style = if l.kind.is_contention() {
            Style::new()
        } else {
            Style::new().dim()
        };
        (cells, style)
    });
    styled_table(&LOCK_COLUMNS, rows, width).block(block)
}

/// Threads that waited; unknown (0) for kernel locks.
fn threads_label(threads: usize) -> String {
    if threads == 0 {
        "-".into()
    } else {
        group(threads as u64)
    }
}

/// Height of a histogram's bar chart (borders, bars and labels).
const CHART_HEIGHT: usize = 8;
/// From this width the two histograms sit side by side, else stacked.
const CHARTS_SIDE_BY_SIDE: u16 = 60;
/// The header of the critical sections' release column.
const RELEASED: &str = "released at";
/// The note when the lock uprobes did not see the lock: what, and why;
/// on two lines when one is too narrow.
const UNTRACED: [&str; 2] = [
    "acquisitions and hold times: not traced",
    "(--lock-mode off, or not a pthread lock)",
];

/// How the selected lock's histograms are shown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Histograms {
    /// Not at all (none has data, or no room).
    #[default]
    Hidden,
    /// A one-line sparkline for each of the first `n` with data.
    Lines(usize),
    /// Bar charts, side by side or stacked, in this many lines.
    Charts(usize),
}

impl Histograms {
    fn lines(&self) -> usize {
        match *self {
            Self::Hidden => 0,
            Self::Lines(n) | Self::Charts(n) => n,
        }
    }
}

/// What of the detail is shown: rows of each site table (`None`: the
/// section is dropped; `Some(0)`: its "none seen" line), the owners line,
/// the note's lines (all or none) and the histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DetailFit {
    waiters: Option<usize>,
    holders: Option<usize>,
    sections: Option<usize>,
    owners: bool,
    note: usize,
    histograms: Histograms,
}

impl Lines for DetailFit {
    /// Lines used: each section is a header and its rows, or one line.
    fn lines(&self) -> u16 {
        let total = section_lines(self.waiters)
            + section_lines(self.holders)
            + section_lines(self.sections)
            + usize::from(self.owners)
            + self.note
            + self.histograms.lines();
        u16::try_from(total).unwrap_or(u16::MAX)
    }
}

/// Lines of a site table of `rows` rows: a header and the rows, or the
/// one "none seen" line; none when dropped.
fn section_lines(rows: Option<usize>) -> usize {
    rows.map_or(0, |n| 1 + n)
}

/// Whether the lock uprobes saw the lock.
fn traced(l: &LockEntry) -> bool {
    l.acquisitions.is_some()
}

/// The lock's histograms that have data: label and buckets.
fn histograms(l: &LockEntry) -> Vec<(&'static str, &[(u64, u64)])> {
    [
        ("wait times ", l.wait_histogram.as_slice()),
        ("hold times ", l.hold_histogram.as_slice()),
    ]
    .into_iter()
    .filter(|(_, h)| has_counts(h))
    .collect()
}

/// Whether `n` histograms' charts are stacked in `width`.
fn stacked(n: usize, width: u16) -> bool {
    n > 1 && width < CHARTS_SIDE_BY_SIDE
}

/// The parts of `l`'s detail that fit in `height` lines of `width`, the
/// most important first: the first waiting site, the first releasing
/// site, the owners, then for a traced lock the acquisitions note and the
/// first critical section; then the other waiting sites, releasing sites
/// and critical sections; the note of an untraced lock; last the
/// histograms, as charts or else one line each. Nothing is shown without
/// the first waiting site.
fn fit_detail(l: &LockEntry, width: u16, height: u16) -> DetailFit {
    let mut budget = LineBudget::new(height);
    let mut fit = DetailFit::default();
    let (waiters, holders, sections) = (l.waiters.len(), l.holders.len(), l.sections.len());
    if !budget.take(1 + waiters.min(1)) {
        return fit;
    }
    fit.waiters = Some(waiters.min(1));
    if budget.take(1 + holders.min(1)) {
        fit.holders = Some(holders.min(1));
    }
    fit.owners = l.owner_seen && budget.take(1);
    let note = note_lines(l, false, usize::from(width)).len();
    if traced(l) && budget.take(note) {
        fit.note = note;
    }
    if (traced(l) || sections > 0) && budget.take(1 + sections.min(1)) {
        fit.sections = Some(sections.min(1));
    }
    for (rows, all) in [
        (&mut fit.waiters, waiters),
        (&mut fit.holders, holders),
        (&mut fit.sections, sections),
    ] {
        if let Some(shown) = rows {
            while *shown < all && budget.take(1) {
                *shown += 1;
            }
        }
    }
    if !traced(l) && budget.take(note) {
        fit.note = note;
    }
    let shown = histograms(l).len();
    let charts = if stacked(shown, width) { shown } else { 1 } * CHART_HEIGHT;
    fit.histograms = if shown == 0 {
        Histograms::Hidden
    } else if budget.take(charts) {
        Histograms::Charts(charts)
    } else if let Some(n) = (1..=shown).rev().find(|&n| budget.take(n)) {
        Histograms::Lines(n)
    } else {
        Histograms::Hidden
    };
    fit
}

/// The selected lock's detail in `width` columns: waiting sites,
/// releasing sites, critical sections, owners, acquisitions and hold
/// times (`estimates` when the lock calls were traced only part of the
/// time), and the wait and hold histograms.
struct LockDetail<'a> {
    lock: &'a LockEntry,
    estimates: bool,
    width: u16,
}

impl DetailView for LockDetail<'_> {
    type Fit = DetailFit;

    /// `g_hot_lock · mutex at 0x5555aaaa0040 · mean wait 41.0 µs`.
    fn title(&self) -> String {
        let l = self.lock;
        let what = match (&l.name, l.kind) {
            (Some(name), LockKind::Kernel) => name.clone(),
            (Some(name), kind) => format!("{name} · {kind} at {}", l.address),
            (None, kind) => format!("{kind} at {}", l.address),
        };
        format!(" {what} · mean wait {} ", format_ns(l.wait_mean_ns))
    }

    fn fit(&self, height: u16) -> DetailFit {
        fit_detail(self.lock, self.width, height)
    }

    fn render(&self, fit: &DetailFit, frame: &mut Frame, area: Rect) {
        render_detail(self.lock, self.estimates, fit, frame, area);
    }
}

/// The parts of `l`'s detail that `fit` keeps, in `inner`.
fn render_detail(l: &LockEntry, estimates: bool, fit: &DetailFit, frame: &mut Frame, inner: Rect) {
    let length = |lines: usize| Constraint::Length(u16::try_from(lines).unwrap_or(u16::MAX));
    let [waiters_area, holders_area, sections_area, owners_area, note_area, histograms_area] =
        Layout::vertical([
            length(section_lines(fit.waiters)),
            length(section_lines(fit.holders)),
            length(section_lines(fit.sections)),
            length(usize::from(fit.owners)),
            length(fit.note),
            length(fit.histograms.lines()),
        ])
        .areas(inner);
    let sites = Sites::new(l, fit.sections.is_some(), inner.width);
    if let Some(rows) = fit.waiters {
        let header = ["waited in", "source", "waits", "wait time"];
        let none = "no waiting code seen";
        let rows = sites.waiters.into_iter().take(rows);
        render_sites(frame, waiters_area, header, rows, sites.widths, none);
    }
    if let Some(rows) = fit.holders {
        let header = ["released by", "source", "wakes", "caused"];
        let none = if l.kind == LockKind::Kernel {
            "releasing code: not traced for kernel locks"
        } else {
            "no wake seen"
        };
        let rows = sites.holders.into_iter().take(rows);
        render_sites(frame, holders_area, header, rows, sites.widths, none);
    }
    if let Some(rows) = fit.sections {
        let header = ["held in", "source", RELEASED, "holds", "hold time"];
        let none = "no critical section traced";
        let rows = sites.sections.into_iter().take(rows);
        render_sites(
            frame,
            sections_area,
            header,
            rows,
            sites.section_widths,
            none,
        );
    }
    if fit.owners {
        frame.render_widget(owners_line(l, usize::from(inner.width)), owners_area);
    }
    if fit.note > 0 {
        let lines = note_lines(l, estimates, usize::from(inner.width));
        frame.render_widget(Paragraph::new(lines), note_area);
    }
    render_histograms(l, fit.histograms, frame, histograms_area);
}

/// `held by thread(s) 24692 (9 waits), 24700 (3 waits)`, cut to `width`.
fn owners_line(l: &LockEntry, width: usize) -> Line<'static> {
    let label = "held by thread(s) ";
    let owners: Vec<String> = l
        .owners
        .iter()
        .map(|o| format!("{} ({} waits)", o.tid, group(o.count)))
        .collect();
    let owners = if owners.is_empty() {
        "none seen".to_string()
    } else {
        owners.join(", ")
    };
    let room = width.saturating_sub(label.len());
    Line::from(vec![label.dim(), Span::raw(ellipsize(&owners, room))])
}

/// Acquisitions (`estimates` when scaled from part of the time), how many
/// were contended, the lock call's latency and failed tries, then the
/// hold times, each line cut to `width`; or why they were not traced.
fn note_lines(l: &LockEntry, estimates: bool, width: usize) -> Vec<Line<'static>> {
    let Some(acquisitions) = l.acquisitions else {
        let one = UNTRACED.join(" ");
        let lines = if one.chars().count() <= width {
            vec![one]
        } else {
            UNTRACED.map(String::from).to_vec()
        };
        return lines
            .into_iter()
            .map(|text| ellipsize_line(Line::from(text).dim(), width))
            .collect();
    };
    let mut count = vec!["acquisitions ".dim(), group(acquisitions).into()];
    if estimates {
        count.push(" (estimates)".dim());
    }
    let contended = l
        .contention_rate
        .filter(|r| r.is_finite())
        .unwrap_or_else(|| percent(l.contentions, acquisitions) / 100.0);
    let mut groups = vec![
        count,
        vec!["contended ".dim(), share_percent(contended, 1).into()],
    ];
    if let Some(p99) = l.acquire_p99_ns {
        let mut acquire = vec!["lock call p99 ".dim(), format_ns(p99).into()];
        if let Some(max) = l.acquire_max_ns {
            acquire.extend([" max ".dim(), format_ns(max).into()]);
        }
        groups.push(acquire);
    }
    if let Some(failed) = l.failed_attempts.filter(|&n| n > 0) {
        groups.push(vec!["failed tries ".dim(), group(failed).into()]);
    }
    let mut lines = vec![fit_groups(groups, width)];
    let holds: Vec<Vec<Span<'static>>> = [
        ("mean ", l.hold_mean_ns),
        ("p99 ", l.hold_p99_ns),
        ("max ", l.hold_max_ns),
        ("total ", l.hold_total_ns),
    ]
    .into_iter()
    .filter_map(|(label, ns)| Some(vec![label.dim(), format_ns(ns?).into()]))
    .enumerate()
    .map(|(i, mut spans)| {
        if i == 0 {
            spans.insert(0, "hold ".dim());
        }
        spans
    })
    .collect();
    if !holds.is_empty() {
        lines.push(fit_groups(holds, width));
    }
    lines.extend(unnecessary_line(l, width));
    lines
}

/// `unnecessary disjoint-write   100% of waits   1.24 s   confidence
/// 0.98`, or `contention needed (sections conflict)`.
fn unnecessary_line(l: &LockEntry, width: usize) -> Option<Line<'static>> {
    let u = l.unnecessary.as_ref()?;
    let groups = if u.class == ContentionClass::True {
        vec![vec![
            "contention needed ".dim(),
            "(sections conflict)".into(),
        ]]
    } else {
        vec![
            vec!["unnecessary ".dim(), u.class.name().bold()],
            vec![share_percent(u.wasted_share, 0).into(), " of waits".dim()],
            vec![format_ns(u.wasted_wait_ns).into(), " wasted".dim()],
            vec!["confidence ".dim(), format!("{:.2}", u.confidence).into()],
        ]
    };
    Some(fit_groups(groups, width))
}

/// `groups` of spans three spaces apart, as many as fit in `width` (the
/// first one cut when it alone does not).
fn fit_groups(groups: Vec<Vec<Span<'static>>>, width: usize) -> Line<'static> {
    let lines = pack_groups(groups, 3, 0, width);
    lines.into_iter().next().unwrap_or_default()
}

/// The wait and hold histograms with data: bar charts side by side (or
/// stacked on a narrow pane), or one sparkline each.
fn render_histograms(l: &LockEntry, shown: Histograms, frame: &mut Frame, area: Rect) {
    let histograms = histograms(l);
    match shown {
        Histograms::Hidden => {}
        Histograms::Lines(n) => {
            let width = usize::from(area.width);
            let lines: Vec<Line> = histograms
                .iter()
                .take(n)
                .map(|(label, h)| {
                    let mut spans = vec![label.dim()];
                    spans.extend(histogram_spans(h).unwrap_or_default());
                    ellipsize_line(Line::from(spans), width)
                })
                .collect();
            frame.render_widget(Paragraph::new(lines), area);
        }
        Histograms::Charts(_) => {
            let n = u32::try_from(histograms.len()).unwrap_or(1);
            let areas = if stacked(histograms.len(), area.width) {
                Layout::vertical(histograms.iter().map(|_| Constraint::Fill(1))).split(area)
            } else {
                Layout::horizontal(histograms.iter().map(|_| Constraint::Ratio(1, n))).split(area)
            };
            for ((label, h), rect) in histograms.iter().zip(areas.iter()) {
                let block = Block::bordered().title(format!(" {}", label));
                render_histogram(frame, *rect, block, h, "");
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ratatui::{backend::TestBackend, style::Modifier, Terminal};

    use super::*;
    use crate::{
        report::{
            model::{tests::sample_report, LockTracing, Report, SectionEntry},
            text::tests::report_with_locks,
        },
        tui::{
            app::tests::{app_on, assert_centred, assert_fits, assert_shows, screen_at as screen},
            tabs::locks::sites::{section_widths, site_widths},
            widgets::shown,
            Action, Tab,
        },
    };

    /// [`report_with_locks`] with the lock uprobes' fields set on the
    /// mutex: acquisitions, hold times, two critical sections and both
    /// histograms, traced in sampled mode (acquisitions are estimates).
    pub(crate) fn traced_report() -> Report {
        let mut r = report_with_locks();
        let hot = &mut r.locks[0];
        hot.acquisitions = Some(65_880);
        hot.contention_rate = Some(0.6);
        hot.failed_attempts = Some(12);
        hot.acquire_p99_ns = Some(3_200);
        hot.acquire_max_ns = Some(5_370_000);
        hot.hold_mean_ns = Some(21_800);
        hot.hold_p99_ns = Some(28_500);
        hot.hold_max_ns = Some(4_400_000);
        hot.hold_total_ns = Some(1_435_000_000);
        hot.wait_histogram = vec![
            (2_048, 50),
            (4_096, 300),
            (8_192, 900),
            (16_384, 2_000),
            (32_768, 400),
            (4_194_304, 3),
        ];
        hot.hold_histogram = vec![(1_024, 50), (2_048, 3_000), (16_384, 2_000), (8_388_608, 3)];
        let section = |function: &str, line, released: Option<&str>, count, hold_ns| SectionEntry {
            function: function.into(),
            file: Some("/src/locks.c".into()),
            line: Some(line),
            module: "locks".into(),
            released_at: released.map(Into::into),
            count,
            hold_ns,
            hold_max_ns: 4_400_000,
            delay_caused_ns: hold_ns / 2,
        };
        hot.sections = vec![
            section(
                "contend_hot",
                166,
                Some("locks.c:169"),
                65_000,
                1_430_000_000,
            ),
            section("contend_cold", 180, None, 880, 5_000_000),
        ];
        r.lock_tracing = Some(LockTracing {
            mode: crate::report::model::TraceMode::Sampled,
            library: "/lib/x86_64-linux-gnu/libc.so.6".into(),
            traced_fraction: 0.05,
            acquisitions_error: Some(0.15),
            windows: 3,
            functions: vec![],
            always_traced: vec![],
            sections_lost: 0,
            unmatched_unlocks: 0,
            held_overflow: 0,
        });
        r
    }

    #[test]
    fn shows_the_ranked_locks_and_the_selected_lock() {
        let text = screen(&app_on(Tab::Locks, report_with_locks()), 100, 30);
        assert_shows(
            &text,
            &[
                // The table.
                "g_hot_lock",
                "mutex",
                "43,683",
                "1.81 s",
                "35.5 µs",
                "5.37 ms",
                "kernel rwsem (read)",
                "0x7f00deadbe00",
                "condvar",
                "9.00 s",
                // The mutex's detail.
                "g_hot_lock · mutex at 0x5555aaaa0040 · mean wait 41.0 µs",
                "waited in",
                "contend_hot",
                "locks.c:166",
                "contend_cold",
                "locks.c:180",
                "released by",
                "release_hot",
                "locks.c:169",
                "43,693",
                "held by thread(s) 24692 (9 waits), 24700 (3 waits)",
                "acquisitions and hold times: not traced (--lock-mode off, or not a pthread lock)",
                "↑/↓ select",
            ],
        );
        // Lock contention first, then the condvar.
        let row = |s: &str| text.find(s).unwrap_or(usize::MAX);
        assert!(row("g_hot_lock") < row("kernel rwsem") && row("kernel rwsem") < row("0x7f00"));
    }

    #[test]
    fn fits_80x24() {
        let text = screen(&app_on(Tab::Locks, report_with_locks()), 80, 24);
        assert_shows(
            &text,
            &[
                "g_hot_lock",
                "kernel rwsem (read)",
                "0x7f00deadbe00",
                "threads",
                "locks.c:166",
                "release_hot",
                "locks.c:169",
                "held by thread(s) 24692",
                "acquisitions and hold times: not traced",
                "(--lock-mode off, or not a pthread lock)",
            ],
        );
        assert_fits(&text, 80);
        assert!(!text.contains("held in") && !text.contains("wait times"));
    }

    #[test]
    fn an_untraced_lock_says_so_in_a_dim_line() {
        let mut app = app_on(Tab::Locks, traced_report());
        // The kernel lock: the lock uprobes never see kernel locks.
        app.handle(Action::Down);
        let note =
            "acquisitions and hold times: not traced (--lock-mode off, or not a pthread lock)";
        let text = screen(&app, 100, 30);
        assert!(text.contains(note), "{text}");
        assert!(dim_at(&app, 100, 30, "acquisitions and hold"));
        assert!(!text.contains("held in") && !text.contains("hold mean"));
        // On two lines when one is too narrow, cut when still too narrow.
        let text = screen(&app, 60, 30);
        assert!(
            text.contains("│acquisitions and hold times: not traced "),
            "{text}"
        );
        assert!(text.contains("│(--lock-mode off, or not a pthread lock)"));
        assert!(dim_at(&app, 60, 30, "(--lock-mode off"));
        let text = screen(&app, 30, 30);
        assert!(text.contains("│(--lock-mode off, or not a …│"), "{text}");
        assert!(text.contains("│releasing code: not traced …│"));
    }

    #[test]
    fn a_traced_lock_shows_acquisitions_hold_times_and_sections() {
        let text = screen(&app_on(Tab::Locks, traced_report()), 100, 40);
        assert_shows(
            &text,
            &[
                "acquisitions 65,880 (estimates)   contended 60.0%   lock call p99 3.20 µs max 5.37 ms",
                "hold mean 21.8 µs   p99 28.5 µs   max 4.40 ms   total 1.44 s",
                // The critical sections, lined up with the other sites.
                "held in",
                "released at",
                "holds hold time",
                "locks.c:166 locks.c:169    65,000    1.43 s",
                "locks.c:180 -                 880   5.00 ms",
            ],
        );
        assert!(!text.contains("not traced"), "{text}");
        // The failed tries when there is room for them.
        let wide = screen(&app_on(Tab::Locks, traced_report()), 120, 40);
        assert!(wide.contains("max 5.37 ms   failed tries 12"), "{wide}");
        // Lined up with the other site tables: sources and numbers.
        let column = |line_with: &str, needle: &str| {
            let line = text.lines().find(|l| l.contains(line_with)).unwrap_or("");
            line.find(needle).map(|i| line[..i].chars().count())
        };
        let source = column("release_hot", "locks.c:169");
        assert!(source.is_some(), "{text}");
        assert_eq!(column("65,000", "locks.c:166"), source);
        assert_eq!(column("held in", "source"), column("released by", "source"));
        assert_eq!(column("65,000", "65,000"), column("43,693", "43,693"));
        // The section rows come after the releasing sites, the note after
        // the owners.
        let row = |s: &str| text.find(s).unwrap_or(usize::MAX);
        assert!(row("released by") < row("held in") && row("held in") < row("held by thread"));
        assert!(row("held by thread") < row("acquisitions 65,880"));
    }

    #[test]
    fn acquisitions_are_estimates_only_when_sampled() {
        let mut r = traced_report();
        let estimates = |r: &Report| {
            let text = screen(&app_on(Tab::Locks, r.clone()), 100, 40);
            assert!(text.contains("acquisitions 65,880"), "{text}");
            text.contains("(estimates)")
        };
        assert!(estimates(&r));
        if let Some(t) = r.lock_tracing.as_mut() {
            t.traced_fraction = 0.9995;
        }
        assert!(!estimates(&r));
        if let Some(t) = r.lock_tracing.as_mut() {
            t.mode = crate::report::model::TraceMode::Full;
            t.traced_fraction = 1.0;
        }
        assert!(!estimates(&r));
        r.lock_tracing = None;
        assert!(!estimates(&r));
        // Without a contention rate the share comes from the counts.
        r.locks[0].contention_rate = None;
        r.locks[0].failed_attempts = Some(0);
        let text = screen(&app_on(Tab::Locks, r), 100, 40);
        assert!(text.contains("contended 66.3%"), "{text}");
        assert!(!text.contains("failed tries"), "{text}");
    }

    #[test]
    fn a_traced_lock_without_sections_says_so() {
        let mut r = traced_report();
        r.locks[0].sections.clear();
        let text = screen(&app_on(Tab::Locks, r), 100, 40);
        assert!(text.contains("no critical section traced"), "{text}");
        assert!(!text.contains("released at"));
    }

    #[test]
    fn histograms_are_charts_side_by_side_on_a_large_terminal() {
        let text = screen(&app_on(Tab::Locks, traced_report()), 100, 40);
        let titles = text
            .lines()
            .find(|l| l.contains(" wait times "))
            .unwrap_or_else(|| panic!("no wait chart:\n{text}"));
        assert!(titles.contains(" hold times "), "side by side:\n{text}");
        assert_shows(&text, &["███", "16µ"]);
        assert_fits(&text, 100);
        // Stacked on a narrow one.
        let text = screen(&app_on(Tab::Locks, traced_report()), 58, 50);
        let row = |s: &str| text.lines().position(|l| l.contains(s));
        assert!(
            row(" wait times ") < row(" hold times "),
            "stacked:\n{text}"
        );
        // Only the histograms with data.
        let mut r = traced_report();
        r.locks[0].hold_histogram = vec![(1_024, 0)];
        let text = screen(&app_on(Tab::Locks, r), 100, 40);
        assert!(text.contains("┌ wait times ") && !text.contains("┌ hold times "));
        // None at all for the lock of the sample report.
        let text = screen(&app_on(Tab::Locks, report_with_locks()), 100, 40);
        assert!(!text.contains("wait times") && !text.contains("┌ hold times"));
    }

    #[test]
    fn fits_80x24_with_every_field_set() {
        let text = screen(&app_on(Tab::Locks, traced_report()), 80, 24);
        assert_shows(
            &text,
            &[
                "g_hot_lock",
                "0x7f00deadbe00",
                "locks.c:166",
                "release_hot",
                "held in",
                "locks.c:169    65,000",
                "held by thread(s) 24692",
                "acquisitions 65,880 (estimates)   contended 60.0%",
                "p99 28.5 µs",
                // No room for charts: a sparkline each.
                "wait times 1.02 µs ▁▂▄█▂",
                "hold times 512 ns",
            ],
        );
        assert!(!text.contains(" wait times "), "{text}");
        assert_fits(&text, 80);
        // Smaller still: the histograms go first.
        let text = screen(&app_on(Tab::Locks, traced_report()), 80, 20);
        assert!(!text.contains("wait times") && text.contains("p99 28.5 µs"));
        assert_fits(&text, 80);
    }

    #[test]
    fn arrows_move_the_selection_and_the_detail() {
        let mut app = app_on(Tab::Locks, report_with_locks());
        app.handle(Action::Down);
        assert_eq!(app.scroll, 0, "the selection moves, not the scroll");
        let text = screen(&app, 100, 30);
        assert!(text.contains("do_user_addr_fault"), "{text}");
        assert!(text.contains("([kernel])"), "{text}");
        assert!(text.contains("releasing code: not traced for kernel locks"));
        assert!(!text.contains("locks.c:166") && !text.contains("held by thread(s)"));
        for _ in 0..5 {
            app.handle(Action::Down);
        }
        let text = screen(&app, 100, 30);
        assert!(text.contains("condvar at 0x7f00deadbe00"), "{text}");
        assert!(text.contains("wait_for_work") && text.contains("post_work"));
        app.handle(Action::Up);
        app.handle(Action::Up);
        let text = screen(&app, 100, 30);
        assert!(text.contains("locks.c:166"), "back on the mutex:\n{text}");
    }

    /// Whether the first `needle` on `app`'s screen of `width` x `height`
    /// is dimmed.
    fn dim_at(app: &App, width: u16, height: u16, needle: &str) -> bool {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| app.render(f)).unwrap();
        let buffer = terminal.backend().buffer();
        let text = screen(app, width, height);
        let (y, line) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle}"));
        let x = line[..line.find(needle).unwrap_or(0)].chars().count();
        buffer[(x as u16, y as u16)]
            .modifier
            .contains(Modifier::DIM)
    }

    #[test]
    fn other_waits_are_dimmed() {
        let app = app_on(Tab::Locks, report_with_locks());
        assert!(dim_at(&app, 100, 30, "0x7f00deadbe00"));
        assert!(!dim_at(&app, 100, 30, "kernel rwsem"));
    }

    #[test]
    fn no_locks_is_one_centred_line() {
        let text = screen(&app_on(Tab::Locks, sample_report()), 80, 24);
        assert_centred(&text, "no thread waited for a lock");
        assert!(!text.contains("waited in"));
    }

    #[test]
    fn odd_data_and_tiny_terminals_never_panic() {
        let mut odd = report_with_locks();
        odd.locks[0].name = Some("x".repeat(300));
        odd.locks[0].waiters.clear();
        odd.locks[0].holders[0].function = "f".repeat(300);
        odd.locks[1].acquisitions = Some(0);
        odd.locks[1].hold_p99_ns = Some(u64::MAX);
        odd.locks[2].contentions = u64::MAX;
        odd.locks[2].owner_seen = true;
        let mut traced = traced_report();
        let hot = &mut traced.locks[0];
        hot.sections[0].function = "g".repeat(300);
        hot.sections[0].released_at = Some("r".repeat(300));
        hot.sections[1].hold_ns = u64::MAX;
        hot.acquisitions = Some(u64::MAX);
        hot.contention_rate = Some(f64::NAN);
        hot.hold_total_ns = Some(u64::MAX);
        hot.wait_histogram = vec![(0, 0), (u64::MAX, u64::MAX)];
        hot.hold_histogram = (0..64).map(|k| (1u64 << k, k)).collect();
        traced.locks[2].sections = traced_report().locks[0].sections.clone();
        for report in [
            report_with_locks(),
            odd,
            traced,
            traced_report(),
            sample_report(),
        ] {
            let mut app = app_on(Tab::Locks, report);
            for (w, h) in [
                (1, 1),
                (10, 3),
                (30, 8),
                (40, 12),
                (59, 40),
                (80, 24),
                (200, 60),
            ] {
                screen(&app, w, h);
                app.handle(Action::Down);
            }
        }
        let mut app = app_on(Tab::Locks, report_with_locks());
        app.report = None;
        assert!(screen(&app, 80, 24).contains("waiting for the first report"));
    }

    #[test]
    fn the_detail_drops_its_least_important_parts_first() {
        let r = report_with_locks();
        let mutex = &r.locks[0];
        let fit = |height| fit_detail(mutex, 98, height);
        let all = fit(u16::MAX);
        assert_eq!(
            all,
            DetailFit {
                waiters: Some(2),
                holders: Some(1),
                owners: true,
                note: 1,
                ..DetailFit::default()
            }
        );
        assert_eq!(all.lines(), 7);
        assert_eq!(fit(7), all);
        // First the note, then the second waiter, then the owners.
        assert_eq!(fit(6), DetailFit { note: 0, ..all });
        assert_eq!(
            fit(5),
            DetailFit {
                waiters: Some(1),
                note: 0,
                ..all
            }
        );
        assert_eq!(
            fit(4),
            DetailFit {
                waiters: Some(1),
                holders: Some(1),
                ..DetailFit::default()
            }
        );
        assert_eq!(
            fit(2),
            DetailFit {
                waiters: Some(1),
                ..DetailFit::default()
            }
        );
        assert_eq!(fit(1), DetailFit::default());
        // A kernel lock: no releasing sites (one line says so), no owners.
        let kernel = fit_detail(&r.locks[1], 98, u16::MAX);
        assert_eq!(kernel.holders, Some(0));
        assert!(!kernel.owners && kernel.note == 1 && kernel.sections.is_none());
        assert_eq!(kernel.lines(), 4);
        // Narrower, the note takes two lines.
        assert_eq!(
            fit_detail(mutex, 78, u16::MAX),
            DetailFit { note: 2, ..all }
        );
    }

    #[test]
    fn a_traced_lock_drops_the_histograms_first() {
        let r = traced_report();
        let mutex = &r.locks[0];
        let fit = |width, height| fit_detail(mutex, width, height);
        let all = fit(78, u16::MAX);
        assert_eq!(
            all,
            DetailFit {
                waiters: Some(2),
                holders: Some(1),
                sections: Some(2),
                owners: true,
                note: 2,
                histograms: Histograms::Charts(CHART_HEIGHT),
            }
        );
        assert_eq!(all.lines(), 19);
        // Narrow: the charts are stacked.
        let narrow = fit(59, u16::MAX);
        assert_eq!(narrow.histograms, Histograms::Charts(2 * CHART_HEIGHT));
        // Then a sparkline each, then one, then none.
        assert_eq!(fit(78, 18).histograms, Histograms::Lines(2));
        assert_eq!(fit(78, 12).histograms, Histograms::Lines(1));
        assert_eq!(
            fit(78, 11),
            DetailFit {
                histograms: Histograms::Hidden,
                ..all
            }
        );
        // Then the second section, then the second waiter; the note and
        // the first section stay longer.
        assert_eq!(
            fit(78, 10),
            DetailFit {
                sections: Some(1),
                histograms: Histograms::Hidden,
                ..all
            }
        );
        assert_eq!(
            fit(78, 9),
            DetailFit {
                waiters: Some(1),
                sections: Some(1),
                histograms: Histograms::Hidden,
                ..all
            }
        );
        assert_eq!(
            fit(78, 7),
            DetailFit {
                waiters: Some(1),
                holders: Some(1),
                owners: true,
                note: 2,
                ..DetailFit::default()
            }
        );
        // An untraced lock with a wait histogram still shows it.
        let mut untraced = report_with_locks().locks[0].clone();
        untraced.wait_histogram = mutex.wait_histogram.clone();
        let fit = fit_detail(&untraced, 78, u16::MAX);
        assert_eq!(fit.histograms, Histograms::Charts(CHART_HEIGHT));
        assert!(fit.sections.is_none() && fit.note == 2);
    }

    #[test]
    fn narrow_tables_drop_columns_instead_of_cutting_numbers() {
        assert!(shown(&LOCK_COLUMNS, 78).iter().all(|k| *k));
        let kept = |width| -> Vec<&str> {
            LOCK_COLUMNS
                .iter()
                .zip(shown(&LOCK_COLUMNS, width))
                .filter(|(_, k)| *k)
                .map(|(c, _)| c.header)
                .collect()
        };
        assert_eq!(kept(60), ["lock", "kind", "waits", "total", "max"]);
        assert_eq!(kept(42), ["lock", "kind", "total", "max"]);
        assert_eq!(kept(41), ["lock", "total", "max"]);
        assert_eq!(kept(5), ["lock"]);
        // The site tables line up and leave the numbers whole.
        assert_eq!(site_widths(78, 40, 12), [45, 12, 9, 9]);
        assert_eq!(site_widths(78, 40, 100), [29, 28, 9, 9]);
        // Short functions leave the source more than half.
        assert_eq!(site_widths(78, 12, 100), [12, 45, 9, 9]);
        assert_eq!(site_widths(58, 12, 23), [14, 23, 9, 9]);
        assert_eq!(site_widths(10, 12, 12), [0, 0, 9, 9]);
        // The critical sections' source and release share the source
        // column: the release gets what it needs, the source the rest.
        assert_eq!(section_widths([33, 24, 9, 9], 11, 11), [33, 12, 11, 9, 9]);
        assert_eq!(section_widths([29, 28, 9, 9], 11, 11), [29, 16, 11, 9, 9]);
        // Squeezed: the source keeps half.
        assert_eq!(section_widths([29, 28, 9, 9], 30, 22), [29, 13, 14, 9, 9]);
        assert_eq!(section_widths([29, 28, 9, 9], 6, 40), [29, 6, 21, 9, 9]);
        assert_eq!(section_widths([0, 0, 9, 9], 6, 11), [0, 0, 0, 9, 9]);
    }

    #[test]
    fn the_selection_follows_its_lock_across_reports() {
        let old = report_with_locks().locks;
        let mut new = old.clone();
        new.rotate_left(1); // kernel, condvar, mutex
        let mut s = LocksState::default();
        s.follow(&old, &new, same_lock);
        assert_eq!(s.selected(3), Some(2), "still the mutex");
        // An unnamed lock is known by its address.
        s.follow(&new, &old, same_lock);
        s.down(3);
        s.down(3);
        let mut moved = old.clone();
        moved.swap(0, 2);
        s.follow(&old, &moved, same_lock);
        assert_eq!(s.selected(3), Some(0), "still the condvar");
        // A lock gone from the list leaves the row selected.
        s.follow(&moved, &old[..2], same_lock);
        assert_eq!(s.selected(2), Some(0));
        s.up();
        assert_eq!(s.selected(0), None);
    }
}
