//! The Locks tab: the locks threads waited for, ranked (lock contention
//! first, then other waits such as condvars and joins, dimmed), and the
//! selected lock's detail: where threads waited, the code that released
//! them, the owner threads seen, and what needs the lock uprobes.
//!
//! On a small terminal the table keeps a few rows (it scrolls to the
//! selection) and the detail drops, in this order: the acquisitions note,
//! the releasing sites after the first, the waiting sites after the first,
//! the owners, the first releasing site.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Cell, Row, Table, TableState},
    Frame,
};

use super::{
    widgets::{
        count_label, first_width, render_message, split_height, styled_table, Column, Selection,
    },
    App,
};
use crate::{
    analysis::locks::is_contention,
    report::{
        model::{source_label, LockEntry},
        text::{ellipsize, format_ns, group, percent},
    },
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
    a.kind == b.kind
        && a.name.as_ref().unwrap_or(&a.address) == b.name.as_ref().unwrap_or(&b.address)
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
    let selected = app.locks.selected(locks.len());
    let chosen = selected.and_then(|i| locks.get(i));
    let detail_want = chosen.map_or(0, |l| fit_detail(l, u16::MAX).lines().saturating_add(2));
    let (table_height, detail_height) = split_height(area.height, locks.len(), detail_want);
    let [table_area, detail_area] = Layout::vertical([
        Constraint::Length(table_height),
        Constraint::Length(detail_height),
    ])
    .areas(area);
    render_table(locks, selected, frame, table_area);
    if let Some(lock) = chosen {
        if detail_area.height > 2 {
            render_detail(lock, frame, detail_area);
        }
    }
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

/// The ranked locks, the selected one highlighted, other waits dimmed.
fn render_table(locks: &[LockEntry], selected: Option<usize>, frame: &mut Frame, area: Rect) {
    let block =
        Block::bordered().title(" Locks (contention first, other waits dimmed; ↑/↓ select) ");
    let width = block.inner(area).width;
    // The name column takes what the others leave.
    let name_width = usize::from(first_width(&LOCK_COLUMNS, width));
    let rows = locks.iter().map(|l| {
        let cells = vec![
            ellipsize(lock_name(l), name_width),
            l.kind.clone(),
            count_label(l.contentions),
            format_ns(l.wait_total_ns),
            format_ns(l.wait_p99_ns),
            format_ns(l.wait_max_ns),
            threads_label(l.threads),
        ];
        let style = if is_contention(&l.kind) {
            Style::new()
        } else {
            Style::new().dim()
        };
        (cells, style)
    });
    let table = styled_table(&LOCK_COLUMNS, rows, width)
        .row_highlight_style(Style::new().reversed())
        .block(block);
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, area, &mut state);
}

/// The lock's name, or its address when it has none.
fn lock_name(l: &LockEntry) -> &str {
    l.name.as_deref().unwrap_or(&l.address)
}

/// Threads that waited; unknown (0) for kernel locks.
fn threads_label(threads: usize) -> String {
    if threads == 0 {
        "-".into()
    } else {
        group(threads as u64)
    }
}

/// What of the detail is shown: rows of each site table (`None`: the
/// section is dropped; `Some(0)`: its "none seen" line), the owners line
/// and the note.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct DetailFit {
    waiters: Option<usize>,
    holders: Option<usize>,
    owners: bool,
    note: bool,
}

impl DetailFit {
    /// Lines used: each section is a header and its rows, or one line.
    fn lines(&self) -> u16 {
        let section = |rows: Option<usize>| rows.map_or(0, |n| 1 + n);
        let total = section(self.waiters)
            + section(self.holders)
            + usize::from(self.owners)
            + usize::from(self.note);
        u16::try_from(total).unwrap_or(u16::MAX)
    }
}

/// The parts of `l`'s detail that fit in `height` lines, the most
/// important first: the first waiting site, the first releasing site, the
/// owners, the other waiting sites, the other releasing sites, the note.
/// Nothing is shown without the first waiting site.
fn fit_detail(l: &LockEntry, height: u16) -> DetailFit {
    let mut left = usize::from(height);
    let mut take = |n: usize| {
        let fits = n <= left;
        if fits {
            left -= n;
        }
        fits
    };
    let mut fit = DetailFit::default();
    let (waiters, holders) = (l.waiters.len(), l.holders.len());
    if !take(1 + waiters.min(1)) {
        return fit;
    }
    fit.waiters = Some(waiters.min(1));
    if take(1 + holders.min(1)) {
        fit.holders = Some(holders.min(1));
    }
    fit.owners = l.owner_seen && take(1);
    for (rows, all) in [(&mut fit.waiters, waiters), (&mut fit.holders, holders)] {
        if let Some(shown) = rows {
            while *shown < all && take(1) {
                *shown += 1;
            }
        }
    }
    fit.note = take(1);
    fit
}

/// The selected lock: waiting sites, releasing sites, owners, and what
/// the lock uprobes would add.
fn render_detail(l: &LockEntry, frame: &mut Frame, area: Rect) {
    let title = ellipsize(&detail_title(l), usize::from(area.width.saturating_sub(2)));
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let fit = fit_detail(l, inner.height);
    let section = |rows: Option<usize>| rows.map_or(0, |n| 1 + n as u16);
    let [waiters_area, holders_area, owners_area, note_area] = Layout::vertical([
        Constraint::Length(section(fit.waiters)),
        Constraint::Length(section(fit.holders)),
        Constraint::Length(u16::from(fit.owners)),
        Constraint::Length(u16::from(fit.note)),
    ])
    .areas(inner);
    let waiters = site_rows(&l.waiters, |w| {
        let numbers = [count_label(w.count), format_ns(w.wait_ns)];
        (&w.function, w.file.as_deref(), w.line, &w.module, numbers)
    });
    let holders = site_rows(&l.holders, |h| {
        let numbers = [count_label(h.count), count_label(h.woken)];
        (&h.function, h.file.as_deref(), h.line, &h.module, numbers)
    });
    let longest_source = waiters
        .iter()
        .chain(&holders)
        .map(|site| site[1].chars().count())
        .max()
        .unwrap_or(0);
    let widths = site_widths(inner.width, longest_source);
    if let Some(rows) = fit.waiters {
        let header = ["waited in", "source", "waits", "wait time"];
        let none = "no waiting code seen";
        let sites = waiters.into_iter().take(rows);
        render_sites(frame, waiters_area, header, sites, widths, none);
    }
    if let Some(rows) = fit.holders {
        let header = ["released by", "source", "wakes", "woken"];
        let none = if l.kind == "kernel" {
            "releasing code: not traced for kernel locks"
        } else {
            "no wake seen"
        };
        let sites = holders.into_iter().take(rows);
        render_sites(frame, holders_area, header, sites, widths, none);
    }
    if fit.owners {
        frame.render_widget(owners_line(l, usize::from(inner.width)), owners_area);
    }
    if fit.note {
        frame.render_widget(note_line(l), note_area);
    }
}

/// `g_hot_lock · mutex at 0x5555aaaa0040 · mean wait 41.0 µs`.
fn detail_title(l: &LockEntry) -> String {
    let what = match (&l.name, l.kind.as_str()) {
        (Some(name), "kernel") => name.clone(),
        (Some(name), kind) => format!("{name} · {kind} at {}", l.address),
        (None, kind) => format!("{kind} at {}", l.address),
    };
    format!(" {what} · mean wait {} ", format_ns(l.wait_mean_ns))
}

/// Widths of the site tables' columns (function, source, two numbers) in
/// `width`, shared by the waiting and releasing sites so that they line
/// up: the source gets what its longest label needs, up to half.
fn site_widths(width: u16, longest_source: usize) -> [u16; 4] {
    let rest = width.saturating_sub(2 * NUMBER + 3);
    let longest = u16::try_from(longest_source.max("source".len())).unwrap_or(u16::MAX);
    let source = longest.min(rest / 2);
    [rest - source, source, NUMBER, NUMBER]
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

/// A table of sites (function, source, two numbers) under a bold header,
/// or `none` when there are no sites.
fn render_sites(
    frame: &mut Frame,
    area: Rect,
    header: [&'static str; 4],
    sites: impl Iterator<Item = [String; 4]>,
    widths: [u16; 4],
    none: &'static str,
) {
    let cell = |i: usize, text: String| {
        let text = ellipsize(&text, usize::from(widths[i]));
        if i < 2 {
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
        frame.render_widget(Line::from(none).dim(), area);
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

/// Acquisitions and hold time when the lock uprobes saw them, else why
/// they are missing.
fn note_line(l: &LockEntry) -> Line<'static> {
    let Some(acquisitions) = l.acquisitions else {
        return Line::from("acquisitions and hold times need the lock uprobes (not yet available)")
            .dim();
    };
    let mut spans = vec![
        "acquisitions ".dim(),
        group(acquisitions).into(),
        "   contended ".dim(),
        format!("{:.1}%", percent(l.contentions, acquisitions)).into(),
    ];
    if let Some(hold) = l.hold_p99_ns {
        spans.push("   hold p99 ".dim());
        spans.push(format_ns(hold).into());
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, style::Modifier, Terminal};

    use super::*;
    use crate::{
        report::{model::tests::sample_report, text::tests::report_with_locks},
        tui::{
            app::tests::{app_on, assert_centred, assert_fits, assert_shows, screen_at as screen},
            widgets::shown,
            Action, Tab,
        },
    };

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
                "acquisitions and hold times need the lock uprobes (not yet available)",
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
                "need the lock uprobes",
            ],
        );
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

    #[test]
    fn other_waits_are_dimmed() {
        let app = app_on(Tab::Locks, report_with_locks());
        let mut terminal = Terminal::new(TestBackend::new(100, 30)).unwrap();
        terminal.draw(|f| app.render(f)).unwrap();
        let buffer = terminal.backend().buffer();
        let text = screen(&app, 100, 30);
        let dim_at = |needle: &str| {
            let (y, line) = text
                .lines()
                .enumerate()
                .find(|(_, l)| l.contains(needle))
                .unwrap_or_else(|| panic!("no {needle}"));
            let x = line[..line.find(needle).unwrap_or(0)].chars().count();
            buffer[(x as u16, y as u16)]
                .modifier
                .contains(Modifier::DIM)
        };
        assert!(dim_at("0x7f00deadbe00"));
        assert!(!dim_at("kernel rwsem"));
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
        for report in [report_with_locks(), odd, sample_report()] {
            let mut app = app_on(Tab::Locks, report);
            for (w, h) in [(1, 1), (10, 3), (30, 8), (40, 12), (80, 24), (200, 60)] {
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
        let all = fit_detail(mutex, u16::MAX);
        assert_eq!(
            all,
            DetailFit {
                waiters: Some(2),
                holders: Some(1),
                owners: true,
                note: true
            }
        );
        assert_eq!(all.lines(), 7);
        assert_eq!(fit_detail(mutex, 7), all);
        // First the note, then the second waiter, then the owners.
        assert_eq!(fit_detail(mutex, 6), DetailFit { note: false, ..all });
        assert_eq!(
            fit_detail(mutex, 5),
            DetailFit {
                waiters: Some(1),
                note: false,
                ..all
            }
        );
        assert_eq!(
            fit_detail(mutex, 4),
            DetailFit {
                waiters: Some(1),
                holders: Some(1),
                ..DetailFit::default()
            }
        );
        assert_eq!(
            fit_detail(mutex, 2),
            DetailFit {
                waiters: Some(1),
                ..DetailFit::default()
            }
        );
        assert_eq!(fit_detail(mutex, 1), DetailFit::default());
        // A kernel lock: no releasing sites (one line says so), no owners.
        let kernel = fit_detail(&r.locks[1], u16::MAX);
        assert_eq!(kernel.holders, Some(0));
        assert!(!kernel.owners && kernel.note);
        assert_eq!(kernel.lines(), 4);
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
        assert_eq!(site_widths(78, 12), [45, 12, 9, 9]);
        assert_eq!(site_widths(78, 100), [29, 28, 9, 9]);
        assert_eq!(site_widths(10, 12), [0, 0, 9, 9]);
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
