//! Which file a mapping is, and how we open it.
//!
//! A target's mappings name files as the target sees them: in its own
//! mount namespace (a container's root filesystem, a service's private
//! `/tmp`), or files since deleted or replaced on disk (a package upgrade
//! under a running service). Opening that name in our namespace finds
//! another file or none. So each mapped file is identified by its (device,
//! inode), as `/proc/PID/maps` gives them, and opened the first time it is
//! seen by the first of these that works:
//! 1. `/proc/PID/map_files/START-END`, the mapped file itself (deleted,
//!    replaced, on a filesystem only the target sees, or not);
//! 2. `/proc/PID/root/NAME`, the name resolved in the target's root and
//!    mount namespace, if it is that file;
//! 3. the name in our namespace, if it is that file.
//!
//! The file is kept open and read through `/proc/self/fd/N`, so it is the
//! file the target maps even if the name is replaced or deleted during the
//! session, and it stays readable after the target exits (and its
//! namespace with it): symbolization happens at the end. Every reader of
//! the target's files opens [`open_path`] of the name, never the name
//! itself. Only code files (mapped executable somewhere) are handled so:
//! data files and shared memory keep their names, and are not held.
//!
//! An executable started by a symbolic link beside it is named by the
//! link (`started_as`: Debian's `redis-server`, a link to
//! `redis-check-rdb`). One file mapped under different names (two
//! processes in different namespaces, or started by different links) is
//! one object, named as first seen; two different files
//! under one name (the host's and a container's libc) are two objects, the
//! later one named `/proc/PID/root/NAME` after the process it was found in,
//! which keeps its file name for display.

use std::{
    collections::{HashMap, HashSet},
    fs::File,
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::PathBuf,
    sync::{Arc, Mutex},
};

use super::maps::Mapping;

/// A file's identity: device (major << 32 | minor, as in the maps) and
/// inode.
type FileId = (u64, u64);

/// The files seen, by identity, and how each name is opened.
#[derive(Default)]
struct Objects {
    names: HashMap<FileId, Arc<str>>,
    /// Names that are not opened as themselves: the path to open, and the
    /// open file it points into (`/proc/self/fd/N`).
    reached: HashMap<Arc<str>, (PathBuf, File)>,
    /// Names given, with the file they name.
    taken: HashMap<Arc<str>, FileId>,
}

static OBJECTS: Mutex<Option<Objects>> = Mutex::new(None);

/// The path at which we open the file the target names `name` (a name as
/// given by [`name_mappings`]).
pub fn open_path(name: &str) -> PathBuf {
    let objects = OBJECTS.lock().unwrap_or_else(|e| e.into_inner());
    objects
        .as_ref()
        .and_then(|o| o.reached.get(name))
        .map_or_else(|| PathBuf::from(name), |(path, _)| path.clone())
}

/// Gives the mappings of code files of process `pid` (files it maps
/// executable, and their other mappings) the names we know those files by
/// (see the module documentation), reaching files seen for the first
/// time. Other mappings (data files, shared memory, devices) keep the
/// names the target gives them.
pub fn name_mappings(pid: u32, mappings: &mut [Mapping]) {
    let code: HashSet<FileId> = mappings
        .iter()
        .filter(|m| m.executable && m.is_file() && m.inode != 0)
        .map(|m| (m.dev, m.inode))
        .collect();
    if code.is_empty() {
        return;
    }
    let mut guard = OBJECTS.lock().unwrap_or_else(|e| e.into_inner());
    let objects = guard.get_or_insert_with(Objects::default);
    for m in mappings.iter_mut() {
        let id = (m.dev, m.inode);
        if !code.contains(&id) {
            continue;
        }
        if let Some(name) = objects.names.get(&id) {
            m.name = name.clone();
        } else if let Some(name) = objects.reach(pid, m, id) {
            objects.names.insert(id, name.clone());
            m.name = name;
        }
    }
}

impl Objects {
    /// The name of a file not seen before, reached and held open as the
    /// module documentation says; None if it cannot be opened (the
    /// process is gone): it is tried again at the next sighting.
    fn reach(&mut self, pid: u32, m: &Mapping, id: FileId) -> Option<Arc<str>> {
        let name = m.name.clone();
        let in_root = format!("/proc/{pid}/root{name}");
        let same = |f: &File| f.metadata().is_ok_and(|meta| same_file(&meta, id));
        // The mapped file itself first: it is that file whatever the
        // filesystem's device numbers (btrfs, overlayfs) say; then the
        // name in the target's root, and in ours, if they are that file.
        let file = open(&format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end))
            .or_else(|| open(&in_root).filter(same))
            .or_else(|| open(&name).filter(same))
            .filter(|f| f.metadata().is_ok_and(|meta| meta.is_file()));
        let Some(file) = file else {
            tracing::debug!("cannot reach {name} of process {pid}");
            return None;
        };
        let name = started_as(pid, &name, id).unwrap_or(name);
        let in_root = format!("/proc/{pid}/root{name}");
        let free = self.taken.get(&name).is_none_or(|&other| other == id);
        let name: Arc<str> = if free { name } else { Arc::from(in_root) };
        let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
        tracing::debug!("{name} of process {pid} is read at {}", path.display());
        crate::object::debuginfod::prefetch(&path);
        self.taken.insert(name.clone(), id);
        self.reached.insert(name.clone(), (path, file));
        Some(name)
    }
}

/// The name a process was started by, where that is a symbolic link to
/// its executable `name` (the file `id`) beside it: Debian's
/// `redis-server` is a link to `redis-check-rdb`, and the maps name the
/// file the link resolves to, so every frame of the server read
/// `(redis-check-rdb)`. Users know the program as `ps` and `top` show
/// it: by its `comm`, the name of what was executed (cut at 15 bytes).
/// None for other files, or when no link beside the file by that name
/// is the file.
fn started_as(pid: u32, name: &str, id: FileId) -> Option<Arc<str>> {
    let exe = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
    if !same_file(&exe, id) {
        return None;
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let comm = comm.trim_end_matches('\n');
    let (dir, file) = name.rsplit_once('/')?;
    if comm.is_empty() || comm.contains('/') || file == comm {
        return None;
    }
    let in_root = format!("/proc/{pid}/root{dir}");
    let is_link_to_file = |entry: &str| {
        let at = format!("{in_root}/{entry}");
        std::fs::symlink_metadata(&at).is_ok_and(|m| m.file_type().is_symlink())
            && std::fs::metadata(&at).is_ok_and(|m| same_file(&m, id))
    };
    let entry = if comm.len() < COMM_MAX {
        is_link_to_file(comm).then(|| comm.to_string())
    } else if file.starts_with(comm) {
        None // cut short, and the file's own name may be what was run
    } else {
        // Cut short: the one link whose name begins so, if only one does.
        let mut links = std::fs::read_dir(&in_root).ok()?.filter_map(|e| {
            let entry = e.ok()?.file_name().into_string().ok()?;
            (entry.starts_with(comm) && is_link_to_file(&entry)).then_some(entry)
        });
        links.next().filter(|_| links.next().is_none())
    }?;
    tracing::debug!("{name} of process {pid} is named {dir}/{entry}, as it was started");
    Some(Arc::from(format!("{dir}/{entry}")))
}

/// The longest `comm` the kernel keeps (`TASK_COMM_LEN` less its NUL).
const COMM_MAX: usize = 15;

/// Opens `path` to read, without side effects on a device or FIFO (never
/// expected among code files, but the names come from the target).
fn open(path: &str) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .ok()
}

/// Whether `meta` is the file `id` of the maps (whose device is
/// major << 32 | minor).
fn same_file(meta: &std::fs::Metadata, (dev, inode): FileId) -> bool {
    let major = u64::from(libc::major(meta.dev()));
    let minor = u64::from(libc::minor(meta.dev()));
    meta.ino() == inode && (major << 32 | minor) == dev
}

/// Whether mapping `m` maps the file `meta` describes.
pub fn maps_file(m: &Mapping, meta: &std::fs::Metadata) -> bool {
    same_file(meta, (m.dev, m.inode))
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::symlink, path::Path};

    use crate::process::maps::ProcMaps;

    /// The name the mappings give the executable `program` is mapped
    /// by, once it has exec'd (one whose file name is in `names`).
    fn exe_name(program: &Path, names: &[&str]) -> Option<String> {
        let mut child = std::process::Command::new(program)
            .arg("5")
            .spawn()
            .expect("starting sleep");
        let mut name = None;
        for _ in 0..400 {
            let maps = ProcMaps::read(child.id()).unwrap_or_default();
            name = maps
                .mappings()
                .iter()
                .find(|m| m.executable && names.iter().any(|n| m.name.ends_with(n)))
                .map(|m| m.name.to_string());
            if name.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let _ = child.kill();
        let _ = child.wait();
        name
    }

    /// A program started by a link beside its file is named by the link
    /// (Debian's `redis-server`, a link to `redis-check-rdb`); one
    /// started by its own name keeps it. Two copies of `sleep`: a file
    /// is named as first seen.
    #[test]
    fn a_program_started_by_a_link_is_named_by_it() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let at = |name: &str| dir.path().join(name);
        for copy in ["real-sleeper", "own-sleeper"] {
            std::fs::copy("/bin/sleep", at(copy)).expect("copying sleep");
        }
        symlink("real-sleeper", at("sleeper-link")).expect("making the link");
        let names = ["/real-sleeper", "/sleeper-link"];
        assert_eq!(
            exe_name(&at("sleeper-link"), &names),
            Some(at("sleeper-link").to_string_lossy().into_owned()),
            "started by the link"
        );
        assert_eq!(
            exe_name(&at("own-sleeper"), &["/own-sleeper"]),
            Some(at("own-sleeper").to_string_lossy().into_owned()),
            "started by its own name"
        );
    }
}
