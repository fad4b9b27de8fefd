//! Harness for memprof-ebpf's root-only integration tests, and the bundled
//! workloads (also used by `cargo xtask demo` and `bench`).
//!
//! Tests run the real `memprof-ebpf` binary, which loads the real eBPF
//! programs, against real programs built from `workloads/` at test time, and
//! assert on the report it writes.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

mod leaks;
pub use leaks::{assert_no_programs_left, loaded_programs};

pub use workloads::{
    build_workload, run_ok, skip_log, workload_dir, workload_source, workspace, Variant,
    DEMO_SECONDS, DEMO_TOOL_ARGS, DEMO_WORKLOAD,
};

/// Asserts that the tool left no file in `dir` (its working directory).
pub fn assert_dir_empty(dir: &Path) {
    let left: Vec<_> = std::fs::read_dir(dir)
        .expect("reading the directory")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(
        left.is_empty(),
        "files left in the working directory {}: {left:?}",
        dir.display()
    );
}

/// Names of our eBPF programs (as `bpftool prog show` lists them).
pub use memprof_common::programs::ALL as PROGRAM_NAMES;

/// The 1-based line of `workloads/NAME.c` that carries `marker`.
pub fn marked_line(name: &str, marker: &str) -> u32 {
    let text = std::fs::read_to_string(workload_source(name)).expect("reading the workload source");
    let idx = text
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line marked {marker:?} in {name}.c"));
    idx as u32 + 1
}

/// Whether skips are failures: `MEMPROF_TESTS_STRICT=1` (set by `cargo
/// xtask test` when run as root), or any CI run (`CI=true`), where a skip
/// could hide a failure and cannot be turned off.
pub fn strict() -> bool {
    workloads::ci() || std::env::var("MEMPROF_TESTS_STRICT").as_deref() == Ok("1")
}

/// Whether a root-only test can run. Without root it prints a loud SKIPPED
/// line and returns false; in [`strict`] mode a skip is a failure instead.
pub fn require_root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(test, "needs root (loads eBPF programs)");
    false
}

/// Reports a skipped test loudly (or fails it in [`strict`] mode). A test
/// skips at most once: a second skip means it ran part of itself and
/// skipped the rest, which would count as passed.
pub fn skip(test: &str, why: &str) {
    if strict() {
        panic!("{test} cannot run here ({why}) and strict mode (CI, or MEMPROF_TESTS_STRICT=1) forbids skipping");
    }
    static SKIPPED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut skipped = SKIPPED.lock().unwrap_or_else(|e| e.into_inner());
    assert!(
        !skipped.iter().any(|t| t == test),
        "{test} skipped twice: a test is one check, split it"
    );
    skipped.push(test.to_string());
    eprintln!("\n*** SKIPPED {test}: {why} ***\n");
    use std::io::Write as _;
    if let Ok(mut log) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(skip_log())
    {
        let _ = writeln!(log, "{test}: {why}");
    }
}

/// Path of the `memprof-ebpf` binary under test.
pub fn tool() -> PathBuf {
    let path = std::env::var_os("MEMPROF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/debug/memprof-ebpf"));
    assert!(
        path.exists(),
        "{} does not exist: run the tests with `cargo xtask test` (it builds the tool and sets MEMPROF_BIN)",
        path.display()
    );
    path
}

/// A child process that is killed when dropped, so a failing test never
/// leaves workloads running.
pub struct TestProcess {
    pub child: Child,
    stdout: Option<BufReader<std::process::ChildStdout>>,
}

impl TestProcess {
    /// Starts `program args` with stdout piped.
    pub fn spawn(program: &Path, args: &[&str]) -> Self {
        Self::spawn_env(program, args, &[])
    }

    /// Starts `program args` with extra environment variables.
    pub fn spawn_env(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
        let stdout = child.stdout.take().map(BufReader::new);
        Self { child, stdout }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the workload to print `ready`.
    pub fn wait_ready(&mut self) {
        let mut line = String::new();
        let reader = self.stdout.as_mut().expect("stdout is piped");
        reader
            .read_line(&mut line)
            .expect("reading the workload's stdout");
        assert_eq!(line.trim(), "ready", "workload did not become ready");
    }

    /// The workload's further stdout lines, each with the instant it was
    /// read, from a thread of their own (until the workload ends).
    pub fn lines_in_background(&mut self) -> std::sync::mpsc::Receiver<(Instant, String)> {
        let reader = self.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                if tx.send((Instant::now(), line)).is_err() {
                    return;
                }
            }
        });
        rx
    }

    /// Waits for exit, at most `limit`.
    pub fn wait_timeout(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for TestProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the `spin` workload, starts it with `args` and waits until its
/// threads run.
pub fn start_spin(args: &[&str]) -> TestProcess {
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let mut target = TestProcess::spawn(&spin, args);
    target.wait_ready();
    target
}

/// What a run of the tool produced.
#[derive(Debug)]
pub struct ToolRun {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    pub wall: Duration,
}

impl ToolRun {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

/// Runs the tool to completion with `args`, killing it (and failing) if it
/// takes longer than `limit`.
pub fn run_tool(args: &[&str], limit: Duration) -> ToolRun {
    run_tool_with(Command::new(tool()).args(args), limit)
}

/// As [`run_tool`], for a prepared command (e.g. under `setpriv`).
pub fn run_tool_with(cmd: &mut Command, limit: Duration) -> ToolRun {
    let start = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting memprof-ebpf");
    finish(child, start, limit)
}

/// Waits for a started tool process, with a time limit.
pub fn finish(child: Child, start: Instant, limit: Duration) -> ToolRun {
    let pid = child.id();
    let out = std::thread::spawn(move || child.wait_with_output());
    while !out.is_finished() {
        if start.elapsed() > limit {
            // SAFETY: kill with the pid of our own unreaped child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            let _ = out.join();
            panic!("memprof-ebpf did not finish within {limit:?}: it hangs");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = out
        .join()
        .expect("waiting thread")
        .expect("waiting for memprof-ebpf");
    ToolRun {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        wall: start.elapsed(),
    }
}

/// Runs the tool with `args` and `--json FILE`, expects success, and
/// returns the run with its parsed report.
pub fn trace(name: &str, args: &[&str]) -> (ToolRun, serde_json::Value) {
    trace_env(name, args, &[], Duration::from_secs(60))
}

/// As [`trace`], with environment variables `env` (passed on to a launched
/// command) and a time limit.
pub fn trace_env(
    name: &str,
    args: &[&str],
    env: &[(&str, &Path)],
    limit: Duration,
) -> (ToolRun, serde_json::Value) {
    let json = report_path(name);
    let mut all = vec!["--json", json.to_str().expect("UTF-8 path")];
    all.extend_from_slice(args);
    let run = run_tool_with(
        Command::new(tool()).args(&all).envs(env.iter().copied()),
        limit,
    );
    assert_eq!(
        run.code(),
        0,
        "memprof-ebpf {args:?} failed: {}",
        run.stderr
    );
    let report = read_report(&json);
    (run, report)
}

/// Reads and parses a JSON report.
pub fn read_report(path: &Path) -> serde_json::Value {
    read_checked(path).0
}

/// Reads a JSON report as the typed model (checked as [`read_report`]
/// checks it).
pub fn read_typed(path: &Path) -> memprof::report::Report {
    read_checked(path).1
}

/// A report file, as JSON and as the typed model. Every report a test
/// reads also reads as the model, and writes back the same: the model and
/// its JSON form do not drift apart.
fn read_checked(path: &Path) -> (serde_json::Value, memprof::report::Report) {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON: {e}\n{text}"));
    assert_eq!(v["schema"], "memprof-ebpf/1", "schema tag");
    let typed = memprof::report::Report::from_json(&text)
        .unwrap_or_else(|e| panic!("report does not read as the model: {e}"));
    let again: serde_json::Value = serde_json::from_str(&typed.to_json()).expect("JSON");
    assert!(again == v, "the model writes the report back differently");
    (v, typed)
}

/// A report already read (by [`trace`] or [`read_report`]) as the typed
/// model, which tests index by field instead of by string.
pub fn typed(report: &serde_json::Value) -> memprof::report::Report {
    serde_json::from_value(report.clone()).expect("read_report checked it reads as the model")
}

/// A fresh path for a report file.
pub fn report_path(test: &str) -> PathBuf {
    let path = workload_dir().join(format!("{test}.json"));
    let _ = std::fs::remove_file(&path);
    path
}

/// Where `nm` puts `symbol`, of `nm`'s kind letter `kind` (`T` text,
/// `B` bss), in `program`: its link address.
pub fn nm_address(program: &Path, kind: char, symbol: &str) -> u64 {
    let nm = Command::new("nm")
        .arg(program)
        .output()
        .expect("nm runs (binutils)");
    let symbols = String::from_utf8_lossy(&nm.stdout);
    let suffix = format!(" {kind} {symbol}");
    symbols
        .lines()
        .find_map(|l| l.strip_suffix(&suffix))
        .and_then(|a| u64::from_str_radix(a, 16).ok())
        .unwrap_or_else(|| panic!("{symbol} in nm's output: {symbols}"))
}

/// Attaches the tool to `pids` (`-p`'s list) for `duration` (`"2s"`)
/// without the dashboard: the run (which must succeed) and its report
/// (test `name`'s).
pub fn attach_for(name: &str, pids: &str, duration: &str) -> (ToolRun, memprof::report::Report) {
    let json = report_path(name);
    let json_arg = json.to_str().expect("UTF-8 path");
    let args = [
        "-p",
        pids,
        "--duration",
        duration,
        "--no-tui",
        "--json",
        json_arg,
    ];
    let run = run_tool(&args, Duration::from_secs(60));
    assert_eq!(run.code(), 0, "{}", run.stderr);
    (run, read_typed(&json))
}

/// The hot-function entry named `function`, if any.
pub fn hot_function<'a>(
    report: &'a memprof::report::Report,
    function: &str,
) -> Option<&'a memprof::report::model::HotFunctionEntry> {
    report.hot_functions.iter().find(|h| h.function == function)
}

/// Builds `workloads/NAME.c` as a shared library (`-g -O1 -fPIC -shared`)
/// and returns its path, `libNAME.so` in the workload directory.
pub fn build_shared_lib(name: &str) -> anyhow::Result<PathBuf> {
    build_shared_lib_with(name, name, &[])
}

/// As [`build_shared_lib`], compiled with `defines` (`-DNAME=VALUE`) into
/// `lib<out>.so`: a variant of the same source.
pub fn build_shared_lib_with(name: &str, out: &str, defines: &[String]) -> anyhow::Result<PathBuf> {
    let src = workload_source(name);
    let lib = workload_dir().join(format!("lib{out}.so"));
    let tmp = workload_dir().join(format!(
        ".lib{out}.so.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    run_ok(
        Command::new("gcc")
            .args([
                "-g",
                "-O1",
                "-fno-omit-frame-pointer",
                "-fPIC",
                "-shared",
                "-Wall",
            ])
            .args(defines)
            .arg("-o")
            .arg(&tmp)
            .arg(&src),
    )?;
    workloads::install_built(&tmp, &lib)?;
    Ok(lib)
}

/// One of our BPF programs attached to something, as seen from outside by
/// `bpftool`: through a BPF link (`bpftool link`) or a perf event that
/// carries it (`bpftool perf`, attachments made without links).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    /// Program name (one of [`PROGRAM_NAMES`]).
    pub name: String,
    /// Program type as bpftool names it: "kprobe" (also uprobes),
    /// "tracepoint", "perf_event", ...
    pub prog_type: String,
    /// "link perf_event", "perf uprobe", ...
    pub how: String,
}

/// Calls `look` every 100 ms until process `pid` (our unreaped child,
/// which /proc shows as a zombie once it exited) has exited, at most
/// `limit`.
pub fn while_running(pid: u32, limit: Duration, mut look: impl FnMut()) {
    let start = Instant::now();
    while start.elapsed() < limit {
        let state = memprof::process::procfs::stat_fields(pid);
        if state.is_none_or(|f| f.first().is_none_or(|s| s == "Z")) {
            break;
        }
        look();
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `enum bpf_link_type` of a `uprobe_multi` link.
const BPF_LINK_TYPE_UPROBE_MULTI: u64 = 12;

/// Our programs attached now by process `holder` (the tool). When bpftool
/// cannot tell which process holds an attachment, all of ours are listed.
pub fn attached_programs(holder: u32) -> Vec<Attached> {
    let bpftool = |args: &[&str]| -> serde_json::Value {
        // A listing can fail when an object goes away while bpftool walks
        // the ids (the tool detaches windows meanwhile): asked again, it
        // is a new walk.
        let run = || {
            Command::new("bpftool")
                .arg("-j")
                .args(args)
                .output()
                .expect("bpftool is installed by `cargo xtask setup`")
        };
        let mut out = run();
        for _ in 0..4 {
            if out.status.success() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
            out = run();
        }
        assert!(
            out.status.success(),
            "bpftool {args:?} failed 5 times: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return serde_json::Value::Array(Vec::new());
        }
        serde_json::from_slice(&out.stdout).expect("bpftool JSON")
    };
    let list = |v: &serde_json::Value| v.as_array().cloned().unwrap_or_default();
    let programs: std::collections::HashMap<u64, (String, String)> =
        list(&bpftool(&["prog", "show"]))
            .iter()
            .filter_map(|p| {
                let name = p["name"].as_str()?;
                PROGRAM_NAMES.contains(&name).then(|| {
                    (
                        p["id"].as_u64().unwrap_or(0),
                        (
                            name.to_string(),
                            p["type"].as_str().unwrap_or("?").to_string(),
                        ),
                    )
                })
            })
            .collect();
    let held = |entry: &serde_json::Value| match (&entry["pids"], &entry["pid"]) {
        (serde_json::Value::Array(pids), _) => pids.iter().any(|p| p["pid"] == holder),
        (_, pid) if pid.is_u64() => *pid == holder,
        _ => true,
    };
    let mut found = Vec::new();
    let mut add = |entry: &serde_json::Value, how: String| {
        if let Some((name, prog_type)) = entry["prog_id"].as_u64().and_then(|id| programs.get(&id))
        {
            if held(entry) {
                found.push(Attached {
                    name: name.clone(),
                    prog_type: prog_type.clone(),
                    how,
                });
            }
        }
    };
    for link in list(&bpftool(&["link", "show"])) {
        // Older bpftools print newer link types as their number.
        let kind = match &link["type"] {
            serde_json::Value::String(s) => s.clone(),
            n if n.as_u64() == Some(BPF_LINK_TYPE_UPROBE_MULTI) => "uprobe_multi".into(),
            other => other.to_string(),
        };
        add(&link, format!("link {kind}"));
    }
    for perf in list(&bpftool(&["perf", "show"])) {
        let kind = perf["fd_type"]
            .as_str()
            .or_else(|| perf["prog_info"].as_str())
            .unwrap_or("?");
        add(&perf, format!("perf {kind}"));
    }
    found
}

/// Source file of a bundled single-file Rust workload.
pub fn rust_workload_source(name: &str) -> PathBuf {
    workspace()
        .join("tests/workloads")
        .join(format!("{name}.rs"))
}

/// The version line of the `rustc` on PATH, or None when there is none.
pub fn rustc_version() -> Option<String> {
    let out = Command::new("rustc").arg("--version").output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Builds `workloads/NAME.rs` (a single-file program) with the `rustc` on
/// PATH (`-g -C force-frame-pointers=yes -O`) and returns the executable's
/// path.
pub fn build_rust_workload(name: &str) -> anyhow::Result<PathBuf> {
    let src = rust_workload_source(name);
    let out = workload_dir().join(name);
    let tmp = workload_dir().join(format!(
        ".{name}.{}.{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    run_ok(
        Command::new("rustc")
            .args(["-g", "-C", "force-frame-pointers=yes", "-O", "-o"])
            .arg(&tmp)
            .arg(&src),
    )?;
    workloads::install_built(&tmp, &out)?;
    Ok(out)
}

/// The 1-based line of the file at `path` that carries `marker`.
pub fn marked_line_in(path: &Path, marker: &str) -> u32 {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let idx = text
        .lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("no line marked {marker:?} in {}", path.display()));
    idx as u32 + 1
}

/// A workload's own account of what it did (see `workloads/truth.h`):
/// the "KEY VALUE" lines it wrote to the file named by `WORKLOAD_TRUTH`.
#[derive(Debug, Clone, Default)]
pub struct Truth(std::collections::BTreeMap<String, u64>);

impl Truth {
    /// A fresh path for the truth file of test `name`.
    pub fn path(name: &str) -> PathBuf {
        let path = workload_dir().join(format!("{name}.truth"));
        let _ = std::fs::remove_file(&path);
        path
    }

    /// Reads the truth file at `path` (the workload must have finished).
    pub fn read(path: &Path) -> Self {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!(
                "the workload wrote no ground truth to {}: {e}",
                path.display()
            )
        });
        Self(
            text.lines()
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect(),
        )
    }

    /// The value of `key`; panics when the workload did not write it.
    pub fn get(&self, key: &str) -> u64 {
        *self
            .0
            .get(key)
            .unwrap_or_else(|| panic!("the workload's truth has no {key:?}: {self:?}"))
    }
}

/// Asserts `low <= value <= high`, naming the quantity and the context.
pub fn assert_between(
    what: &str,
    value: f64,
    low: f64,
    high: f64,
    context: &dyn std::fmt::Display,
) {
    assert!(
        (low..=high).contains(&value),
        "{what}: {value} is outside [{low}, {high}]: {context}"
    );
}

/// Asserts that `value` is within `tolerance` (a fraction) of `truth`.
pub fn assert_near(
    what: &str,
    value: u64,
    truth: u64,
    tolerance: f64,
    context: &dyn std::fmt::Display,
) {
    let (v, t) = (value as f64, truth as f64);
    assert!(
        (v - t).abs() <= t * tolerance,
        "{what}: reported {value}, the workload's truth is {truth} (tolerance {:.0}%): {context}",
        tolerance * 100.0
    );
}

/// The array at `key` of the report (a failure says what was there).
pub fn report_array<'a>(report: &'a serde_json::Value, key: &str) -> &'a [serde_json::Value] {
    report[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is not an array: {report:#}"))
}

/// The tool's arguments to launch `command` with every allocator call
/// traced and the lock profiler off.
pub fn full_alloc_launch<'a>(command: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "--alloc-mode",
        "full",
        "--lock-mode",
        "off",
        "--no-tui",
        "--",
    ];
    args.extend_from_slice(command);
    args
}

/// As [`trace`], with the launched workload writing its ground truth:
/// returns the run, the report and the truth.
pub fn trace_truth(name: &str, args: &[&str]) -> (ToolRun, serde_json::Value, Truth) {
    let truth = Truth::path(name);
    let (run, report) = trace_env(
        name,
        args,
        &[("WORKLOAD_TRUTH", &truth)],
        Duration::from_secs(120),
    );
    (run, report, Truth::read(&truth))
}

/// What [`attach_gated`] returns.
pub struct AttachRun {
    pub run: ToolRun,
    pub report: serde_json::Value,
    pub truth: Truth,
}

/// The main use case, with exact ground truth: starts `program args` (with
/// `env`) held at its start gate (`WORKLOAD_GO_SIGNAL=1`, see
/// `workloads/truth.h`), attaches the tool to it with `-p PID` and
/// `flags`, and once the tool says it is tracing sends the go signal: the
/// workload does all its measured work while traced, writes its truth and
/// exits, which ends the session.
pub fn attach_gated(
    name: &str,
    flags: &[&str],
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> AttachRun {
    attach_gated_with(name, flags, program, args, env, |_| {})
}

/// [`attach_gated`], calling `look` with the target's pid once it is
/// ready, before the tool attaches.
pub fn attach_gated_with(
    name: &str,
    flags: &[&str],
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    look: impl FnOnce(u32),
) -> AttachRun {
    let truth_path = Truth::path(name);
    let truth_str = truth_path.to_str().expect("UTF-8 path").to_string();
    let mut all_env = vec![("WORKLOAD_GO_SIGNAL", "1"), ("WORKLOAD_TRUTH", &truth_str)];
    all_env.extend_from_slice(env);
    let mut target = TestProcess::spawn_env(program, args, &all_env);
    target.wait_ready();
    look(target.pid());
    let pid = target.pid().to_string();
    let json = report_path(name);
    let mut args = vec![
        "-p",
        &pid,
        "--no-tui",
        "--json",
        json.to_str().expect("UTF-8 path"),
    ];
    args.extend_from_slice(flags);
    let tool = TracingTool::start(&args);
    // SAFETY: kill with the pid of our own unreaped child.
    unsafe { libc::kill(target.pid() as i32, libc::SIGUSR1) };
    let status = target.wait_timeout(Duration::from_secs(120));
    assert!(
        status.is_some_and(|s| s.success()),
        "the workload failed: {status:?}"
    );
    let run = tool.finish(Duration::from_secs(120));
    assert_eq!(
        run.code(),
        0,
        "memprof-ebpf -p {pid} {flags:?} failed: {}",
        run.stderr
    );
    AttachRun {
        report: read_report(&json),
        truth: Truth::read(&truth_path),
        run,
    }
}

/// The tool started with `-v` and running: [`TracingTool::start`] returns
/// once it has logged that it traces (every probe attached), which is when
/// a test may start the work it wants seen, or signal the tool.
pub struct TracingTool {
    child: Child,
    start: Instant,
    stderr: std::thread::JoinHandle<String>,
}

impl TracingTool {
    /// Starts the tool with `args` (plus `-v`) and waits until it traces.
    pub fn start(args: &[&str]) -> Self {
        let start = Instant::now();
        let mut child = Command::new(tool())
            .arg("-v")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting memprof-ebpf");
        let stderr = child.stderr.take().expect("stderr is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = std::thread::spawn(move || {
            let mut all = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Logged once everything is attached (session::run).
                if line.contains("tracing pid") {
                    let _ = tx.send(());
                }
                all.push_str(&line);
                all.push('\n');
            }
            all
        });
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            let log = stderr.join().unwrap_or_default();
            panic!("memprof-ebpf {args:?} never said it was tracing: {log}");
        }
        Self {
            child,
            start,
            stderr,
        }
    }

    /// The tool's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the tool to exit, at most `limit` from its start.
    pub fn finish(self, limit: Duration) -> ToolRun {
        let mut run = finish(self.child, self.start, limit);
        run.stderr = self.stderr.join().expect("stderr reader");
        run
    }
}
