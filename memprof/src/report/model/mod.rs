//! The report: one model that the summary, the JSON file and the dashboard
//! all render. Field names are the versioned JSON schema ([`SCHEMA`]);
//! each feature's part of it has its own file.

use serde::{Deserialize, Serialize};

/// An enum whose JSON form is one fixed string per variant: `name()` is
/// that string (also the `Display` form, which honours width and
/// alignment), `from_name` reads it back, `ALL` lists the variants.
macro_rules! schema_enum {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:tt,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ::serde::Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The schema's name for the value.
            pub fn name(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)+
                }
            }

            /// The value the schema calls `name`, if there is one.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|v| v.name() == name)
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.name())
            }
        }
    };
}

mod allocator;
mod cpu;
mod loader;
mod locks;
mod sharing;

pub use allocator::*;
pub use cpu::*;
pub use loader::*;
pub use locks::*;
pub use sharing::*;

pub use super::section::{Section, Sections};

/// Version tag of the JSON form. Bump on incompatible changes.
pub const SCHEMA: &str = "memprof-ebpf/1";

/// The report's `schema` field: written as [`SCHEMA`]; a report of
/// another version is not read as this one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Schema;

impl Serialize for Schema {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(SCHEMA)
    }
}

impl<'de> Deserialize<'de> for Schema {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let tag = String::deserialize(d)?;
        if tag == SCHEMA {
            Ok(Schema)
        } else {
            let why = format!("a report of schema {tag}; this reads {SCHEMA}");
            Err(serde::de::Error::custom(why))
        }
    }
}

/// How a family of uprobes (the allocator's, the locks') ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceMode {
    /// Not traced.
    #[default]
    Off,
    /// Every call traced.
    Full,
    /// Traced in windows within the overhead budget: counts are scaled.
    Sampled,
    /// Benchmarks only: probes that do nothing, at the places of `full`.
    Floor,
}

impl TraceMode {
    pub fn name(self) -> &'static str {
        match self {
            TraceMode::Off => "off",
            TraceMode::Full => "full",
            TraceMode::Sampled => "sampled",
            TraceMode::Floor => "floor",
        }
    }

    /// Whether counts traced in this mode over `fraction` of the session
    /// are estimates (scaled up from the traced windows).
    pub fn estimates(self, fraction: f64) -> bool {
        self == TraceMode::Sampled && fraction < FULLY_TRACED
    }
}

impl std::fmt::Display for TraceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A traced fraction at least this high is the whole session (a window
/// controller's own timing leaves a sliver untraced).
pub const FULLY_TRACED: f64 = 0.999;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub schema: Schema,
    pub target: Target,
    /// Seconds traced.
    pub duration_s: f64,
    pub sampling: Sampling,
    pub hot_functions: Vec<HotFunctionEntry>,
    pub threads: Vec<ThreadEntry>,
    /// Cache lines threads contend for, most costly first.
    pub false_sharing: Vec<SharingEntry>,
    /// The most-sampled lines that are not in `false_sharing`, and why:
    /// what the detector looked at and cleared.
    pub false_sharing_dismissed: Vec<DismissedLine>,
    /// The allocator profile (`mode: "off"` when not traced).
    pub allocator: AllocatorReport,
    /// Contended locks, most wait time first, then locks the uprobes saw
    /// taken without contention.
    pub locks: Vec<LockEntry>,
    /// How lock calls were traced (null when the lock uprobes are off or
    /// no pthread library was found).
    pub lock_tracing: Option<LockTracing>,
    /// How futex waits were traced (null when the lock profiler did not
    /// run).
    pub lock_contention: Option<LockContention>,
    /// The parts analyses keep in their own directories, one top-level
    /// key each ([`Section`]).
    #[serde(flatten)]
    pub sections: Sections,
    /// The profiler's own cost.
    pub loader: Loader,
    /// Things the reader should know (target exited, events lost, ...).
    pub notes: Vec<String>,
    /// The CPU samples by call chain, for the profile exporters (pprof,
    /// flame graphs, push); the JSON ranks functions instead. None unless
    /// an exporter asked (the session sets it to an empty list): the
    /// dashboard's report every second need not resolve every chain.
    #[serde(skip)]
    pub cpu_stacks: Option<Vec<crate::report::profiles::CpuStack>>,
    /// Every sampled allocation chain, likewise (the JSON's heap profile
    /// lists the top sites).
    #[serde(skip)]
    pub alloc_chains: Option<Vec<crate::report::profiles::AllocChain>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Target {
    pub pid: u32,
    pub command: String,
    /// Threads seen during the session (present at attach or created later).
    pub threads_seen: usize,
    /// Whether the target exited before the session ended.
    pub exited: bool,
    /// The traced processes (`-p` pids, children followed, a cgroup's),
    /// with their threads (in [`Report::threads`] by `pid`); the main one
    /// first.
    pub processes: Vec<ProcessEntry>,
}

/// One traced process.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    /// As this machine sees it.
    pub pid: u32,
    /// In its own pid namespace (a container's), when that differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<u32>,
    /// Empty when it was never read (the process had exited).
    pub command: String,
    pub threads: usize,
    pub samples: u64,
}

impl ProcessEntry {
    /// `4711`, or `4711 (ns 1)` in another pid namespace.
    pub fn pid_label(&self) -> String {
        match self.ns_pid {
            Some(ns) => format!("{} (ns {ns})", self.pid),
            None => self.pid.to_string(),
        }
    }
}

/// A function that code was inlined into, at the line of the inlined call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallerRef {
    pub function: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

/// `, inlined into main fs.c:25, inlined into ...` (empty when not
/// inlined), for a summary line.
pub fn inlined_label(callers: &[CallerRef]) -> String {
    callers
        .iter()
        .map(|c| {
            let at = source_label(c.file.as_deref(), c.line, "?");
            format!(", inlined into {} {at}", c.function)
        })
        .collect()
}

/// `file.c:12`, `file.c`, or `(module)`.
pub fn source_label(file: Option<&str>, line: Option<u32>, module: &str) -> String {
    use crate::process::maps::short_name;
    match (file, line) {
        (Some(file), Some(line)) => format!("{}:{line}", short_name(file)),
        (Some(file), None) => short_name(file).to_string(),
        _ => format!("({module})"),
    }
}

impl Report {
    /// Notes on the profiler's own cost: its programs' run time unknown,
    /// a sampler whose interrupts take a share that matters.
    pub fn cost_notes(&self) -> impl Iterator<Item = String> {
        self.loader
            .note()
            .into_iter()
            .chain(self.sampling.cost_note())
    }

    /// Serializes to pretty JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of strings and numbers cannot fail; a
        // non-finite float becomes null.
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }

    /// A report from its JSON form (what `--json` wrote).
    pub fn from_json(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    /// The fixtures the dashboard's tests take from here.
    pub(crate) use crate::report::fixtures::{
        false_sharing_entry, fixture_code, fixture_word, sample_report,
    };

    #[test]
    fn modes_serialize_as_the_schema_names_them() {
        fn json<T: Serialize>(v: &T) -> String {
            serde_json::to_string(v).unwrap()
        }
        assert_eq!(json(&TraceMode::Off), "\"off\"");
        assert_eq!(json(&TraceMode::Full), "\"full\"");
        assert_eq!(json(&TraceMode::Sampled), "\"sampled\"");
        assert_eq!(json(&TraceMode::Floor), "\"floor\"");
        assert_eq!(json(&AddressMode::Decoded), "\"decoded\"");
        assert_eq!(json(&AddressMode::Precise), "\"precise\"");
        for m in [
            TraceMode::Off,
            TraceMode::Full,
            TraceMode::Sampled,
            TraceMode::Floor,
        ] {
            assert_eq!(json(&m), format!("\"{m}\""), "Display matches the JSON");
        }
    }

    /// Each value serializes as its name, reads back from it, and shows
    /// as it (with the width and alignment asked for).
    fn assert_named<T>(all: &[T], from_name: fn(&str) -> Option<T>)
    where
        T: Serialize + std::fmt::Display + std::fmt::Debug + Copy + PartialEq,
    {
        for &v in all {
            let name = v.to_string();
            assert_eq!(serde_json::to_string(&v).unwrap(), format!("\"{name}\""));
            assert_eq!(from_name(&name), Some(v));
            assert_eq!(format!("{v:>20}"), format!("{name:>20}"));
        }
        assert_eq!(from_name("no such name"), None);
    }

    #[test]
    fn schema_enums_serialize_as_their_names() {
        assert_named(SampleSource::ALL, SampleSource::from_name);
        assert_named(SharingKind::ALL, SharingKind::from_name);
        assert_named(ObjectKind::ALL, ObjectKind::from_name);
        assert_named(DismissReason::ALL, DismissReason::from_name);
        assert_named(AllocOp::ALL, AllocOp::from_name);
        assert_named(SizeClass::ALL, SizeClass::from_name);
        assert_named(BlockOrigin::ALL, BlockOrigin::from_name);
        assert_named(ThreadPhase::ALL, ThreadPhase::from_name);
        assert_named(Syscall::ALL, Syscall::from_name);
        assert_named(LockKind::ALL, LockKind::from_name);
        assert_eq!(
            serde_json::to_string(&Some(BlockOrigin::Reused)).unwrap(),
            "\"reused\""
        );
        assert_eq!(serde_json::to_string(&None::<BlockOrigin>).unwrap(), "null");
    }

    #[test]
    fn the_sample_source_is_the_precise_events_when_they_gave_addresses() {
        use crate::kernel::loader::SamplingSource;
        for s in [SamplingSource::CpuClock, SamplingSource::Cycles] {
            assert_eq!(SampleSource::of(s, None).name(), s.name());
            assert_eq!(SampleSource::of(s, Some("pebs")), SampleSource::Pebs);
            assert_eq!(SampleSource::of(s, Some("ibs")), SampleSource::Ibs);
        }
    }

    #[test]
    fn only_lock_kinds_are_contention() {
        let contention: Vec<&str> = LockKind::ALL
            .iter()
            .filter(|k| k.is_contention())
            .map(|k| k.name())
            .collect();
        assert_eq!(contention, ["mutex", "rwlock", "futex", "kernel"]);
        assert_eq!(LockKind::default(), LockKind::Futex);
    }

    #[test]
    fn only_a_sampled_session_traced_in_part_gives_estimates() {
        assert!(TraceMode::Sampled.estimates(0.5));
        assert!(!TraceMode::Sampled.estimates(FULLY_TRACED));
        assert!(!TraceMode::Full.estimates(0.5));
        assert!(!TraceMode::Off.estimates(0.0));
    }

    #[test]
    fn json_has_the_promised_top_level_keys() {
        let v: serde_json::Value = serde_json::from_str(&sample_report().to_json()).unwrap();
        assert_eq!(v["schema"], "memprof-ebpf/1");
        for key in [
            "target",
            "duration_s",
            "sampling",
            "hot_functions",
            "false_sharing",
            "allocator",
            "locks",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        assert_eq!(v["target"]["pid"], 42);
        assert_eq!(v["target"]["command"], "./work 2");
        for key in ["source", "frequency_hz", "samples", "lost"] {
            assert!(v["sampling"].get(key).is_some(), "missing sampling.{key}");
        }
        let hot = &v["hot_functions"][0];
        for key in ["function", "file", "line", "module", "samples"] {
            assert!(hot.get(key).is_some(), "missing hot_functions[].{key}");
        }
        assert!(v["allocator"].is_object());
        assert!(v["false_sharing"].is_array() && v["locks"].is_array());
    }

    #[test]
    fn a_report_reads_back_as_it_was_written() {
        let reports = [
            sample_report(),
            crate::report::fixtures::report_with_allocator(),
        ];
        for report in reports {
            let json = report.to_json();
            let back = Report::from_json(&json).expect("the report reads back");
            // Not assert_eq: the two texts would fill the screen.
            assert!(back.to_json() == json, "differs: {}", back.to_json());
        }
    }

    #[test]
    fn lock_addresses_read_back_as_written() {
        for (a, text) in [
            (LockAddress::At(0x7f00_1234), "\"0x7f001234\""),
            (LockAddress::Kernel, "\"kernel\""),
            (LockAddress::Other, "\"other\""),
        ] {
            assert_eq!(serde_json::to_string(&a).unwrap(), text);
            assert_eq!(serde_json::from_str::<LockAddress>(text).unwrap(), a);
        }
        assert!(serde_json::from_str::<LockAddress>("\"0xzz\"").is_err());
        assert!(serde_json::from_str::<LockAddress>("\"1234\"").is_err());
    }

    #[test]
    fn fields_left_out_when_empty_read_back_empty() {
        let mut report = sample_report();
        report.false_sharing = vec![crate::report::fixtures::false_sharing_entry()];
        report.false_sharing[0].processes.clear();
        let json = report.to_json();
        let back = Report::from_json(&json).expect("reads back");
        assert!(back.false_sharing[0].processes.is_empty());
    }

    #[test]
    fn a_report_of_another_schema_is_not_read() {
        let json = sample_report()
            .to_json()
            .replace("\"memprof-ebpf/1\"", "\"memprof-ebpf/0\"");
        let e = Report::from_json(&json).unwrap_err().to_string();
        assert!(e.contains("memprof-ebpf/0"), "{e}");
    }

    #[test]
    fn source_labels() {
        let mut h = sample_report().hot_functions[0].clone();
        h.file = None;
        h.line = None;
        assert_eq!(h.source_label(), "(work)");
        h.file = Some("/src/app/main.c".into());
        assert_eq!(h.source_label(), "main.c");
        h.line = Some(42);
        assert_eq!(h.source_label(), "main.c:42");
    }

    /// The JSON form of the fully filled fixture report, byte for byte as
    /// the schema has it.
    #[test]
    fn json_of_the_full_report_is_unchanged() {
        let json = crate::report::fixtures::full_report().to_json();
        if std::env::var_os("MEMPROF_UPDATE_SNAPSHOTS").is_some() {
            let path = concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/report/testdata/report.json"
            );
            std::fs::write(path, &json).expect("fixture writable");
            return;
        }
        assert_eq!(json, include_str!("../testdata/report.json"));
    }
}
