//! Files the tool writes (the JSON report, `--log-file`, `--command-output`),
//! created safely although the tool runs as root in somebody's directory.
//!
//! - The last path component is never followed if it is a symbolic link
//!   (`O_NOFOLLOW`), and a FIFO or device there is never opened for long
//!   (`O_NONBLOCK`, then checked).
//! - A file that already exists is reused only when it is a regular file
//!   with one link, owned by the user who ran the tool; anything else is
//!   refused with a usage error (exit status 2) that says why. It is
//!   truncated only after those checks.
//! - Under `sudo`, files are handed to the user who ran sudo
//!   (`SUDO_UID`/`SUDO_GID`), not left owned by root in their directory.
//!
//! Files are opened when the session starts, before any probe is attached
//! and before the tool gives up the privileges it no longer needs, and
//! written through the open descriptor at the end.

use std::{
    fs::File,
    os::{
        fd::{AsRawFd, FromRawFd},
        unix::{ffi::OsStrExt, fs::MetadataExt},
    },
    path::Path,
};

use crate::error::{Error, Result};

/// Mode of reports and captured output.
pub const REPORT_MODE: u32 = 0o644;
/// Mode of log files (they may name paths and addresses of the target).
pub const LOG_MODE: u32 = 0o600;

/// The user on whose behalf files are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
    /// Whether files must be handed over (we are root acting for another
    /// user, under sudo).
    pub hand_over: bool,
}

impl Invoker {
    /// Who ran us: the sudo user when running as root under sudo, else our
    /// own effective ids.
    pub fn current() -> Self {
        // SAFETY: geteuid and getegid have no preconditions.
        let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Self::from_env(
            euid,
            egid,
            std::env::var("SUDO_UID").ok().as_deref(),
            std::env::var("SUDO_GID").ok().as_deref(),
        )
    }

    /// [`Invoker::current`] from its inputs. `SUDO_*` count only when we
    /// run as root (sudo sets them; a user cannot gain anything by setting
    /// them for an unprivileged run) and both parse.
    pub fn from_env(euid: u32, egid: u32, sudo_uid: Option<&str>, sudo_gid: Option<&str>) -> Self {
        let parse = |v: Option<&str>| v.and_then(|s| s.trim().parse::<u32>().ok());
        match (euid, parse(sudo_uid), parse(sudo_gid)) {
            (0, Some(uid), Some(gid)) if uid != 0 => Self {
                uid,
                gid,
                hand_over: true,
            },
            _ => Self {
                uid: euid,
                gid: egid,
                hand_over: false,
            },
        }
    }
}

/// Creates (or safely reuses) `path` for writing, with `mode` for a new
/// file. `what` names the file in messages ("the JSON report").
pub fn create(path: &Path, mode: u32, what: &'static str) -> Result<File> {
    create_for(path, mode, what, Invoker::current())
}

/// [`create`] on behalf of `invoker`.
pub fn create_for(path: &Path, mode: u32, what: &'static str, invoker: Invoker) -> Result<File> {
    let refuse = |reason: String| {
        Error::Usage(format!(
            "refusing to write {what} to {}: {reason}",
            path.display()
        ))
    };
    let io_error = |source: std::io::Error| Error::Output {
        what,
        path: path.to_path_buf(),
        source,
    };
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| refuse("the path contains a NUL byte".into()))?;
    let flags =
        libc::O_WRONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;

    // A new file: O_EXCL makes sure we created it and nothing was there.
    // SAFETY: `c_path` is a valid NUL-terminated string; open does not keep it.
    let fd = unsafe { libc::open(c_path.as_ptr(), flags | libc::O_CREAT | libc::O_EXCL, mode) };
    if fd >= 0 {
        // SAFETY: open returned a new descriptor that nothing else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        if invoker.hand_over {
            // SAFETY: fchown on a descriptor we own.
            if unsafe { libc::fchown(file.as_raw_fd(), invoker.uid, invoker.gid) } != 0 {
                return Err(io_error(std::io::Error::last_os_error()));
            }
        }
        return blocking(file).map_err(io_error);
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EEXIST) => {}
        Some(libc::EISDIR) => return Err(refuse("it is a directory".into())),
        _ => return Err(io_error(err)),
    }

    // Something is there. Get a handle on exactly that (O_PATH: nothing is
    // opened for reading or writing, so a device or FIFO has no effect),
    // never following a symlink, and judge what the handle points at.
    // SAFETY: as above.
    let fd = unsafe {
        libc::open(
            c_path.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io_error(std::io::Error::last_os_error()));
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    let handle = unsafe { File::from_raw_fd(fd) };
    let meta = handle.metadata().map_err(io_error)?;
    if let Some(reason) = unsafe_to_reuse(&meta, &invoker) {
        return Err(refuse(reason));
    }
    // Open that very inode for writing through the handle.
    let reopen = std::ffi::CString::new(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(|_| refuse("cannot name its descriptor".into()))?;
    // SAFETY: as above.
    let fd = unsafe { libc::open(reopen.as_ptr(), flags & !libc::O_NOFOLLOW) };
    if fd < 0 {
        return Err(io_error(std::io::Error::last_os_error()));
    }
    // SAFETY: open returned a new descriptor that nothing else owns.
    let file = unsafe { File::from_raw_fd(fd) };
    let again = file.metadata().map_err(io_error)?;
    if (again.dev(), again.ino()) != (meta.dev(), meta.ino()) {
        return Err(refuse("it changed while being opened".into()));
    }
    file.set_len(0).map_err(io_error)?;
    // A reused file gets the mode a new one would have (a log: 0600).
    // SAFETY: fchmod on a descriptor we own.
    if unsafe { libc::fchmod(file.as_raw_fd(), mode) } != 0 {
        return Err(io_error(std::io::Error::last_os_error()));
    }
    blocking(file).map_err(io_error)
}

/// Why an existing file must not be written over, if it must not: only a
/// regular file of the invoker's, with no other name, is reused.
fn unsafe_to_reuse(meta: &std::fs::Metadata, invoker: &Invoker) -> Option<String> {
    let kind = meta.file_type();
    if kind.is_symlink() {
        return Some("it is a symbolic link".into());
    }
    if kind.is_dir() {
        return Some("it is a directory".into());
    }
    if !kind.is_file() {
        return Some("it is not a regular file (a FIFO, socket or device)".into());
    }
    if meta.uid() != invoker.uid {
        return Some(format!(
            "it belongs to uid {}, not to you (uid {}); remove it or choose another path",
            meta.uid(),
            invoker.uid
        ));
    }
    if meta.nlink() != 1 {
        return Some(format!(
            "it has {} hard links, so writing it would change another file too",
            meta.nlink()
        ));
    }
    None
}

/// Clears `O_NONBLOCK` (set only so that opening a FIFO cannot hang).
fn blocking(file: File) -> std::io::Result<File> {
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own, with plain integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, os::unix::fs::PermissionsExt};

    use super::*;

    fn me() -> Invoker {
        // SAFETY: geteuid and getegid have no preconditions.
        let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
        Invoker {
            uid,
            gid,
            hand_over: false,
        }
    }

    fn usage(e: Error) -> String {
        match e {
            Error::Usage(m) => m,
            other => panic!("expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn sudo_ids_count_only_for_root() {
        let sudo = Invoker::from_env(0, 0, Some("1000"), Some("1001"));
        assert_eq!((sudo.uid, sudo.gid, sudo.hand_over), (1000, 1001, true));
        let plain_root = Invoker::from_env(0, 0, None, None);
        assert_eq!((plain_root.uid, plain_root.hand_over), (0, false));
        let user = Invoker::from_env(1000, 1000, Some("0"), Some("0"));
        assert_eq!((user.uid, user.hand_over), (1000, false));
        let garbage = Invoker::from_env(0, 0, Some("x"), Some("1"));
        assert!(!garbage.hand_over);
        let sudo_to_root = Invoker::from_env(0, 0, Some("0"), Some("0"));
        assert!(!sudo_to_root.hand_over);
    }

    #[test]
    fn a_new_file_gets_the_mode_and_an_old_one_is_truncated() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("report.json");
        let mut f = create_for(&path, LOG_MODE, "the test file", me()).unwrap();
        f.write_all(b"first, longer content").unwrap();
        drop(f);
        assert_eq!(std::fs::metadata(&path).unwrap().mode() & 0o777, 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut f = create_for(&path, LOG_MODE, "the test file", me()).unwrap();
        f.write_all(b"second").unwrap();
        drop(f);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second");
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            0o600,
            "a reused log gets the log's mode"
        );
    }

    #[test]
    fn a_symlink_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, "keep me").unwrap();
        let link = dir.path().join("memprof-ebpf.log");
        std::os::unix::fs::symlink(&canary, &link).unwrap();
        let msg = usage(create_for(&link, LOG_MODE, "the log", me()).unwrap_err());
        assert!(msg.contains("symbolic link"), "{msg}");
        // A dangling link is refused too (O_EXCL does not follow it).
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        let msg = usage(create_for(&dangling, LOG_MODE, "the log", me()).unwrap_err());
        assert!(msg.contains("symbolic link"), "{msg}");
        assert!(!dir.path().join("nowhere").exists());
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "keep me");
    }

    #[test]
    fn hard_links_fifos_directories_and_other_owners_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("canary");
        std::fs::write(&canary, "keep me").unwrap();
        let hard = dir.path().join("hard");
        std::fs::hard_link(&canary, &hard).unwrap();
        let msg = usage(create_for(&hard, REPORT_MODE, "the report", me()).unwrap_err());
        assert!(msg.contains("hard links"), "{msg}");
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "keep me");

        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let msg = usage(create_for(&fifo, REPORT_MODE, "the report", me()).unwrap_err());
        assert!(msg.contains("FIFO"), "{msg}");

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        let msg = usage(create_for(&sub, REPORT_MODE, "the report", me()).unwrap_err());
        assert!(msg.contains("directory"), "{msg}");

        let null = Path::new("/dev/null");
        let msg = usage(create_for(null, REPORT_MODE, "the report", me()).unwrap_err());
        assert!(msg.contains("not a regular file"), "{msg}");

        let other = Invoker {
            uid: me().uid + 1,
            ..me()
        };
        let msg = usage(create_for(&canary, REPORT_MODE, "the report", other).unwrap_err());
        assert!(msg.contains("belongs to uid"), "{msg}");
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "keep me");
    }
}
