//! The dashboard's tabs: which there are, in order, and each one's view.
//! A tab draws itself from the [`App`] alone.

pub mod allocator;
pub mod cache;
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
    CacheUse,
}

impl Tab {
    pub const ALL: [Tab; 5] = [
        Tab::Overview,
        Tab::FalseSharing,
        Tab::Allocator,
        Tab::Locks,
        Tab::CacheUse,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Tab::Overview => "1 Overview",
            Tab::FalseSharing => "2 False sharing",
            Tab::Allocator => "3 Allocator",
            Tab::Locks => "4 Locks",
            Tab::CacheUse => "5 Cache use",
        }
    }

    /// Draws the tab's body in `area`.
    pub fn render(self, app: &App, frame: &mut Frame, area: Rect) {
        match self {
            Tab::Overview => overview::render(app, frame, area),
            Tab::FalseSharing => sharing::render(app, frame, area),
            Tab::Allocator => allocator::render(app, frame, area),
            Tab::Locks => locks::render(app, frame, area),
            Tab::CacheUse => cache::render(app, frame, area),
        }
    }
}
