//! What the tabs share: the selected row of a table, a centred message in
//! a tab's frame, tables that drop columns on a narrow pane rather than
//! cut numbers, and counts short enough for their columns.

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::Line,
    widgets::{Block, Cell, Row, Table},
    Frame,
};

use crate::report::text::group;

/// A tab's selected row: ↑/↓ on the tab move it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Selection {
    selected: usize,
}

impl Selection {
    /// Selects the next row of a table of `rows` rows.
    pub fn down(&mut self, rows: usize) {
        self.selected = (self.selected + 1).min(rows.saturating_sub(1));
    }

    /// Selects the previous row.
    pub fn up(&mut self) {
        self.selected = self.selected.saturating_sub(1);
    }

    /// The selected row of a table of `rows` rows (the table may have
    /// shrunk since the selection was made).
    pub fn selected(&self, rows: usize) -> Option<usize> {
        (rows > 0).then(|| self.selected.min(rows - 1))
    }

    /// Keeps the same item selected when a new report ranks the items
    /// differently (`same` says whether two rows are the same item); an
    /// item gone from the list leaves the row selected.
    pub fn follow<T>(&mut self, old: &[T], new: &[T], same: impl Fn(&T, &T) -> bool) {
        let Some(was) = self.selected(old.len()).and_then(|i| old.get(i)) else {
            return;
        };
        if let Some(i) = new.iter().position(|item| same(was, item)) {
            self.selected = i;
        }
    }
}

/// One centred line in a tab's frame titled `title`.
pub fn render_message(frame: &mut Frame, area: Rect, title: &str, text: &str) {
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let [_, middle, _] = Layout::vertical([
        Constraint::Fill(1),
        Constraint::Length(1),
        Constraint::Fill(1),
    ])
    .areas(inner);
    frame.render_widget(Line::from(text).centered(), middle);
}

/// A table column: header, width (the least width for a `fill` column,
/// which also takes the spare room), numbers (right-aligned) or text, and
/// rank: when the columns do not fit, the highest rank goes first (0:
/// never).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Column {
    pub header: &'static str,
    width: u16,
    fill: bool,
    numeric: bool,
    rank: u8,
}

impl Column {
    pub const fn text(header: &'static str, width: u16, rank: u8) -> Self {
        Self {
            header,
            width,
            fill: false,
            numeric: false,
            rank,
        }
    }

    pub const fn number(header: &'static str, width: u16, rank: u8) -> Self {
        Self {
            numeric: true,
            ..Self::text(header, width, rank)
        }
    }

    pub const fn fill(self) -> Self {
        Self { fill: true, ..self }
    }

    fn cell(&self, text: String) -> Cell<'static> {
        if self.numeric {
            Cell::from(Line::from(text).right_aligned())
        } else {
            Cell::from(text)
        }
    }
}

/// Which of `columns` to show in `width`: all, or without the highest
/// ranks, so that no number is cut.
pub fn shown(columns: &[Column], width: u16) -> Vec<bool> {
    let mut keep = vec![true; columns.len()];
    let need = |keep: &[bool]| -> u32 {
        let kept = columns.iter().zip(keep).filter(|(_, k)| **k);
        let (n, sum) = kept.fold((0u32, 0u32), |(n, sum), (c, _)| {
            (n + 1, sum + u32::from(c.width))
        });
        sum + n.saturating_sub(1)
    };
    let mut by_rank: Vec<usize> = (0..columns.len())
        .filter(|&i| columns[i].rank > 0)
        .collect();
    by_rank.sort_by_key(|&i| std::cmp::Reverse(columns[i].rank));
    for i in by_rank {
        if need(&keep) <= u32::from(width) {
            break;
        }
        keep[i] = false;
    }
    keep
}

/// The room the first column has in `width`: what the other columns
/// shown leave it.
pub fn first_width(columns: &[Column], width: u16) -> u16 {
    let others: u16 = columns
        .iter()
        .zip(shown(columns, width))
        .skip(1)
        .filter(|(_, k)| *k)
        .map(|(c, _)| c.width + 1)
        .sum();
    width.saturating_sub(others)
}

/// A table of `rows` (one text per column) showing the columns that fit in
/// `width`, with a bold header.
pub fn table(columns: &[Column], rows: Vec<Vec<String>>, width: u16) -> Table<'static> {
    let rows = rows.into_iter().map(|row| (row, Style::new()));
    styled_table(columns, rows, width)
}

/// [`table`] with a style for each row.
pub fn styled_table(
    columns: &[Column],
    rows: impl IntoIterator<Item = (Vec<String>, Style)>,
    width: u16,
) -> Table<'static> {
    let keep = shown(columns, width);
    let kept = |i: &usize| keep.get(*i).copied().unwrap_or(false);
    let rows: Vec<Row> = rows
        .into_iter()
        .map(|(row, style)| {
            row.into_iter()
                .enumerate()
                .filter(|(i, _)| kept(i))
                .map(|(i, text)| columns[i].cell(text))
                .collect::<Row>()
                .style(style)
        })
        .collect();
    let header = columns
        .iter()
        .enumerate()
        .filter(|(i, _)| kept(i))
        .map(|(_, c)| c.cell(c.header.to_string()))
        .collect::<Row>()
        .bold();
    let widths: Vec<Constraint> = columns
        .iter()
        .enumerate()
        .filter(|(i, _)| kept(i))
        .map(|(_, c)| {
            if c.fill {
                Constraint::Min(c.width)
            } else {
                Constraint::Length(c.width)
            }
        })
        .collect();
    Table::new(rows, widths).header(header)
}

/// A count in at most 9 characters: `1,234,567`, then `12.3M`, `4.56G`.
pub fn count_label(n: u64) -> String {
    match n {
        0..10_000_000 => group(n),
        10_000_000..1_000_000_000 => format!("{:.1}M", n as f64 / 1e6),
        1_000_000_000..1_000_000_000_000 => format!("{:.2}G", n as f64 / 1e9),
        _ => format!("{:.2}T", n as f64 / 1e12),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selection_is_clamped_to_the_rows() {
        let mut s = Selection::default();
        assert_eq!(s.selected(0), None);
        s.down(3);
        s.down(3);
        s.down(3);
        assert_eq!(s.selected(3), Some(2));
        assert_eq!(s.selected(1), Some(0), "the table shrank");
        s.up();
        s.up();
        s.up();
        assert_eq!(s.selected(3), Some(0));
        s.down(0);
        assert_eq!(s.selected(3), Some(0));
    }

    #[test]
    fn selection_follows_its_item() {
        let mut s = Selection::default();
        s.down(3);
        s.follow(&[1, 2, 3], &[3, 2, 1, 0], |a, b| a == b);
        assert_eq!(s.selected(4), Some(1));
        s.down(4);
        s.follow(&[3, 2, 1, 0], &[0, 3, 2], |a, b| a == b);
        assert_eq!(s.selected(3), Some(2), "gone: the row stays selected");
        s.follow(&[], &[1], |a: &i32, b| a == b);
        assert_eq!(s.selected(3), Some(2));
    }

    #[test]
    fn first_column_gets_what_the_others_leave() {
        const COLUMNS: [Column; 3] = [
            Column::text("name", 4, 0).fill(),
            Column::number("a", 5, 1),
            Column::number("b", 5, 2),
        ];
        assert_eq!(first_width(&COLUMNS, 30), 30 - 12);
        // "b" goes: 4 + 1 + 5 fit in 10.
        assert_eq!(first_width(&COLUMNS, 10), 4);
        assert_eq!(first_width(&COLUMNS, 3), 3);
    }

    #[test]
    fn counts_stay_within_nine_characters() {
        for (n, label) in [
            (0, "0"),
            (9_999_999, "9,999,999"),
            (12_345_678, "12.3M"),
            (4_560_000_000, "4.56G"),
            (7_000_000_000_000, "7.00T"),
        ] {
            assert_eq!(count_label(n), label);
        }
    }
}
