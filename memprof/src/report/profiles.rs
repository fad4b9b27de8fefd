//! The report's findings as stack profiles, one per concern, in the shape
//! pprof and flame graphs share: samples that are a call chain (innermost
//! frame first), a value per sample type, and labels for what a chain
//! cannot say (the cache line, the lock, the object).
//!
//! Pure: built from the [`Report`] alone, so every number in an exported
//! profile is one of the report's (the JSON's) numbers.

use super::model::{CallerRef, Report};

/// Which concern a profile is about; its name goes in exported file names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileKind {
    Cpu,
    Alloc,
    Lock,
    Sharing,
}

impl ProfileKind {
    pub const ALL: [ProfileKind; 4] = [Self::Cpu, Self::Alloc, Self::Lock, Self::Sharing];

    pub fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Alloc => "alloc",
            Self::Lock => "lock",
            Self::Sharing => "sharing",
        }
    }
}

/// One frame of a chain.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackFrame {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
    /// The object's file name (`libc.so.6`), when known.
    pub module: Option<String>,
    /// The object's path, when known (to read its build id).
    pub object: Option<String>,
}

impl StackFrame {
    pub fn named(function: &str) -> Self {
        Self {
            function: function.into(),
            file: None,
            line: None,
            module: None,
            object: None,
        }
    }
}

impl StackFrame {
    /// A frame in `module` at `file:line`, from a report entry.
    fn at(function: &str, file: &Option<String>, line: Option<u32>, module: &str) -> Self {
        Self {
            function: function.into(),
            file: file.clone(),
            line,
            module: Some(module.into()),
            object: None,
        }
    }
}

impl From<&CallerRef> for StackFrame {
    fn from(c: &CallerRef) -> Self {
        Self {
            function: c.function.clone(),
            file: c.file.clone(),
            line: c.line,
            module: None,
            object: None,
        }
    }
}

/// A label value.
#[derive(Debug, Clone, PartialEq)]
pub enum Label {
    Str(String),
    /// A number and its unit (pprof's `num_unit`), if any.
    Num(i64, Option<&'static str>),
}

/// One sample: a chain, one value per sample type, labels.
#[derive(Debug, Clone, PartialEq)]
pub struct StackSample {
    /// Innermost first.
    pub frames: Vec<StackFrame>,
    pub values: Vec<i64>,
    pub labels: Vec<(&'static str, Label)>,
}

/// A profile of one concern.
#[derive(Debug, Clone, PartialEq)]
pub struct StackProfile {
    pub kind: ProfileKind,
    /// (type, unit) of each value, in pprof's conventions.
    pub sample_types: Vec<(&'static str, &'static str)>,
    /// The sample type a viewer shows first.
    pub default_type: &'static str,
    /// (type, unit, value) of the sampling period, for sampled profiles.
    pub period: Option<(&'static str, &'static str, i64)>,
    pub samples: Vec<StackSample>,
    /// Session length, in ns.
    pub duration_ns: i64,
    /// Text for the reader (pprof comments): what the numbers are.
    pub comments: Vec<String>,
}

impl StackProfile {
    fn new(kind: ProfileKind, types: &[(&'static str, &'static str)], report: &Report) -> Self {
        Self {
            kind,
            sample_types: types.to_vec(),
            default_type: types[types.len() - 1].0,
            period: None,
            samples: Vec::new(),
            duration_ns: (report.duration_s * 1e9) as i64,
            comments: Vec::new(),
        }
    }

    /// The sum of each value over the samples.
    pub fn totals(&self) -> Vec<i64> {
        let mut totals = vec![0; self.sample_types.len()];
        for s in &self.samples {
            for (t, v) in totals.iter_mut().zip(&s.values) {
                *t += v;
            }
        }
        totals
    }
}

/// A CPU call chain and the samples taken in it (kept with the report for
/// the exporters, not in the JSON: the JSON ranks functions).
#[derive(Debug, Clone, PartialEq)]
pub struct CpuStack {
    /// The thread sampled.
    pub tid: u32,
    /// Innermost first: where the sample landed, then its callers.
    pub frames: Vec<StackFrame>,
    pub samples: u64,
}

/// The target's executable, as the CPU samples' frames name it (the first
/// object that is not a shared library or a pseudo-region), else the first
/// word of its command.
pub fn main_object(report: &Report) -> Option<String> {
    let from_samples = report
        .cpu_stacks
        .iter()
        .flatten()
        .flat_map(|s| &s.frames)
        .filter_map(|f| f.object.as_deref())
        .find(|o| o.starts_with('/') && !o.contains(".so"));
    from_samples.map(str::to_owned).or_else(|| {
        report
            .target
            .command
            .split_whitespace()
            .next()
            .map(Into::into)
    })
}

/// A sampled allocation chain, scaled like the report's heap-profile
/// sites (None where they are null). Kept with the report for the
/// exporters: the JSON lists the top sites only.
#[derive(Debug, Clone, PartialEq)]
pub struct AllocChain {
    /// Innermost first: the wrappers, the site, its callers.
    pub frames: Vec<StackFrame>,
    /// The site (the first frame outside the wrappers), as
    /// [`site_label`] names it.
    pub site: String,
    pub alloc_objects: Option<u64>,
    pub alloc_space: Option<u64>,
    pub inuse_objects: Option<u64>,
    pub inuse_space: Option<u64>,
}

/// The `alloc_site` label of an allocation site: its function and, when
/// known, `file:line` (file name only), e.g. `parse (load.c:42)`; one
/// function may allocate at several sites.
pub fn site_label(function: &str, file: Option<&str>, line: Option<u32>) -> String {
    match (file, line) {
        (Some(file), Some(line)) => {
            let name = file.rsplit('/').next().unwrap_or(file);
            format!("{function} ({name}:{line})")
        }
        _ => function.to_owned(),
    }
}

/// Every profile the report has data for (a concern with no samples has
/// none).
pub fn profiles(report: &Report) -> Vec<StackProfile> {
    ProfileKind::ALL
        .into_iter()
        .map(|kind| profile(kind, report))
        .filter(|p| !p.samples.is_empty())
        .collect()
}

/// The profile of one concern (maybe without samples).
pub fn profile(kind: ProfileKind, report: &Report) -> StackProfile {
    match kind {
        ProfileKind::Cpu => cpu(report),
        ProfileKind::Alloc => alloc(report),
        ProfileKind::Lock => lock(report),
        ProfileKind::Sharing => sharing(report),
    }
}

impl StackProfile {
    /// A concern's profile with its sample types and no samples.
    pub fn empty(kind: ProfileKind, report: &Report) -> Self {
        let mut p = profile(kind, report);
        p.samples.clear();
        p
    }
}

/// CPU samples, and CPU time at one sampling period per sample.
fn cpu(report: &Report) -> StackProfile {
    let hz = report.sampling.frequency_hz.max(1);
    let period = (1_000_000_000 / hz) as i64;
    let mut p = StackProfile::new(
        ProfileKind::Cpu,
        &[("samples", "count"), ("cpu", "nanoseconds")],
        report,
    );
    p.period = Some(("cpu", "nanoseconds", period));
    p.comments.push(format!(
        "{} samples at {hz} Hz ({}); cpu time is samples x {period} ns",
        report.sampling.samples,
        report.sampling.source.name()
    ));
    p.samples = report
        .cpu_stacks
        .iter()
        .flatten()
        .map(|s| StackSample {
            frames: s.frames.clone(),
            values: vec![s.samples as i64, s.samples as i64 * period],
            labels: vec![("thread", Label::Num(i64::from(s.tid), None))],
        })
        .collect();
    p
}

/// The sampled allocations' chains, scaled by their sampling weight.
fn alloc(report: &Report) -> StackProfile {
    let mut p = StackProfile::new(
        ProfileKind::Alloc,
        &[
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
        ],
        report,
    );
    let Some(heap) = report.allocator.heap_profile.as_ref() else {
        return p;
    };
    p.comments.push(heap.basis.clone());
    if let Some(chains) = report.alloc_chains.as_ref().filter(|c| !c.is_empty()) {
        alloc_chains(&mut p, chains);
        return p;
    }
    heap_samples(
        &mut p,
        &heap.sites,
        "site(s)",
        |site| {
            [
                site.alloc_objects,
                site.alloc_space,
                site.inuse_objects,
                site.inuse_space,
            ]
        },
        |site| {
            let frames = if site.chain.is_empty() {
                vec![StackFrame::at(
                    &site.function,
                    &site.file,
                    site.line,
                    &site.module,
                )]
            } else {
                site.chain.iter().map(StackFrame::from).collect()
            };
            let label = site_label(&site.function, site.file.as_deref(), site.line);
            (frames, label)
        },
    );
    p
}

/// Every sampled chain as a sample (all of them: the JSON has the top
/// sites, whose figures are the sums of their chains').
fn alloc_chains(p: &mut StackProfile, chains: &[AllocChain]) {
    heap_samples(
        p,
        chains,
        "chain(s)",
        |c| {
            [
                c.alloc_objects,
                c.alloc_space,
                c.inuse_objects,
                c.inuse_space,
            ]
        },
        |c| (c.frames.clone(), c.site.clone()),
    );
}

/// One sample per entry whose four heap figures (`values`: allocated
/// objects and bytes, in-use objects and bytes) are all known, at its
/// frames with its `alloc_site` label (`sample`); a comment says how many
/// entries (`what`) were left out for an unknown figure.
fn heap_samples<T>(
    p: &mut StackProfile,
    entries: &[T],
    what: &str,
    values: impl Fn(&T) -> [Option<u64>; 4],
    sample: impl Fn(&T) -> (Vec<StackFrame>, String),
) {
    let mut unknown = 0;
    for entry in entries {
        let values = values(entry);
        if values.iter().any(Option::is_none) {
            unknown += 1;
            continue;
        }
        let (frames, site) = sample(entry);
        p.samples.push(StackSample {
            frames,
            values: values.iter().map(|v| v.unwrap_or(0) as i64).collect(),
            labels: vec![("alloc_site", Label::Str(site))],
        });
    }
    if unknown > 0 {
        p.comments.push(format!(
            "{unknown} {what} left out: their scaled totals are unknown (see the JSON)"
        ));
    }
}

/// Lock waits at the waiters' chains, and the delay each holder's sections
/// caused at the holder's release site (a third sample type, so that the
/// delay is not counted twice).
fn lock(report: &Report) -> StackProfile {
    let mut p = StackProfile::new(
        ProfileKind::Lock,
        &[
            ("contentions", "count"),
            ("delay", "nanoseconds"),
            ("caused_delay", "nanoseconds"),
        ],
        report,
    );
    p.default_type = "delay";
    p.comments.push(
        "contentions and delay: futex waits at the waiting call chain; caused_delay: \
         the waits a holder's release ended, at the release site"
            .into(),
    );
    for lock in &report.locks {
        let name = lock.label();
        let labels = |role: &str| {
            vec![
                ("lock", Label::Str(name.clone())),
                ("kind", Label::Str(lock.kind.name().into())),
                ("role", Label::Str(role.into())),
            ]
        };
        for w in &lock.waiters {
            let site = StackFrame::at(&w.function, &w.file, w.line, &w.module);
            let mut frames: Vec<StackFrame> = w.chain.iter().map(|c| parse_chain(c)).collect();
            if frames.first().is_none_or(|f| f.function != site.function) {
                frames.insert(0, site);
            }
            p.samples.push(StackSample {
                frames,
                values: vec![w.count as i64, w.wait_ns as i64, 0],
                labels: labels("waiter"),
            });
        }
        for h in &lock.holders {
            p.samples.push(StackSample {
                frames: vec![StackFrame::at(&h.function, &h.file, h.line, &h.module)],
                values: vec![0, 0, h.delay_caused_ns as i64],
                labels: labels("holder"),
            });
        }
    }
    p
}

/// A chain entry of the lock report, "function (file:line)" or "function".
fn parse_chain(entry: &str) -> StackFrame {
    let Some((function, rest)) = entry.rsplit_once(" (") else {
        return StackFrame::named(entry);
    };
    let place = rest.strip_suffix(')').unwrap_or(rest);
    let (file, line) = match place.rsplit_once(':') {
        Some((file, line)) if line.parse::<u32>().is_ok() => (file, line.parse().ok()),
        _ => (place, None),
    };
    StackFrame {
        function: function.into(),
        file: Some(file.into()),
        line,
        module: None,
        object: None,
    }
}

/// Sampled accesses at the code touching each contended line, and the
/// line's invalidations at the code that wrote it most.
fn sharing(report: &Report) -> StackProfile {
    let mut p = StackProfile::new(
        ProfileKind::Sharing,
        &[("accesses", "count"), ("invalidations", "count")],
        report,
    );
    p.comments.push(
        "accesses: sampled reads and writes of a shared cache line by this code; \
         invalidations: the line's, at the code that wrote it most"
            .into(),
    );
    for e in &report.false_sharing {
        let labels = vec![
            ("cache_line", Label::Str(e.line.clone())),
            ("object", Label::Str(e.object.name.clone())),
            ("kind", Label::Str(e.kind.name().into())),
        ];
        let top_writer = e
            .code
            .iter()
            .enumerate()
            .max_by_key(|(i, c)| (c.writes, std::cmp::Reverse(*i)))
            .map(|(i, _)| i);
        for (i, c) in e.code.iter().enumerate() {
            let invalidations = if Some(i) == top_writer {
                e.invalidations as i64
            } else {
                0
            };
            let mut frames = vec![StackFrame::at(&c.function, &c.file, c.line, &c.module)];
            frames.extend(c.inlined_into.iter().map(StackFrame::from));
            p.samples.push(StackSample {
                frames,
                values: vec![(c.reads + c.writes) as i64, invalidations],
                labels: labels.clone(),
            });
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_chain_entries_are_parsed_into_frames() {
        let f = parse_chain("worker (/src/app.c:42)");
        assert_eq!(f.function, "worker");
        assert_eq!(f.file.as_deref(), Some("/src/app.c"));
        assert_eq!(f.line, Some(42));
        let f = parse_chain("start_thread (pthread_create.c)");
        assert_eq!(
            (f.file.as_deref(), f.line),
            (Some("pthread_create.c"), None)
        );
        let f = parse_chain("libc.so.6+0x1234");
        assert_eq!(f, StackFrame::named("libc.so.6+0x1234"));
        // A C++ name with parentheses keeps them.
        let f = parse_chain("ns::f(int) (/a.cc:7)");
        assert_eq!((f.function.as_str(), f.line), ("ns::f(int)", Some(7)));
    }
}
