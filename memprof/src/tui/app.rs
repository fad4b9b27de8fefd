//! Dashboard state and what keys do to it.

use std::{collections::BTreeMap, time::Instant};

use ratatui::{
    layout::{Constraint, Layout},
    style::{Style, Stylize},
    text::{Line, Span},
    widgets::Tabs,
    Frame,
};

use super::layout::Selection;
use super::rates::{Rates, Totals};
use super::tabs::{
    allocator::AllocatorState,
    locks::{same_lock, LocksState},
    sharing::{same_line, SharingState},
    Tab,
};
use crate::report::Report;

/// What a key asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Quit,
    NextTab,
    PrevTab,
    Tab(usize),
    Up,
    Down,
    Redraw,
}

/// The dashboard's state.
pub struct App {
    pub title: String,
    pub tab: usize,
    pub report: Option<Report>,
    /// First row shown in scrollable tables.
    pub scroll: usize,
    /// The Allocator tab's selection (↑/↓ there move it instead of
    /// scrolling).
    pub allocator: AllocatorState,
    /// The Locks tab's selection (↑/↓ there move it too).
    pub locks: LocksState,
    /// The False sharing tab's selection (↑/↓ there move it too).
    pub sharing: SharingState,
    /// The selection on each report section's tab, by the section's key.
    sections: BTreeMap<String, Selection>,
    /// The newest log line and how many there were (logs stay in memory
    /// while the dashboard is on screen).
    pub log_line: Option<(String, u64)>,
    /// The last report's totals, when it came, and the rates up to it.
    rates: Option<(Totals, Instant, Rates)>,
}

impl App {
    pub fn new(title: String) -> Self {
        Self {
            title,
            tab: 0,
            report: None,
            scroll: 0,
            allocator: AllocatorState::default(),
            locks: LocksState::default(),
            sharing: SharingState::default(),
            sections: BTreeMap::new(),
            log_line: None,
            rates: None,
        }
    }

    pub fn set_report(&mut self, report: Report) {
        let now = Instant::now();
        let totals = Totals::of(&report);
        let rates = match &self.rates {
            Some((prev, at, rates)) => {
                let dt = now.duration_since(*at).as_secs_f64();
                if dt > 0.0 {
                    totals.rates_since(prev, dt)
                } else {
                    rates.clone()
                }
            }
            None if report.duration_s > 0.0 => {
                totals.rates_since(&Totals::default(), report.duration_s)
            }
            None => Rates::default(),
        };
        self.rates = Some((totals, now, rates));
        if let Some(old) = &self.report {
            self.locks.follow(&old.locks, &report.locks, same_lock);
            self.sharing
                .follow(&old.false_sharing, &report.false_sharing, same_line);
        }
        self.report = Some(report);
    }

    /// Samples per second over the last refresh.
    pub fn samples_per_s(&self) -> f64 {
        self.rates.as_ref().map_or(0.0, |r| r.2.samples)
    }

    /// The profiler's own cost and the samples, per second over the last
    /// refresh.
    pub fn rates(&self) -> Rates {
        self.rates.as_ref().map(|r| r.2.clone()).unwrap_or_default()
    }

    /// The tabs: the built-in ones, then one per report section that has
    /// one.
    pub fn tabs(&self) -> Vec<Tab> {
        let sections = self
            .report
            .as_ref()
            .map_or(0, |r| r.sections.tabs().count());
        Tab::ALL
            .into_iter()
            .chain((0..sections).map(Tab::Section))
            .collect()
    }

    /// A tab's title, numbered as its key.
    fn title(&self, index: usize, tab: Tab) -> String {
        match tab {
            Tab::Section(n) => {
                let sections = self.report.as_ref().map(|r| &r.sections);
                let title = sections.and_then(|s| s.tabs().nth(n)?.tab_title());
                format!("{} {}", index + 1, title.unwrap_or_default())
            }
            tab => tab.title().to_string(),
        }
    }

    /// The key and rows of the section on the current tab.
    fn current_section(&self) -> Option<(String, usize)> {
        let Tab::Section(n) = self.current_tab() else {
            return None;
        };
        let section = self.report.as_ref()?.sections.tabs().nth(n)?;
        Some((section.key().to_string(), section.tab_rows()))
    }

    /// The selection on the tab of the section `key`.
    pub fn selection_of(&self, key: &str) -> Selection {
        self.sections.get(key).copied().unwrap_or_default()
    }

    pub fn handle(&mut self, action: Action) {
        let n = self.tabs().len();
        match action {
            Action::NextTab => self.tab = (self.tab + 1) % n,
            Action::PrevTab => self.tab = (self.tab + n - 1) % n,
            Action::Tab(i) if i < n => self.tab = i,
            Action::Down if self.current_tab() == Tab::Allocator => {
                self.allocator.down(self.allocator_rows());
            }
            Action::Up if self.current_tab() == Tab::Allocator => self.allocator.up(),
            Action::Down if self.current_tab() == Tab::Locks => self.locks.down(self.lock_rows()),
            Action::Up if self.current_tab() == Tab::Locks => self.locks.up(),
            Action::Down if self.current_tab() == Tab::FalseSharing => {
                self.sharing.down(self.sharing_rows());
            }
            Action::Up if self.current_tab() == Tab::FalseSharing => self.sharing.up(),
            Action::Down | Action::Up if matches!(self.current_tab(), Tab::Section(_)) => {
                if let Some((key, rows)) = self.current_section() {
                    let selection = self.sections.entry(key).or_default();
                    match action {
                        Action::Down => selection.down(rows),
                        _ => selection.up(),
                    }
                }
            }
            Action::Down => self.scroll = self.scroll.saturating_add(1),
            Action::Up => self.scroll = self.scroll.saturating_sub(1),
            Action::Tab(_) | Action::Quit | Action::Redraw => {}
        }
    }

    /// Rows of the Allocator tab's latency table.
    fn allocator_rows(&self) -> usize {
        self.report.as_ref().map_or(0, |r| r.allocator.ops.len())
    }

    /// Rows of the Locks tab's table.
    fn lock_rows(&self) -> usize {
        self.report.as_ref().map_or(0, |r| r.locks.len())
    }

    /// Rows of the False sharing tab's table.
    fn sharing_rows(&self) -> usize {
        self.report.as_ref().map_or(0, |r| r.false_sharing.len())
    }

    pub fn current_tab(&self) -> Tab {
        let tabs = self.tabs();
        tabs[self.tab.min(tabs.len() - 1)]
    }

    /// Draws the whole screen. Pure: reads state, does no I/O.
    pub fn render(&self, frame: &mut Frame) {
        let [tabs_area, body, help] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Fill(1),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        let tabs = self.tabs();
        let keys = tabs.len();
        let tabs = Tabs::new(tabs.into_iter().enumerate().map(|(i, t)| self.title(i, t)))
            .select(self.tab)
            .highlight_style(Style::new().bold().reversed());
        frame.render_widget(tabs, tabs_area);
        self.current_tab().render(self, frame, body);
        let arrows = if self.current_tab() != Tab::Overview {
            "select"
        } else {
            "scroll"
        };
        let mut footer = vec![Span::from(format!(
            " q quit · Tab/←/→ or 1-{} switch tab · ↑/↓ {arrows} ",
            keys.min(9)
        ))
        .dim()];
        if let Some((line, count)) = &self.log_line {
            footer.push(Span::from(format!("│ log ({count}, shown on exit): {line}")).yellow());
        }
        frame.render_widget(
            super::widgets::ellipsize_line(Line::from(footer), usize::from(help.width)),
            help,
        );
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use ratatui::{backend::TestBackend, Terminal};

    use super::*;
    use crate::report::{model::tests::sample_report, text::tests::report_with_allocator};

    fn screen(app: &App) -> String {
        screen_at(app, 100, 30)
    }

    /// The app rendered on a `width`×`height` test terminal, as text.
    pub(crate) fn screen_at(app: &App, width: u16, height: u16) -> String {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| app.render(f)).unwrap();
        let buffer = terminal.backend().buffer();
        let mut text = String::new();
        for y in 0..buffer.area.height {
            for x in 0..buffer.area.width {
                text.push_str(buffer[(x, y)].symbol());
            }
            text.push('\n');
        }
        text
    }

    /// The app showing `report` on `tab`.
    pub(crate) fn app_on(tab: Tab, report: Report) -> App {
        let mut app = App::new("pid 42".into());
        app.set_report(report);
        app.tab = app.tabs().iter().position(|t| *t == tab).unwrap_or(0);
        app
    }

    /// Fails, showing the screen, unless `text` has each of `expected`.
    pub(crate) fn assert_shows(text: &str, expected: &[&str]) {
        for expected in expected {
            assert!(text.contains(expected), "missing {expected}:\n{text}");
        }
    }

    /// Fails unless every line of `text` fits in `width` columns.
    pub(crate) fn assert_fits(text: &str, width: usize) {
        for line in text.lines() {
            assert!(line.chars().count() <= width, "wider than {width}: {line}");
        }
    }

    /// Fails unless `text` has `message` on a line of its own, centred
    /// in the frame.
    pub(crate) fn assert_centred(text: &str, message: &str) {
        let line = text
            .lines()
            .find(|l| l.contains(message))
            .unwrap_or_else(|| panic!("no {message}:\n{text}"));
        let margin = |rest: &str| line.chars().count() - rest.chars().count();
        let left = margin(line.trim_start_matches(['│', ' ']));
        let right = margin(line.trim_end_matches(['│', ' ']));
        assert!(left.abs_diff(right) <= 2, "centred: {line:?}");
    }

    #[test]
    fn renders_without_a_report() {
        let app = App::new("pid 1".into());
        let text = screen(&app);
        assert!(text.contains("Overview"));
        assert!(text.contains("False sharing"));
        assert!(text.contains("waiting for the first samples"));
    }

    #[test]
    fn overview_shows_the_report() {
        let mut app = App::new("pid 42".into());
        app.set_report(sample_report());
        let text = screen(&app);
        assert!(text.contains("spin"), "{text}");
        assert!(text.contains("work.c:12"));
        assert!(text.contains("1,000"));
        assert!(text.contains("cpu-clock"));
        assert!(text.contains("profiler"), "all info lines fit:\n{text}");
    }

    #[test]
    fn tiny_terminal_does_not_panic() {
        let mut app = App::new("pid 42".into());
        app.set_report(sample_report());
        for report in [sample_report(), report_with_allocator()] {
            app.set_report(report);
            for tab in 0..Tab::ALL.len() {
                app.tab = tab;
                let mut terminal = Terminal::new(TestBackend::new(10, 3)).unwrap();
                terminal.draw(|f| app.render(f)).unwrap();
            }
        }
    }

    #[test]
    fn keys_switch_tabs_and_scroll() {
        let mut app = App::new(String::new());
        app.handle(Action::NextTab);
        assert_eq!(app.current_tab(), Tab::FalseSharing);
        app.handle(Action::PrevTab);
        app.handle(Action::PrevTab);
        assert_eq!(app.current_tab(), Tab::Locks, "wraps to the last tab");
        app.handle(Action::Tab(2));
        assert_eq!(app.current_tab(), Tab::Allocator);
        app.handle(Action::Tab(9));
        assert_eq!(app.current_tab(), Tab::Allocator);
        app.handle(Action::Tab(0));
        app.handle(Action::Up);
        assert_eq!(app.scroll, 0);
        app.handle(Action::Down);
        assert_eq!(app.scroll, 1);
        assert!(screen(&app).contains("↑/↓ scroll"));
        app.handle(Action::Tab(1));
        app.handle(Action::Down);
        assert_eq!(app.scroll, 1, "the False sharing tab selects instead");
        assert!(screen(&app).contains("↑/↓ select"));
    }

    #[test]
    fn arrows_select_allocator_rows_on_its_tab() {
        let mut app = App::new(String::new());
        app.set_report(report_with_allocator());
        let rows = app.allocator_rows();
        assert!(rows > 1);
        app.handle(Action::Tab(2));
        app.handle(Action::Down);
        assert_eq!(app.scroll, 0, "the selection moves, not the scroll");
        assert_eq!(app.allocator.selected(rows), Some(1));
        for _ in 0..rows + 3 {
            app.handle(Action::Down);
        }
        assert_eq!(app.allocator.selected(rows), Some(rows - 1));
        app.handle(Action::Up);
        assert_eq!(app.allocator.selected(rows), Some(rows - 2));
        assert!(screen(&app).contains("↑/↓ select"));
    }
}
