//! tracefs: finding (or mounting) it, and reading tracepoint record layouts.
//!
//! Tracepoint records change layout between kernel versions, and our
//! tracepoint programs are compiled once, so the loader reads the offsets
//! of the fields they need from the `format` files and passes them in as
//! load-time globals.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

const CANDIDATES: [&str; 2] = ["sys/kernel/tracing", "sys/kernel/debug/tracing"];

/// Returns the tracefs directory, mounting tracefs at `/sys/kernel/tracing`
/// if no mounted copy is found (it is not mounted at boot on every system).
pub fn ensure_mounted(root: &Path) -> Result<PathBuf> {
    if let Some(found) = find(root) {
        return Ok(found);
    }
    let target = root.join(CANDIDATES[0]);
    let status = std::process::Command::new("mount")
        .args(["-t", "tracefs", "nodev"])
        .arg(&target)
        .stderr(std::process::Stdio::piped())
        .output();
    match status {
        Ok(out) if out.status.success() && find(root).is_some() => {
            tracing::info!("mounted tracefs at {}", target.display());
            Ok(target)
        }
        Ok(out) => Err(not_mounted(&String::from_utf8_lossy(&out.stderr))),
        Err(e) => Err(not_mounted(&e.to_string())),
    }
}

fn find(root: &Path) -> Option<PathBuf> {
    CANDIDATES
        .iter()
        .map(|c| root.join(c))
        .find(|p| p.join("events").is_dir())
}

fn not_mounted(why: &str) -> Error {
    Error::KernelFeature {
        feature: "tracefs",
        hint: format!(
            "tracefs is not mounted and mounting it failed ({}); mount it with \
             `mount -t tracefs nodev /sys/kernel/tracing` (kernel needs CONFIG_TRACING)",
            why.trim()
        ),
    }
}

/// A field of a tracepoint record, from its `format` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    pub offset: u32,
    pub size: u32,
}

/// Parses a tracepoint `format` file into its fields.
pub fn parse_format(text: &str) -> Vec<Field> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim().strip_prefix("field:")?;
            let mut parts = line.split(';').map(str::trim);
            let decl = parts.next()?;
            let mut offset = None;
            let mut size = None;
            for part in parts {
                if let Some(v) = part.strip_prefix("offset:") {
                    offset = v.parse().ok();
                } else if let Some(v) = part.strip_prefix("size:") {
                    size = v.parse().ok();
                }
            }
            // "char comm[16]" -> "comm"; "__data_loc char[] name" -> "name".
            let name = decl.split_whitespace().last()?;
            let name = name.split('[').next()?.to_string();
            Some(Field {
                name,
                offset: offset?,
                size: size?,
            })
        })
        .collect()
}

/// Offset of `field` in tracepoint `category:event`, checking its size.
pub fn field_offset(
    tracefs: &Path,
    category: &str,
    event: &str,
    field: &str,
    size: u32,
) -> Result<u32> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(event)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::KernelFeature {
        feature: "a needed tracepoint",
        hint: format!("cannot read {}: {e}", path.display()),
    })?;
    parse_format(&text)
        .into_iter()
        .find(|f| f.name == field && f.size == size)
        .map(|f| f.offset)
        .ok_or_else(|| Error::KernelFeature {
            feature: "a needed tracepoint field",
            hint: format!("{category}:{event} has no {size}-byte field `{field}` on this kernel"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEWTASK: &str = "name: task_newtask
ID: 155
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;
\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;
\tfield:__data_loc char[] filename;\toffset:40;\tsize:4;\tsigned:0;

print fmt: \"pid=%d\"
";

    #[test]
    fn parses_fields_of_every_shape() {
        let fields = parse_format(NEWTASK);
        let get = |n: &str| fields.iter().find(|f| f.name == n).cloned();
        assert_eq!(
            get("pid"),
            Some(Field {
                name: "pid".into(),
                offset: 8,
                size: 4
            })
        );
        assert_eq!(get("comm").map(|f| (f.offset, f.size)), Some((12, 16)));
        assert_eq!(get("clone_flags").map(|f| f.offset), Some(32));
        assert_eq!(get("filename").map(|f| f.offset), Some(40));
        assert_eq!(fields.len(), 6);
    }

    #[test]
    fn field_offset_reads_and_checks_size() {
        let dir = tempfile::tempdir().unwrap();
        let ev = dir.path().join("events/task/task_newtask");
        std::fs::create_dir_all(&ev).unwrap();
        std::fs::write(ev.join("format"), NEWTASK).unwrap();
        assert_eq!(
            field_offset(dir.path(), "task", "task_newtask", "clone_flags", 8).unwrap(),
            32
        );
        let err = field_offset(dir.path(), "task", "task_newtask", "clone_flags", 4).unwrap_err();
        assert_eq!(err.exit_code(), crate::error::exit_code::KERNEL_FEATURE);
        assert!(field_offset(dir.path(), "task", "nope", "pid", 4).is_err());
    }

    #[test]
    fn finds_a_mounted_tree() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find(dir.path()).is_none());
        std::fs::create_dir_all(dir.path().join("sys/kernel/debug/tracing/events")).unwrap();
        assert_eq!(
            find(dir.path()),
            Some(dir.path().join("sys/kernel/debug/tracing"))
        );
    }
}
