//! What the tabs draw alike: a centred message in a tab's frame, tables
//! that drop columns on a narrow pane rather than cut numbers, counts
//! short enough for their columns, text cut, wrapped or packed to a
//! width, and log2 latency histograms (a bar chart, or one line).

use ratatui::{
    layout::{Constraint, Layout, Rect},
    style::{Style, Stylize},
    text::{Line, Span},
    widgets::{Bar, BarChart, Block, Cell, Paragraph, Row, Table},
    Frame,
};

use crate::report::text::{ellipsize, format_ns, group};

/// One centred line in a tab's frame titled `title`.
pub fn render_message(frame: &mut Frame, area: Rect, title: &str, text: &str) {
    render_lines(frame, area, title, vec![Line::from(text.to_string())]);
}

/// Centred lines in a tab's frame titled `title`; the first ones when
/// they do not all fit.
pub fn render_lines(frame: &mut Frame, area: Rect, title: &str, lines: Vec<Line<'static>>) {
    let block = Block::bordered().title(title);
    let inner = block.inner(area);
    frame.render_widget(block, area);
    let n = u16::try_from(lines.len()).unwrap_or(u16::MAX);
    let width = usize::from(inner.width);
    let lines: Vec<Line> = lines
        .into_iter()
        .map(|l| ellipsize_line(l, width))
        .collect();
    let [_, middle, _] = Layout::vertical([
        Constraint::Fill(1),
        Constraint::Length(n),
        Constraint::Fill(1),
    ])
    .areas(inner);
    frame.render_widget(Paragraph::new(lines).centered(), middle);
}

/// `line` cut to `width` characters, ending with `…` (in the style of the
/// span cut) when cut.
pub fn ellipsize_line(line: Line<'static>, width: usize) -> Line<'static> {
    let total: usize = line.spans.iter().map(|s| s.content.chars().count()).sum();
    if total <= width {
        return line;
    }
    let mut left = width;
    let mut spans = Vec::new();
    for span in line.spans {
        let n = span.content.chars().count();
        if n < left {
            left -= n;
            spans.push(span);
            continue;
        }
        // Text follows (the line is too long), so this span is cut.
        if left > 0 {
            let mut cut: String = span.content.chars().take(left - 1).collect();
            cut.push('…');
            spans.push(Span::styled(cut, span.style));
        }
        break;
    }
    Line::from(spans).style(line.style)
}

/// `groups` of spans packed into lines of `width`: `gap` spaces apart,
/// each line led by `indent` spaces; a group that does not fit the line
/// starts the next one, and a line still too long is cut.
pub fn pack_groups(
    groups: Vec<Vec<Span<'static>>>,
    gap: usize,
    indent: usize,
    width: usize,
) -> Vec<Line<'static>> {
    let mut lines = Vec::new();
    let mut line: Vec<Span<'static>> = Vec::new();
    let mut used = 0;
    for group in groups {
        let n: usize = group.iter().map(|s| s.content.chars().count()).sum();
        if !line.is_empty() && used + gap + n > width {
            lines.push(ellipsize_line(Line::from(std::mem::take(&mut line)), width));
        }
        if line.is_empty() {
            if indent > 0 {
                line.push(Span::raw(" ".repeat(indent)));
            }
            used = indent;
        } else {
            line.push(Span::raw(" ".repeat(gap)));
            used += gap;
        }
        line.extend(group);
        used += n;
    }
    lines.push(ellipsize_line(Line::from(line), width));
    lines
}

/// `text` wrapped at word boundaries into lines of at most `width`
/// characters; a word longer than a line is cut.
pub fn wrap_words(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        let word = ellipsize(word, width);
        let used = line.chars().count();
        if used > 0 && used + 1 + word.chars().count() > width {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&word);
    }
    if !line.is_empty() {
        lines.push(line);
    }
    lines
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
    column_width(columns, 0, width)
}

/// The room column `index` (the one that fills) has in `width`: what the
/// other columns shown leave it.
pub fn column_width(columns: &[Column], index: usize, width: u16) -> u16 {
    let others: u16 = columns
        .iter()
        .zip(shown(columns, width))
        .enumerate()
        .filter(|(i, (_, k))| *i != index && *k)
        .map(|(_, (c, _))| c.width + 1)
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

/// A log2 histogram ((upper bound in ns, count) buckets) as a bar chart
/// in `block`, one bar per bucket labelled with its upper bound, or
/// `empty` when it has no counts.
pub fn render_histogram(
    frame: &mut Frame,
    area: Rect,
    block: Block<'static>,
    histogram: &[(u64, u64)],
    empty: &str,
) {
    let buckets = log2_buckets(histogram);
    if buckets.is_empty() {
        frame.render_widget(Paragraph::new(empty.to_string()).block(block), area);
        return;
    }
    let inner = block.inner(area).width;
    let n = u16::try_from(buckets.len()).unwrap_or(u16::MAX);
    // Gaps between the bars only while every bucket still fits.
    let gap = u16::from(n.saturating_mul(2).saturating_sub(1) <= inner);
    let bar_width = ((inner + gap) / n).saturating_sub(gap).clamp(1, 5);
    let bars: Vec<Bar> = buckets
        .iter()
        .map(|&(upper, count)| Bar::with_label(tick(upper), count).text_value(String::new()))
        .collect();
    let chart = BarChart::new(bars)
        .bar_width(bar_width)
        .bar_gap(gap)
        .bar_style(Style::new().cyan())
        .block(block);
    frame.render_widget(chart, area);
}

/// `64 ns ▂█▅▁ 4.10 µs`: a log2 histogram in one line, from the lower
/// bound of its first bucket to the upper bound of its last; `None` when
/// it has no counts.
pub fn histogram_spans(histogram: &[(u64, u64)]) -> Option<Vec<Span<'static>>> {
    let buckets = log2_buckets(histogram);
    let (first, last) = (buckets.first()?, buckets.last()?);
    let counts: Vec<u64> = buckets.iter().map(|b| b.1).collect();
    Some(vec![
        format!("{} ", format_ns(first.0 / 2)).dim(),
        sparkline(&counts).cyan(),
        format!(" {}", format_ns(last.0)).dim(),
    ])
}

/// The histogram as contiguous log2 buckets: sorted by upper bound, a
/// missing bucket between two present ones filled with zero calls, and
/// the empty buckets at both ends dropped.
fn log2_buckets(histogram: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut sorted = histogram.to_vec();
    sorted.sort_by_key(|b| b.0);
    let start = sorted.iter().position(|b| b.1 > 0);
    let end = sorted.iter().rposition(|b| b.1 > 0);
    let (Some(start), Some(end)) = (start, end) else {
        return Vec::new();
    };
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(end + 1 - start);
    for &(upper, count) in &sorted[start..=end] {
        while let Some(&(prev, _)) = out.last() {
            match prev.checked_mul(2) {
                Some(next) if prev > 0 && upper / prev >= 3 => out.push((next, 0)),
                _ => break,
            }
        }
        out.push((upper, count));
    }
    out
}

/// Whether a log2 histogram has any count (something to draw).
pub fn has_counts(histogram: &[(u64, u64)]) -> bool {
    histogram.iter().any(|b| b.1 > 0)
}

/// One block character per count, scaled to the largest; a non-zero count
/// shows at least the lowest block.
fn sparkline(counts: &[u64]) -> String {
    const LEVELS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let max = counts.iter().copied().max().unwrap_or(0);
    counts
        .iter()
        .map(|&c| {
            if c == 0 || max == 0 {
                LEVELS[0]
            } else {
                let level = (c as u128 * 8).div_ceil(max as u128) as usize;
                LEVELS[level.clamp(1, 8)]
            }
        })
        .collect()
}

/// A bucket bound in at most four characters: `64n`, `16µ`, `2m`, `1s`.
fn tick(ns: u64) -> String {
    match ns {
        0..1_000 => format!("{ns}n"),
        1_000..1_000_000 => format!("{}µ", ns / 1_000),
        1_000_000..1_000_000_000 => format!("{}m", ns / 1_000_000),
        _ => format!("{}s", ns / 1_000_000_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_cut_with_an_ellipsis_in_their_style() {
        let line = Line::from(vec!["ab".dim(), "cdef".bold()]);
        assert_eq!(ellipsize_line(line.clone(), 6), line);
        let cut = ellipsize_line(line.clone(), 4);
        assert_eq!(cut.spans.len(), 2);
        assert_eq!(cut.spans[1].content, "c…");
        assert_eq!(cut.spans[1].style, Style::new().bold());
        let cut = ellipsize_line(line.clone(), 2);
        assert_eq!(cut.spans.len(), 1);
        assert_eq!(cut.spans[0].content, "a…");
        assert!(ellipsize_line(line, 0).spans.is_empty());
    }

    #[test]
    fn groups_pack_into_lines_of_the_width() {
        let groups = || {
            vec![
                vec!["ab".into(), "c".bold()],
                vec!["de".into()],
                vec!["fgh".into()],
            ]
        };
        let text = |lines: Vec<Line>| lines.iter().map(Line::to_string).collect::<Vec<_>>();
        assert_eq!(text(pack_groups(groups(), 2, 0, 20)), ["abc  de  fgh"]);
        assert_eq!(text(pack_groups(groups(), 3, 1, 9)), [" abc   de", " fgh"]);
        assert_eq!(text(pack_groups(groups(), 1, 0, 2)), ["a…", "de", "f…"]);
        assert_eq!(text(pack_groups(vec![], 1, 0, 2)), [""]);
    }

    #[test]
    fn words_wrap_within_the_width() {
        assert_eq!(
            wrap_words("Give each thread its own line.", 12),
            ["Give each", "thread its", "own line."]
        );
        assert_eq!(wrap_words("  ", 10), Vec::<String>::new());
        assert_eq!(wrap_words("abcdefgh ij", 4), ["abc…", "ij"]);
        assert_eq!(wrap_words("a b", 0), ["a", "b"]);
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
        const MIDDLE: [Column; 3] = [
            Column::number("a", 5, 1),
            Column::text("name", 4, 0).fill(),
            Column::number("b", 5, 2),
        ];
        assert_eq!(column_width(&MIDDLE, 1, 30), 30 - 12);
        assert_eq!(column_width(&MIDDLE, 1, 10), 4);
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

    #[test]
    fn histogram_buckets_are_contiguous_and_trimmed() {
        assert!(log2_buckets(&[]).is_empty());
        assert!(log2_buckets(&[(64, 0), (128, 0)]).is_empty());
        assert_eq!(
            log2_buckets(&[(1024, 2), (32, 0), (64, 5), (128, 0), (4096, 1), (8192, 0)]),
            [
                (64, 5),
                (128, 0),
                (256, 0),
                (512, 0),
                (1024, 2),
                (2048, 0),
                (4096, 1)
            ]
        );
        // hdrhistogram-style bounds (2^k - 1) fill gaps too.
        assert_eq!(
            log2_buckets(&[(63, 1), (255, 1)]),
            [(63, 1), (126, 0), (255, 1)]
        );
        assert_eq!(
            log2_buckets(&[(0, 1), (u64::MAX, 1)]),
            [(0, 1), (u64::MAX, 1)]
        );
    }

    #[test]
    fn a_histogram_in_one_line() {
        assert!(histogram_spans(&[(64, 0)]).is_none());
        assert!(!has_counts(&[(64, 0)]) && has_counts(&[(64, 0), (128, 1)]));
        let spans = histogram_spans(&[(128, 4), (512, 1)]).unwrap_or_default();
        let text: String = spans.iter().map(|s| s.content.as_ref()).collect();
        assert_eq!(text, "64 ns █ ▂ 512 ns");
    }

    #[test]
    fn sparkline_and_ticks() {
        assert_eq!(sparkline(&[]), "");
        assert_eq!(sparkline(&[0, 0]), "  ");
        assert_eq!(sparkline(&[1, 0, 1000, 500]), "▁ █▄");
        assert_eq!(sparkline(&[u64::MAX, 1]), "█▁");
        assert_eq!(tick(64), "64n");
        assert_eq!(tick(16_384), "16µ");
        assert_eq!(tick(2_097_152), "2m");
        assert_eq!(tick(u64::MAX), "18446744073s");
    }
}
