//! The traced process, and how we learn that it exited.

use std::{
    os::fd::{FromRawFd, OwnedFd},
    path::Path,
    time::Duration,
};

use tokio::io::unix::AsyncFd;

use super::{
    command::FinalCommand,
    launch::{self, Launched},
    procfs::command_line,
};
use crate::{
    error::{Error, Result},
    kernel::{preflight, rings::readable},
};

/// How long a launched command gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// What to trace.
#[derive(Debug, Clone)]
pub enum TargetSpec {
    Pid(u32),
    Command(Vec<String>),
}

/// An attached process or a launched command.
pub enum TargetHandle {
    Attached {
        pid: u32,
        exit: Option<AsyncFd<OwnedFd>>,
    },
    Launched(Launched),
}

impl TargetHandle {
    /// The process to trace: attached, or launched and held at its gate.
    /// Returns it with its command line and, when launched, what it
    /// finally runs (seen through `env`).
    pub fn open(
        root: &Path,
        spec: &TargetSpec,
        output: &launch::Output,
        run_as: Option<&launch::RunAs>,
        notes: &mut Vec<String>,
    ) -> Result<(Self, String, Option<FinalCommand>)> {
        match spec {
            TargetSpec::Pid(pid) => {
                let tgid = preflight::check_pid(root, *pid)?;
                if tgid != *pid {
                    notes.push(format!(
                        "{pid} is a thread of process {tgid}: all of its threads are traced"
                    ));
                }
                let handle = TargetHandle::Attached {
                    pid: tgid,
                    exit: pidfd(tgid)?,
                };
                let command = command_line(tgid).ok_or(Error::NoSuchProcess { pid: *pid })?;
                Ok((handle, command, None))
            }
            TargetSpec::Command(cmd) => {
                let launched = Launched::spawn(cmd, output, run_as)?;
                let inherited = |name: &str| std::env::var_os(name);
                let last = super::command::final_command(cmd, &inherited).or_else(|| {
                    // `env -S ...` and the like: the command itself, as
                    // our environment has it.
                    Some(FinalCommand {
                        exe: super::launch::resolve(cmd.first()?, inherited("PATH"))?,
                        preload: std::env::var("LD_PRELOAD").ok(),
                        library_path: std::env::var("LD_LIBRARY_PATH").ok(),
                        through: 0,
                    })
                });
                Ok((TargetHandle::Launched(launched), cmd.join(" "), last))
            }
        }
    }

    pub fn pid(&self) -> u32 {
        match self {
            TargetHandle::Attached { pid, .. } => *pid,
            TargetHandle::Launched(l) => l.pid,
        }
    }

    pub fn launched(&self) -> bool {
        matches!(self, TargetHandle::Launched(_))
    }

    /// Resolves when the process has exited.
    pub async fn exited(&mut self) {
        match self {
            TargetHandle::Attached { exit: Some(fd), .. } => {
                // A pidfd becomes readable when the process exits.
                let _ = fd.readable().await;
            }
            TargetHandle::Attached { pid, exit: None } => loop {
                // No pidfd support: poll. Check first: the event loop
                // re-creates this future more often than it sleeps.
                if !Path::new(&format!("/proc/{pid}")).exists() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            },
            TargetHandle::Launched(l) => l.wait().await,
        }
    }

    /// Ends a launched command that is still running: SIGTERM, then SIGKILL
    /// after a grace period. Returns a note for the report, if it ran.
    pub async fn stop_launched(&mut self) -> Option<String> {
        let TargetHandle::Launched(l) = self else {
            return None;
        };
        if let Some(pid) = l.child.id() {
            // SAFETY: kill with a pid we spawned and have not reaped.
            unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        }
        if tokio::time::timeout(TERM_GRACE, l.wait()).await.is_err() {
            let _ = l.child.start_kill();
            l.wait().await;
            Some("the command ignored SIGTERM at the end of the session and was killed".into())
        } else {
            Some("the command was stopped with SIGTERM at the end of the session".into())
        }
    }
}

/// Opens a pidfd for `pid`, registered with tokio.
fn pidfd(pid: u32) -> Result<Option<AsyncFd<OwnedFd>>> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if fd < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::ESRCH) {
            return Err(Error::NoSuchProcess { pid });
        }
        tracing::info!("pidfd_open unavailable ({err}); polling /proc for the target's exit");
        return Ok(None);
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    Ok(Some(readable(fd, "the pidfd")?))
}
