//! How a tab shares out its lines. Parts of a view take lines from a
//! [`LineBudget`] in order of importance, so that on a small terminal the
//! least important go first. A master/detail tab (Locks, False sharing)
//! is a table of entries with the selected entry's detail in a frame
//! under it ([`render_master_detail`]): the table keeps a few rows, the
//! detail then gets the lines it wants ([`split_height`]), and the detail
//! shows what of it fits ([`DetailView`]).

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::Style,
    widgets::{Block, Table, TableState},
    Frame,
};

use crate::report::text::ellipsize;

/// Table rows kept on a small terminal before the detail gets any room.
const MIN_TABLE_ROWS: usize = 3;

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

/// Lines shared out among the parts of a view, the most important part
/// first: a part gets its lines only while that many are left. A budget
/// holds at most a terminal's height (`u16` lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineBudget {
    left: usize,
}

impl LineBudget {
    pub fn new(lines: u16) -> Self {
        Self {
            left: usize::from(lines),
        }
    }

    /// Takes `n` lines if that many are left; whether it did.
    pub fn take(&mut self, n: usize) -> bool {
        let fits = n <= self.left;
        if fits {
            self.left -= n;
        }
        fits
    }

    /// Takes the lines left, up to `n`; how many it took.
    pub fn take_up_to(&mut self, n: u16) -> u16 {
        let taken = n.min(u16::try_from(self.left).unwrap_or(u16::MAX));
        self.left -= usize::from(taken);
        taken
    }
}

/// Heights of a table of `rows` rows (borders and header included) and of
/// the selected row's detail below it in `height` rows: the table keeps a
/// few rows, the detail then gets what it wants (`detail_want`, borders
/// included), the table the rows left up to all its rows, and the detail
/// whatever remains after that.
pub fn split_height(height: u16, rows: usize, detail_want: u16) -> (u16, u16) {
    let rows = u16::try_from(rows).unwrap_or(u16::MAX);
    let table_min = 3 + rows.clamp(1, MIN_TABLE_ROWS as u16);
    let table_full = rows.saturating_add(3).max(table_min);
    let mut budget = LineBudget::new(height);
    if !budget.take(usize::from(table_min)) {
        return (height, 0);
    }
    budget.take_up_to(detail_want);
    let table = table_min + budget.take_up_to(table_full - table_min);
    (table, height - table)
}

/// The lines a detail's parts use.
pub trait Lines {
    fn lines(&self) -> u16;
}

/// The selected entry's detail, laid out for the width inside its frame:
/// what of it fits a height, and how to draw that.
pub trait DetailView {
    /// What of the detail is shown.
    type Fit: Lines;

    /// The frame's title (cut to the frame's width).
    fn title(&self) -> String;

    /// The parts that fit in `height` lines, the most important first.
    fn fit(&self, height: u16) -> Self::Fit;

    /// Draws the parts `fit` keeps in `area`, inside the frame.
    fn render(&self, fit: &Self::Fit, frame: &mut Frame, area: Rect);
}

/// A master/detail view in `area`: the table of `entries` that `table`
/// makes for its area, the selected entry highlighted (the table scrolls
/// to it), and under it in a frame the detail `detail` lays out for an
/// entry and a width, given the lines [`split_height`] leaves it.
pub fn render_master_detail<'a, T, V: DetailView>(
    frame: &mut Frame,
    area: Rect,
    entries: &'a [T],
    selection: Selection,
    table: impl FnOnce(Rect) -> Table<'static>,
    detail: impl FnOnce(&'a T, u16) -> V,
) {
    let selected = selection.selected(entries.len());
    let inner_width = area.width.saturating_sub(2);
    let view = selected
        .and_then(|i| entries.get(i))
        .map(|entry| detail(entry, inner_width));
    let detail_want = view
        .as_ref()
        .map_or(0, |v| v.fit(u16::MAX).lines().saturating_add(2));
    let (table_height, detail_height) = split_height(area.height, entries.len(), detail_want);
    let [table_area, detail_area] = Layout::vertical([
        Constraint::Length(table_height),
        Constraint::Length(detail_height),
    ])
    .areas(area);
    let table = table(table_area).row_highlight_style(Style::new().reversed());
    let mut state = TableState::new().with_selected(selected);
    frame.render_stateful_widget(table, table_area, &mut state);
    if let Some(view) = view.filter(|_| detail_area.height > 2) {
        let title = ellipsize(&view.title(), usize::from(inner_width));
        let block = Block::bordered().title(title);
        let inner = block.inner(detail_area);
        frame.render_widget(block, detail_area);
        view.render(&view.fit(inner.height), frame, inner);
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
    fn the_table_keeps_a_few_rows_and_the_detail_gets_the_rest() {
        // 80x24 leaves 22 rows: all three rows, the detail the rest.
        assert_eq!(split_height(22, 3, 9), (6, 16));
        // Many rows: the table keeps three while the detail wants more.
        assert_eq!(split_height(22, 40, 30), (6, 16));
        // Tall: the detail gets what it wants, the table the rest.
        assert_eq!(split_height(50, 40, 9), (41, 9));
        // Taller than both want: the detail takes the spare rows.
        assert_eq!(split_height(50, 3, 9), (6, 44));
        // Too small for the detail.
        assert_eq!(split_height(5, 3, 9), (5, 0));
        assert_eq!(split_height(0, 0, 0), (0, 0));
    }

    #[test]
    fn a_budget_gives_lines_while_there_are_enough() {
        let mut budget = LineBudget::new(5);
        assert!(budget.take(2));
        assert!(!budget.take(4), "not enough: nothing taken");
        assert!(budget.take(3));
        assert!(budget.take(0) && !budget.take(1));
        let mut budget = LineBudget::new(u16::MAX);
        assert_eq!(budget.take_up_to(10), 10);
        assert!(budget.take(usize::from(u16::MAX) - 20));
        assert_eq!(budget.take_up_to(u16::MAX), 10);
        assert_eq!(budget.take_up_to(1), 0);
    }
}
