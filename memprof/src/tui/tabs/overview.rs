//! The Overview tab: target, sampling health, hot functions, threads.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::Line,
    widgets::{Block, Paragraph, Row, Table},
    Frame,
};

use crate::report::{
    text::{ellipsize, format_bytes, format_duration, group},
    Report,
};
use crate::tui::App;

/// Draws the tab: the target and sampling health on top, the hot
/// functions and the threads side by side under it.
pub fn render(app: &App, frame: &mut Frame, area: Rect) {
    let Some(report) = &app.report else {
        let text = Paragraph::new(format!("{}: waiting for the first samples…", app.title))
            .block(Block::bordered().title(" Overview "));
        frame.render_widget(text, area);
        return;
    };
    let [info, tables] = Layout::vertical([Constraint::Length(6), Constraint::Fill(1)]).areas(area);
    render_info(report, app.samples_per_s(), frame, info);
    let [hot, threads] =
        Layout::horizontal([Constraint::Percentage(72), Constraint::Percentage(28)]).areas(tables);
    render_hot_functions(report, app.scroll, frame, hot);
    render_threads(report, frame, threads);
}

/// The target, elapsed time and threads, samples (`per_s` over the last
/// refresh) and those lost, and what the profiler itself costs.
fn render_info(report: &Report, per_s: f64, frame: &mut Frame, area: Rect) {
    let t = &report.target;
    let s = &report.sampling;
    let live = report.threads.iter().filter(|t| !t.exited).count();
    let lost_style = if s.lost > 0 {
        Style::new().red().bold()
    } else {
        Style::new()
    };
    let lines = vec![
        Line::from(vec![
            "target ".dim(),
            format!("pid {} ", t.pid).bold(),
            ellipsize(&t.command, 60).into(),
            if t.exited {
                " (exited)".red()
            } else {
                "".into()
            },
        ]),
        Line::from(vec![
            "elapsed ".dim(),
            format_duration(report.duration_s).into(),
            "   threads ".dim(),
            format!("{live} live / {} seen", t.threads_seen).into(),
        ]),
        Line::from(vec![
            "samples ".dim(),
            group(s.samples).into(),
            format!(" ({:.0}/s, {} at {} Hz)", per_s, s.source, s.frequency_hz).into(),
            "   lost ".dim(),
            ratatui::text::Span::styled(group(s.lost), lost_style),
        ]),
    ];
    let l = &report.loader;
    let mut lines = lines;
    lines.push(Line::from(vec![
        "profiler ".dim(),
        // Start-up dominates the first second; a share is meaningless then.
        if report.duration_s < 1.0 {
            format!("measuring…, {}", format_bytes(l.peak_rss_bytes))
        } else {
            format!(
                "{:.1}% of a core, {}",
                l.cpu_share * 100.0,
                format_bytes(l.peak_rss_bytes)
            )
        }
        .into(),
    ]));
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Overview ")),
        area,
    );
}

/// The hot functions from row `scroll` on.
fn render_hot_functions(report: &Report, scroll: usize, frame: &mut Frame, area: Rect) {
    let rows = report.hot_functions.iter().skip(scroll).map(|h| {
        Row::new(vec![
            format!("{:5.1}%", h.share * 100.0),
            format!("{:5.1}%", h.total_share * 100.0),
            group(h.samples),
            h.function.clone(),
            h.source_label(),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(6),
            Constraint::Length(6),
            Constraint::Length(8),
            Constraint::Fill(2),
            Constraint::Fill(1),
        ],
    )
    .header(Row::new(["self", "total", "samples", "function", "source"]).bold())
    .block(Block::bordered().title(" Hot functions (self time; total with callees) "));
    frame.render_widget(table, area);
}

/// The threads seen, an exited one marked `†`.
fn render_threads(report: &Report, frame: &mut Frame, area: Rect) {
    let rows = report.threads.iter().map(|t| {
        let name = if t.exited {
            format!("{} †", t.name)
        } else {
            t.name.clone()
        };
        Row::new(vec![t.tid.to_string(), name, group(t.samples)])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(7),
            Constraint::Fill(1),
            Constraint::Length(7),
        ],
    )
    .header(Row::new(["tid", "name", "samples"]).bold())
    .block(Block::bordered().title(" Threads "));
    frame.render_widget(table, area);
}
