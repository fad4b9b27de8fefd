//! The target's threads: how they change ([`ThreadEvent`]) and how many
//! were alive at a given moment (the allocator's serial and parallel
//! phases).

/// A change in the target's threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThreadEvent {
    /// Present when tracing started.
    Existing {
        tid: u32,
    },
    /// Created while we traced.
    Created {
        tid: u32,
        parent: u32,
        time_ns: u64,
    },
    Exited {
        tid: u32,
        time_ns: u64,
    },
    /// The process called `execve` (its threads other than `tid` are gone).
    Exec {
        tid: u32,
        time_ns: u64,
    },
}

/// Live-thread count over time, from thread creation and exit events.
#[derive(Debug, Clone, Default)]
pub struct LiveThreads {
    /// Threads alive before the first change.
    initial: i64,
    /// (time, count from then on), sorted by time.
    changes: Vec<(u64, i64)>,
}

impl LiveThreads {
    pub fn new(initial: usize) -> Self {
        Self {
            initial: initial as i64,
            changes: Vec::new(),
        }
    }

    /// A thread was created (+1) or exited (-1) at `time_ns`. Events may
    /// arrive slightly out of order (they come from several CPUs).
    pub fn change(&mut self, time_ns: u64, delta: i64) {
        let at = self.changes.partition_point(|(t, _)| *t <= time_ns);
        let before = if at == 0 {
            self.initial
        } else {
            self.changes[at - 1].1
        };
        self.changes.insert(at, (time_ns, before + delta));
        for later in &mut self.changes[at + 1..] {
            later.1 += delta;
        }
    }

    /// Threads alive at `time_ns` (at least 1: the caller is one).
    pub fn at(&self, time_ns: u64) -> u32 {
        self.count_at(time_ns).clamp(1, i64::from(u32::MAX)) as u32
    }

    /// Threads alive at `time_ns`, as counted (may be 0).
    pub fn count_at(&self, time_ns: u64) -> i64 {
        let at = self.changes.partition_point(|(t, _)| *t <= time_ns);
        if at == 0 {
            self.initial
        } else {
            self.changes[at - 1].1
        }
    }

    /// `n` more threads were alive before the first change.
    pub fn add_initial(&mut self, n: usize) {
        self.initial += n as i64;
        for c in &mut self.changes {
            c.1 += n as i64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_creation_and_exit_even_out_of_order() {
        let mut l = LiveThreads::new(1);
        l.change(100, 1);
        l.change(300, -1);
        l.change(200, 1); // arrives late
        assert_eq!(l.at(50), 1);
        assert_eq!(l.at(100), 2);
        assert_eq!(l.at(250), 3);
        assert_eq!(l.at(300), 2);
        assert_eq!(LiveThreads::new(0).at(5), 1);
    }
}
