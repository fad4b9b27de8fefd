//! Containers and services: a target in a private mount namespace, run
//! from a filesystem only that namespace sees with its own copy of libc
//! (what a container's root filesystem is from the host), is attached with
//! `-p` and gives the same findings as the same workload run directly; a
//! binary deleted after it started is still symbolized; a process in a
//! pid namespace is shown with its namespace ids; and `--cgroup` traces a
//! cgroup's processes, one of them started after the tool attached.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memprof::report::{
    model::{AllocOp, LockKind, SamplingScope},
    Report,
};
use memprof_tests::*;

use crate::allocator::{slowalloc_excess_ns, SLOW_FREE_NS, SLOW_MALLOC_NS};

/// Runs `program` (with `env` and `args`) in a private mount namespace
/// from a tmpfs mounted at `dir`, which only that namespace sees, with
/// `files` (our libc, a preloaded library) copied next to it and found
/// there first (`LD_LIBRARY_PATH`). The process keeps the pid `unshare`
/// started with (no fork), so it is the child the returned command
/// spawns: `(program, args)` for [`attach_gated`].
fn in_private_root(
    dir: &Path,
    files: &[&Path],
    env: &[(&str, &str)],
    program: &Path,
    args: &[&str],
) -> (PathBuf, Vec<String>) {
    const SCRIPT: &str = r#"d=$1; shift
mount -t tmpfs memprof-test "$d" || exit 90
while [ "$1" != -- ]; do cp "$1" "$d/" || exit 91; shift; done; shift
exec env LD_LIBRARY_PATH="$d" "$@""#;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("creating the mount point");
    let inside = dir.join(program.file_name().expect("a file name"));
    let mut all: Vec<String> = ["--mount", "--propagation", "private", "sh", "-c", SCRIPT]
        .map(String::from)
        .to_vec();
    all.push("sh".into());
    all.push(dir.display().to_string());
    all.extend(
        files
            .iter()
            .chain([&program])
            .map(|f| f.display().to_string()),
    );
    all.push("--".into());
    all.extend(env.iter().map(|(k, v)| format!("{k}={v}")));
    all.push(inside.display().to_string());
    all.extend(args.iter().map(|a| a.to_string()));
    (PathBuf::from("unshare"), all)
}

/// The C library this test (and the C workloads) use.
fn our_libc() -> PathBuf {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("our maps");
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| Path::new(p).file_name().is_some_and(|n| n == "libc.so.6"))
        .map(PathBuf::from)
        .expect("libc.so.6 in our maps")
}

/// The files process `pid` maps whose name ends with one of `names`.
fn mapped(pid: u32, names: &[&str]) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut files: Vec<String> = maps
        .lines()
        .map(|l| l.split_whitespace().skip(5).collect::<Vec<_>>().join(" "))
        .filter(|p| names.iter().any(|n| p.ends_with(n)))
        .collect();
    files.dedup();
    files
}

/// Whether `unshare` can make a private mount namespace here (a
/// container may forbid it): the namespace tests skip loudly if not.
fn can_unshare(test: &str) -> bool {
    let ok = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "true"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        skip(
            test,
            "unshare --mount fails here: no private mount namespace",
        );
    }
    ok
}

/// What must be the same whether the `locks contended` workload runs
/// directly or from its own root: the hot user function, g_hot_lock's
/// finding (a mutex, waited for at the WAIT line, released at RELEASE,
/// every acquisition counted), and libc's functions named.
fn assert_locks_findings(report: &Report, truth: &Truth, how: &str) {
    let hot = &report.hot_functions;
    let top_user = hot
        .iter()
        .find(|h| h.module == "locks")
        .unwrap_or_else(|| panic!("{how}: no function of the workload: {hot:#?}"));
    assert_eq!(top_user.function, "busy_ns", "{how}: {hot:#?}");
    assert!(
        top_user
            .file
            .as_deref()
            .is_some_and(|f| f.ends_with("locks.c")),
        "{how}: {top_user:#?}"
    );
    assert!(
        hot.iter()
            .any(|h| h.module == "libc.so.6" && !h.function.contains("+0x")),
        "{how}: libc's functions are named: {hot:#?}"
    );
    let locks = &report.locks;
    let lock = locks
        .iter()
        .find(|l| l.name.as_deref() == Some("g_hot_lock"))
        .unwrap_or_else(|| panic!("{how}: g_hot_lock is listed: {locks:#?}"));
    assert_eq!(lock.kind, LockKind::Mutex, "{how}: {lock:#?}");
    let waiters: Vec<(&str, Option<u32>)> = lock
        .waiters
        .iter()
        .map(|s| (s.function.as_str(), s.line))
        .collect();
    let holders: Vec<(&str, Option<u32>)> = lock
        .holders
        .iter()
        .map(|s| (s.function.as_str(), s.line))
        .collect();
    for (list, marker, sites, shown) in [
        (
            "waiters",
            "// WAIT",
            waiters,
            &lock.waiters as &dyn std::fmt::Debug,
        ),
        ("holders", "// RELEASE", holders, &lock.holders),
    ] {
        let line = marked_line("locks", marker);
        assert!(
            sites
                .iter()
                .any(|&(function, at)| function == "contend_hot" && at == Some(line)),
            "{how}: {list} at contend_hot locks.c:{line}: {shown:#?}"
        );
    }
    assert_near(
        &format!("{how}: g_hot_lock acquisitions"),
        lock.acquisitions.unwrap_or(0),
        truth.get("hot_acquisitions"),
        0.01,
        &format!("{lock:#?}"),
    );
}

/// Proves that files are opened in the target's mount namespace: the
/// `locks` workload, run from a tmpfs that only its private mount
/// namespace sees and with its own copy of libc, is attached with `-p`
/// and its functions, source lines, lock finding and counts are the
/// same as when it runs directly. Before #20 every frame was
/// `locks+0x...` and no lock function was found to probe.
#[test]
fn a_private_mount_namespace_gives_the_same_findings() {
    let test = "a_private_mount_namespace_gives_the_same_findings";
    if !require_root(test) || !can_unshare(test) {
        return;
    }
    let locks = build_workload("locks", Variant::Debug).expect("building locks");
    let flags = ["--lock-mode", "full", "--alloc-mode", "off"];
    let args = ["contended", "4", "2"];
    let direct = attach_gated("ns-direct", &flags, &locks, &args, &[]);
    assert_locks_findings(&typed(&direct.report), &direct.truth, "direct");

    let dir = workload_dir().join("ns-root");
    let libc = our_libc();
    let (unshare, ns_args) = in_private_root(&dir, &[&libc], &[], &locks, &args);
    let ns_args: Vec<&str> = ns_args.iter().map(String::as_str).collect();
    // The files it maps are the copies, which our namespace cannot see.
    let files = dir.display().to_string();
    let mut seen = Vec::new();
    let run = attach_gated_with("ns-private", &flags, &unshare, &ns_args, &[], |pid| {
        seen = mapped(pid, &["/locks", "/libc.so.6"]);
    });
    assert_eq!(
        seen,
        [format!("{files}/locks"), format!("{files}/libc.so.6")],
        "the workload maps its own copies"
    );
    assert!(
        !dir.join("locks").exists() && !dir.join("libc.so.6").exists(),
        "our namespace does not see the target's files"
    );
    assert_locks_findings(&typed(&run.report), &run.truth, "private root");
    let _ = std::fs::remove_dir(&dir);
    assert_no_programs_left();
}

/// Proves the allocator is found and timed in the target's own files: a
/// preloaded allocator with known latencies (slowalloc: malloc 3 us, free
/// 1 us), copied with libc into the private root, is the one traced, and
/// its latencies are right.
#[test]
fn allocator_latency_in_a_private_mount_namespace() {
    let test = "allocator_latency_in_a_private_mount_namespace";
    if !require_root(test) || !can_unshare(test) {
        return;
    }
    let alloc = build_workload("alloc", Variant::Debug).expect("building alloc");
    let lib = build_shared_lib("slowalloc").expect("building libslowalloc.so");
    let dir = workload_dir().join("ns-alloc-root");
    let preload = format!("LD_PRELOAD={}/libslowalloc.so", dir.display());
    let (key, value) = preload.split_once('=').unwrap();
    let (unshare, args) = in_private_root(
        &dir,
        &[&our_libc(), &lib],
        &[(key, value)],
        &alloc,
        &["threads", "2", "5000"],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = attach_gated(
        "ns-alloc",
        &["--alloc-mode", "full", "--lock-mode", "off"],
        &unshare,
        &args,
        &[],
    );
    let report = typed(&run.report);
    let a = &report.allocator;
    assert_eq!(
        a.path.as_deref(),
        Some(format!("{}/libslowalloc.so", dir.display()).as_str()),
        "the target's own copy is traced: {a:#?}"
    );
    // What each call really takes untraced, timed on our copy of the shim.
    let excess = slowalloc_excess_ns(&lib).round() as u64;
    for (op, truth_ns) in [
        (AllocOp::Malloc, SLOW_MALLOC_NS + excess),
        (AllocOp::Free, SLOW_FREE_NS + excess),
    ] {
        let rows: Vec<_> = a.ops.iter().filter(|r| r.op == op).collect();
        let traced: u64 = rows.iter().map(|r| r.traced).sum();
        assert!(traced > 0, "{op} traced: {a:#?}");
        let p50 = rows
            .iter()
            .map(|r| r.p50_ns.unwrap_or(0) * r.traced)
            .sum::<u64>()
            / traced;
        // As in the allocator suite: 20% (the bench judges the 10%). A CI
        // run on a fresh machine reported free at 1,237 ns against a
        // nominal 1,020 (by hand 1,044-1,083), when a free takes ~1,070
        // untraced; the probes' calibrated cost is printed too.
        assert_near(
            &format!("{op} p50 (ns)"),
            p50,
            truth_ns,
            0.2,
            &format!("{:#?}\n{:#?}", a.probe_cost_ns, a.ops),
        );
    }
    let _ = std::fs::remove_dir(&dir);
    assert_no_programs_left();
}

/// Attached to a parent whose work runs in child processes started before
/// the tool (as `stress-ng` hands its stressors to workers), the report
/// says so and how to trace them: before, it showed an idle process and
/// nothing else. Listed with `-p`, the children get no such note.
#[test]
fn children_started_before_attaching_are_named_in_a_note() {
    if !require_root("children_started_before_attaching_are_named_in_a_note") {
        return;
    }
    /// Ends the shell and its sleeps however the test ends.
    struct Family(std::process::Child);
    impl Drop for Family {
        fn drop(&mut self) {
            for kid in children_of(self.0.id()) {
                let _ = Command::new("kill").arg(kid.to_string()).status();
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let family = Family(
        Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .expect("sh runs"),
    );
    let pid = family.0.id();
    let is_sleep = |p: &u32| {
        std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "sleep")
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let children = loop {
        let kids = children_of(pid);
        if (kids.len() == 2 && kids.iter().all(is_sleep)) || std::time::Instant::now() > deadline {
            break kids;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(children.len(), 2, "sh started its two sleeps: {children:?}");
    let (_, report) = attach_for("children-note", &pid.to_string(), "2s");
    let all = format!("{pid},{},{}", children[0], children[1]);
    let (_, listed) = attach_for("children-listed", &all, "2s");
    drop(family);
    let note = report
        .notes
        .iter()
        .find(|n| n.contains("child process(es) started before tracing"))
        .unwrap_or_else(|| panic!("no note on the children: {:#?}", report.notes));
    assert!(
        note.contains(&format!("pid {pid} has 2 child"))
            && note.contains(&format!("{} sleep", children[0]))
            && note.contains(&format!("-p {all} ")),
        "{note}"
    );
    assert!(
        !listed
            .notes
            .iter()
            .any(|n| n.contains("started before tracing")),
        "{:#?}",
        listed.notes
    );
    assert_no_programs_left();
}

/// The processes whose parent is `pid`, by pid.
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|p: &u32| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
            rest.split_whitespace().nth(1) == Some(&pid.to_string())
        })
        .collect();
    kids.sort_unstable();
    kids
}

/// Proves a binary deleted after it started is read from the mapping, not
/// looked for at its path: the hot function of `spin`, started from a
/// copy that is then removed, is named with its source line.
#[test]
fn a_deleted_binary_is_still_symbolized() {
    if !require_root("a_deleted_binary_is_still_symbolized") {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let copy = workload_dir().join("spin-deleted");
    std::fs::copy(&spin, &copy).expect("copying spin");
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut target = TestProcess::spawn(&copy, &["time", "2", "20"]);
    target.wait_ready();
    std::fs::remove_file(&copy).expect("deleting the binary");
    assert_eq!(
        mapped(target.pid(), &["spin-deleted (deleted)"]).len(),
        1,
        "the kernel says the mapped file is deleted"
    );
    let (_, report) = attach_for("deleted-binary", &target.pid().to_string(), "2s");
    let hot = hot_function(&report, "spin_worker")
        .unwrap_or_else(|| panic!("spin_worker is named: {:#?}", report.hot_functions));
    assert_eq!(hot.module, "spin-deleted", "{hot:#?}");
    assert!(
        hot.file.as_deref().is_some_and(|f| f.ends_with("spin.c")) && hot.line.is_some(),
        "with its source line: {hot:#?}"
    );
    assert_no_programs_left();
}

/// Proves a binary replaced on disk after it started (a package upgrade
/// under a running service: a new file renamed over the old name) is read
/// from what the process maps, not from the new file at its path: `spin`
/// runs from a path where `locks` is then installed, and the hot function
/// is still spin's, with its source line.
#[test]
fn a_replaced_binary_is_read_from_its_mapping() {
    if !require_root("a_replaced_binary_is_read_from_its_mapping") {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let locks = build_workload("locks", Variant::Debug).expect("building locks");
    let path = workload_dir().join("spin-replaced");
    std::fs::copy(&spin, &path).expect("copying spin");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut target = TestProcess::spawn(&path, &["time", "2", "20"]);
    target.wait_ready();
    let upgrade = workload_dir().join("spin-replaced.new");
    std::fs::copy(&locks, &upgrade).expect("copying locks");
    std::fs::rename(&upgrade, &path).expect("replacing the binary");
    let (_, report) = attach_for("replaced-binary", &target.pid().to_string(), "2s");
    let hot = hot_function(&report, "spin_worker")
        .unwrap_or_else(|| panic!("spin_worker is named: {:#?}", report.hot_functions));
    assert!(
        hot.file.as_deref().is_some_and(|f| f.ends_with("spin.c")),
        "spin's source: {hot:#?}"
    );
    drop(target);
    let _ = std::fs::remove_file(&path);
    assert_no_programs_left();
}

/// A cgroup that does not exist, or has no process, is a usage error
/// (exit code 2) that names it, before anything is loaded.
#[test]
fn a_missing_or_empty_cgroup_is_a_usage_error() {
    let test = "a_missing_or_empty_cgroup_is_a_usage_error";
    if !require_root(test) {
        return;
    }
    let run = run_tool(
        &["--cgroup", "memprof-no-such.service", "--duration", "1s"],
        Duration::from_secs(30),
    );
    assert_eq!(run.code(), 2, "{}", run.stderr);
    assert!(run.stderr.contains("no such cgroup"), "{}", run.stderr);
    let name = format!("memprof-empty-{}", std::process::id());
    let Some(_cgroup) = TestCgroup::create_or_skip(test, &name) else {
        return;
    };
    let run = run_tool(
        &["--cgroup", &name, "--duration", "1s"],
        Duration::from_secs(30),
    );
    assert_eq!(run.code(), 2, "{}", run.stderr);
    assert!(run.stderr.contains("no process in it"), "{}", run.stderr);
    assert_no_programs_left();
}

/// Proves pid namespaces are shown: a workload that is pid 1 of its own
/// pid namespace is reported with its host pid and `ns_pid` 1, its
/// threads with the ids their namespace gives them.
#[test]
fn a_pid_namespace_shows_both_ids() {
    let test = "a_pid_namespace_shows_both_ids";
    if !require_root(test) {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    let mut unshare = TestProcess::spawn(
        Path::new("unshare"),
        &[
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            spin.to_str().unwrap(),
            "time",
            "2",
            "20",
        ],
    );
    unshare.wait_ready();
    let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.pid()))
        .unwrap_or_default();
    let Some(pid) = children.split_whitespace().next().map(String::from) else {
        skip(test, "unshare --pid started no child");
        return;
    };
    let (run, report) = attach_for("pid-namespace", &pid, "2s");
    let processes = &report.target.processes;
    assert_eq!(processes.len(), 1, "{processes:#?}");
    assert_eq!(Some(processes[0].pid), pid.parse().ok());
    assert_eq!(processes[0].ns_pid, Some(1), "{processes:#?}");
    let threads = &report.threads;
    assert_eq!(threads.len(), 3, "main and two workers: {threads:#?}");
    for t in threads {
        let ns = t.ns_tid.unwrap_or_else(|| panic!("{t:#?}"));
        assert!((1..=3).contains(&ns) && t.tid != ns, "{t:#?}");
        assert_eq!(Some(t.pid), pid.parse().ok(), "{t:#?}");
    }
    assert!(
        run.stdout.contains(&format!("pid {pid} (ns 1)")),
        "the summary shows both: {}",
        run.stdout
    );
    assert_no_programs_left();
}

/// The unified (cgroup v2) hierarchy's mount point.
fn unified_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        (after.split_whitespace().next()? == "cgroup2")
            .then(|| PathBuf::from(before.split_whitespace().nth(4).unwrap_or("")))
    })
}

/// A cgroup made for a test, removed (with its processes killed) at the
/// end.
struct TestCgroup(PathBuf);

impl TestCgroup {
    /// A cgroup named `name` under the cgroup v2 mount, or None after a
    /// loud skip of `test` when there is no such mount or it cannot be
    /// made there.
    fn create_or_skip(test: &str, name: &str) -> Option<Self> {
        let Some(root) = unified_root() else {
            skip(test, "no cgroup v2 hierarchy is mounted");
            return None;
        };
        let dir = root.join(name);
        let _ = std::fs::remove_dir(&dir);
        match std::fs::create_dir(&dir) {
            Ok(()) => Some(Self(dir)),
            Err(e) => {
                let why = format!("cannot create a cgroup under {}: {e}", root.display());
                skip(test, &why);
                None
            }
        }
    }

    fn join(&self, pid: u32) {
        std::fs::write(self.0.join("cgroup.procs"), pid.to_string()).expect("joining the cgroup");
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("cgroup.kill"), "1");
        let start = Instant::now();
        while std::fs::remove_dir(&self.0).is_err() && start.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Proves `--cgroup`: a cgroup created here holds one `spin` when the
/// tool attaches by the cgroup's name, a second `spin` starts in it
/// (joins, then execs, as service managers do) after the tool traces,
/// and a third, running already, is moved into it. All are traced, their
/// threads grouped under their processes, each with its own samples; the
/// session goes on after the first exits.
#[test]
fn a_cgroup_is_traced_with_a_process_started_later() {
    let test = "a_cgroup_is_traced_with_a_process_started_later";
    if !require_root(test) {
        return;
    }
    let name = format!("memprof-test-{}", std::process::id());
    let Some(cgroup) = TestCgroup::create_or_skip(test, &name) else {
        return;
    };
    let spin = build_workload("spin", Variant::Debug).expect("building spin");
    // The main one (lowest pid) ends first: the session goes on. It runs
    // 3 s: the attach (up to ~1 s on a loaded CI machine) comes out of
    // that, and the other two share the CPUs with it after.
    let mut first = TestProcess::spawn(&spin, &["time", "1", "3"]);
    first.wait_ready();
    cgroup.join(first.pid());
    let json = report_path("cgroup");
    let tool = TracingTool::start(&[
        "--cgroup",
        &name,
        "--duration",
        "6s",
        "--no-tui",
        "--json",
        json.to_str().unwrap(),
    ]);
    // Joins the cgroup, then runs spin: its exec is what the kernel sees.
    let procs = cgroup.0.join("cgroup.procs");
    let script = format!("echo $$ > {} && exec \"$0\" time 2 3", procs.display());
    let mut second = TestProcess::spawn(Path::new("sh"), &["-c", &script, spin.to_str().unwrap()]);
    second.wait_ready();
    // Runs already, and is moved into the cgroup: no exec to see; the
    // tool's look at the cgroup (every second) finds it.
    let mut third = TestProcess::spawn(&spin, &["time", "1", "3"]);
    third.wait_ready();
    cgroup.join(third.pid());
    let run = tool.finish(Duration::from_secs(60));
    assert_eq!(run.code(), 0, "{}", run.stderr);
    let report = read_typed(&json);
    // A cgroup's processes come and go: its timer is one per CPU.
    assert_eq!(report.sampling.scope, SamplingScope::Cpus);
    let processes = &report.target.processes;
    let by_pid = |pid: u32| {
        processes
            .iter()
            .find(|p| p.pid == pid)
            .unwrap_or_else(|| panic!("pid {pid} is listed: {processes:#?}"))
    };
    for (process, threads) in [(&first, 2usize), (&second, 3)] {
        let p = by_pid(process.pid());
        assert_eq!(p.threads, threads, "main and workers: {p:#?}");
        assert!(p.samples > 500, "{p:#?}");
        assert!(p.command.contains("spin time"), "{p:#?}");
    }
    let moved = by_pid(third.pid());
    assert_eq!(moved.threads, 2, "{moved:#?}");
    assert!(moved.samples > 100, "{moved:#?}");
    assert_eq!(processes.len(), 3, "{processes:#?}");
    let threads = &report.threads;
    let of = |pid: u32| threads.iter().filter(|t| t.pid == pid).count();
    assert_eq!(
        (of(first.pid()), of(second.pid()), of(third.pid())),
        (2, 3, 2),
        "{threads:#?}"
    );
    let notes = &report.notes;
    let joined = format!(
        "2 process(es) that joined the cgroup (pid {}, {})",
        second.pid(),
        third.pid()
    );
    assert!(notes.iter().any(|n| n.contains(&joined)), "{notes:#?}");
    assert!(hot_function(&report, "spin_worker").is_some());
    drop(cgroup);
    assert_no_programs_left();
}
