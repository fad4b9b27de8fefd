//! Whole-screen snapshots of every tab: each tab, for fixture reports and
//! selections, rendered at several terminal sizes, text and styles, and
//! compared with the screens kept in `snapshots/`. A change to what the
//! dashboard draws fails here; after a deliberate one, run the tests with
//! `MEMPROF_UPDATE_SNAPSHOTS=1` to write the new screens, and review them.

use std::fmt::Write as _;

use ratatui::{
    backend::TestBackend,
    buffer::Buffer,
    style::{Color, Modifier},
    Terminal,
};

use super::{Action, App, Tab};
use crate::report::{
    model::tests::sample_report,
    text::tests::{report_with_allocator, report_with_locks},
    Report,
};

/// The terminal sizes each case is drawn at.
const SIZES: [(u16, u16); 4] = [(50, 20), (80, 24), (100, 30), (160, 50)];

/// Codes for the styles of a screen, in order of first use; `.` is the
/// default style.
const CODES: &str = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";

/// The app on `tab` showing `report` (none: waiting for one), after
/// `downs` presses of ↓.
fn app(tab: Tab, report: Option<Report>, downs: usize) -> App {
    let mut app = App::new("pid 42".into());
    if let Some(report) = report {
        app.set_report(report);
    }
    app.tab = app.tabs().iter().position(|t| *t == tab).unwrap_or(0);
    for _ in 0..downs {
        app.handle(Action::Down);
    }
    app
}

fn buffer(app: &App, width: u16, height: u16) -> Buffer {
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| app.render(f)).unwrap();
    terminal.backend().buffer().clone()
}

/// The screen as text, each line ended by `|`, then each line's styles
/// as one code per cell (lines in the default style left out, trailing
/// default cells cut) and what the codes stand for.
fn dump(buffer: &Buffer) -> String {
    let mut styles: Vec<(Color, Color, Modifier)> = Vec::new();
    let mut text = String::new();
    let mut coded = String::new();
    for y in 0..buffer.area.height {
        let mut codes = String::new();
        for x in 0..buffer.area.width {
            let cell = &buffer[(x, y)];
            text.push_str(cell.symbol());
            let style = (cell.fg, cell.bg, cell.modifier);
            if style == (Color::Reset, Color::Reset, Modifier::empty()) {
                codes.push('.');
                continue;
            }
            let i = styles.iter().position(|s| *s == style).unwrap_or_else(|| {
                styles.push(style);
                styles.len() - 1
            });
            codes.push(CODES.chars().nth(i).unwrap_or('?'));
        }
        text.push_str("|\n");
        let codes = codes.trim_end_matches('.');
        if !codes.is_empty() {
            let _ = writeln!(coded, "{y:>3} {codes}");
        }
    }
    text.push_str(&coded);
    for (i, style) in styles.iter().enumerate() {
        let code = CODES.chars().nth(i).unwrap_or('?');
        let (fg, bg, modifier) = style;
        let _ = writeln!(text, "{code} = fg {fg:?}, bg {bg:?}, {modifier:?}");
    }
    text
}

/// Every case at every size, each under a heading.
fn screens(cases: Vec<(&str, App)>) -> String {
    let mut out = String::new();
    for (name, app) in &cases {
        for (width, height) in SIZES {
            let _ = writeln!(out, "=== {name} at {width}x{height}");
            out.push_str(&dump(&buffer(app, width, height)));
        }
    }
    out
}

/// Fails unless `actual` is the snapshot `name`, showing the first line
/// that differs; writes it instead when `MEMPROF_UPDATE_SNAPSHOTS` is set.
fn check(name: &str, actual: &str) {
    let path = format!(
        "{}/src/tui/snapshots/{name}.txt",
        env!("CARGO_MANIFEST_DIR")
    );
    if std::env::var_os("MEMPROF_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected == actual {
        return;
    }
    let mut heading = "";
    for (i, (e, a)) in expected.lines().zip(actual.lines()).enumerate() {
        if e.starts_with("=== ") {
            heading = e;
        }
        assert_eq!(
            a,
            e,
            "{name} differs at line {} ({heading}); left: drawn, right: kept",
            i + 1
        );
    }
    panic!(
        "{name}: {} lines, expected {}",
        actual.lines().count(),
        expected.lines().count()
    );
}

#[test]
fn overview() {
    let cases = vec![
        ("waiting", app(Tab::Overview, None, 0)),
        ("sample", app(Tab::Overview, Some(sample_report()), 0)),
        ("scrolled", app(Tab::Overview, Some(sample_report()), 1)),
        // Two processes, in pid namespaces: the Processes table.
        (
            "processes",
            app(
                Tab::Overview,
                Some(crate::report::fixtures::full_report()),
                0,
            ),
        ),
    ];
    check("overview", &screens(cases));
}

#[test]
fn false_sharing() {
    use super::tabs::sharing::tests::{report_with, report_with_sharing};
    let cases = vec![
        ("waiting", app(Tab::FalseSharing, None, 0)),
        (
            "empty",
            app(Tab::FalseSharing, Some(report_with(vec![])), 0),
        ),
        (
            "first",
            app(Tab::FalseSharing, Some(report_with_sharing()), 0),
        ),
        (
            "second",
            app(Tab::FalseSharing, Some(report_with_sharing()), 1),
        ),
    ];
    check("false_sharing", &screens(cases));
}

#[test]
fn allocator() {
    let mut sampled = report_with_allocator();
    sampled.allocator.mode = crate::report::model::TraceMode::Sampled;
    sampled.allocator.sampled = true;
    sampled.allocator.traced_fraction = 0.048;
    sampled.allocator.memory = None;
    sampled.allocator.lost = 5;
    let cases = vec![
        ("waiting", app(Tab::Allocator, None, 0)),
        ("off", app(Tab::Allocator, Some(sample_report()), 0)),
        (
            "first",
            app(Tab::Allocator, Some(report_with_allocator()), 0),
        ),
        (
            "second",
            app(Tab::Allocator, Some(report_with_allocator()), 1),
        ),
        ("sampled", app(Tab::Allocator, Some(sampled), 0)),
    ];
    check("allocator", &screens(cases));
}

#[test]
fn locks() {
    use super::tabs::locks::tests::traced_report;
    let cases = vec![
        ("waiting", app(Tab::Locks, None, 0)),
        ("none", app(Tab::Locks, Some(sample_report()), 0)),
        ("mutex", app(Tab::Locks, Some(report_with_locks()), 0)),
        ("kernel", app(Tab::Locks, Some(report_with_locks()), 1)),
        ("condvar", app(Tab::Locks, Some(report_with_locks()), 2)),
        ("traced", app(Tab::Locks, Some(traced_report()), 0)),
        ("traced kernel", app(Tab::Locks, Some(traced_report()), 1)),
    ];
    check("locks", &screens(cases));
}
