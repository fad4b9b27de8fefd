//! pprof export: each [`StackProfile`] as a gzip-compressed
//! `profile.proto`, the format `go tool pprof`, Grafana Pyroscope and
//! Parca read.
//!
//! The messages are declared here with `prost`'s derive (the schema is
//! small and stable; no build step needs `protoc`). Field numbers follow
//! `github.com/google/pprof/proto/profile.proto`.

use std::collections::HashMap;
use std::io::Write as _;

use prost::Message;

use super::profiles::{Label, StackFrame, StackProfile};

#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<PLabel>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PLabel {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
}

/// Builds a [`Profile`], interning strings, functions, locations and
/// mappings.
struct Builder<'a> {
    p: Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(String, Option<String>), u64>,
    locations: HashMap<StackFrame, u64>,
    mappings: HashMap<String, u64>,
    /// The main executable's file name, whose frames go to mapping 1.
    main: Option<(String, u64)>,
    build_id: &'a mut dyn FnMut(&str) -> Option<String>,
}

impl Builder<'_> {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.p.string_table.len() as i64;
        self.p.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn value_type(&mut self, (kind, unit): (&str, &str)) -> ValueType {
        ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, f: &StackFrame) -> u64 {
        let key = (f.function.clone(), f.file.clone());
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.p.function.len() as u64 + 1;
        let name = self.string(&f.function);
        let filename = self.string(f.file.as_deref().unwrap_or(""));
        self.p.function.push(Function {
            id,
            name,
            system_name: name,
            filename,
        });
        self.functions.insert(key, id);
        id
    }

    /// The mapping of an object (its path, or its file name), with its
    /// build id when it can be read.
    fn mapping(&mut self, f: &StackFrame) -> u64 {
        if let (Some((name, id)), Some(module)) = (&self.main, &f.module) {
            if name == module {
                return *id;
            }
        }
        let Some(object) = f.object.as_ref().or(f.module.as_ref()) else {
            return 0;
        };
        self.add_mapping(object)
    }

    fn add_mapping(&mut self, object: &str) -> u64 {
        if let Some(&id) = self.mappings.get(object) {
            return id;
        }
        let id = self.p.mapping.len() as u64 + 1;
        let build_id = (self.build_id)(object).unwrap_or_default();
        let mapping = Mapping {
            id,
            filename: self.string(object),
            build_id: self.string(&build_id),
            // Symbolized here: a profile store must not symbolize again.
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            ..Mapping::default()
        };
        self.p.mapping.push(mapping);
        self.mappings.insert(object.to_owned(), id);
        id
    }

    fn location(&mut self, f: &StackFrame) -> u64 {
        if let Some(&id) = self.locations.get(f) {
            return id;
        }
        let id = self.p.location.len() as u64 + 1;
        let function_id = self.function(f);
        let mapping_id = self.mapping(f);
        self.p.location.push(Location {
            id,
            mapping_id,
            address: 0,
            line: vec![Line {
                function_id,
                line: f.line.map_or(0, i64::from),
            }],
        });
        self.locations.insert(f.clone(), id);
        id
    }

    fn label(&mut self, key: &str, value: &Label) -> PLabel {
        let key = self.string(key);
        match value {
            Label::Str(s) => PLabel {
                key,
                str: self.string(s),
                ..PLabel::default()
            },
            Label::Num(n, unit) => PLabel {
                key,
                num: *n,
                num_unit: unit.map_or(0, |u| self.string(u)),
                ..PLabel::default()
            },
        }
    }
}

/// `profile` as a pprof message. `main` is the target's executable (the
/// first mapping, which pprof takes for the main binary); `build_id` reads
/// an object's build id (hex) from its path; `time_nanos` is the session's
/// start.
pub fn encode(
    profile: &StackProfile,
    main: Option<&str>,
    time_nanos: i64,
    build_id: &mut dyn FnMut(&str) -> Option<String>,
) -> Profile {
    let mut b = Builder {
        p: Profile::default(),
        strings: HashMap::new(),
        functions: HashMap::new(),
        locations: HashMap::new(),
        mappings: HashMap::new(),
        main: None,
        build_id,
    };
    // String 0 is always "".
    b.string("");
    if let Some(main) = main {
        let id = b.add_mapping(main);
        let name = main.rsplit('/').next().unwrap_or(main).to_owned();
        b.main = Some((name, id));
    }
    b.p.sample_type = profile
        .sample_types
        .iter()
        .map(|&t| b.value_type(t))
        .collect();
    b.p.default_sample_type = b.string(profile.default_type);
    if let Some((kind, unit, period)) = profile.period {
        b.p.period_type = Some(b.value_type((kind, unit)));
        b.p.period = period;
    }
    b.p.time_nanos = time_nanos;
    b.p.duration_nanos = profile.duration_ns;
    b.p.comment = profile.comments.iter().map(|c| b.string(c)).collect();
    for s in &profile.samples {
        let location_id = s.frames.iter().map(|f| b.location(f)).collect();
        let label = s.labels.iter().map(|(k, v)| b.label(k, v)).collect();
        b.p.sample.push(Sample {
            location_id,
            value: s.values.clone(),
            label,
        });
    }
    b.p
}

/// The gzip-compressed encoding, as pprof files are stored.
pub fn to_gzip(profile: &Profile) -> std::io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&profile.encode_to_vec())?;
    gz.finish()
}

/// The hex build id (`.note.gnu.build-id`) of the object at `path`.
pub fn read_build_id(path: &str) -> Option<String> {
    use object::Object as _;
    let data = std::fs::read(crate::process::objects::open_path(path)).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let id = file.build_id().ok()??;
    Some(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// Where the profile of `kind` goes: `{kind}` in `template` replaced by
/// it, else `template.KIND.pb.gz`.
pub fn path_for(template: &std::path::Path, kind: &str, ext: &str) -> std::path::PathBuf {
    let text = template.to_string_lossy();
    if text.contains("{kind}") {
        text.replace("{kind}", kind).into()
    } else {
        format!("{text}.{kind}.{ext}").into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::profiles::{ProfileKind, StackSample};

    fn frame(function: &str, line: u32) -> StackFrame {
        StackFrame {
            function: function.into(),
            file: Some("/src/a.c".into()),
            line: Some(line),
            module: Some("a".into()),
            object: Some("/bin/a".into()),
        }
    }

    fn sample_profile() -> StackProfile {
        StackProfile {
            kind: ProfileKind::Lock,
            sample_types: vec![("contentions", "count"), ("delay", "nanoseconds")],
            default_type: "delay",
            period: None,
            samples: vec![
                StackSample {
                    frames: vec![frame("wait_here", 10), frame("main", 3)],
                    values: vec![7, 7000],
                    labels: vec![("lock", Label::Str("g_lock".into()))],
                },
                StackSample {
                    frames: vec![frame("other", 20), frame("main", 3)],
                    values: vec![1, 50],
                    labels: vec![("thread", Label::Num(12, None))],
                },
            ],
            duration_ns: 5_000_000_000,
            comments: vec!["a comment".into()],
        }
    }

    /// Decoding what we encode gives back every sample's chain, values and
    /// labels, with the tables shared (one location for `main`).
    #[test]
    fn a_profile_round_trips_through_the_wire_format() {
        let mut ids = 0;
        let mut build_id = |_: &str| {
            ids += 1;
            Some("abcd".to_string())
        };
        let p = encode(&sample_profile(), Some("/bin/a"), 1, &mut build_id);
        let gz = to_gzip(&p).unwrap();
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut raw).unwrap();
        let back = Profile::decode(&raw[..]).unwrap();
        assert_eq!(back, p);
        let s = |i: i64| back.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        assert_eq!(s(back.sample_type[1].r#type), "delay");
        assert_eq!(s(back.default_sample_type), "delay");
        assert_eq!(back.location.len(), 3, "main is one location");
        assert_eq!(back.mapping.len(), 1);
        assert_eq!(ids, 1, "one build id read per object");
        assert_eq!(s(back.mapping[0].build_id), "abcd");
        let first = &back.sample[0];
        assert_eq!(first.value, vec![7, 7000]);
        let leaf = &back.location[first.location_id[0] as usize - 1];
        let f = &back.function[leaf.line[0].function_id as usize - 1];
        assert_eq!((s(f.name), leaf.line[0].line), ("wait_here", 10));
        assert_eq!(s(first.label[0].key), "lock");
        assert_eq!(s(first.label[0].str), "g_lock");
        assert_eq!(back.sample[1].label[0].num, 12);
        assert_eq!(s(back.comment[0]), "a comment");
    }

    #[test]
    fn file_names_follow_the_template() {
        let p = std::path::Path::new("/tmp/out-{kind}.pb.gz");
        assert_eq!(
            path_for(p, "cpu", "pb.gz"),
            std::path::Path::new("/tmp/out-cpu.pb.gz")
        );
        let p = std::path::Path::new("/tmp/prof");
        assert_eq!(
            path_for(p, "lock", "pb.gz"),
            std::path::Path::new("/tmp/prof.lock.pb.gz")
        );
    }

    #[test]
    fn the_build_id_of_this_test_binary_is_read() {
        let exe = std::env::current_exe().unwrap();
        let id = read_build_id(exe.to_str().unwrap());
        // Rust links with --build-id on Linux by default.
        assert!(id.is_some_and(|id| id.len() >= 16 && id.chars().all(|c| c.is_ascii_hexdigit())));
        assert_eq!(read_build_id("/nonexistent"), None);
    }
}
