//! Who defines a symbol: the objects a process (or a command about to
//! run) searches for a name, in the dynamic linker's order, and where in
//! an object the functions of a given name are.
//!
//! The allocator and the lock functions are looked for this way: probing
//! "libc" by name would attach happily and see nothing when the
//! executable or a preloaded library defines the function instead.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use blazesym::inspect::{
    source::{Elf, Source},
    Inspector,
};

use crate::process::{
    command::FinalCommand,
    maps::{self, ProcMaps},
    objects::{self, open_path},
};

/// One probe-able function: the names defined at one address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryPoint {
    /// The names looked for that are defined at this address, in the
    /// order they were asked for (the first is the one to report).
    pub names: Vec<String>,
    /// Offset of the function in the file (what a uprobe attaches to).
    pub file_offset: u64,
}

/// The code objects mapped by process `pid`, in the order the dynamic
/// linker searches them for a symbol: the executable, then other objects,
/// libc last.
pub fn objects_of(pid: u32) -> anyhow::Result<Vec<Arc<str>>> {
    let maps = ProcMaps::read(pid)?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|e| exe_name(&maps, pid, e));
    Ok(candidates(&maps, exe.as_deref()))
}

/// The name of process `pid`'s executable among its mappings: the one that
/// maps the file `/proc/PID/exe` is (its link, `link`, names it in the
/// target's namespace, and says `(deleted)` after it is).
fn exe_name(maps: &ProcMaps, pid: u32, link: PathBuf) -> PathBuf {
    std::fs::metadata(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|meta| {
            maps.mappings()
                .iter()
                .find(|m| m.is_file() && objects::maps_file(m, &meta))
        })
        .map_or_else(
            || {
                // Told by name: the link's, which ends in " (deleted)" then.
                let text = link.to_string_lossy();
                PathBuf::from(text.strip_suffix(" (deleted)").unwrap_or(&text))
            },
            |m| PathBuf::from(&*m.name),
        )
}

/// The objects a command will search for a symbol, before it runs: the
/// executable itself (static binaries, programs defining it themselves),
/// then the `LD_PRELOAD` libraries of the environment it runs with, then
/// the libc we use ourselves.
pub fn objects_for_command(command: &FinalCommand) -> Vec<Arc<str>> {
    let mut candidates: Vec<Arc<str>> = vec![Arc::from(command.exe.to_string_lossy().as_ref())];
    if let Some(preload) = &command.preload {
        let search = command.library_path.as_deref().unwrap_or("");
        candidates.extend(
            preload
                .split([':', ' '])
                .filter(|s| !s.is_empty())
                .filter_map(|name| resolve_library(name, search))
                .map(Arc::from),
        );
    }
    if let Ok(maps) = ProcMaps::read(std::process::id()) {
        candidates.extend(maps.code_files().into_iter().filter(|f| is_libc(f)));
    }
    candidates
}

/// A preloaded library named without a directory is looked up where the
/// dynamic linker looks: `LD_LIBRARY_PATH` (`search`), then the default
/// directories.
fn resolve_library(name: &str, search: &str) -> Option<String> {
    if name.contains('/') {
        return Some(name.to_string());
    }
    let defaults = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/lib",
        "/usr/lib",
    ];
    search
        .split([':', ';'])
        .filter(|d| !d.is_empty())
        .chain(defaults)
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.exists())
        .map(|p| p.to_string_lossy().into_owned())
}

/// Mapped code objects in the order the dynamic linker would search them
/// for `malloc`: the executable, then other objects, libc last.
fn candidates(maps: &ProcMaps, exe: Option<&Path>) -> Vec<Arc<str>> {
    let mut files = maps.code_files();
    let rank = |f: &Arc<str>| {
        if exe.is_some_and(|e| Path::new(&**f) == e) {
            0
        } else if is_libc(f) {
            2
        } else {
            1
        }
    };
    files.sort_by_key(rank); // stable: address order within a rank
    files
}

fn is_libc(path: &str) -> bool {
    maps::is_libc(maps::short_name(path))
}

/// The ELF symbol tables of `path`, which say what it defines.
pub fn elf_source(path: &str) -> Source {
    let mut elf = Elf::new(open_path(path));
    elf.debug_syms = false; // the ELF symbol tables say what is defined
    Source::Elf(elf)
}

/// The functions among `names` that `path` defines, one entry per
/// distinct address (names in `names` order); `None` when its symbols
/// cannot be read.
pub fn entry_points(inspector: &Inspector, path: &str, names: &[&str]) -> Option<Vec<EntryPoint>> {
    let found = match inspector.lookup(&elf_source(path), names) {
        Ok(found) => found,
        Err(e) => {
            tracing::debug!("cannot read the symbols of {path}: {e}");
            return None;
        }
    };
    // Group names by the file offset of their definition. A versioned
    // name may have several (glibc's pthread_cond_wait@GLIBC_2.2.5 for
    // old binaries, @@GLIBC_2.3.2 for new ones): all are entry points.
    let mut by_offset: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for (name, hits) in names.iter().zip(&found) {
        for offset in hits.iter().filter_map(|s| s.file_offset) {
            let names = by_offset.entry(offset).or_default();
            if !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
    }
    Some(
        by_offset
            .into_iter()
            .map(|(file_offset, names)| EntryPoint { names, file_offset })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn search_order_is_exe_then_others_then_libc() {
        let maps = ProcMaps::parse(
            "1000-2000 r-xp 0 0:0 0 /usr/lib/x86_64-linux-gnu/libc.so.6\n\
             3000-4000 r-xp 0 0:0 0 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n\
             5000-6000 r-xp 0 0:0 0 /opt/app/bin/server\n\
             7000-8000 r-xp 0 0:0 0 /usr/lib/x86_64-linux-gnu/libm.so.6\n",
        );
        let order: Vec<String> = candidates(&maps, Some(Path::new("/opt/app/bin/server")))
            .iter()
            .map(|p| maps::short_name(p).to_string())
            .collect();
        assert_eq!(order[0], "server");
        assert_eq!(order.last().map(String::as_str), Some("libc.so.6"));
        assert_eq!(order.len(), 4);
    }
}
