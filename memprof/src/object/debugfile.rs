//! Separate debug files: where a distribution (or `objcopy
//! --only-keep-debug`) put the symbol table and DWARF a stripped binary
//! lost. Looked up as gdb and perf do: by build id under each debug
//! directory (`/usr/lib/debug/.build-id/ab/cdef….debug`), then by the
//! `.gnu_debuglink` name beside the binary, in its `.debug/` directory and
//! under each debug directory at the binary's own path. A debug-link
//! candidate whose build id differs from the binary's is another build's
//! and is passed over.
//!
//! Debug files fetched from debuginfod servers are found in their cache
//! ([`super::debuginfod`]).
//!
//! Code is symbolized by blazesym, which follows the same links itself;
//! this is for what it does not do: the data symbols (globals) of the
//! debug file's symbol table and the DWARF types of globals.

use std::path::{Path, PathBuf};

use object::Object as _;

/// Where distributions install debug files.
pub const DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

/// What a binary says about its debug file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Links {
    pub build_id: Option<Vec<u8>>,
    /// The `.gnu_debuglink` file name.
    pub debuglink: Option<String>,
    /// Whether the binary has a symbol table of its own (not stripped).
    pub symtab: bool,
    /// Whether it has DWARF of its own.
    pub dwarf: bool,
}

/// Reads the build id, debug link and what symbols the ELF file at `path`
/// has; `None` if it cannot be read or parsed.
pub fn links(path: &Path) -> Option<Links> {
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    Some(Links {
        build_id: file.build_id().ok().flatten().map(<[u8]>::to_vec),
        debuglink: file
            .gnu_debuglink()
            .ok()
            .flatten()
            .and_then(|(name, _crc)| std::str::from_utf8(name).ok().map(String::from)),
        symtab: file.symbol_table().is_some(),
        dwarf: file.section_by_name(".debug_info").is_some(),
    })
}

/// The candidate debug files of the binary at `binary`, most specific
/// first: by build id, then by debug link (the caller checks a debug-link
/// candidate's build id).
pub fn candidates(binary: &Path, links: &Links, dirs: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(id) = links.build_id.as_deref().filter(|id| id.len() > 1) {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        for dir in dirs {
            out.push(
                Path::new(dir)
                    .join(".build-id")
                    .join(&hex[..2])
                    .join(format!("{}.debug", &hex[2..])),
            );
        }
    }
    if let Some(name) = links.debuglink.as_deref().filter(|n| !n.contains('/')) {
        let parent = binary.parent().unwrap_or(Path::new("/"));
        out.push(parent.join(name));
        out.push(parent.join(".debug").join(name));
        let relative = parent.strip_prefix("/").unwrap_or(parent);
        for dir in dirs {
            out.push(Path::new(dir).join(relative).join(name));
        }
    }
    out.retain(|c| c != binary);
    out
}

/// The debug file of the binary at `binary` (a path we can open), if the
/// binary lacks what it holds (its symbol table or its DWARF) and one is
/// installed or was fetched from a debuginfod server ([`super::debuginfod`]).
pub fn find(binary: &Path) -> Option<PathBuf> {
    let own = links(binary)?;
    if own.symtab && own.dwarf {
        return None;
    }
    installed(binary, &own).or_else(|| {
        let id = own.build_id.as_deref()?;
        super::debuginfod::cached(id).filter(|c| same_build(&own, c))
    })
}

/// The installed debug file of `binary`, whose own links are `own`.
pub fn installed(binary: &Path, own: &Links) -> Option<PathBuf> {
    candidates(binary, own, &DEBUG_DIRS)
        .into_iter()
        .filter(|c| c.is_file())
        .find(|c| same_build(own, c))
}

/// Whether the debug file `candidate` is of the same build as the binary
/// whose links are `own`, when both say which.
fn same_build(own: &Links, candidate: &Path) -> bool {
    match (&own.build_id, links(candidate).and_then(|l| l.build_id)) {
        (Some(a), Some(b)) => *a == b,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_first_then_the_debug_link_places() {
        let links = Links {
            build_id: Some(vec![0xab, 0xcd, 0xef, 0x01]),
            debuglink: Some("prog.debug".into()),
            ..Links::default()
        };
        let c = candidates(Path::new("/opt/app/bin/prog"), &links, &DEBUG_DIRS);
        let c: Vec<&str> = c.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            c,
            [
                "/usr/lib/debug/.build-id/ab/cdef01.debug",
                "/lib/debug/.build-id/ab/cdef01.debug",
                "/opt/app/bin/prog.debug",
                "/opt/app/bin/.debug/prog.debug",
                "/usr/lib/debug/opt/app/bin/prog.debug",
                "/lib/debug/opt/app/bin/prog.debug",
            ]
        );
    }

    #[test]
    fn no_links_no_candidates_and_never_the_binary_itself() {
        let none = candidates(Path::new("/bin/p"), &Links::default(), &DEBUG_DIRS);
        assert!(none.is_empty());
        // A link naming the binary itself, or escaping its directory.
        for name in ["p", "../etc/p"] {
            let links = Links {
                debuglink: Some(name.into()),
                ..Links::default()
            };
            let c = candidates(Path::new("/bin/p"), &links, &[]);
            assert!(!c.contains(&PathBuf::from("/bin/p")), "{c:?}");
            assert!(c.iter().all(|p| !p.to_str().unwrap().contains("..")));
        }
    }

    #[test]
    fn this_test_binary_has_its_own_symbols() {
        let exe = std::env::current_exe().unwrap();
        let l = links(&exe).unwrap();
        assert!(l.symtab);
        assert_eq!(find(&exe), None);
        assert_eq!(links(Path::new("/nonexistent")), None);
    }
}
