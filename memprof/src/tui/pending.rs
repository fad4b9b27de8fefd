//! Tabs whose analyses this version does not have yet: they say so plainly.

use ratatui::{
    layout::Rect,
    widgets::{Block, Paragraph, Wrap},
    Frame,
};

use super::Tab;

/// Says what `tab` will show. Overview, Allocator and Locks have their
/// own modules and never come here.
pub fn render(tab: Tab, frame: &mut Frame, area: Rect) {
    let what = match tab {
        Tab::FalseSharing => "cache lines written by several threads, by object and field",
        Tab::Overview | Tab::Allocator | Tab::Locks => "",
    };
    let text = format!(
        "This tab will show {what}.\n\nIt is not analysed by this version of memprof-ebpf."
    );
    let block = Block::bordered().title(format!(" {} ", &tab.title()[2..]));
    frame.render_widget(
        Paragraph::new(text).wrap(Wrap { trim: true }).block(block),
        area,
    );
}
