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
#[derive(Debug, Default)]
pub enum Output {
    /// Our own stdin, stdout and stderr.
    #[default]
    Inherit,
    /// stdout and stderr to this file (opened safely by the caller), stdin
    /// from /dev/null: under the dashboard with `--command-output`.
    File(std::fs::File),
    /// stdout and stderr captured in memory (the last
    /// [`CAPTURE_LIMIT`] bytes), stdin from /dev/null: under the dashboard,
    /// so it can neither draw over the screen nor take its keys.
    Capture(Captured),
    /// stdout to our stderr: when our stdout carries the JSON report.
    StdoutToStderr,
}

/// Bytes of a captured command's output that are kept (the newest).
pub const CAPTURE_LIMIT: usize = 64 * 1024;

#[derive(Debug, Default)]
struct Tail {
    bytes: std::collections::VecDeque<u8>,
    total: u64,
    done: bool,
}

/// A launched command's output, read from a pipe on a thread of its own.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    tail: std::sync::Arc<(std::sync::Mutex<Tail>, std::sync::Condvar)>,
}

impl Captured {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tail> {
        self.tail.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds output, keeping the newest [`CAPTURE_LIMIT`] bytes.
    fn push(&self, chunk: &[u8]) {
        let mut tail = self.lock();
        tail.total += chunk.len() as u64;
        tail.bytes.extend(chunk);
        let excess = tail.bytes.len().saturating_sub(CAPTURE_LIMIT);
        tail.bytes.drain(..excess);
    }

    fn close(&self) {
        self.lock().done = true;
        self.tail.1.notify_all();
    }

    /// Reads `pipe` until its end on a new thread that holds no privilege.
    fn read_from(&self, mut pipe: std::io::PipeReader) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("memprof-output".into())
            .spawn(move || {
                crate::privilege::drop_all_in_this_thread();
                let mut buf = [0u8; 8192];
                loop {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => me.push(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                        Err(_) => break,
                    }
                }
                me.close();
            })
            .map(drop)
    }

    /// The captured text, waiting up to `wait` for the pipe to close (a
    /// process the command started may hold it open), with a note when
    /// older output was dropped. `None` when there was no output.
    pub fn text(&self, wait: std::time::Duration) -> Option<String> {
        let guard = self.lock();
        let (tail, _) = self
            .tail
            .1
            .wait_timeout_while(guard, wait, |t| !t.done)
            .unwrap_or_else(|e| e.into_inner());
        if tail.total == 0 {
            return None;
        }
        let (front, back) = tail.bytes.as_slices();
        let mut text = String::from_utf8_lossy(&[front, back].concat()).into_owned();
        if tail.total > tail.bytes.len() as u64 {
            text.insert_str(
                0,
                &format!(
                    "[truncated: the first {} of {} bytes are not shown]\n",
                    tail.total - tail.bytes.len() as u64,
                    tail.total
                ),
            );
        }
        Some(text)
    }
}

/// The user a launched command runs as (`-u`), resolved before launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: String,
}

/// Environment variable that passes [`RunAs`] to the gate.
const RUN_AS_ENV: &str = "MEMPROF_EBPF_GATE_USER";

impl RunAs {
    /// Looks `user` (a name or a numeric uid) up in the user database.
    pub fn lookup(user: &str) -> Result<Self> {
        let unknown = || Error::Usage(format!("no such user: {user}"));
        let mut pwd: libc::passwd = unsafe_zeroed_passwd();
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = match user.parse::<u32>() {
            // SAFETY: every pointer is valid for the call; `buf` outlives
            // the use of the strings getpwuid_r points into it.
            Ok(uid) => unsafe {
                libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result)
            },
            Err(_) => {
                let name = std::ffi::CString::new(user).map_err(|_| unknown())?;
                // SAFETY: as above; `name` is NUL-terminated.
                unsafe {
                    libc::getpwnam_r(
                        name.as_ptr(),
                        &mut pwd,
                        buf.as_mut_ptr(),
                        buf.len(),
                        &mut result,
                    )
                }
            }
        };
        if rc != 0 || result.is_null() {
            return Err(unknown());
        }
        // SAFETY: getpw*_r succeeded, so pw_name and pw_dir point at
        // NUL-terminated strings inside `buf`, alive here.
        let (name, home) = unsafe {
            (
                std::ffi::CStr::from_ptr(pwd.pw_name)
                    .to_string_lossy()
                    .into_owned(),
                std::ffi::CStr::from_ptr(pwd.pw_dir)
                    .to_string_lossy()
                    .into_owned(),
            )
        };
        let mut groups = vec![0 as libc::gid_t; 256];
        let mut n = groups.len() as libc::c_int;
        let c_name = std::ffi::CString::new(name.clone()).map_err(|_| unknown())?;
        // SAFETY: `groups` has room for `n` entries; getgrouplist writes at
        // most that many and sets `n` to how many there are.
        if unsafe { libc::getgrouplist(c_name.as_ptr(), pwd.pw_gid, groups.as_mut_ptr(), &mut n) }
            < 0
        {
            return Err(Error::Usage(format!(
                "user {user} is in more than {} groups",
                groups.len()
            )));
        }
        groups.truncate(n.max(0) as usize);
        Ok(Self {
            name,
            uid: pwd.pw_uid,
            gid: pwd.pw_gid,
            groups,
            home,
        })
    }

    fn encode(&self) -> String {
        let groups: Vec<String> = self.groups.iter().map(u32::to_string).collect();
        format!(
            "{}:{}:{}:{}:{}",
            self.uid,
            self.gid,
            groups.join(","),
            self.name,
            self.home
        )
    }

    fn decode(text: &str) -> Option<Self> {
        let mut parts = text.splitn(5, ':');
        let uid = parts.next()?.parse().ok()?;
        let gid = parts.next()?.parse().ok()?;
        let groups = parts
            .next()?
            .split(',')
            .filter(|g| !g.is_empty())
            .map(|g| g.parse().ok())
            .collect::<Option<Vec<u32>>>()?;
        let name = parts.next()?.to_string();
        let home = parts.next()?.to_string();
        Some(Self {
            name,
            uid,
            gid,
            groups,
            home,
        })
    }

    /// Becomes this user: groups, then gid, then uid (after which no
    /// change back is possible).
    fn become_user(&self) -> std::io::Result<()> {
        let last = std::io::Error::last_os_error;
        // SAFETY: `groups` is a valid array of `len` gids.
        if unsafe { libc::setgroups(self.groups.len(), self.groups.as_ptr()) } != 0 {
            return Err(last());
        }
        // SAFETY: plain integer arguments.
        if unsafe { libc::setresgid(self.gid, self.gid, self.gid) } != 0 {
            return Err(last());
        }
        // SAFETY: plain integer arguments.
        if unsafe { libc::setresuid(self.uid, self.uid, self.uid) } != 0 {
            return Err(last());
        }
        Ok(())
    }
}

/// An all-zero `passwd` for getpw*_r to fill.
fn unsafe_zeroed_passwd() -> libc::passwd {
    // SAFETY: passwd is a plain C struct of integers and pointers, for which
    // all-zero (null pointers) is a valid value.
    unsafe { std::mem::zeroed() }
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
    /// Starts `command` behind the gate, its output going to `output`, as
    /// `run_as` when given.
    pub fn spawn(command: &[String], output: &Output, run_as: Option<&RunAs>) -> Result<Self> {
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
        match run_as {
            Some(user) => cmd.env(RUN_AS_ENV, user.encode()),
            // Only we may ask the gate to change users.
            None => cmd.env_remove(RUN_AS_ENV),
        };
        let internal = |e: std::io::Error| Error::Internal(anyhow::anyhow!("{e}"));
        let mut capture = None;
        match output {
            Output::Inherit => {}
            Output::File(file) => {
                cmd.stdin(std::process::Stdio::null())
                    .stdout(file.try_clone().map_err(internal)?)
                    .stderr(file.try_clone().map_err(internal)?);
            }
            Output::Capture(captured) => {
                let (reader, writer) = std::io::pipe().map_err(internal)?;
                cmd.stdin(std::process::Stdio::null())
                    .stdout(writer.try_clone().map_err(internal)?)
                    .stderr(writer);
                capture = Some((captured, reader));
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
        // `cmd` holds the pipe's write ends until dropped: only the
        // command's may keep the reader from seeing the end.
        drop(cmd);
        if let Some((captured, reader)) = capture {
            captured.read_from(reader).map_err(internal)?;
        }
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
    let mut command = std::process::Command::new(program);
    command
        .args(rest)
        .env_remove(GATE_ENV)
        .env_remove(RUN_AS_ENV);
    if let Some(text) = std::env::var_os(RUN_AS_ENV) {
        let Some(user) = text.to_str().and_then(RunAs::decode) else {
            eprintln!("memprof-ebpf: bad {RUN_AS_ENV}");
            std::process::exit(125);
        };
        if let Err(e) = user.become_user() {
            eprintln!("memprof-ebpf: cannot become user {}: {e}", user.name);
            std::process::exit(125);
        }
        command
            .env("HOME", &user.home)
            .env("USER", &user.name)
            .env("LOGNAME", &user.name);
    }
    let err = command.exec();
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
    fn run_as_survives_the_trip_to_the_gate() {
        let user = RunAs {
            name: "nobody".into(),
            uid: 65534,
            gid: 65534,
            groups: vec![65534, 100],
            home: "/nonexistent:odd".into(),
        };
        assert_eq!(RunAs::decode(&user.encode()), Some(user.clone()));
        let no_groups = RunAs {
            groups: Vec::new(),
            ..user
        };
        assert_eq!(RunAs::decode(&no_groups.encode()), Some(no_groups));
        assert_eq!(RunAs::decode("1:x:::"), None);
    }

    #[test]
    fn users_are_looked_up_by_name_and_uid() {
        let root = RunAs::lookup("root").unwrap();
        assert_eq!((root.uid, root.gid, root.home.as_str()), (0, 0, "/root"));
        assert_eq!(RunAs::lookup("0").unwrap().name, "root");
        assert!(matches!(
            RunAs::lookup("no-such-user-xyz"),
            Err(Error::Usage(_))
        ));
    }

    #[test]
    fn captured_output_keeps_the_newest_bytes_and_says_so() {
        let c = Captured::new();
        assert_eq!(c.text(std::time::Duration::ZERO), None);
        c.push(b"hello\n");
        c.close();
        assert_eq!(
            c.text(std::time::Duration::ZERO).as_deref(),
            Some("hello\n")
        );
        let c = Captured::new();
        c.push(&vec![b'a'; CAPTURE_LIMIT]);
        c.push(b"end");
        let text = c.text(std::time::Duration::from_millis(1)).unwrap();
        assert!(
            text.starts_with("[truncated: the first 3 of 65539 bytes"),
            "{}",
            &text[..80]
        );
        assert!(text.ends_with("aend"));
    }

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
