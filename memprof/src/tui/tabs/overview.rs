//! The Overview tab: target, sampling health, hot functions, threads.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::Line,
    widgets::{Block, Paragraph, Row, Table},
    Frame,
};

use crate::report::{
    text::{ellipsize, format_bytes, format_duration, group, share_of_a_core},
    Report,
};
use crate::tui::{rates::Rates, App};

/// Draws the tab: the target and sampling health on top, the hot
/// functions and the threads side by side under it.
pub fn render(app: &App, frame: &mut Frame, area: Rect) {
    let Some(report) = &app.report else {
        let text = Paragraph::new(format!("{}: waiting for the first samples…", app.title))
            .block(Block::bordered().title(" Overview "));
        frame.render_widget(text, area);
        return;
    };
    let [info, mut tables] =
        Layout::vertical([Constraint::Length(7), Constraint::Fill(1)]).areas(area);
    render_info(report, &app.rates(), frame, info);
    // Several processes (or one in another pid namespace): a table of
    // them across the tab, at most a third of it.
    let processes = &report.target.processes;
    if processes.len() > 1 || processes.iter().any(|p| p.ns_pid.is_some()) {
        let rows = u16::try_from(processes.len()).unwrap_or(u16::MAX);
        let [top, rest] = Layout::vertical([
            // Borders, header and a row at least; else up to a third.
            Constraint::Length(rows.saturating_add(3).min((tables.height / 3).max(4))),
            Constraint::Fill(1),
        ])
        .areas(tables);
        render_processes(report, frame, top);
        tables = rest;
    }
    let [hot, threads] =
        Layout::horizontal([Constraint::Percentage(72), Constraint::Percentage(28)]).areas(tables);
    render_hot_functions(report, app.scroll, frame, hot);
    render_threads(report, frame, threads);
}

/// The traced processes (several: `-p` pids, a cgroup's, children; or one
/// in another pid namespace), with their threads and samples.
fn render_processes(report: &Report, frame: &mut Frame, area: Rect) {
    let processes = &report.target.processes;
    let pid_width = processes
        .iter()
        .map(|p| p.pid_label().len())
        .max()
        .unwrap_or(0)
        .max(7);
    let rows = processes.iter().map(|p| {
        Row::new(vec![
            p.pid_label(),
            if p.command.is_empty() {
                "(exited)".to_string()
            } else {
                p.command.clone()
            },
            p.threads.to_string(),
            group(p.samples),
        ])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(pid_width as u16),
            Constraint::Fill(1),
            Constraint::Length(4),
            Constraint::Length(7),
        ],
    )
    .header(Row::new(["pid", "command", "thr", "samples"]).bold())
    .block(Block::bordered().title(" Processes "));
    frame.render_widget(table, area);
}

/// The target, elapsed time and threads, samples and those lost, and what
/// the profiler itself costs (rates over the last refresh).
fn render_info(report: &Report, rates: &Rates, frame: &mut Frame, area: Rect) {
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
            format!(
                " ({:.0}/s, {} at {} Hz)",
                rates.samples, s.source, s.frequency_hz
            )
            .into(),
            "   lost ".dim(),
            ratatui::text::Span::styled(group(s.lost), lost_style),
            "   sampled ".dim(),
            s.scope.per().into(),
        ]),
    ];
    let mut lines = lines;
    lines.extend(cost_lines(
        report,
        rates,
        area.width.saturating_sub(2).into(),
    ));
    frame.render_widget(
        Paragraph::new(lines).block(Block::bordered().title(" Overview ")),
        area,
    );
}

/// The profiler's CPU and memory and its BPF programs' run time, then the
/// records read from the rings, busiest ring first; lines cut to `width`.
fn cost_lines(report: &Report, rates: &Rates, width: usize) -> [Line<'static>; 2] {
    let l = &report.loader;
    // Start-up dominates the first second; a share is meaningless then.
    if report.duration_s < 1.0 {
        return [
            Line::from(vec![
                "profiler ".dim(),
                format!("measuring…, {}", format_bytes(l.peak_rss_bytes)).into(),
            ]),
            Line::default(),
        ];
    }
    let bpf = match (rates.bpf_run_share, rates.bpf_runs) {
        (Some(share), Some(runs)) => format!(
            "{}, {} runs/s",
            share_of_a_core(Some(share)),
            group(runs.round() as u64)
        ),
        _ => format!("run time unknown (bpf_stats {})", l.bpf_stats),
    };
    let profiler = format!(
        "{:.1}% of a core, {}",
        rates.cpu_share * 100.0,
        format_bytes(l.peak_rss_bytes)
    );
    let rings: Vec<String> = rates
        .rings
        .iter()
        .filter(|(_, per_s)| *per_s > 0.0)
        .map(|(name, per_s)| format!("{name} {}", group(per_s.round() as u64)))
        .collect();
    let rings = format!(
        "{}/s{}{}",
        group(rates.ring_events.round() as u64),
        if rings.is_empty() { "" } else { ": " },
        rings.join(", ")
    );
    let cut = |lead: usize, text: String| ellipsize(&text, width.saturating_sub(lead));
    [
        Line::from(vec![
            "profiler ".dim(),
            profiler.clone().into(),
            "   BPF ".dim(),
            cut(9 + profiler.chars().count() + 7, bpf).into(),
        ]),
        Line::from(vec!["ring records ".dim(), cut(13, rings).into()]),
    ]
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
    let tid_width = report
        .threads
        .iter()
        .map(|t| t.tid_label().len())
        .max()
        .unwrap_or(0)
        .max(7);
    let rows = report.threads.iter().map(|t| {
        let name = if t.exited {
            format!("{} †", t.name)
        } else {
            t.name.clone()
        };
        Row::new(vec![t.tid_label(), name, group(t.samples)])
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(tid_width as u16),
            Constraint::Fill(1),
            Constraint::Length(7),
        ],
    )
    .header(Row::new(["tid", "name", "samples"]).bold())
    .block(Block::bordered().title(" Threads "));
    frame.render_widget(table, area);
}
