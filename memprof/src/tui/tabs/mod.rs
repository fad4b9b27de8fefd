//! The dashboard's tabs: which there are, in order, and each one's view.
//! A tab draws itself from the [`App`] alone. After the built-in tabs come
//! the report's [`crate::report::section::Section`]s that have one.

pub mod allocator;
pub mod locks;
pub mod overview;
pub mod sharing;

use ratatui::{layout::Rect, Frame};

use super::App;

/// The tabs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tab {
    Overview,
    FalseSharing,
    Allocator,
    Locks,
    /// The report's `n`th section with a tab.
    Section(usize),
}

impl Tab {
    pub const ALL: [Tab; 4] = [Tab::Overview, Tab::FalseSharing, Tab::Allocator, Tab::Locks];

    pub fn title(self) -> &'static str {
        match self {
            Tab::Overview => "1 Overview",
            Tab::FalseSharing => "2 False sharing",
            Tab::Allocator => "3 Allocator",
            Tab::Locks => "4 Locks",
            Tab::Section(_) => "",
        }
    }

    /// Draws the tab's body in `area`.
    pub fn render(self, app: &App, frame: &mut Frame, area: Rect) {
        match self {
            Tab::Overview => overview::render(app, frame, area),
            Tab::FalseSharing => sharing::render(app, frame, area),
            Tab::Allocator => allocator::render(app, frame, area),
            Tab::Locks => locks::render(app, frame, area),
            Tab::Section(n) => {
                let section = app.report.as_ref().and_then(|r| r.sections.tabs().nth(n));
                if let (Some(section), Some(report)) = (section, &app.report) {
                    section.render_tab(report, frame, area, app.selection_of(section.key()));
                }
            }
        }
    }
}
