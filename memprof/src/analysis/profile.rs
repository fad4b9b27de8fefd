//! CPU profile of the target: where its threads spend their time.
//!
//! Pure: fed with plain [`Sample`] and [`ThreadEvent`] values, ranked with a
//! caller-supplied resolver from [`Place`] to [`Frame`], so it is tested
//! without root, without BPF and without symbol files.

use std::collections::{BTreeMap, HashMap};

use crate::collect::procmaps::Place;
use crate::symbolize::Frame;

/// Where a sample landed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SampleAt {
    /// User code at this place.
    User(Place),
    /// The thread was in the kernel (system call, page fault, ...).
    Kernel,
}

/// One CPU sample of one thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub time_ns: u64,
    pub tid: u32,
    pub at: SampleAt,
    /// User stack id in the stack map, when one was recorded.
    pub stack_id: Option<u32>,
}

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

/// What we know of one thread.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ThreadStats {
    pub samples: u64,
    /// Created after tracing started (by `parent`).
    pub created_by: Option<u32>,
    pub exited: bool,
}

/// The aggregated profile.
#[derive(Debug, Clone, Default)]
pub struct Profile {
    by_place: HashMap<SampleAt, u64>,
    stacks: HashMap<u32, u64>,
    /// Resolved frames (innermost first) of the stacks read so far.
    stack_frames: HashMap<u32, Vec<Place>>,
    threads: BTreeMap<u32, ThreadStats>,
    samples: u64,
    execs: u32,
}

/// A function with its sample count, the source line inside it that
/// collected the most samples, and its share of all samples.
#[derive(Debug, Clone, PartialEq)]
pub struct HotFunction {
    pub frame: Frame,
    /// Samples in the function itself (self time).
    pub samples: u64,
    pub share: f64,
    /// Samples with the function anywhere on the user stack (self time plus
    /// time in what it calls). Needs frame pointers in the target; without
    /// them it falls back to at least the self samples that had a stack.
    pub total: u64,
    pub total_share: f64,
}

impl Profile {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_sample(&mut self, sample: Sample) {
        self.samples += 1;
        *self.by_place.entry(sample.at).or_default() += 1;
        if let Some(id) = sample.stack_id {
            *self.stacks.entry(id).or_default() += 1;
        }
        self.threads.entry(sample.tid).or_default().samples += 1;
    }

    pub fn add_thread_event(&mut self, event: ThreadEvent) {
        match event {
            ThreadEvent::Existing { tid } => {
                self.threads.entry(tid).or_default();
            }
            ThreadEvent::Created { tid, parent, .. } => {
                self.threads.entry(tid).or_default().created_by = Some(parent);
            }
            ThreadEvent::Exited { tid, .. } => {
                self.threads.entry(tid).or_default().exited = true;
            }
            ThreadEvent::Exec { tid, .. } => {
                self.execs += 1;
                // execve kills every other thread of the process.
                for (other, stats) in self.threads.iter_mut() {
                    if *other != tid {
                        stats.exited = true;
                    }
                }
                self.threads.entry(tid).or_default().exited = false;
            }
        }
    }

    /// Total samples of the target.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// Samples taken while the thread was in the kernel.
    pub fn kernel_samples(&self) -> u64 {
        self.by_place.get(&SampleAt::Kernel).copied().unwrap_or(0)
    }

    pub fn threads(&self) -> &BTreeMap<u32, ThreadStats> {
        &self.threads
    }

    /// Threads not known to have exited.
    pub fn live_threads(&self) -> usize {
        self.threads.values().filter(|t| !t.exited).count()
    }

    pub fn execs(&self) -> u32 {
        self.execs
    }

    /// Sample counts per user stack id.
    pub fn stacks(&self) -> &HashMap<u32, u64> {
        &self.stacks
    }

    /// Re-resolves samples recorded as unmapped (a library mapped after
    /// our last look at the memory map) with `place`.
    pub fn remap_unmapped(&mut self, mut place: impl FnMut(u64) -> Place) {
        let unmapped: Vec<(SampleAt, u64)> = self
            .by_place
            .iter()
            .filter(|(at, _)| matches!(at, SampleAt::User(Place::Unmapped { .. })))
            .map(|(at, n)| (at.clone(), *n))
            .collect();
        for (at, count) in unmapped {
            let SampleAt::User(Place::Unmapped { address }) = at else {
                continue;
            };
            let now = place(address);
            if !matches!(now, Place::Unmapped { .. }) {
                self.by_place.remove(&at);
                *self.by_place.entry(SampleAt::User(now)).or_default() += count;
            }
        }
    }

    /// Whether some samples are at addresses not (yet) found in a mapping.
    pub fn has_unmapped(&self) -> bool {
        self.by_place
            .keys()
            .any(|at| matches!(at, SampleAt::User(Place::Unmapped { .. })))
    }

    /// Stack ids sampled whose frames have not been read yet.
    pub fn unread_stacks(&self) -> Vec<u32> {
        self.stacks
            .keys()
            .filter(|id| !self.stack_frames.contains_key(id))
            .copied()
            .collect()
    }

    /// Records the frames (innermost first) of stack `id`.
    pub fn set_stack(&mut self, id: u32, frames: Vec<Place>) {
        self.stack_frames.insert(id, frames);
    }

    /// Distinct user places sampled (what needs symbolizing).
    pub fn user_places(&self) -> impl Iterator<Item = &Place> {
        self.by_place.keys().filter_map(|at| match at {
            SampleAt::User(place) => Some(place),
            SampleAt::Kernel => None,
        })
    }

    /// Functions ranked by samples (self time), at most `limit`. Samples in
    /// the kernel are gathered under one `[kernel]` entry.
    pub fn hot_functions(
        &self,
        limit: usize,
        mut resolve: impl FnMut(&Place) -> Frame,
    ) -> Vec<HotFunction> {
        // (function, module) -> (total, samples per (file, line))
        type Key = (String, String);
        type Lines = HashMap<(Option<String>, Option<u32>), u64>;
        let mut functions: HashMap<Key, (u64, Lines)> = HashMap::new();
        for (at, &count) in &self.by_place {
            let frame = match at {
                SampleAt::User(place) => resolve(place),
                SampleAt::Kernel => Frame::kernel(),
            };
            let entry = functions.entry((frame.function, frame.module)).or_default();
            entry.0 += count;
            *entry.1.entry((frame.file, frame.line)).or_default() += count;
        }
        // Inclusive counts: each stack credits every function on it once.
        // Callers with no self time get their hottest call-site line.
        let mut inclusive: HashMap<Key, u64> = HashMap::new();
        let mut call_sites: HashMap<Key, Lines> = HashMap::new();
        for (id, &count) in &self.stacks {
            let Some(frames) = self.stack_frames.get(id) else {
                continue;
            };
            let mut seen: Vec<Key> = Vec::with_capacity(frames.len());
            for place in frames {
                let f = resolve(place);
                let key = (f.function, f.module);
                if !seen.contains(&key) {
                    *call_sites
                        .entry(key.clone())
                        .or_default()
                        .entry((f.file, f.line))
                        .or_default() += count;
                    seen.push(key);
                }
            }
            for key in seen {
                *inclusive.entry(key).or_default() += count;
            }
        }
        for (key, lines) in call_sites {
            functions.entry(key).or_insert((0, lines));
        }
        let total = self.samples.max(1) as f64;
        let mut ranked: Vec<HotFunction> = functions
            .into_iter()
            .map(|((function, module), (samples, lines))| {
                let total_samples = inclusive
                    .get(&(function.clone(), module.clone()))
                    .copied()
                    .unwrap_or(0)
                    .max(samples);
                // The line with the most samples; ties go to the lower line so
                // the output is stable.
                let ((file, line), _) = lines
                    .into_iter()
                    .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
                    .unwrap_or(((None, None), 0));
                HotFunction {
                    frame: Frame {
                        function,
                        module,
                        file,
                        line,
                    },
                    samples,
                    share: samples as f64 / total,
                    total: total_samples,
                    total_share: total_samples as f64 / total,
                }
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| b.total.cmp(&a.total))
                .then_with(|| a.frame.function.cmp(&b.frame.function))
        });
        ranked.truncate(limit);
        ranked
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn at(offset: u64) -> SampleAt {
        SampleAt::User(Place::File {
            path: Arc::from("/bin/w"),
            file_offset: offset,
        })
    }

    fn sample(tid: u32, at: SampleAt) -> Sample {
        Sample {
            time_ns: 0,
            tid,
            at,
            stack_id: Some(1),
        }
    }

    /// Offsets 0x100..0x1ff are `spin` (line = offset / 16), the rest `idle`.
    fn resolve(place: &Place) -> Frame {
        let Place::File { file_offset, .. } = place else {
            return Frame::unknown(place);
        };
        let function = if (0x100..0x200).contains(file_offset) {
            "spin"
        } else {
            "idle"
        };
        Frame {
            function: function.into(),
            module: "w".into(),
            file: Some("w.c".into()),
            line: Some((*file_offset / 16) as u32),
        }
    }

    #[test]
    fn empty_profile_ranks_nothing() {
        let p = Profile::new();
        assert_eq!(p.samples(), 0);
        assert!(p.hot_functions(10, resolve).is_empty());
        assert_eq!(p.live_threads(), 0);
    }

    #[test]
    fn ranks_functions_and_picks_the_hottest_line() {
        let mut p = Profile::new();
        for _ in 0..5 {
            p.add_sample(sample(1, at(0x110)));
        }
        for _ in 0..3 {
            p.add_sample(sample(2, at(0x150)));
        }
        p.add_sample(sample(1, at(0x300)));
        p.add_sample(sample(1, SampleAt::Kernel));
        let hot = p.hot_functions(10, resolve);
        assert_eq!(hot.len(), 3);
        assert_eq!(hot[0].frame.function, "spin");
        assert_eq!(hot[0].samples, 8);
        assert_eq!(
            hot[0].frame.line,
            Some(0x11),
            "line with 5 of the 8 samples"
        );
        assert!((hot[0].share - 0.8).abs() < 1e-9);
        assert_eq!(p.kernel_samples(), 1);
        assert!(hot.iter().any(|h| h.frame.function == "[kernel]"));
        assert_eq!(p.hot_functions(1, resolve).len(), 1);
        assert_eq!(p.threads()[&1].samples, 7);
        assert_eq!(p.stacks()[&1], 10);
        assert_eq!(p.user_places().count(), 3);
    }

    #[test]
    fn total_time_comes_from_stacks() {
        let mut p = Profile::new();
        // Stack 1: spin (0x110) called from idle (0x300); stack 2: idle alone.
        for _ in 0..6 {
            p.add_sample(Sample {
                time_ns: 0,
                tid: 1,
                at: at(0x110),
                stack_id: Some(1),
            });
        }
        for _ in 0..4 {
            p.add_sample(Sample {
                time_ns: 0,
                tid: 1,
                at: at(0x300),
                stack_id: Some(2),
            });
        }
        assert_eq!(p.unread_stacks().len(), 2);
        let place = |o| Place::File {
            path: Arc::from("/bin/w"),
            file_offset: o,
        };
        // A recursive caller appears twice on the stack but counts once.
        p.set_stack(1, vec![place(0x110), place(0x310), place(0x320)]);
        p.set_stack(2, vec![place(0x300)]);
        assert!(p.unread_stacks().is_empty());
        let hot = p.hot_functions(10, resolve);
        let get = |f: &str| hot.iter().find(|h| h.frame.function == f).unwrap().clone();
        assert_eq!((get("spin").samples, get("spin").total), (6, 6));
        assert_eq!((get("idle").samples, get("idle").total), (4, 10));
        // A caller without self time is listed after those with, with its
        // call-site line.
        p.set_stack(1, vec![place(0x110), place(0x010)]);
        let hot = p.hot_functions(10, |pl| match pl {
            Place::File {
                file_offset: 0x010, ..
            } => Frame {
                function: "caller".into(),
                module: "w".into(),
                file: Some("w.c".into()),
                line: Some(1),
            },
            other => resolve(other),
        });
        let caller = hot.last().unwrap();
        assert_eq!(
            (caller.frame.function.as_str(), caller.samples, caller.total),
            ("caller", 0, 6)
        );
        assert_eq!(caller.frame.line, Some(1));
    }

    #[test]
    fn unmapped_samples_are_remapped_later() {
        let mut p = Profile::new();
        let unmapped = SampleAt::User(Place::Unmapped { address: 0x7000 });
        p.add_sample(sample(1, unmapped.clone()));
        p.add_sample(sample(1, unmapped));
        p.add_sample(sample(
            1,
            SampleAt::User(Place::Unmapped { address: 0x9000 }),
        ));
        p.add_sample(sample(1, at(0x110)));
        assert!(p.has_unmapped());
        // 0x7000 is now known to be file offset 0x110 (the same place as the
        // fourth sample); 0x9000 is still unknown.
        p.remap_unmapped(|a| {
            if a == 0x7000 {
                Place::File {
                    path: Arc::from("/bin/w"),
                    file_offset: 0x110,
                }
            } else {
                Place::Unmapped { address: a }
            }
        });
        assert!(p.has_unmapped());
        let hot = p.hot_functions(10, resolve);
        assert_eq!(hot[0].frame.function, "spin");
        assert_eq!(hot[0].samples, 3);
        assert_eq!(p.samples(), 4);
    }

    #[test]
    fn thread_lifecycle() {
        let mut p = Profile::new();
        p.add_thread_event(ThreadEvent::Existing { tid: 10 });
        p.add_thread_event(ThreadEvent::Created {
            tid: 11,
            parent: 10,
            time_ns: 5,
        });
        p.add_thread_event(ThreadEvent::Created {
            tid: 12,
            parent: 10,
            time_ns: 6,
        });
        assert_eq!(p.live_threads(), 3);
        p.add_thread_event(ThreadEvent::Exited {
            tid: 11,
            time_ns: 7,
        });
        assert_eq!(p.live_threads(), 2);
        assert_eq!(p.threads()[&11].created_by, Some(10));
        // exec from thread 12: it becomes the only thread.
        p.add_thread_event(ThreadEvent::Exec {
            tid: 12,
            time_ns: 8,
        });
        assert_eq!(p.live_threads(), 1);
        assert!(!p.threads()[&12].exited);
        assert_eq!(p.execs(), 1);
    }
}
