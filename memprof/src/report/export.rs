//! Profile files for the tools people already use: `--pprof` (one
//! gzip-compressed `profile.proto` per concern) and `--flamegraph`
//! (interactive SVG flame graphs of CPU time, allocated bytes and lock
//! delay). Like the JSON report, the files are opened when the session
//! starts (see [`crate::output`]) and written at the end.

use std::{
    fs::File,
    io::Write as _,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

use super::{
    model::{peak_rss, status_kib},
    pprof,
    profiles::{main_object, profiles, ProfileKind, StackProfile},
    Report,
};
use crate::{
    error::{Error, Result},
    output,
};

/// The concerns that get a flame graph, and which value each shows.
const FLAME_KINDS: [(ProfileKind, &str); 3] = [
    (ProfileKind::Cpu, "samples"),
    (ProfileKind::Alloc, "alloc_space"),
    (ProfileKind::Lock, "delay"),
];

/// An open output file for one concern.
struct Out {
    kind: ProfileKind,
    file: File,
    path: PathBuf,
}

/// The profile files asked for, open.
#[derive(Default)]
pub struct ProfileFiles {
    pprof: Vec<Out>,
    flame: Vec<Out>,
}

impl ProfileFiles {
    /// Creates every file now (a bad path fails before tracing): for
    /// `--pprof T`, `T` with `{kind}` replaced, or `T.KIND.pb.gz`; for
    /// `--flamegraph T`, likewise with `.svg`.
    pub fn open(pprof: Option<&Path>, flame: Option<&Path>) -> Result<Self> {
        let mut files = Self::default();
        if let Some(t) = pprof {
            for kind in ProfileKind::ALL {
                let path = pprof::path_for(t, kind.name(), "pb.gz");
                let file = output::create(&path, output::REPORT_MODE, "a pprof profile")?;
                files.pprof.push(Out { kind, file, path });
            }
        }
        if let Some(t) = flame {
            for (kind, _) in FLAME_KINDS {
                let path = pprof::path_for(t, kind.name(), "svg");
                let file = output::create(&path, output::REPORT_MODE, "a flame graph")?;
                files.flame.push(Out { kind, file, path });
            }
        }
        Ok(files)
    }

    pub fn is_empty(&self) -> bool {
        self.pprof.is_empty() && self.flame.is_empty()
    }

    /// Writes every file from `report`. A concern without data gets an
    /// empty profile (no samples) and a flame graph that says so.
    pub fn write(self, report: &Report) -> Result<()> {
        if self.is_empty() {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let rss_before = reset_peak_rss();
        let all = profiles(report);
        let main = main_object(report);
        let start = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64)
            - (report.duration_s * 1e9) as i64;
        let mut ids = std::collections::HashMap::new();
        let mut build_id = |path: &str| -> Option<String> {
            ids.entry(path.to_owned())
                .or_insert_with(|| pprof::read_build_id(path))
                .clone()
        };
        for mut out in self.pprof {
            let empty = StackProfile::empty(out.kind, report);
            let profile = all.iter().find(|p| p.kind == out.kind).unwrap_or(&empty);
            let encoded = pprof::encode(profile, main.as_deref(), start, &mut build_id);
            let bytes = pprof::to_gzip(&encoded).map_err(|source| failed(&out.path, source))?;
            out.file
                .write_all(&bytes)
                .map_err(|source| failed(&out.path, source))?;
            eprintln!(
                "memprof-ebpf: {} profile ({} samples) written to {}",
                out.kind.name(),
                profile.samples.len(),
                out.path.display()
            );
        }
        for (mut out, (_, value)) in self.flame.into_iter().zip(FLAME_KINDS) {
            let profile = all.iter().find(|p| p.kind == out.kind);
            let svg = super::flame::svg(profile, out.kind, value);
            out.file
                .write_all(svg.as_bytes())
                .map_err(|source| failed(&out.path, source))?;
            eprintln!(
                "memprof-ebpf: {} flame graph written to {}",
                out.kind.name(),
                out.path.display()
            );
        }
        // For `cargo xtask bench --only export`: what writing them cost.
        let extra = peak_rss().zip(rss_before).map(|(p, b)| p.saturating_sub(b));
        eprintln!(
            "memprof-ebpf: profiles written in {} ms (peak memory +{})",
            started.elapsed().as_millis(),
            extra.map_or("unknown".into(), |b| format!(
                "{:.1} MiB",
                b as f64 / 1048576.0
            ))
        );
        Ok(())
    }
}

/// This process's resident memory now, after resetting its peak (`VmHWM`)
/// to it (`clear_refs` 5, Linux 4.0 and later), in bytes.
fn reset_peak_rss() -> Option<u64> {
    std::fs::write("/proc/self/clear_refs", "5").ok()?;
    status_kib("VmRSS:").map(|k| k * 1024)
}

fn failed(path: &Path, source: std::io::Error) -> Error {
    Error::Output {
        what: "a profile",
        path: path.to_owned(),
        source,
    }
}
