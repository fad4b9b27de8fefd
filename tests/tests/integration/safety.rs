//! Running as root safely: files the tool creates cannot be redirected
//! through symbolic links, belong to the user who ran sudo, a launched
//! command can run as another user, and the tool keeps only the
//! capabilities it needs once its probes are attached.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memprof::report::{model::TraceMode, Report};
use memprof_tests::*;

const CANARY_TEXT: &str = "canary: must stay as it is\n";

/// A fresh directory under the workload directory.
fn scratch(name: &str) -> PathBuf {
    let dir = workload_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a scratch directory");
    dir
}

fn canary(dir: &Path) -> PathBuf {
    let path = dir.join("canary");
    std::fs::write(&path, CANARY_TEXT).expect("writing the canary");
    path
}

fn assert_canary(path: &Path) {
    assert_eq!(
        std::fs::read_to_string(path).expect("reading the canary"),
        CANARY_TEXT,
        "the file behind the symlink was changed"
    );
}

/// Every file option, pointed at a symlink to a canary, is refused with
/// exit status 2 before anything is traced, and the canary is unchanged.
/// The check is the same with the dashboard (a terminal on stdout), which
/// is where the log file used to be created.
#[test]
fn symlinks_at_output_paths_are_refused_and_their_targets_untouched() {
    if !require_root("symlinks_at_output_paths_are_refused_and_their_targets_untouched") {
        return;
    }
    let dir = scratch("safety-symlinks");
    let canary = canary(&dir);
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let spin = spin.to_str().expect("UTF-8 path");
    for flag in ["--json", "--log-file", "--command-output"] {
        let link = dir.join(format!("link{flag}"));
        std::os::unix::fs::symlink(&canary, &link).expect("planting the symlink");
        let run = run_tool(
            &[
                "--no-tui",
                flag,
                link.to_str().expect("UTF-8 path"),
                "--",
                spin,
                "time",
                "1",
                "1",
            ],
            Duration::from_secs(30),
        );
        assert_eq!(run.code(), 2, "{flag}: exit status: {}", run.stderr);
        assert!(
            run.stderr.contains("refusing to write") && run.stderr.contains("symbolic link"),
            "{flag}: {}",
            run.stderr
        );
        assert_canary(&canary);
    }
    // With the dashboard: a terminal from `script`, the JSON path a link.
    let link = dir.join("dashboard.json");
    std::os::unix::fs::symlink(&canary, &link).expect("planting the symlink");
    let inner = format!(
        "{} --json {} -- {spin} time 1 1",
        tool().display(),
        link.display()
    );
    let out = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .output()
        .expect("util-linux script is installed by `cargo xtask setup`");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "under a terminal: {text}");
    assert!(text.contains("symbolic link"), "{text}");
    assert_canary(&canary);
    assert_no_programs_left();
}

/// Under sudo (SUDO_UID/SUDO_GID set), the JSON report, the log and the
/// command's output belong to that user, with modes 0644, 0600 and 0644;
/// `-u nobody` runs the command as nobody (it prints its own uid).
#[test]
fn files_belong_to_the_sudo_user_and_u_runs_the_command_as_that_user() {
    if !require_root("files_belong_to_the_sudo_user_and_u_runs_the_command_as_that_user") {
        return;
    }
    let dir = scratch("safety-sudo");
    // `nobody` must be able to reach the files' directory only to prove
    // ownership: the tool itself writes them as root.
    let (json, log, output) = (dir.join("r.json"), dir.join("l.log"), dir.join("c.out"));
    let mut cmd = Command::new(tool());
    cmd.env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .args(["--no-tui", "-v", "-u", "nobody", "--json"])
        .arg(&json)
        .arg("--log-file")
        .arg(&log)
        .arg("--command-output")
        .arg(&output)
        .args(["--", "sh", "-c", "id -u; id -g"]);
    let run = run_tool_with(&mut cmd, Duration::from_secs(60));
    assert_eq!(run.code(), 0, "{}", run.stderr);
    // New files get the mode as the umask leaves it.
    // SAFETY: umask only swaps a process-wide mask; set back at once.
    let umask = unsafe {
        let old = libc::umask(0o022);
        libc::umask(old);
        old
    };
    for (path, mode) in [(&json, 0o644), (&log, 0o600), (&output, 0o644)] {
        let mode = mode & !umask;
        let meta = std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{} was not written: {e}", path.display()));
        assert_eq!(
            (meta.uid(), meta.gid()),
            (65534, 65534),
            "{} belongs to the sudo user",
            path.display()
        );
        assert_eq!(
            meta.permissions().mode() & 0o777,
            mode,
            "mode of {}",
            path.display()
        );
    }
    let report = read_typed(&json);
    assert!(report.target.exited, "{:#?}", report.target);
    let printed = std::fs::read_to_string(&output).expect("the command's output");
    assert_eq!(printed, "65534\n65534\n", "the command ran as nobody");
    let logged = std::fs::read_to_string(&log).expect("the log");
    assert!(
        logged.contains("capabilities kept after attach"),
        "the log file has the session's info lines: {logged}"
    );
    assert_no_programs_left();
}

/// The capability bits of `CapEff:` (or another `Cap*:` line) in a
/// /proc status file.
fn caps_line(status: &str, key: &str) -> u64 {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or_else(|| panic!("no {key} in {status}"))
}

/// Runs the tool on `target` with `options` and, once it has dropped its
/// capabilities, checks every thread against `kept` (the session thread
/// holds exactly it), the bounding set and no-new-privileges. Returns the
/// report.
fn check_capabilities(name: &str, target: &TestProcess, options: &[&str], kept: u64) -> Report {
    let json = report_path(name);
    let child = Command::new(tool())
        .args(["--no-tui", "-p", &target.pid().to_string()])
        .args(options)
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting memprof-ebpf");
    let status_of = |task: &Path| std::fs::read_to_string(task.join("status")).unwrap_or_default();
    let proc_dir = PathBuf::from(format!("/proc/{}", child.id()));
    let start = Instant::now();
    let main_status = loop {
        let status = status_of(&proc_dir);
        // The drop ends with no-new-privs: wait for the whole of it.
        if status.lines().any(|l| l == "NoNewPrivs:\t1") {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{name}: the tool never dropped its capabilities: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        caps_line(&main_status, "CapEff:"),
        kept,
        "{name}: the session thread keeps exactly the documented set"
    );
    assert_eq!(caps_line(&main_status, "CapPrm:"), kept, "{name}");
    assert_eq!(
        caps_line(&main_status, "CapBnd:") & !kept,
        0,
        "{name}: bounding set"
    );
    assert!(
        main_status.lines().any(|l| l == "NoNewPrivs:\t1"),
        "{name}: {main_status}"
    );
    for task in std::fs::read_dir(proc_dir.join("task"))
        .expect("tasks")
        .flatten()
    {
        let status = status_of(&task.path());
        if status.is_empty() {
            continue; // the thread ended meanwhile
        }
        for key in ["CapEff:", "CapPrm:"] {
            assert_eq!(
                caps_line(&status, key) & !kept,
                0,
                "{name}: thread {:?} holds more than the kept set: {status}",
                task.file_name()
            );
        }
    }
    let run = finish(child, start, Duration::from_secs(90));
    assert_eq!(run.code(), 0, "{name}: {}", run.stderr);
    assert!(
        !run.stderr.contains("could not drop capabilities"),
        "{name}: {}",
        run.stderr
    );
    assert_no_programs_left();
    read_typed(&json)
}

/// Once attached, the tool keeps only the capabilities it documents, in
/// every thread. Without windowed uprobes (allocator traced in full, lock
/// uprobes off) that excludes CAP_SYS_ADMIN, and the session still ends
/// in a normal report.
#[test]
fn capabilities_after_attach_are_the_documented_ones() {
    if !require_root("capabilities_after_attach_are_the_documented_ones") {
        return;
    }
    let target = start_spin(&["time", "2", "30"]);
    let kept = memprof::privilege::mask(&memprof::privilege::kept(false));
    let report = check_capabilities(
        "safety-caps",
        &target,
        &[
            "--duration",
            "4s",
            "--alloc-mode",
            "full",
            "--lock-mode",
            "off",
        ],
        kept,
    );
    assert!(report.sampling.samples > 1000, "{:#?}", report.sampling);
}

/// In the default (sampled) allocator mode the probes are re-attached in
/// windows after the drop, which the kernel allows only with CAP_SYS_ADMIN
/// besides CAP_BPF and CAP_PERFMON: it is kept then, and a second window
/// really opens (`alloc hold` on a malloc-heavy loop: the first window is
/// followed by a gap of several seconds).
#[test]
fn sampled_mode_keeps_what_re_attaching_its_windows_needs() {
    if !require_root("sampled_mode_keeps_what_re_attaching_its_windows_needs") {
        return;
    }
    let alloc = build_workload("alloc", Variant::Debug).expect("building alloc");
    let mut target = TestProcess::spawn(&alloc, &["hold", "40"]);
    target.wait_ready();
    let kept = memprof::privilege::mask(&memprof::privilege::kept(true));
    // The windows are read from the debug log: the report's own count of
    // them depends on its traced fraction, which is known wrong (#17).
    let log = workload_dir().join("safety-caps-windows.log");
    let _ = std::fs::remove_file(&log);
    let report = check_capabilities(
        "safety-caps-windows",
        &target,
        &[
            "--duration",
            "14s",
            "--lock-mode",
            "off",
            "-vv",
            "--log-file",
            log.to_str().expect("UTF-8 path"),
        ],
        kept,
    );
    let logged = std::fs::read_to_string(&log).expect("the log");
    assert!(
        !logged.contains("cannot re-attach"),
        "re-attaching failed: {logged}"
    );
    assert!(
        logged.contains("Alloc window 2:"),
        "a second window was attached: {logged}"
    );
    assert_eq!(
        report.allocator.mode,
        TraceMode::Sampled,
        "{:#?}",
        report.allocator
    );
}

/// Under the dashboard, a launched command's output can neither draw over
/// the screen nor land in a file nobody asked for: it is captured (the
/// newest 64 KiB, with a note saying what was cut) and printed once the
/// dashboard has closed; the working directory stays empty.
#[test]
fn a_launched_command_s_output_is_shown_after_the_dashboard() {
    if !require_root("a_launched_command_s_output_is_shown_after_the_dashboard") {
        return;
    }
    let dir = scratch("safety-capture");
    // 100,000 bytes of digits, then a last line: more than is kept.
    let inner = format!(
        "stty cols 100 rows 30; cd {} && {} --alloc-mode off --lock-mode off -- \
         sh -c 'sleep 3; yes 0123456789 | head -c 100000; echo; echo the-last-line; sleep 1'",
        dir.display(),
        tool().display()
    );
    let script = Command::new("script")
        .args(["-qec", &inner, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .expect("util-linux script is installed by `cargo xtask setup`");
    let waiter = std::thread::spawn(move || script.wait_with_output());
    // Meanwhile: every thread of the tool, the dashboard's key reader and
    // the output reader included, holds no more than the kept set.
    check_every_thread_of_the_running_tool("--lock-mode");
    let out = waiter
        .join()
        .expect("waiting thread")
        .expect("waiting for script");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        &text[text.len().saturating_sub(3000)..]
    );
    let shown = text
        .find("memprof-ebpf: output of the command:")
        .unwrap_or_else(|| {
            panic!(
                "no captured output: {}",
                &text[text.len().saturating_sub(3000)..]
            )
        });
    let after = &text[shown..];
    assert!(
        after.contains("[truncated: the first") && after.contains("of 100015 bytes are not shown]"),
        "{}",
        &after[..after.len().min(300)]
    );
    assert!(after.contains("the-last-line"), "the newest output is kept");
    assert!(
        text.find("memprof-ebpf summary").is_some_and(|s| s > shown),
        "the summary comes after the output"
    );
    assert_dir_empty(&dir);
    assert_no_programs_left();
}

/// Finds the running tool (its first argument is the tool, and `marker`
/// is among the others), waits until it has dropped its capabilities, and
/// checks each of its threads (at least three: the session, the dashboard's
/// key reader, the output reader) against the set kept without windows.
fn check_every_thread_of_the_running_tool(marker: &str) {
    let tool_path = tool();
    let kept = memprof::privilege::mask(&memprof::privilege::kept(false));
    let start = Instant::now();
    let pid = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            (args.first()? == &tool_path.as_os_str().as_encoded_bytes()
                && args.iter().any(|a| a == &marker.as_bytes()))
            .then_some(pid)
        });
        if let Some(pid) = found {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the tool never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let proc_dir = PathBuf::from(format!("/proc/{pid}"));
    loop {
        let status = std::fs::read_to_string(proc_dir.join("status")).unwrap_or_default();
        if status.lines().any(|l| l == "NoNewPrivs:\t1") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the tool never dropped its capabilities: {status}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut threads = 0;
    for task in std::fs::read_dir(proc_dir.join("task"))
        .expect("tasks")
        .flatten()
    {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if status.is_empty() {
            continue;
        }
        threads += 1;
        for key in ["CapEff:", "CapPrm:"] {
            assert_eq!(
                caps_line(&status, key) & !kept,
                0,
                "thread {:?} holds more than the kept set: {status}",
                task.file_name()
            );
        }
    }
    assert!(
        threads >= 3,
        "the dashboard's helper threads exist: {threads}"
    );
}
