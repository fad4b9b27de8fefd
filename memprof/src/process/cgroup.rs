//! A cgroup (v2) as the target (`--cgroup`): where it is, the ids of it
//! and the cgroups below it (what the kernel programs compare a task's
//! cgroup with), and the processes in them.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// A cgroup of the unified (v2) hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    /// Its directory.
    pub dir: PathBuf,
}

/// Where the unified hierarchy is mounted, from `mountinfo` (e.g.
/// `/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on hybrid systems).
pub fn unified_root(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let fstype = after.split_whitespace().next()?;
        let mount_point = before.split_whitespace().nth(4)?;
        (fstype == "cgroup2").then(|| PathBuf::from(mount_point))
    })
}

impl Cgroup {
    /// What the report says of a `--cgroup` session with `count` processes
    /// at its start.
    pub fn start_note(&self, count: usize) -> String {
        format!(
            "cgroup {}: {count} process{} at the start; those started in it later are \
             traced from their exec, those moved into it within a second",
            self.dir.display(),
            if count == 1 { "" } else { "es" }
        )
    }

    /// Finds the cgroup `spec` names: a directory of the unified hierarchy
    /// (absolute, or relative to its root), or a systemd unit (or slice,
    /// scope) name, looked for anywhere in it.
    pub fn resolve(spec: &str) -> Result<Self> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let root = unified_root(&mountinfo).ok_or_else(|| {
            Error::Usage(format!(
                "--cgroup {spec}: no cgroup v2 hierarchy is mounted (mount -t cgroup2 none \
                 /sys/fs/cgroup)"
            ))
        })?;
        let dir = Self::find_dir(&root, spec).and_then(|d| d.canonicalize().ok());
        let dir = dir.filter(|d| d.starts_with(&root)).ok_or_else(|| {
            Error::Usage(format!(
                "--cgroup {spec}: no such cgroup under {} (give its directory, a path \
                 relative to it, or a systemd unit name)",
                root.display()
            ))
        })?;
        Ok(Self { dir })
    }

    /// The directory `spec` names under `root` (see [`Cgroup::resolve`]).
    fn find_dir(root: &Path, spec: &str) -> Option<PathBuf> {
        let is_cgroup = |d: &Path| d.join("cgroup.procs").is_file();
        let given = Path::new(spec);
        if given.is_absolute() && given.starts_with(root) && is_cgroup(given) {
            return Some(given.to_path_buf());
        }
        // `/sys/fs/cgroup/x` on a hybrid system, or `x` or `/x`.
        let relative = given
            .strip_prefix("/sys/fs/cgroup")
            .or_else(|_| given.strip_prefix("/"))
            .unwrap_or(given);
        let under = root.join(relative);
        if is_cgroup(&under) {
            return Some(under);
        }
        if spec.contains('/') {
            return None;
        }
        // A unit name: breadth-first, so the shallowest match wins.
        let mut queue = vec![root.to_path_buf()];
        while let Some(dir) = queue.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                if entry.file_name() == spec && is_cgroup(&path) {
                    return Some(path);
                }
                queue.insert(0, path);
            }
        }
        None
    }

    /// The cgroup's directory and those of the cgroups below it.
    fn tree(&self) -> Vec<PathBuf> {
        let mut all = Vec::new();
        let mut dirs = vec![self.dir.clone()];
        while let Some(dir) = dirs.pop() {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            all.push(dir);
        }
        all
    }

    /// The kernel's ids of the cgroup and those below it (a cgroup's id is
    /// its directory's inode number), for the exec tracepoint's filter.
    pub fn ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .tree()
            .iter()
            .filter_map(|d| std::fs::metadata(d).ok())
            .map(|m| m.ino())
            .collect();
        ids.sort_unstable();
        ids
    }

    /// The processes in the cgroup and the cgroups below it, in pid order,
    /// except ours (a profiler started inside the cgroup).
    pub fn processes(&self) -> Vec<u32> {
        let me = std::process::id();
        let mut pids: Vec<u32> = self
            .tree()
            .iter()
            .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
            .flat_map(|text| {
                text.lines()
                    .filter_map(|l| l.trim().parse::<u32>().ok())
                    .collect::<Vec<_>>()
            })
            .filter(|&p| p != me)
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unified_hierarchy_is_found_in_mountinfo() {
        let hybrid = "\
35 24 0:30 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
36 35 0:31 / /sys/fs/cgroup/unified rw,nosuid,nodev - cgroup2 cgroup2 rw
37 35 0:32 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu";
        assert_eq!(
            unified_root(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let pure = "30 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(unified_root(pure), Some(PathBuf::from("/sys/fs/cgroup")));
        assert_eq!(unified_root("1 0 8:1 / / rw - ext4 /dev/sda1 rw"), None);
    }

    /// A directory tree standing for a hierarchy: paths, relative paths
    /// and unit names find the right directory; a file named like a unit
    /// or a path outside the tree does not.
    #[test]
    fn cgroups_are_found_by_path_or_unit_name() {
        let root = std::env::temp_dir().join(format!("memprof-cgroups-{}", std::process::id()));
        let unit = root.join("system.slice/redis.service");
        std::fs::create_dir_all(&unit).unwrap();
        for d in [&root, &root.join("system.slice"), &unit] {
            std::fs::write(d.join("cgroup.procs"), "").unwrap();
        }
        std::fs::write(unit.join("cgroup.procs"), "12\n7\n").unwrap();
        let leaf = unit.join("worker");
        std::fs::create_dir_all(&leaf).unwrap();
        std::fs::write(leaf.join("cgroup.procs"), "9\n12\n").unwrap();
        let find = |spec: &str| Cgroup::find_dir(&root, spec);
        assert_eq!(find("redis.service"), Some(unit.clone()));
        assert_eq!(find("system.slice/redis.service"), Some(unit.clone()));
        assert_eq!(find("/system.slice/redis.service"), Some(unit.clone()));
        assert_eq!(find(unit.to_str().unwrap()), Some(unit.clone()));
        assert_eq!(find("cgroup.procs"), None);
        assert_eq!(find("nginx.service"), None);
        assert_eq!(find("system.slice/nginx.service"), None);
        let cgroup = Cgroup { dir: unit.clone() };
        assert_eq!(cgroup.processes(), [7, 9, 12], "with descendants");
        let ids = cgroup.ids();
        let ino = |d: &Path| std::fs::metadata(d).unwrap().ino();
        let mut want = vec![ino(&unit), ino(&leaf)];
        want.sort_unstable();
        assert_eq!(ids, want, "its id and its descendant's");
        std::fs::remove_dir_all(&root).unwrap();
    }
}
