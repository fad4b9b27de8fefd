//! CPU profile of the target: where its threads spend their time.
//!
//! Pure: fed with plain [`Sample`] and [`ThreadEvent`] values, ranked with a
//! caller-supplied resolver from [`Place`] to [`Frame`], so it is tested
//! without root, without BPF and without symbol files.

use std::collections::{BTreeMap, HashMap};

use crate::object::symbolize::Frame;
use crate::process::{maps::Place, threads::ThreadEvent};
use crate::report::profiles::{CpuStack, StackFrame};

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
    /// Samples that have a user stack, by where they landed and stack id.
    /// (For user code the stack starts at the caller: the sampled
    /// instruction is the `SampleAt`.)
    with_stack: HashMap<(SampleAt, u32), u64>,
    /// Resolved frames (innermost first) of the stacks read so far.
    stack_frames: HashMap<u32, Vec<Place>>,
    /// Every sample by thread, where it landed and stack id (None: no
    /// user stack), for the exporters' per-thread call chains.
    by_thread: HashMap<(u32, SampleAt, Option<u32>), u64>,
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
        if let Some(id) = sample.stack_id {
            *self.with_stack.entry((sample.at.clone(), id)).or_default() += 1;
        }
        *self
            .by_thread
            .entry((sample.tid, sample.at.clone(), sample.stack_id))
            .or_default() += 1;
        *self.by_place.entry(sample.at).or_default() += 1;
        self.threads.entry(sample.tid).or_default().samples += 1;
    }

    pub fn add_thread_event(&mut self, event: ThreadEvent) {
        match event {
            ThreadEvent::Existing { tid } => {
                self.threads.entry(tid).or_default();
            }
            ThreadEvent::Created { tid, parent, .. } => {
                // Parent 0: a process that joined the traced cgroup, made
                // by a process we do not trace.
                self.threads.entry(tid).or_default().created_by = (parent != 0).then_some(parent);
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

    /// Samples recorded with user stack `id`.
    pub fn stack_samples(&self, id: u32) -> u64 {
        self.with_stack
            .iter()
            .filter(|((_, s), _)| *s == id)
            .map(|(_, n)| n)
            .sum()
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
        let unmapped: Vec<(u32, u64, Option<u32>)> = self
            .by_thread
            .keys()
            .filter_map(|(tid, at, id)| match at {
                SampleAt::User(Place::Unmapped { address }) => Some((*tid, *address, *id)),
                _ => None,
            })
            .collect();
        for (tid, address, id) in unmapped {
            let now = place(address);
            if matches!(now, Place::Unmapped { .. }) {
                continue;
            }
            let old = (tid, SampleAt::User(Place::Unmapped { address }), id);
            if let Some(count) = self.by_thread.remove(&old) {
                *self
                    .by_thread
                    .entry((tid, SampleAt::User(now), id))
                    .or_default() += count;
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
        let mut ids: Vec<u32> = self
            .with_stack
            .keys()
            .map(|(_, id)| *id)
            .filter(|id| !self.stack_frames.contains_key(id))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Records the frames (innermost first) of stack `id`, up to the
    /// first that is in no mapping: a frame-pointer walk through code
    /// built without frame pointers takes data for return addresses, and
    /// what it finds past such a frame is no caller. Attached to `pbzip2`
    /// (libbz2 has no frame pointers), `[unmapped]` had 64.7% of the
    /// samples as its total time.
    pub fn set_stack(&mut self, id: u32, mut frames: Vec<Place>) {
        let wild = frames
            .iter()
            .position(|p| matches!(p, Place::Unmapped { .. }));
        frames.truncate(wild.unwrap_or(frames.len()));
        self.stack_frames.insert(id, frames);
    }

    /// Distinct user places sampled (what needs symbolizing).
    pub fn user_places(&self) -> impl Iterator<Item = &Place> {
        self.by_place.keys().filter_map(|at| match at {
            SampleAt::User(place) => Some(place),
            SampleAt::Kernel => None,
        })
    }

    /// Every sample by thread and call chain (innermost first: where it
    /// landed, then its callers as far as unwound), for the profile
    /// exporters. A sample without a user stack is its own frame alone; the
    /// counts add up to [`Profile::samples`]. Heaviest chains first.
    pub fn stacks(&self, mut resolve: impl FnMut(&Place) -> Frame) -> Vec<CpuStack> {
        let mut frames: HashMap<Place, StackFrame> = HashMap::new();
        let mut frame = |place: &Place| -> StackFrame {
            frames
                .entry(place.clone())
                .or_insert_with(|| stack_frame(place, resolve(place)))
                .clone()
        };
        let mut chains: HashMap<(u32, Vec<StackFrame>), u64> = HashMap::new();
        for ((tid, at, id), &count) in &self.by_thread {
            let mut chain = vec![leaf(at, &mut frame)];
            let callers = id
                .and_then(|id| self.stack_frames.get(&id))
                .map(Vec::as_slice)
                .unwrap_or(&[]);
            chain.extend(callers.iter().map(&mut frame));
            *chains.entry((*tid, chain)).or_default() += count;
        }
        let mut stacks: Vec<CpuStack> = chains
            .into_iter()
            .map(|((tid, frames), samples)| CpuStack {
                tid,
                frames,
                samples,
            })
            .collect();
        stacks.sort_by(|a, b| {
            b.samples
                .cmp(&a.samples)
                .then_with(|| (a.tid, &a.frames).cmp(&(b.tid, &b.frames)))
        });
        stacks
    }

    /// Functions ranked by self time (samples in the function), with their
    /// total time (samples with the function anywhere on the stack), at
    /// most `limit`. Samples in the kernel are gathered under `[kernel]`.
    /// Callers with no self time are listed after the rest, at their
    /// hottest call site.
    pub fn hot_functions(
        &self,
        limit: usize,
        resolve: impl FnMut(&Place) -> Frame,
    ) -> Vec<HotFunction> {
        let mut ix = Interner::new(resolve);
        let acc = self.accumulate(&mut ix);
        let all = self.samples.max(1) as f64;
        let mut ranked: Vec<HotFunction> = acc
            .into_iter()
            .zip(ix.into_keys())
            .filter(|(a, _)| a.total > 0 || a.own > 0)
            .map(|(a, key)| a.into_hot(key, all))
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

    /// The samples of each function, indexed by its number in `ix`: self
    /// samples and lines from where samples landed, total samples and call
    /// sites from the stacks.
    fn accumulate<'p, F: FnMut(&Place) -> Frame>(
        &'p self,
        ix: &mut Interner<'p, F>,
    ) -> Vec<FunctionAcc> {
        let mut acc: Vec<FunctionAcc> = Vec::new();
        let slot = |acc: &mut Vec<FunctionAcc>, f: usize| {
            if acc.len() <= f {
                acc.resize_with(f + 1, FunctionAcc::default);
            }
        };
        let mut with_stack_at: HashMap<&SampleAt, u64> = HashMap::new();
        let mut seen: Vec<usize> = Vec::new();
        for ((at, id), &count) in &self.with_stack {
            *with_stack_at.entry(at).or_default() += count;
            let (leaf, _) = ix.at(at);
            seen.clear();
            seen.push(leaf);
            let frames = self.stack_frames.get(id).map(Vec::as_slice).unwrap_or(&[]);
            for place in frames {
                let (f, line) = ix.place(place);
                if !seen.contains(&f) {
                    seen.push(f);
                    slot(&mut acc, f);
                    *acc[f].call_sites.entry(line).or_default() += count;
                }
            }
            for &f in &seen {
                slot(&mut acc, f);
                acc[f].total += count;
            }
        }
        for (at, &count) in &self.by_place {
            let (f, line) = ix.at(at);
            slot(&mut acc, f);
            let a = &mut acc[f];
            a.own += count;
            *a.lines.entry(line).or_default() += count;
            // Samples without a stack count for their own function only.
            a.total += count - with_stack_at.get(at).copied().unwrap_or(0);
        }
        acc
    }
}

/// A resolved frame, with the object's path (for its build id).
fn stack_frame(place: &Place, f: Frame) -> StackFrame {
    StackFrame {
        function: f.function,
        file: f.file,
        line: f.line,
        module: Some(f.module),
        object: match place {
            Place::File { path, .. } => Some(path.to_string()),
            _ => None,
        },
    }
}

/// The frame a sample landed in.
fn leaf(at: &SampleAt, frame: &mut impl FnMut(&Place) -> StackFrame) -> StackFrame {
    match at {
        SampleAt::User(place) => frame(place),
        SampleAt::Kernel => {
            let k = Frame::kernel();
            StackFrame {
                module: Some(k.module),
                ..StackFrame::named(&k.function)
            }
        }
    }
}

/// Per function: self samples, total samples, self lines, call sites.
#[derive(Default)]
struct FunctionAcc {
    own: u64,
    total: u64,
    lines: HashMap<LineKey, u64>,
    call_sites: HashMap<LineKey, u64>,
}

impl FunctionAcc {
    /// The ranking entry of function `(function, module)`, at its busiest
    /// line (or call site, for a function with no self time); shares are
    /// of `all` samples.
    fn into_hot(self, (function, module): (String, String), all: f64) -> HotFunction {
        let lines = if self.own > 0 {
            self.lines
        } else {
            self.call_sites
        };
        // The busiest line; ties go to the lower line, for stable output.
        let (file, line) = lines
            .into_iter()
            .max_by(|x, y| x.1.cmp(&y.1).then_with(|| y.0.cmp(&x.0)))
            .map(|(l, _)| l)
            .unwrap_or((None, None));
        HotFunction {
            frame: Frame {
                function,
                module,
                file,
                line,
            },
            samples: self.own,
            share: self.own as f64 / all,
            total: self.total,
            total_share: self.total as f64 / all,
        }
    }
}

type LineKey = (Option<String>, Option<u32>);

/// Resolves each distinct place once per ranking and numbers the functions,
/// so stacks are counted with integer keys (the dashboard ranks every
/// second).
struct Interner<'p, F> {
    resolve: F,
    places: HashMap<&'p Place, (usize, LineKey)>,
    functions: HashMap<(String, String), usize>,
    kernel: Option<usize>,
}

impl<'p, F: FnMut(&Place) -> Frame> Interner<'p, F> {
    fn new(resolve: F) -> Self {
        Self {
            resolve,
            places: HashMap::new(),
            functions: HashMap::new(),
            kernel: None,
        }
    }

    fn function(&mut self, key: (String, String)) -> usize {
        let next = self.functions.len();
        *self.functions.entry(key).or_insert(next)
    }

    fn place(&mut self, place: &'p Place) -> (usize, LineKey) {
        if let Some(hit) = self.places.get(place) {
            return hit.clone();
        }
        let frame = (self.resolve)(place);
        let f = self.function((frame.function, frame.module));
        let hit = (f, (frame.file, frame.line));
        self.places.insert(place, hit.clone());
        hit
    }

    fn at(&mut self, at: &'p SampleAt) -> (usize, LineKey) {
        match at {
            SampleAt::User(place) => self.place(place),
            SampleAt::Kernel => {
                let f = match self.kernel {
                    Some(f) => f,
                    None => {
                        let k = Frame::kernel();
                        let f = self.function((k.function, k.module));
                        self.kernel = Some(f);
                        f
                    }
                };
                (f, (None, None))
            }
        }
    }

    /// The function keys, indexed by their numbers.
    fn into_keys(self) -> Vec<(String, String)> {
        let mut keys: Vec<((String, String), usize)> = self.functions.into_iter().collect();
        keys.sort_by_key(|(_, i)| *i);
        keys.into_iter().map(|(k, _)| k).collect()
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

    /// A stack walk that left the mappings stops there: no `[unmapped]`
    /// caller, and nothing it found after is counted as a caller.
    #[test]
    fn a_stack_ends_at_its_first_unmapped_frame() {
        let mut p = Profile::new();
        for _ in 0..3 {
            p.add_sample(Sample {
                time_ns: 0,
                tid: 1,
                at: at(0x110),
                stack_id: Some(1),
            });
        }
        let place = |o| Place::File {
            path: Arc::from("/bin/w"),
            file_offset: o,
        };
        let wild = Place::Unmapped { address: 0x10 };
        p.set_stack(1, vec![wild, place(0x310)]);
        let hot = p.hot_functions(10, resolve);
        let names: Vec<_> = hot.iter().map(|h| h.frame.function.as_str()).collect();
        assert_eq!(names, ["spin"], "{hot:?}");
        assert_eq!(hot[0].total, 3);
    }

    /// The exporters' chains: per thread, the leaf then the callers, every
    /// sample once (with or without a stack, before and after an unmapped
    /// address is found in a mapping).
    #[test]
    fn stacks_hold_every_sample_per_thread_and_chain() {
        let mut p = Profile::new();
        p.set_stack(
            1,
            vec![Place::File {
                path: Arc::from("/bin/w"),
                file_offset: 0x400,
            }],
        );
        for _ in 0..3 {
            p.add_sample(sample(1, at(0x110)));
        }
        p.add_sample(sample(2, at(0x110)));
        p.add_sample(Sample {
            stack_id: None,
            ..sample(1, SampleAt::Kernel)
        });
        let unmapped = SampleAt::User(Place::Unmapped { address: 0x7000 });
        p.add_sample(sample(2, unmapped));
        p.remap_unmapped(|a| Place::File {
            path: Arc::from("/bin/w"),
            file_offset: a - 0x6f00,
        });
        let stacks = p.stacks(resolve);
        assert_eq!(stacks.iter().map(|s| s.samples).sum::<u64>(), p.samples());
        let names =
            |s: &CpuStack| -> Vec<String> { s.frames.iter().map(|f| f.function.clone()).collect() };
        assert_eq!((stacks[0].tid, stacks[0].samples), (1, 3));
        assert_eq!(names(&stacks[0]), ["spin", "idle"]);
        assert_eq!(stacks[0].frames[0].object.as_deref(), Some("/bin/w"));
        let kernel = stacks
            .iter()
            .find(|s| s.frames[0].function == "[kernel]")
            .unwrap();
        assert_eq!((kernel.tid, kernel.frames.len()), (1, 1));
        // The remapped sample landed in `spin` (0x100), its thread's own.
        let thread2: u64 = stacks
            .iter()
            .filter(|s| s.tid == 2)
            .map(|s| s.samples)
            .sum();
        assert_eq!(thread2, 2);
        assert!(stacks.iter().all(|s| s.frames[0].function != "[unmapped]"));
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
        assert_eq!(p.stack_samples(1), 10);
        assert_eq!(p.user_places().count(), 3);
    }

    #[test]
    fn total_time_comes_from_stacks() {
        let mut p = Profile::new();
        let sample = |at: SampleAt, stack_id| Sample {
            time_ns: 0,
            tid: 1,
            at,
            stack_id,
        };
        // 6 samples in spin (0x110) whose callers are idle, recursively.
        for _ in 0..6 {
            p.add_sample(sample(at(0x110), Some(1)));
        }
        // 4 samples in idle itself, called from idle (its own stack).
        for _ in 0..4 {
            p.add_sample(sample(at(0x300), Some(2)));
        }
        // 5 samples in spin without a stack, 2 with a stack never read, and
        // one in the kernel whose user stack is idle.
        for _ in 0..5 {
            p.add_sample(sample(at(0x120), None));
        }
        p.add_sample(sample(at(0x130), Some(3)));
        p.add_sample(sample(at(0x130), Some(3)));
        p.add_sample(sample(SampleAt::Kernel, Some(4)));
        assert_eq!(p.unread_stacks(), vec![1, 2, 3, 4]);
        let place = |o| Place::File {
            path: Arc::from("/bin/w"),
            file_offset: o,
        };
        // Stacks start at the caller; a recursive caller counts once.
        p.set_stack(1, vec![place(0x310), place(0x320)]);
        p.set_stack(2, vec![place(0x330)]);
        p.set_stack(4, vec![place(0x340)]);
        assert_eq!(p.unread_stacks(), vec![3]);
        let hot = p.hot_functions(10, resolve);
        let get = |f: &str| hot.iter().find(|h| h.frame.function == f).unwrap().clone();
        // spin: 6 + 5 + 2 samples of its own; nothing calls into it here.
        assert_eq!((get("spin").samples, get("spin").total), (13, 13));
        // idle: 4 own; on the stack of 6 spin samples and 1 kernel sample.
        assert_eq!((get("idle").samples, get("idle").total), (4, 11));
        assert_eq!((get("[kernel]").samples, get("[kernel]").total), (1, 1));
        // Totals never undercount: every sample counts for its own function.
        assert!(hot.iter().all(|h| h.total >= h.samples));
        assert!((get("idle").total_share - 11.0 / 18.0).abs() < 1e-9);

        // A caller without self time is listed after the rest, at its
        // call-site line.
        p.set_stack(1, vec![place(0x010)]);
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
