//! The Allocator tab: how the allocator was traced, latency per split with
//! the selected split's histogram, the memory composition at peak, the
//! allocator's syscalls and the top allocation sites.
//!
//! The panes have priorities: on a small terminal the header, the latency
//! table and the memory bar stay, and sites, then syscalls, are dropped.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Color, Style, Stylize},
    text::{Line, Span},
    widgets::{Block, Paragraph, Table, TableState, Wrap},
    Frame,
};

use crate::report::{
    format::{format_measured, format_median, maybe},
    model::{AllocatorReport, MemoryReport, OpStats, SiteEntry, SyscallStats, TraceMode},
    text::{
        allocator_off, by_time, format_bytes, format_ns, from_loop, group, library_label,
        live_label, percent, sites_by_bytes, syscall_origin,
    },
};
use crate::tui::{
    layout::{LineBudget, Selection},
    widgets::{count_label, histogram_spans, render_histogram, render_message, table, Column},
    App,
};

/// The tab's frame title, for its one-line messages.
const TITLE: &str = " Allocator ";
/// From this width, the histogram sits beside the latency table and
/// syscalls beside sites.
const WIDE: u16 = 120;
/// Width of the histogram pane beside the latency table.
const CHART_WIDTH: u16 = 44;
/// The latency pane needs this height for a bar chart beside the table.
const CHART_HEIGHT: u16 = 9;
/// The height the latency pane wants on a wide terminal, for the chart.
const CHART_WANT: u16 = 12;
/// Rows wanted for the syscalls and sites tables.
const SYSCALL_ROWS: usize = 6;
const SITE_ROWS: usize = 8;

/// The tab's own state: which latency row is selected.
pub type AllocatorState = Selection;

/// The tab's panes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pane {
    Header,
    Ops,
    Memory,
    Syscalls,
    Sites,
    /// Syscalls and sites side by side (wide terminals).
    Lower,
}

/// Top to bottom on screen.
const SCREEN_ORDER: [Pane; 6] = [
    Pane::Header,
    Pane::Ops,
    Pane::Memory,
    Pane::Syscalls,
    Pane::Sites,
    Pane::Lower,
];

/// The rows a pane needs to be worth showing, and the rows it can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Want {
    pane: Pane,
    min: u16,
    max: u16,
}

/// Draws the tab.
pub fn render(app: &App, frame: &mut Frame, area: Rect) {
    let Some(report) = &app.report else {
        render_message(frame, area, TITLE, "waiting for the first report…");
        return;
    };
    let a = &report.allocator;
    if allocator_off(a) {
        render_message(
            frame,
            area,
            TITLE,
            "allocator tracing is off (--alloc-mode off)",
        );
        return;
    }
    if a.library.is_none() {
        render_message(frame, area, TITLE, "no allocator found in the target");
        return;
    }
    let selected = app.allocator.selected(a.ops.len());
    let wide = area.width >= WIDE;
    let wants = wants(a, wide);
    let heights = fit_panes(area.height, &wants);
    let panes: Vec<(Pane, u16)> = SCREEN_ORDER
        .iter()
        .filter_map(|pane| {
            let i = wants.iter().position(|w| w.pane == *pane)?;
            (heights[i] > 0).then_some((*pane, heights[i]))
        })
        .collect();
    let areas = Layout::vertical(panes.iter().map(|(_, h)| Constraint::Length(*h))).split(area);
    for ((pane, _), rect) in panes.iter().zip(areas.iter()) {
        match pane {
            Pane::Header => render_header(a, frame, *rect),
            Pane::Ops => render_ops(a, selected, frame, *rect),
            Pane::Memory => render_memory(a.memory.as_ref(), frame, *rect),
            Pane::Syscalls => render_syscalls(&a.syscalls, frame, *rect),
            Pane::Sites => render_sites(&a.sites, frame, *rect),
            Pane::Lower => {
                let [left, right] =
                    Layout::horizontal([Constraint::Percentage(42), Constraint::Fill(1)])
                        .areas(*rect);
                render_syscalls(&a.syscalls, frame, left);
                render_sites(&a.sites, frame, right);
            }
        }
    }
}

/// What each pane wants, in priority order (most important first). A
/// table wants all its rows (up to a cap) and needs a few of them.
fn wants(a: &AllocatorReport, wide: bool) -> Vec<Want> {
    // Borders and the table header, then the rows.
    let table = |rows: usize, cap: usize| 3 + rows.clamp(1, cap) as u16;
    let memory = if a.memory.is_some() { 4 } else { 3 };
    // The latency pane has the histogram line too.
    let ops_max =
        (1 + table(a.ops.len(), usize::from(u16::MAX - 4))).max(if wide { CHART_WANT } else { 0 });
    let mut wants = vec![
        Want {
            pane: Pane::Header,
            min: 4,
            max: 4,
        },
        Want {
            pane: Pane::Ops,
            min: 1 + table(a.ops.len(), 4),
            max: ops_max,
        },
        Want {
            pane: Pane::Memory,
            min: memory,
            max: memory,
        },
    ];
    if wide {
        let rows = a.syscalls.len().min(SYSCALL_ROWS).max(a.sites.len());
        wants.push(Want {
            pane: Pane::Lower,
            min: table(rows, 3),
            max: table(rows, SITE_ROWS),
        });
    } else {
        wants.push(Want {
            pane: Pane::Sites,
            min: table(a.sites.len(), 3),
            max: table(a.sites.len(), SITE_ROWS),
        });
        wants.push(Want {
            pane: Pane::Syscalls,
            min: table(a.syscalls.len(), 2),
            max: table(a.syscalls.len(), SYSCALL_ROWS),
        });
    }
    wants
}

/// Heights for the panes, in the order of `wants`; 0 for a pane dropped.
/// Each pane, in priority order, gets its minimum if that still fits; the
/// rows left then go to each shown pane up to its maximum. Rows nobody
/// wants stay empty at the bottom.
fn fit_panes(height: u16, wants: &[Want]) -> Vec<u16> {
    let mut budget = LineBudget::new(height);
    let mut heights: Vec<u16> = wants
        .iter()
        .map(|w| {
            if budget.take(usize::from(w.min)) {
                w.min
            } else {
                0
            }
        })
        .collect();
    for (h, w) in heights.iter_mut().zip(wants) {
        if *h > 0 {
            *h += budget.take_up_to(w.max.saturating_sub(*h));
        }
    }
    heights
}

/// Library (in the title), mode, calls traced and lost.
fn render_header(a: &AllocatorReport, frame: &mut Frame, area: Rect) {
    let lost = if a.lost > 0 {
        Style::new().red().bold()
    } else {
        Style::new()
    };
    let mut second = vec![
        "calls traced ".dim(),
        group(a.calls_traced).into(),
        "   lost ".dim(),
        Span::styled(group(a.lost), lost),
    ];
    if !a.large_rule.is_empty() {
        second.push("   large = ".dim());
        second.push(a.large_rule.clone().into());
    }
    let lines = vec![Line::from(mode_label(a)), Line::from(second)];
    let title = Line::from(vec![
        " Allocator: ".into(),
        library_label(a).bold(),
        " ".into(),
    ]);
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(title)),
        area,
    );
}

/// `full: every call traced`, or for sampled mode how much was traced.
fn mode_label(a: &AllocatorReport) -> String {
    match a.mode {
        TraceMode::Full => "full: every call traced".into(),
        TraceMode::Sampled => format!(
            "sampled: probes attached {:.1}% of the time, counts scaled",
            a.traced_fraction * 100.0
        ),
        other => other.name().into(),
    }
}

/// The latency table with the selected split's histogram, beside it on a
/// large pane, else as a one-line sparkline under it.
fn render_ops(a: &AllocatorReport, selected: Option<usize>, frame: &mut Frame, area: Rect) {
    let title = if a.sampled {
        " Latency per split (↑/↓ select; counts scaled) "
    } else {
        " Latency per split (↑/↓ select) "
    };
    let block = Block::bordered().title(title);
    let chosen = selected.and_then(|i| a.ops.get(i));
    if a.ops.is_empty() {
        frame.render_widget(
            Paragraph::new("no allocator calls traced yet").block(block),
            area,
        );
        return;
    }
    let beside = area.width >= WIDE && area.height >= CHART_HEIGHT;
    let (outer, chart_area) = if beside {
        let [t, c] =
            Layout::horizontal([Constraint::Fill(1), Constraint::Length(CHART_WIDTH)]).areas(area);
        (t, Some(c))
    } else {
        (area, None)
    };
    let inner = block.inner(outer);
    frame.render_widget(block, outer);
    let (table_area, spark_area) = if beside {
        (inner, None)
    } else {
        let [t, s] = Layout::vertical([Constraint::Fill(1), Constraint::Length(1)]).areas(inner);
        (t, Some(s))
    };
    let mut state = TableState::new().with_selected(selected);
    let resolution = a.probe_cost_ns.as_ref().map(|c| c.resolution_ns);
    let table = ops_table(&a.ops, resolution, table_area.width);
    frame.render_stateful_widget(table, table_area, &mut state);
    if let (Some(rect), Some(op)) = (chart_area, chosen) {
        render_chart(op, frame, rect);
    }
    if let (Some(rect), Some(op)) = (spark_area, chosen) {
        frame.render_widget(spark_line(op), rect);
    }
}

/// The latency table's columns; on a narrow pane p50, phase, origin,
/// mean and class go, in that order.
const OP_COLUMNS: [Column; 9] = [
    Column::text("op", 14, 0).fill(),
    Column::text("class", 7, 4),
    Column::text("origin", 6, 6),
    Column::text("phase", 8, 7),
    Column::number("count", 9, 1),
    Column::number("mean", 7, 5),
    Column::number("p50", 7, 8),
    Column::number("p99", 7, 2),
    Column::number("max", 7, 3),
];

/// The latency rows, durations humanized, with the columns that fit in
/// `width`.
fn ops_table(ops: &[OpStats], resolution: Option<u64>, width: u16) -> Table<'static> {
    let rows = ops
        .iter()
        .map(|op| {
            vec![
                op.op.to_string(),
                op.class.to_string(),
                op.origin.map_or_else(|| "-".into(), |o| o.to_string()),
                op.phase.to_string(),
                maybe(op.count, count_label),
                format_measured(op.mean_ns, resolution),
                format_median(op.p50_ns, from_loop(op), resolution),
                format_measured(op.p99_ns, resolution),
                format_measured(op.max_ns, resolution),
            ]
        })
        .collect();
    table(&OP_COLUMNS, rows, width).row_highlight_style(Style::new().reversed())
}

/// `malloc small reused parallel`: the split's name.
fn split_name(op: &OpStats) -> String {
    format!(
        "{} {} {} {}",
        op.op,
        op.class,
        op.origin.map_or("-", |o| o.name()),
        op.phase
    )
}

/// The selected split's histogram as a bar chart, one bar per log2 bucket.
fn render_chart(op: &OpStats, frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(format!(" {} ", split_name(op)));
    render_histogram(frame, area, block, &op.histogram, "no calls traced");
}

/// `histogram malloc small reused parallel 64 ns ▂█▅▁ 4.10 µs`: the
/// selected split's histogram in one line.
fn spark_line(op: &OpStats) -> Line<'static> {
    let mut spans = vec!["histogram ".dim()];
    match histogram_spans(&op.histogram) {
        Some(histogram) => {
            spans.push(format!("{} ", split_name(op)).into());
            spans.extend(histogram);
        }
        None => spans.push(format!("{}: no calls traced", split_name(op)).into()),
    }
    Line::from(spans)
}

/// The parts of mapped memory at its peak: label, bytes and colour.
fn memory_parts(m: &MemoryReport) -> [(&'static str, u64, Color); 4] {
    [
        ("requested", m.requested_at_peak, Color::Green),
        ("internal frag", m.internal_fragmentation, Color::Yellow),
        ("blowup", m.blowup, Color::Red),
        ("external+meta", m.external_fragmentation, Color::Magenta),
    ]
}

/// The memory composition bar and its legend, or why there is none.
fn render_memory(memory: Option<&MemoryReport>, frame: &mut Frame, area: Rect) {
    let Some(m) = memory else {
        let block = Block::bordered().title(" Memory ");
        frame.render_widget(
            Paragraph::new("memory composition needs --alloc-mode full").block(block),
            area,
        );
        return;
    };
    let mut title = format!(
        " Memory at peak: {} mapped · requested peak {} ",
        format_bytes(m.mapped_peak),
        format_bytes(m.requested_peak)
    );
    if !m.usable_known {
        title.push_str("· block sizes unknown ");
    }
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    let parts = memory_parts(m);
    let bytes: Vec<u64> = parts.iter().map(|p| p.1).collect();
    let widths = segment_widths(&bytes, inner.width);
    let bar: Vec<Span> = parts
        .iter()
        .zip(&widths)
        .map(|(p, &w)| Span::styled("█".repeat(w as usize), Style::new().fg(p.2)))
        .collect();
    let whole = if m.mapped_peak > 0 {
        m.mapped_peak
    } else {
        bytes.iter().sum()
    };
    let legend = legend(&parts, whole, inner.width);
    frame.render_widget(
        Paragraph::new(vec![Line::from(bar), legend])
            .wrap(Wrap { trim: true })
            .block(block),
        area,
    );
}

/// `■ requested 30.0 MiB (46.9%)  ■ …`, without the bytes when that is
/// too long for `width`.
fn legend(parts: &[(&'static str, u64, Color)], whole: u64, width: u16) -> Line<'static> {
    let item = |(label, bytes, _): &(&str, u64, Color), with_bytes: bool| {
        let share = percent(*bytes, whole);
        if with_bytes {
            format!("{label} {} ({share:.1}%)", format_bytes(*bytes))
        } else {
            format!("{label} {share:.1}%")
        }
    };
    let long: usize = parts
        .iter()
        .map(|p| item(p, true).chars().count() + 4)
        .sum();
    let with_bytes = long <= width as usize;
    let mut spans = Vec::new();
    for part in parts {
        spans.push(Span::styled("■ ", Style::new().fg(part.2)));
        spans.push(Span::raw(item(part, with_bytes)));
        spans.push(Span::raw("  "));
    }
    Line::from(spans)
}

/// Cells of a bar of `width` for each part, proportional to its bytes;
/// they add up to `width` (largest remainders get the odd cells), or to 0
/// when all parts are 0.
fn segment_widths(parts: &[u64], width: u16) -> Vec<u16> {
    let total: u128 = parts.iter().map(|&p| p as u128).sum();
    if total == 0 {
        return vec![0; parts.len()];
    }
    let exact: Vec<(u128, u128)> = parts
        .iter()
        .map(|&p| {
            let scaled = p as u128 * width as u128;
            (scaled / total, scaled % total)
        })
        .collect();
    let mut widths: Vec<u16> = exact.iter().map(|e| e.0 as u16).collect();
    let given: u16 = widths.iter().sum();
    let mut order: Vec<usize> = (0..parts.len()).collect();
    order.sort_by(|&x, &y| exact[y].1.cmp(&exact[x].1));
    for &i in order.iter().take(width.saturating_sub(given) as usize) {
        widths[i] += 1;
    }
    widths
}

/// The syscalls table's columns.
const SYSCALL_COLUMNS: [Column; 5] = [
    Column::text("syscall", 8, 0),
    Column::text("inside", 8, 1).fill(),
    Column::number("count", 9, 3),
    Column::number("time", 7, 2),
    Column::number("bytes", 10, 4),
];

/// The allocator's mapping syscalls, the most time first.
fn render_syscalls(syscalls: &[SyscallStats], frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(" Syscalls ");
    if syscalls.is_empty() {
        frame.render_widget(Paragraph::new("none seen").block(block), area);
        return;
    }
    let rows = by_time(syscalls)
        .into_iter()
        .map(|s| {
            vec![
                s.name.to_string(),
                syscall_origin(s).to_string(),
                count_label(s.count),
                format_ns(s.total_ns),
                format_bytes(s.bytes),
            ]
        })
        .collect();
    let width = block.inner(area).width;
    frame.render_widget(table(&SYSCALL_COLUMNS, rows, width).block(block), area);
}

/// The sites table's columns.
const SITE_COLUMNS: [Column; 5] = [
    Column::text("function", 12, 0).fill(),
    Column::text("source", 10, 1).fill(),
    Column::number("count", 9, 4),
    Column::number("bytes", 10, 2),
    Column::number("live", 10, 3),
];

/// The sites that requested the most bytes; live bytes are leak candidates.
fn render_sites(sites: &[SiteEntry], frame: &mut Frame, area: Rect) {
    let block = Block::bordered().title(" Top sites (by bytes; live = not freed) ");
    if sites.is_empty() {
        frame.render_widget(Paragraph::new("none seen").block(block), area);
        return;
    }
    let rows = sites_by_bytes(sites)
        .into_iter()
        .map(|s| {
            vec![
                s.function.clone(),
                s.source_label(),
                maybe(s.count, count_label),
                maybe(s.bytes, format_bytes),
                live_label(s),
            ]
        })
        .collect();
    let width = block.inner(area).width;
    frame.render_widget(table(&SITE_COLUMNS, rows, width).block(block), area);
}

#[cfg(test)]
mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::{
        report::text::tests::report_with_allocator,
        tui::{widgets::shown, Tab},
    };

    use crate::tui::app::tests::{app_on, assert_centred, assert_shows, screen_at as screen};

    #[test]
    fn shows_latency_memory_syscalls_and_sites() {
        let text = screen(&app_on(Tab::Allocator, report_with_allocator()), 100, 40);
        assert_shows(
            &text,
            &[
                "glibc 2.36 (libc.so.6)",
                "full: every call traced",
                "123,456",
                "malloc",
                "reused",
                "45 ns",
                "p50",
                "12.5 µs",
                "histogram malloc small reused parallel",
                "blowup",
                "requested 46.9%",
                "64.0 MiB mapped",
                "Syscalls",
                "mmap",
                "outside",
                "untraced",
                "make_buffer",
                "work.c:30",
                "2.0 MiB",
            ],
        );
    }

    #[test]
    fn fits_80x24_keeping_the_important_panes() {
        let text = screen(&app_on(Tab::Allocator, report_with_allocator()), 80, 24);
        assert_shows(
            &text,
            &[
                "glibc 2.36",
                "calls traced",
                "malloc",
                "free",
                "histogram",
                "blowup",
                "make_buffer",
            ],
        );
        // No room for p50 at 80 columns; the other columns stay whole.
        assert!(!text.contains("p50") && text.contains("p99") && text.contains("max"));
    }

    #[test]
    fn wide_terminal_puts_the_histogram_beside_the_table() {
        let mut app = app_on(Tab::Allocator, report_with_allocator());
        app.handle(crate::tui::Action::Down);
        let text = screen(&app, 160, 50);
        // The chart's title names the selected split (the second row).
        assert!(text.contains(" free small reused parallel "), "{text}");
        assert!(text.contains("128n"), "bucket labels:\n{text}");
        assert!(!text.contains("histogram "));
        assert!(text.contains("Syscalls") && text.contains("make_buffer"));
        assert!(text.contains("requested 30.0 MiB (46.9%)"), "{text}");
    }

    #[test]
    fn off_mode_is_one_centered_line() {
        let mut r = report_with_allocator();
        r.allocator = AllocatorReport {
            mode: TraceMode::Off,
            ..Default::default()
        };
        let text = screen(&app_on(Tab::Allocator, r), 80, 24);
        assert_centred(&text, "allocator tracing is off (--alloc-mode off)");
        assert!(!text.contains("Latency"));
    }

    #[test]
    fn no_library_says_no_allocator_found() {
        let mut r = report_with_allocator();
        r.allocator.library = None;
        let text = screen(&app_on(Tab::Allocator, r), 80, 24);
        assert!(text.contains("no allocator found in the target"), "{text}");
    }

    #[test]
    fn sampled_mode_says_scaled_and_that_memory_needs_full() {
        let mut r = report_with_allocator();
        r.allocator.mode = TraceMode::Sampled;
        r.allocator.sampled = true;
        r.allocator.traced_fraction = 0.048;
        r.allocator.memory = None;
        r.allocator.lost = 5;
        let text = screen(&app_on(Tab::Allocator, r), 80, 24);
        assert!(
            text.contains("sampled: probes attached 4.8% of the time, counts scaled"),
            "{text}"
        );
        assert!(text.contains("memory composition needs --alloc-mode full"));
    }

    #[test]
    fn lost_events_are_red() {
        let mut r = report_with_allocator();
        r.allocator.lost = 5;
        let app = app_on(Tab::Allocator, r);
        let mut terminal = Terminal::new(TestBackend::new(100, 30)).unwrap();
        terminal.draw(|f| app.render(f)).unwrap();
        let buffer = terminal.backend().buffer();
        let red = (0..buffer.area.height).any(|y| {
            (0..buffer.area.width).any(|x| {
                let cell = &buffer[(x, y)];
                cell.symbol() == "5" && cell.fg == Color::Red
            })
        });
        assert!(red);
    }

    #[test]
    fn empty_and_odd_data_never_panic() {
        let mut r = report_with_allocator();
        r.allocator.ops[0].histogram.clear();
        r.allocator.ops[1].histogram = vec![(0, 0), (u64::MAX, 1)];
        let mut empty = report_with_allocator();
        let a = &mut empty.allocator;
        a.ops.clear();
        a.syscalls.clear();
        a.sites.clear();
        a.memory = Some(MemoryReport::default());
        for report in [r, empty] {
            let mut app = app_on(Tab::Allocator, report);
            for (w, h) in [
                (1, 1),
                (10, 3),
                (30, 8),
                (80, 24),
                (119, 30),
                (120, 9),
                (200, 60),
            ] {
                screen(&app, w, h);
                app.handle(crate::tui::Action::Down);
            }
        }
    }

    #[test]
    fn small_heights_drop_low_priority_panes() {
        let a = report_with_allocator().allocator;
        let wants = wants(&a, false);
        let order: Vec<Pane> = wants.iter().map(|w| w.pane).collect();
        assert_eq!(
            order,
            [
                Pane::Header,
                Pane::Ops,
                Pane::Memory,
                Pane::Sites,
                Pane::Syscalls
            ]
        );
        // 80x24 leaves 22 rows: everything but the syscalls.
        let h = fit_panes(22, &wants);
        assert_eq!(h.iter().sum::<u16>(), 22);
        assert_eq!(h, [4, 8, 4, 6, 0]);
        // Tall: every pane gets what it wants: all its rows.
        assert_eq!(fit_panes(60, &wants), [4, 9, 4, 6, 6]);
        // Wide: syscalls beside sites; the chart wants some height.
        let wide = fit_panes(60, &super::wants(&a, true));
        assert_eq!(wide, [4, CHART_WANT, 4, 6]);
        // Too small for anything.
        assert_eq!(fit_panes(3, &wants), [0, 0, 0, 0, 0]);
    }

    #[test]
    fn memory_bar_segments_fill_the_width() {
        assert_eq!(segment_widths(&[0, 0], 10), [0, 0]);
        assert_eq!(segment_widths(&[1, 1, 1], 10), [4, 3, 3]);
        assert_eq!(segment_widths(&[30, 4, 10, 20], 64), [30, 4, 10, 20]);
        let w = segment_widths(&[u64::MAX, u64::MAX, 1], 77);
        assert_eq!(w.iter().sum::<u16>(), 77);
        assert_eq!(segment_widths(&[5], 0), [0]);
    }

    #[test]
    fn narrow_tables_drop_columns_instead_of_cutting_numbers() {
        let all = shown(&OP_COLUMNS, 200);
        assert!(all.iter().all(|k| *k));
        // 80 columns: all but p50.
        let at_80 = shown(&OP_COLUMNS, 78);
        assert_eq!(
            at_80,
            [true, true, true, true, true, true, false, true, true]
        );
        // Very narrow: the op name and what matters most.
        let tiny = shown(&OP_COLUMNS, 20);
        assert_eq!(
            tiny,
            [true, false, false, false, false, false, false, false, false]
        );
        let kept: Vec<&str> = OP_COLUMNS
            .iter()
            .zip(shown(&OP_COLUMNS, 45))
            .filter(|(_, k)| *k)
            .map(|(c, _)| c.header)
            .collect();
        assert_eq!(kept, ["op", "count", "p99", "max"]);
    }
}
