//! Log lines kept in memory while the dashboard owns the terminal: the
//! dashboard shows the newest one, and they are printed to stderr once the
//! terminal is restored. No file is written unless `--log-file` asks.

use std::{
    collections::VecDeque,
    io::Write,
    sync::{Arc, Mutex, MutexGuard},
};

/// Lines kept; older ones are dropped and counted.
pub const CAPACITY: usize = 2000;

#[derive(Default)]
struct Lines {
    lines: VecDeque<String>,
    dropped: u64,
    /// Once the terminal is free again, lines go straight to stderr.
    pass_through: bool,
}

/// A bounded, shared buffer of log lines; a `tracing` writer.
#[derive(Clone, Default)]
pub struct LogRing {
    inner: Arc<Mutex<Lines>>,
}

impl LogRing {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Lines> {
        // A panic while holding the lock leaves whole lines behind: go on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends one line (without its newline).
    pub fn push(&self, line: &str) {
        let mut inner = self.lock();
        if inner.pass_through {
            drop(inner);
            eprintln!("{line}");
            return;
        }
        if inner.lines.len() == CAPACITY {
            inner.lines.pop_front();
            inner.dropped += 1;
        }
        inner.lines.push_back(line.to_string());
    }

    /// The newest line and how many there were in all, for the dashboard.
    pub fn last(&self) -> Option<(String, u64)> {
        let inner = self.lock();
        let total = inner.lines.len() as u64 + inner.dropped;
        inner.lines.back().map(|l| (l.clone(), total))
    }

    /// Prints every line kept to stderr, and from now on prints new ones
    /// at once: for when the dashboard has given the terminal back.
    pub fn release_to_stderr(&self) {
        let lines = {
            let mut inner = self.lock();
            inner.pass_through = true;
            Self::take(&mut inner)
        };
        for line in lines {
            eprintln!("{line}");
        }
    }

    /// Takes every line, with a first line saying how many were dropped
    /// (what [`LogRing::release_to_stderr`] prints; for tests).
    #[cfg(test)]
    fn drain(&self) -> Vec<String> {
        Self::take(&mut self.lock())
    }

    fn take(inner: &mut Lines) -> Vec<String> {
        let mut out = Vec::with_capacity(inner.lines.len() + 1);
        if inner.dropped > 0 {
            out.push(format!(
                "({} earlier log lines were dropped; use --log-file FILE to keep them all)",
                inner.dropped
            ));
        }
        out.extend(inner.lines.drain(..));
        inner.dropped = 0;
        out
    }
}

/// One event's text, added to the ring as whole lines when dropped.
pub struct LineWriter {
    ring: LogRing,
    buf: Vec<u8>,
}

impl Write for LineWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LineWriter {
    fn drop(&mut self) {
        let text = String::from_utf8_lossy(&self.buf);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            self.ring.push(line);
        }
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogRing {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> Self::Writer {
        LineWriter {
            ring: self.clone(),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter as _;

    #[test]
    fn keeps_whole_lines_and_counts_what_it_drops() {
        let ring = LogRing::new();
        assert_eq!(ring.last(), None);
        assert!(ring.drain().is_empty());
        {
            let mut w = ring.make_writer();
            w.write_all(b"WARN first ").unwrap();
            w.write_all(b"part\nsecond\n\n").unwrap();
        }
        assert_eq!(ring.last(), Some(("second".to_string(), 2)));
        for i in 0..CAPACITY {
            ring.push(&format!("line {i}"));
        }
        let lines = ring.drain();
        assert_eq!(lines.len(), CAPACITY + 1);
        assert!(
            lines[0].contains("2 earlier log lines were dropped"),
            "{}",
            lines[0]
        );
        assert_eq!(lines[1], "line 0");
        assert!(ring.drain().is_empty(), "drained");
    }
}
