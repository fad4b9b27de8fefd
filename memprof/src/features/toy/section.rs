//! The toy analysis's part of the report: its JSON form (the serde type),
//! its lines in the summary, and its dashboard tab.

use std::fmt::Write as _;

use ratatui::{
    layout::{Constraint, Rect},
    style::{Style, Stylize},
    widgets::{Block, Row, Table},
    Frame,
};
use serde::{Deserialize, Serialize};

use crate::{
    report::{
        section::{Section, SectionKind},
        Report,
    },
    tui::Selection,
};

/// The section's key in the JSON report.
pub const KEY: &str = "toy_kernel_share";

/// How the report reads the section back.
pub const KIND: SectionKind = SectionKind::of::<KernelShare>(KEY);

/// Each thread's sampled time in the kernel, most samples first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelShare {
    pub threads: Vec<ThreadShare>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ThreadShare {
    pub tid: u32,
    pub samples: u64,
    /// Of `samples`, those taken in the kernel.
    pub kernel: u64,
}

impl ThreadShare {
    fn percent(&self) -> f64 {
        100.0 * self.kernel as f64 / self.samples.max(1) as f64
    }
}

impl Section for KernelShare {
    fn key(&self) -> &str {
        KEY
    }

    fn to_json(&self) -> serde_json::Value {
        // A struct of numbers always serializes.
        serde_json::to_value(self).unwrap_or_default()
    }

    fn write_text(&self, out: &mut String) {
        if self.threads.is_empty() {
            let _ = writeln!(out, "Kernel share: no samples");
            return;
        }
        let _ = writeln!(out, "Kernel share: each thread's samples in the kernel");
        for t in &self.threads {
            let _ = writeln!(
                out,
                "  tid {}: {} of {} samples ({:.1}%)",
                t.tid,
                t.kernel,
                t.samples,
                t.percent()
            );
        }
    }

    fn tab_title(&self) -> Option<&str> {
        Some("Kernel share")
    }

    fn tab_rows(&self) -> usize {
        self.threads.len()
    }

    fn render_tab(&self, _report: &Report, frame: &mut Frame, area: Rect, selection: Selection) {
        let selected = selection.selected(self.threads.len());
        let rows = self.threads.iter().enumerate().map(|(i, t)| {
            let style = match selected == Some(i) {
                true => Style::new().reversed(),
                false => Style::new(),
            };
            let cells = [
                t.tid.to_string(),
                t.samples.to_string(),
                format!("{:.1}%", t.percent()),
            ];
            Row::new(cells).style(style)
        });
        let widths = [
            Constraint::Length(10),
            Constraint::Length(10),
            Constraint::Fill(1),
        ];
        let table = Table::new(rows, widths)
            .header(Row::new(["tid", "samples", "in kernel"]).bold())
            .block(Block::bordered().title(" Kernel share "));
        frame.render_widget(table, area);
    }

    fn clone_box(&self) -> Box<dyn Section> {
        Box::new(self.clone())
    }
}
