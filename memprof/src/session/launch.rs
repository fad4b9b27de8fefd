//! Launching a command so that it is traced from its first instruction.
//!
//! We start ourselves (`/proc/self/exe`) as a tiny *gate*: it waits on a
//! pipe, and only when the probes are attached for its pid do we release it,
//! and it `exec`s the user's command in place (same pid). This needs no
//! `fork` in our multithreaded process and no `ptrace`.

use std::{
    ffi::OsString,
    io::{Read, Write},
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
};

use crate::error::{Error, Result};

/// Environment variable that turns our binary into the gate; its value is
/// the pipe's read-end file descriptor.
pub const GATE_ENV: &str = "MEMPROF_EBPF_EXEC_GATE";

/// Where a launched command's output goes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Output {
    /// Our own stdin, stdout and stderr.
    #[default]
    Inherit,
    /// stdout and stderr to this file, stdin from /dev/null: under the
    /// dashboard, so it cannot draw over the screen or take its keys.
    File(PathBuf),
    /// stdout to our stderr: when our stdout carries the JSON report.
    StdoutToStderr,
}

/// A launched command, held at the gate until [`Launched::release`].
///
/// Dropping it kills the command if it is still running, so no error path
/// leaves it behind.
pub struct Launched {
    pub child: tokio::process::Child,
    pub pid: u32,
    gate: Option<std::fs::File>,
    /// Its exit status, once it has exited.
    pub status: Option<std::process::ExitStatus>,
}

impl Launched {
    /// Starts `command` behind the gate, its output going to `output`.
    pub fn spawn(command: &[String], output: &Output) -> Result<Self> {
        let program = command
            .first()
            .ok_or_else(|| Error::Usage("no command given after --".into()))?;
        let display = command.join(" ");
        resolve(program, std::env::var_os("PATH")).ok_or_else(|| Error::LaunchFailed {
            command: display.clone(),
            reason: format!("`{program}` was not found or is not executable"),
        })?;

        let (read_end, write_end) = pipe()?;
        let mut cmd = tokio::process::Command::new("/proc/self/exe");
        cmd.args(command)
            .env(GATE_ENV, read_end.as_raw_fd().to_string())
            .kill_on_drop(true);
        match output {
            Output::Inherit => {}
            Output::File(path) => {
                let file = std::fs::File::create(path).map_err(|e| Error::LaunchFailed {
                    command: display.clone(),
                    reason: format!("cannot create {} for its output: {e}", path.display()),
                })?;
                cmd.stdin(std::process::Stdio::null())
                    .stdout(file.try_clone().map_err(|e| anyhow::anyhow!("{e}"))?)
                    .stderr(file);
            }
            Output::StdoutToStderr => {
                cmd.stdout(std::io::stderr());
            }
        }

        let child = cmd.spawn().map_err(|e| Error::LaunchFailed {
            command: display,
            reason: e.to_string(),
        })?;
        drop(read_end);
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("launched child has no pid"))?;
        Ok(Self {
            child,
            pid,
            gate: Some(std::fs::File::from(write_end)),
            status: None,
        })
    }

    /// Waits for the command to exit and records its status.
    pub async fn wait(&mut self) {
        if self.status.is_none() {
            self.status = self.child.wait().await.ok();
        }
    }

    /// Lets the command run.
    pub fn release(&mut self) -> Result<()> {
        if let Some(mut gate) = self.gate.take() {
            gate.write_all(b"go")
                .map_err(|e| anyhow::anyhow!("releasing the launched command: {e}"))?;
        }
        Ok(())
    }
}

/// A pipe whose write end is close-on-exec and whose read end is inherited
/// by the gate process.
fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(anyhow::anyhow!("pipe2: {}", std::io::Error::last_os_error()).into());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours alone.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: clearing FD_CLOEXEC on a descriptor we own.
    if unsafe { libc::fcntl(read_end.as_raw_fd(), libc::F_SETFD, 0) } != 0 {
        return Err(anyhow::anyhow!("fcntl: {}", std::io::Error::last_os_error()).into());
    }
    Ok((read_end, write_end))
}

/// Finds `program` the way `execvp` would: as a path when it has a `/`,
/// else in each directory of `PATH`.
pub fn resolve(program: &str, path: Option<OsString>) -> Option<PathBuf> {
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        let p = PathBuf::from(program);
        return executable(&p).then_some(p);
    }
    let path = path.unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|p| executable(p))
}

/// The gate's side: wait for the go signal, then become the command.
/// Never returns.
pub fn run_gate(fd: &str) -> ! {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let Ok(fd) = fd.parse::<i32>() else {
        eprintln!("memprof-ebpf: bad {GATE_ENV}");
        std::process::exit(125);
    };
    // SAFETY: the parent put the read end of the gate pipe at this number
    // and nothing else in this fresh process owns it.
    let mut gate = unsafe { std::fs::File::from_raw_fd(fd) };
    let mut go = [0u8; 2];
    if gate.read_exact(&mut go).is_err() {
        // The profiler went away without releasing us: do not run the
        // command untraced behind the user's back.
        std::process::exit(125);
    }
    drop(gate);
    let Some((program, rest)) = args.split_first() else {
        std::process::exit(125);
    };
    let err = std::process::Command::new(program)
        .args(rest)
        .env_remove(GATE_ENV)
        .exec();
    eprintln!(
        "memprof-ebpf: cannot run {}: {err}",
        program.to_string_lossy()
    );
    std::process::exit(127);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_execvp() {
        assert_eq!(
            resolve("sh", Some("/nonexistent:/bin".into())),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(resolve("/bin/sh", None), Some(PathBuf::from("/bin/sh")));
        assert_eq!(resolve("no-such-program-xyz", Some("/bin".into())), None);
        assert_eq!(resolve("./no/such/file", None), None);
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("data");
        std::fs::write(&plain, "x").unwrap();
        assert_eq!(
            resolve(plain.to_str().unwrap(), None),
            None,
            "not executable"
        );
        assert_eq!(
            resolve("data", Some(dir.path().into())),
            None,
            "not executable via PATH"
        );
    }
}
