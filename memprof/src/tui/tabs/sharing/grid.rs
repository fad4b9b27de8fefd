//! The False sharing tab's word grid: the selected cache line's sixteen
//! 4-byte words, each marked with how it was touched and coloured by the
//! thread that touched it (red when several did), the byte offsets above
//! them and a legend under them.

use memprof_common::sharing::{WORDS_PER_LINE as WORDS, WORD_BYTES};
use ratatui::{
    style::{Color, Style, Stylize},
    text::{Line, Span},
};

use crate::report::model::{SharingEntry, WordEntry};
use crate::tui::widgets::pack_groups;

/// Width of the label left of the grid (`byte `).
pub(super) const GRID_LABEL: u16 = 5;

/// The threads' colours, in the order of the entry's threads; they repeat
/// past ten threads. Red is kept for words several threads touch.
const THREAD_COLOURS: [Color; 10] = [
    Color::Blue,
    Color::Green,
    Color::Yellow,
    Color::Magenta,
    Color::Cyan,
    Color::LightBlue,
    Color::LightGreen,
    Color::LightYellow,
    Color::LightMagenta,
    Color::LightCyan,
];

/// A word several threads touch.
fn shared_style() -> Style {
    Style::new().bg(Color::Red).fg(Color::White).bold()
}

/// The grid laid out for `width` columns.
pub(super) struct Grid {
    /// Byte offsets above the words, when the words are wide enough.
    pub(super) offsets: Option<Line<'static>>,
    pub(super) words: Line<'static>,
    pub(super) legend: Vec<Line<'static>>,
}

impl Grid {
    pub(super) fn new(e: &SharingEntry, width: u16) -> Self {
        let words = line_words(&e.words);
        let palette = Palette::new(e, &words);
        let (label, cell) = grid_geometry(width);
        let offsets = (cell >= 3).then(|| {
            let mut text = if label > 0 {
                format!("{:<1$}", "byte", usize::from(label))
            } else {
                String::new()
            };
            for i in 0..WORDS as u32 {
                text.push_str(&format!("{:<1$}", i * WORD_BYTES, usize::from(cell)));
            }
            Line::from(text.trim_end().to_string()).dim()
        });
        let mut spans = vec![Span::raw(" ".repeat(usize::from(label)))];
        // The coloured part of a word, and the gap after it.
        let paint = if cell >= 2 { cell - 1 } else { 1 };
        for w in &words {
            let (mark, style) = word_cell(w, &palette);
            let left = usize::from((paint - 1) / 2);
            let right = usize::from(paint - 1) - left;
            let text = format!("{}{mark}{}", " ".repeat(left), " ".repeat(right));
            spans.push(Span::styled(text, style));
            if cell > paint {
                spans.push(Span::raw(" ".repeat(usize::from(cell - paint))));
            }
        }
        let shared = words.iter().any(|w| w.threads.len() > 1);
        Self {
            offsets,
            words: Line::from(spans),
            legend: legend_lines(&palette, shared, label, usize::from(width)),
        }
    }
}

/// What one word of the line saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Word {
    reads: u64,
    writes: u64,
    threads: Vec<u32>,
}

/// The line's sixteen words; entries past the line are ignored.
fn line_words(words: &[WordEntry]) -> [Word; WORDS] {
    let mut grid: [Word; WORDS] = Default::default();
    for w in words {
        let Some(cell) = grid.get_mut((w.offset / WORD_BYTES) as usize) else {
            continue;
        };
        cell.reads = cell.reads.saturating_add(w.reads);
        cell.writes = cell.writes.saturating_add(w.writes);
        for tid in &w.threads {
            if !cell.threads.contains(tid) {
                cell.threads.push(*tid);
            }
        }
    }
    grid
}

/// The threads of a line and their colours: the entry's threads in order,
/// then any other thread its words name.
struct Palette {
    tids: Vec<u32>,
}

impl Palette {
    fn new(e: &SharingEntry, words: &[Word]) -> Self {
        let mut tids = e.threads.clone();
        for tid in words.iter().flat_map(|w| &w.threads) {
            if !tids.contains(tid) {
                tids.push(*tid);
            }
        }
        Self { tids }
    }

    fn style(&self, tid: u32) -> Style {
        let i = self.tids.iter().position(|t| *t == tid).unwrap_or(0);
        Style::new()
            .bg(THREAD_COLOURS[i % THREAD_COLOURS.len()])
            .fg(Color::Black)
    }
}

/// A word's mark (`W` written, `R` read only, `·` untouched) and style:
/// its thread's colour, red when several threads touch it.
fn word_cell(w: &Word, palette: &Palette) -> (char, Style) {
    let mark = if w.writes > 0 {
        'W'
    } else if w.reads > 0 {
        'R'
    } else {
        '·'
    };
    let style = match w.threads.as_slice() {
        [] if mark == '·' => Style::new().dim(),
        // Touched by a thread not recorded.
        [] => Style::new().reversed(),
        [tid] => palette.style(*tid),
        _ => shared_style(),
    };
    (mark, style)
}

/// The grid's label width and the width of a word in `width` columns: the
/// widest words (up to 4 columns) that fit with the label, else without
/// it; one column each on a pane narrower than the line (the rest is cut).
pub(super) fn grid_geometry(width: u16) -> (u16, u16) {
    let words = WORDS as u16;
    (1..=4u16)
        .rev()
        .find(|cell| GRID_LABEL + words * cell <= width)
        .map(|cell| (GRID_LABEL, cell))
        .or_else(|| {
            (1..=4u16)
                .rev()
                .find(|cell| words * cell <= width)
                .map(|cell| (0, cell))
        })
        .unwrap_or((0, 1))
}

/// The legend under the words: each thread's colour, the shared colour
/// when a word has several threads, and the marks; packed into lines of
/// `width`, indented like the words.
fn legend_lines(palette: &Palette, shared: bool, indent: u16, width: usize) -> Vec<Line<'static>> {
    let mut items: Vec<Vec<Span<'static>>> = palette
        .tids
        .iter()
        .map(|tid| {
            vec![
                Span::styled("  ", palette.style(*tid)),
                format!(" {tid}").into(),
            ]
        })
        .collect();
    if shared {
        items.push(vec![
            Span::styled("  ", shared_style()),
            " several threads".into(),
        ]);
    }
    for mark in ["W written", "R read only", "· untouched"] {
        items.push(vec![mark.dim()]);
    }
    pack_groups(items, 2, usize::from(indent), width)
}
