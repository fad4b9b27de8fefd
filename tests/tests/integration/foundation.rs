//! Foundation: attach, sample, symbolize, follow threads, summarize, detach.
//!
//! Each test runs the real tool against a real workload and asserts on the
//! JSON report (and exit code, and what is left loaded in the kernel).
//! They share kernel state, so `cargo xtask test` runs them one at a time.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use memprof::{
    kernel::sampler::Tick,
    report::{
        model::{Loader, SampleSource, SamplingScope, Schema},
        Report,
    },
};
use memprof_tests::*;

const LIMIT: Duration = Duration::from_secs(60);

/// Checks the report names `function` as the hottest, with the marked line
/// of spin.c as its hottest source line.
fn assert_hot(report: &Report, function: &str) {
    let top = report
        .hot_functions
        .first()
        .unwrap_or_else(|| panic!("no hot functions; report: {report:#?}"));
    assert_eq!(
        top.function, function,
        "hottest function; report: {report:#?}"
    );
    let file = top.file.as_deref().unwrap_or_default();
    assert!(
        file.ends_with("spin.c"),
        "source file of {function}: {file:?}"
    );
    let line = marked_line("spin", &format!("HOT {function}"));
    assert_eq!(top.line, Some(line), "hottest line of {function}");
    assert!(top.module.starts_with("spin"), "{top:#?}");
    assert!(top.share > 0.5, "share: {}", top.share);
}

#[test]
fn launch_names_the_hot_function_with_file_and_line() {
    if !require_root("launch_names_the_hot_function_with_file_and_line") {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let (run, report) = trace("launch", &["--", spin.to_str().unwrap(), "time", "2", "2"]);
    let report = typed(&report);
    assert_hot(&report, "spin_worker");
    assert!(report.target.exited, "the target's exit ends the session");
    assert!(report.target.command.contains("spin time 2 2"));
    // Two spinners on two CPUs for ~2 s at 999 Hz: thousands of samples.
    let samples = report.sampling.samples;
    assert!(samples > 1000, "samples: {samples}");
    assert!([SampleSource::CpuClock, SampleSource::Cycles].contains(&report.sampling.source));
    assert_eq!(report.sampling.lost, 0);
    // A launched command is sampled per thread (its threads inherit it).
    assert_eq!(report.sampling.scope, SamplingScope::Threads);
    // Total time from user stacks: the thread function that calls
    // spin_worker has no self time but all of spin_worker's time, at the
    // line of the call.
    let worker = hot_function(&report, "spin_worker").unwrap();
    let caller = hot_function(&report, "spin_thread")
        .unwrap_or_else(|| panic!("no caller from stacks: {report:#?}"));
    assert_eq!(caller.samples, 0, "{caller:#?}");
    let (caller_total, worker_self) = (caller.total_samples, worker.samples);
    assert!(
        caller_total * 10 >= worker_self * 9,
        "caller total {caller_total} vs worker self {worker_self}"
    );
    assert_eq!(caller.line, Some(marked_line("spin", "CALL spin_worker")));
    // Stacks lost to a full map would make totals low; a few can collide.
    let (errors, samples) = (report.sampling.stack_errors, report.sampling.samples);
    assert!(
        errors * 100 <= samples,
        "{errors} stack errors in {samples} samples"
    );
    // Nothing from our launch gate (the tool's own binary before the exec).
    let gate: Vec<_> = report
        .hot_functions
        .iter()
        .filter(|h| h.module == "memprof-ebpf")
        .collect();
    assert!(
        gate.is_empty(),
        "samples of the launch gate leaked in: {gate:#?}"
    );
    // Main thread plus two named spinners, both created after the launch.
    let threads = &report.threads;
    for name in ["spin-0", "spin-1"] {
        let t = threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("thread {name}: {threads:#?}"));
        assert!(t.samples > 50, "{name} sampled: {t:#?}");
        assert_eq!(t.created_by, Some(report.target.pid));
    }
    // The summary is printed too, ranked, with the hot function first.
    let first_row = run
        .stdout
        .lines()
        .skip_while(|l| !l.contains("samples  function"))
        .nth(1)
        .unwrap_or("");
    assert!(
        first_row.contains("spin_worker") && first_row.contains("spin.c:"),
        "summary:\n{}",
        run.stdout
    );
    assert_no_programs_left();
}

#[test]
fn the_scheduler_tick_samples_without_an_interrupt_of_its_own() {
    if !require_root("the_scheduler_tick_samples_without_an_interrupt_of_its_own") {
        return;
    }
    let tick = match Tick::find() {
        Ok(tick) => tick,
        Err(why) => {
            eprintln!("SKIP: this kernel has no tick to sample on: {why}");
            return;
        }
    };
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let args = [
        "--sampler",
        "tick",
        "--",
        spin.to_str().unwrap(),
        "time",
        "2",
        "2",
    ];
    let (run, report) = trace("tick", &args);
    let report = typed(&report);
    let s = &report.sampling;
    assert_eq!(s.source, SampleSource::Tick, "{s:?}");
    assert_eq!(s.frequency_hz, tick.hz, "the kernel's CONFIG_HZ");
    assert_eq!(s.scope, SamplingScope::Threads);
    assert_eq!(s.interrupt_ns, None, "no interrupt of the tool's own");
    assert!(
        report.notes.iter().any(|n| n.contains("scheduler tick")),
        "{:?}",
        report.notes
    );
    // The same function and line as the timer finds: the tick's user
    // registers are the interrupted ones.
    assert_hot(&report, "spin_worker");
    // Two spinners, 2 s each: a tick every 1/HZ s of each one's running
    // time (a little less when the tool's own threads take the CPU).
    for name in ["spin-0", "spin-1"] {
        let t = report
            .threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("thread {name}: {:#?}", report.threads));
        let expected = 2.0 * tick.hz as f64;
        let got = t.samples as f64;
        assert!(
            (0.75 * expected..=1.05 * expected).contains(&got),
            "{name}: {got} samples against {expected} ticks of 2 s"
        );
    }
    assert!(run.stdout.contains("(tick)"), "summary:\n{}", run.stdout);
    assert_no_programs_left();
}

#[test]
fn attach_by_pid_follows_a_thread_created_later_and_honours_duration() {
    if !require_root("attach_by_pid_follows_a_thread_created_later_and_honours_duration") {
        return;
    }
    // One spinner for 14 s; a second thread (late_worker) appears after
    // 2.5 s (attaching takes about 0.2 s). The tool ends about 4 s after the
    // session: the kernel removes the allocator probes one grace period at
    // a time (the summary is shown first).
    let mut target = start_spin(&["time", "1", "14", "2500"]);
    let pid = target.pid().to_string();
    let (run, report) = trace("attach", &["-p", &pid, "--duration", "4s"]);
    let report = typed(&report);

    assert_eq!(report.target.pid.to_string(), pid);
    assert!(!report.target.exited);
    let duration = report.duration_s;
    // The session is stopped by the 4 s timer; the event loop may notice
    // it late on a loaded machine, never early.
    assert!(
        (4.0..=6.0).contains(&duration),
        "--duration 4s traced {duration} s"
    );
    // And the whole run, start-up, symbolization and detaching included,
    // ends: a bound against hanging (detaching takes ~0.2 s a probe), not a
    // performance assertion.
    assert!(
        run.wall < Duration::from_secs(30),
        "wall time {:?}",
        run.wall
    );

    // Attached to spinning threads, which seldom switch, the running
    // threads get a timer each, and the thread created later inherits it.
    let switches = report
        .sampling
        .switches_per_s
        .expect("counted when attached");
    assert!(switches < 50_000.0, "spinners switching {switches}/s");
    assert_eq!(report.sampling.scope, SamplingScope::Threads);
    let late = hot_function(&report, "late_worker")
        .unwrap_or_else(|| panic!("late_worker not sampled: {report:#?}"));
    assert!(late.samples > 200, "late_worker: {late:#?}");
    assert_eq!(late.line, Some(marked_line("spin", "HOT late_worker")));
    let threads = &report.threads;
    let late_thread = threads
        .iter()
        .find(|t| t.name == "late")
        .expect("the late thread is listed");
    assert_eq!(
        late_thread.created_by.unwrap().to_string(),
        pid,
        "seen being created"
    );
    assert!(late_thread.samples > 200);
    assert!(hot_function(&report, "spin_worker").is_some());
    // The target keeps running: tracing never stops it.
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target must survive the session"
    );
    assert_no_programs_left();
}

/// Attached to threads that switch hundreds of thousands of times a
/// second, the timer is one per CPU: per-thread events opened on threads
/// that already run stop one timer and start another at each of their
/// switches (Debian's `sysbench threads` pinned that way kept 0.11 of its
/// speed under them; see `memprof/src/kernel/sampler.rs`). Where an
/// interrupt costs 5 µs or more (these VMs) the rate is 99 Hz, not 999,
/// and a note says why (an attached `sysbench threads` kept 0.70 of its
/// throughput at 999 Hz); `--sample-freq 999` still gets 999. Each rate
/// keeps the target's samples: its threads keep CPU 0 busy for the 2 s.
#[test]
fn attached_to_threads_that_switch_often_the_timer_is_per_cpu_or_the_tick() {
    if !require_root("attached_to_threads_that_switch_often_the_timer_is_per_cpu_or_the_tick") {
        return;
    }
    let locks = build_workload("locks", Variant::Debug).expect("building locks");
    // Two threads on one CPU, each yielding to the other at every round,
    // for longer than the two sessions here take: the test ends them
    // (with 12 s they were gone before a session under CI's load ended;
    // with 40 s, once here before the second of two).
    let args = ["-c", "0", locks.to_str().unwrap(), "yield", "2", "120"];
    let mut target = TestProcess::spawn(std::path::Path::new("/usr/bin/taskset"), &args);
    target.wait_ready();
    let pid = target.pid().to_string();
    // The timer's interrupt cost, from the asked rate's run, first.
    let mut slow = false;
    for asked in [Some("999"), None] {
        // The sampler alone: with the lock and allocator probes on, closing
        // their uprobe links at exit waited in the kernel's
        // synchronize_srcu for up to 57 s on this target (1 session in 4
        // here, kernel 6.18), a defect of its own (#33's closing note).
        let mut args = vec![
            "-p",
            &pid,
            "--duration",
            "2s",
            "--lock-mode",
            "off",
            "--alloc-mode",
            "off",
        ];
        args.extend(asked.iter().flat_map(|hz| ["--sample-freq", hz]));
        let (_, report) = trace("attach-switching", &args);
        let report = typed(&report);
        let s = &report.sampling;
        let switches = s.switches_per_s.expect("counted when attached");
        assert!(
            switches > 50_000.0,
            "two pinned yielders switching {switches}/s"
        );
        // Where the timer's rate would be lowered, the tick samples when
        // this kernel has one to sample on.
        if asked.is_some() {
            slow = s.interrupt_ns.is_some_and(|ns| ns >= 5_000.0);
        }
        let lowered = asked.is_none() && slow;
        let tick = Tick::find().ok().filter(|_| lowered);
        if lowered && tick.is_none() {
            eprintln!("SKIP part: no tick to sample on here ({:?})", Tick::find());
        }
        let expected: u64 = match (tick, lowered) {
            (Some(t), _) => t.hz,
            (None, true) => 99,
            (None, false) => 999,
        };
        assert_eq!(s.frequency_hz, expected, "asked {asked:?}: {s:?}");
        let (scope, source) = match tick {
            Some(_) => (SamplingScope::Threads, SampleSource::Tick),
            None => (SamplingScope::Cpus, SampleSource::CpuClock),
        };
        assert_eq!(
            (s.scope, s.source),
            (scope, source),
            "asked {asked:?}: {s:?}"
        );
        let note = |text: &str| report.notes.iter().any(|n| n.contains(text));
        assert_eq!(
            note("CPU sampling at 99 Hz"),
            lowered && tick.is_none(),
            "asked {asked:?}: {:?}",
            report.notes
        );
        assert_eq!(
            note("scheduler tick") && note("where a timer of its own would stall"),
            tick.is_some(),
            "asked {asked:?}: {:?}",
            report.notes
        );
        assert_eq!(
            s.interrupt_ns.is_none(),
            tick.is_some(),
            "no interrupt of ours on the tick"
        );
        // Half of CPU 0's 2 s.
        assert!(
            s.samples > expected,
            "asked {asked:?}: samples of the target: {}",
            s.samples
        );
    }
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "the target must survive the session"
    );
    assert_no_programs_left();
}

#[test]
fn target_exiting_mid_session_still_yields_a_report() {
    if !require_root("target_exiting_mid_session_still_yields_a_report") {
        return;
    }
    // 3 s: attaching takes 0.5-1 s on a loaded 2-CPU machine, and with
    // 1.5 s the traced part fell under the 0.5 s checked below (0.49 s).
    let target = start_spin(&["time", "2", "3"]);
    let pid = target.pid().to_string();
    let json = report_path("exit-mid");
    let run = run_tool(
        &[
            "-p",
            &pid,
            "--duration",
            "60s",
            "--json",
            json.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    let report = read_typed(&json);
    // The target exits after 3 s: the session ends then, not after the
    // 60 s asked for.
    let traced = report.duration_s;
    assert!(
        (0.5..30.0).contains(&traced),
        "the session must end with the target, traced {traced} s"
    );
    assert!(report.target.exited);
    assert!(report.notes.iter().any(|n| n.contains("exited")));
    assert_hot(&report, "spin_worker");
    assert!(
        run.stdout.contains("target exited"),
        "summary says so:\n{}",
        run.stdout
    );
    assert_no_programs_left();
}

#[test]
fn sigint_and_sigterm_detach_and_still_print_the_summary() {
    if !require_root("sigint_and_sigterm_detach_and_still_print_the_summary") {
        return;
    }
    let mut target = start_spin(&["time", "1", "60"]);
    for (name, signal) in [("SIGINT", libc::SIGINT), ("SIGTERM", libc::SIGTERM)] {
        let json = report_path(&format!("signal-{name}"));
        let pid = target.pid().to_string();
        let tool = TracingTool::start(&["-p", &pid, "--json", json.to_str().unwrap()]);
        // Tracing: give the sampler a second of the spinning target.
        std::thread::sleep(Duration::from_secs(1));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(tool.pid() as i32, signal) };
        let run = tool.finish(LIMIT);
        assert_eq!(run.code(), 0, "{name}: stderr: {}", run.stderr);
        assert!(
            run.stdout.contains("Hot functions"),
            "summary after {name}:\n{}",
            run.stdout
        );
        let report = read_typed(&json);
        assert_hot(&report, "spin_worker");
        assert!(
            target.child.try_wait().unwrap().is_none(),
            "{name} to the profiler must not stop the target"
        );
        assert_no_programs_left();
    }
}

#[test]
fn stripped_binary_degrades_to_module_and_offset() {
    if !require_root("stripped_binary_degrades_to_module_and_offset") {
        return;
    }
    let spin = build_workload("spin", Variant::Stripped).unwrap();
    let (_, report) = trace(
        "stripped",
        &["--", spin.to_str().unwrap(), "time", "2", "1.5"],
    );
    let report = typed(&report);
    let top = report
        .hot_functions
        .first()
        .unwrap_or_else(|| panic!("no hot functions: {report:#?}"));
    assert_eq!(top.module, "spin-stripped");
    let function = top.function.as_str();
    assert!(
        function.starts_with("spin-stripped+0x"),
        "module+offset expected, got {function}"
    );
    assert!(top.file.is_none() && top.line.is_none());
    // Without symbols each function is named by its start, from its FDE
    // in `.eh_frame`: the spinning loop's samples add up to one entry
    // (they were spread over one "function" per sampled instruction).
    assert!(
        top.share > 0.8,
        "the spinning function is one entry: {:#?}",
        report.hot_functions
    );
    // Where `nm` puts spin_worker in the unstripped build: in gcc's
    // default position-independent executable, text's addresses are its
    // file offsets, which name code without a symbol.
    let unstripped = build_workload("spin", Variant::Debug).unwrap();
    let spin_worker = nm_address(&unstripped, 'T', "spin_worker");
    assert_eq!(
        function,
        format!("spin-stripped+{spin_worker:#x}"),
        "named by spin_worker's start"
    );
}

#[test]
fn static_binary_is_symbolized() {
    if !require_root("static_binary_is_symbolized") {
        return;
    }
    let spin = build_workload("spin", Variant::Static).unwrap();
    let (_, report) = trace(
        "static",
        &["--", spin.to_str().unwrap(), "time", "2", "1.5"],
    );
    assert_hot(&typed(&report), "spin_worker");
}

#[test]
fn missing_tracefs_is_mounted() {
    if !require_root("missing_tracefs_is_mounted") {
        return;
    }
    let mounted = || {
        std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .any(|l| l.contains(" /sys/kernel/tracing tracefs "))
    };
    if mounted() {
        let status = Command::new("umount")
            .arg("/sys/kernel/tracing")
            .status()
            .unwrap();
        if !status.success() {
            skip(
                "missing_tracefs_is_mounted",
                "tracefs is busy and cannot be unmounted to test this",
            );
            return;
        }
    }
    assert!(!mounted());
    let run = run_tool(&["--duration", "1s", "--", "/bin/sleep", "3"], LIMIT);
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    assert!(mounted(), "the tool mounts tracefs when it is missing");
    assert_no_programs_left();
}

#[test]
fn bad_input_gets_its_exit_code_and_message() {
    if !require_root("bad_input_gets_its_exit_code_and_message") {
        return;
    }
    let quick = Duration::from_secs(30);
    // Usage errors: 2.
    for args in [
        &[][..],
        &["-p", "1", "--", "ls"],
        &["-p", "1", "--duration", "soon"],
        &["-p", "x"],
        &["-p", "1,,2"],
        &["-p", "1,1"],
    ] {
        let run = run_tool(args, quick);
        assert_eq!(run.code(), 2, "{args:?}: {}", run.stderr);
        assert!(!run.stderr.is_empty());
    }
    // A pid that does not exist: 3.
    let unused = (400_000..4_000_000)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .unwrap();
    let run = run_tool(&["-p", &unused.to_string(), "--duration", "1s"], quick);
    assert_eq!(run.code(), 3, "{}", run.stderr);
    assert!(run.stderr.contains("no such process"), "{}", run.stderr);
    // The same in a list of pids, after one that exists.
    let me = std::process::id().to_string();
    let list = format!("{me},{unused}");
    let run = run_tool(&["-p", &list, "--duration", "1s"], quick);
    assert_eq!(run.code(), 3, "{}", run.stderr);
    assert!(run.stderr.contains(&unused.to_string()), "{}", run.stderr);
    // A kernel thread (kthreadd is pid 2): a usage error.
    let run = run_tool(&["-p", "2", "--duration", "1s"], quick);
    assert_eq!(run.code(), 2, "{}", run.stderr);
    assert!(run.stderr.contains("kernel thread"), "{}", run.stderr);
    // A zombie (exited, not yet reaped): no such process, 3.
    let mut zombie = Command::new("/bin/true").spawn().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let run = run_tool(&["-p", &zombie.id().to_string(), "--duration", "1s"], quick);
    let _ = zombie.wait();
    assert_eq!(run.code(), 3, "zombie: {}", run.stderr);
    // A command that does not exist: 6.
    let run = run_tool(&["--duration", "1s", "--", "/nonexistent/program"], quick);
    assert_eq!(run.code(), 6, "{}", run.stderr);
    assert!(run.stderr.contains("not found"), "{}", run.stderr);
    // A command that exists but cannot start (its interpreter is missing):
    // 6 too, not an empty report.
    let script = workload_dir().join("bad-interpreter.sh");
    std::fs::write(&script, "#!/nonexistent/interpreter\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let run = run_tool(&["--", script.to_str().unwrap()], quick);
    assert_eq!(run.code(), 6, "{}", run.stderr);
    assert!(
        run.stderr.contains("ended before the command started"),
        "{}",
        run.stderr
    );
    // A kernel without BTF: 5 (BTF hidden under an empty tmpfs in a
    // private mount namespace).
    let run = run_tool_with(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount -t tmpfs -o ro none /sys/kernel/btf && exec {} -p 1 --duration 1s",
                tool().display()
            )),
        quick,
    );
    assert_eq!(run.code(), 5, "{}", run.stderr);
    assert!(run.stderr.contains("BTF"), "{}", run.stderr);
    // Not root: 4, with advice.
    let run = run_tool_with(
        Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--inh-caps=-all",
                "--",
            ])
            .arg(tool())
            .args(["-p", "1", "--duration", "1s"]),
        quick,
    );
    assert_eq!(run.code(), 4, "{}", run.stderr);
    assert!(run.stderr.contains("sudo"), "{}", run.stderr);
    // --help lists the exit codes.
    let run = run_tool(&["--help"], quick);
    assert_eq!(run.code(), 0);
    assert!(run.stdout.contains("Exit status") && run.stdout.contains("no such process"));
    assert_no_programs_left();
}

#[test]
fn exec_is_followed_into_the_new_program() {
    if !require_root("exec_is_followed_into_the_new_program") {
        return;
    }
    // before_exec_worker for 3 s, then exec a copy of the program under
    // another name ("spin-next time 1 1.5"): samples of the old image that
    // are read after the exec must still be put in the old file. (3 s, not
    // 1.5: a CI attach took ~1 s, which left too little for 300 samples.)
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let next = workload_dir().join("spin-next");
    std::fs::copy(&spin, &next).unwrap();
    let mut target = TestProcess::spawn(&spin, &["chain", "3", next.to_str().unwrap()]);
    target.wait_ready();
    let (_, report) = trace("exec", &["-p", &target.pid().to_string()]);
    let report = typed(&report);
    assert!(report.target.exited);
    let notes = &report.notes;
    assert!(
        notes.iter().any(|n| n.contains("exec 1 time")),
        "notes: {notes:#?}"
    );
    for (function, module) in [("before_exec_worker", "spin"), ("spin_worker", "spin-next")] {
        let entries: Vec<_> = report
            .hot_functions
            .iter()
            .filter(|h| h.function == function && h.samples > 0)
            .collect();
        assert_eq!(
            entries.len(),
            1,
            "{function} must be in one module only: {entries:#?}"
        );
        let h = entries[0];
        assert_eq!(h.module, module, "{function}");
        assert!(h.samples > 300, "{function}: {h:#?}");
        assert_eq!(
            h.line,
            Some(marked_line("spin", &format!("HOT {function}"))),
            "{function}"
        );
    }
    // The spinner thread of the new image was seen being created.
    let threads = &report.threads;
    assert!(
        threads
            .iter()
            .any(|t| t.name == "spin-0" && t.created_by.is_some()),
        "{threads:#?}"
    );
    assert_no_programs_left();
}

#[test]
fn short_lived_threads_keep_their_names() {
    if !require_root("short_lived_threads_keep_their_names") {
        return;
    }
    // Five threads of ~50 ms each, one after another: gone from /proc long
    // before the loader drains their samples.
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let (_, report) = trace("burst", &["--", spin.to_str().unwrap(), "burst", "5"]);
    let report = typed(&report);
    let threads = &report.threads;
    for i in 0..5 {
        let name = format!("burst-{i}");
        let t = threads
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name}: {threads:#?}"));
        assert!(t.exited, "{t:#?}");
        assert!(t.created_by.is_some(), "{t:#?}");
        assert!(t.samples > 5, "{t:#?}");
    }
}

#[test]
fn a_thread_id_attaches_to_its_whole_process() {
    if !require_root("a_thread_id_attaches_to_its_whole_process") {
        return;
    }
    let target = start_spin(&["time", "2", "10"]);
    let pid = target.pid();
    let tid = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .find(|&t| t != pid)
        .expect("a second thread");
    let (_, report) = trace("tid", &["-p", &tid.to_string(), "--duration", "2s"]);
    let report = typed(&report);
    assert_eq!(report.target.pid, pid, "traces the process of the thread");
    let note = format!("{tid} is a thread of process {pid}");
    assert!(report.notes.iter().any(|n| n.contains(&note)));
    let threads = &report.threads;
    let sampled = threads.iter().filter(|t| t.samples > 100).count();
    assert_eq!(sampled, 2, "both spinners sampled: {threads:#?}");
}

#[test]
fn json_to_stdout_is_pure_json() {
    if !require_root("json_to_stdout_is_pure_json") {
        return;
    }
    let spin = build_workload("spin", Variant::Debug).unwrap();
    let run = run_tool(
        &[
            "--json",
            "-",
            "--",
            spin.to_str().unwrap(),
            "time",
            "1",
            "1",
        ],
        LIMIT,
    );
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    // stdout is one JSON document; the summary and the launched command's
    // own output ("ready") go to stderr.
    let v = Report::from_json(&run.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", run.stdout));
    assert!(
        run.stderr.contains("ready"),
        "the command's stdout went to stderr"
    );
    // The schema tag: a report of another one does not read at all.
    assert_eq!(v.schema, Schema);
    assert!(
        run.stderr.contains("Hot functions"),
        "summary on stderr:\n{}",
        run.stderr
    );
}

#[test]
fn a_launched_command_is_ended_with_the_session() {
    if !require_root("a_launched_command_is_ended_with_the_session") {
        return;
    }
    // A command that ignores SIGTERM must still not outlive the session.
    let json = report_path("launch-end");
    let script = "trap '' TERM; while :; do :; done";
    let run = run_tool(
        &[
            "--duration",
            "1s",
            "--json",
            json.to_str().unwrap(),
            "--",
            "/bin/sh",
            "-c",
            script,
        ],
        LIMIT,
    );
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    let report = read_typed(&json);
    let pid = report.target.pid;
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the command outlived the session"
    );
    assert!(
        report.notes.iter().any(|n| n.contains("ignored SIGTERM")),
        "{:#?}",
        report.notes
    );
    assert!(report.sampling.samples > 100);
    assert_no_programs_left();
}

/// The kernel's run-time statistics switch (`kernel.bpf_stats_enabled`).
fn bpf_stats_sysctl() -> String {
    std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|e| format!("unreadable: {e}"))
}

/// Whether process `pid` holds the descriptor `BPF_ENABLE_STATS` returns
/// (an anonymous inode named `bpf-stats`).
fn holds_bpf_stats_fd(pid: u32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|link| link.to_string_lossy() == "anon_inode:bpf-stats")
}

/// `loader[key]` is `expected` within 1% (a rate the report derives from
/// its own totals and duration). `got` is the loader's `key` (NaN when
/// unknown).
fn assert_rate(key: &str, got: f64, loader: &Loader, expected: f64) {
    assert!(
        (got - expected).abs() <= expected.abs() * 0.01,
        "{key}: {got}, expected {expected}: {loader:#?}"
    );
}

/// The tool attached to `pid` for 3 s with `more` arguments, writing its
/// report to `json`, once it traces.
fn attach_for_3s(pid: &str, json: &std::path::Path, more: &[&str]) -> TracingTool {
    let json = json.to_str().unwrap();
    let args = ["-p", pid, "--duration", "3s", "--json", json];
    TracingTool::start(&[&args[..], more].concat())
}

#[test]
fn the_report_gives_the_profilers_own_kernel_cost() {
    let test = "the_report_gives_the_profilers_own_kernel_cost";
    if !require_root(test) {
        return;
    }
    let before = bpf_stats_sysctl();
    let mut target = start_spin(&["time", "2", "30"]);
    let pid = target.pid().to_string();
    let json = report_path("cost");
    let tool = attach_for_3s(&pid, &json, &[]);
    // Run-time statistics are on while the programs run: the tool holds
    // the descriptor that keeps them on.
    let held = holds_bpf_stats_fd(tool.pid());
    let run = tool.finish(LIMIT);
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    let report = read_typed(&json);
    let loader = &report.loader;
    let duration = report.duration_s;

    // Ring records: the two spinners' samples went through the sample ring.
    let rings = &loader.rings;
    let sum: u64 = rings.iter().map(|r| r.events).sum();
    assert_eq!(loader.ring_events, sum, "{loader:#?}");
    let samples_ring = rings
        .iter()
        .find(|r| r.name == "samples")
        .unwrap_or_else(|| panic!("no samples ring: {loader:#?}"));
    let sampled = samples_ring.events;
    let samples = report.sampling.samples;
    assert!(samples > 1000, "2 spinners for 3 s at 999 Hz: {samples}");
    assert!(
        sampled >= samples,
        "{sampled} sample records read, {samples} samples reported"
    );
    assert_rate(
        "ring_events_per_s",
        loader.ring_events_per_s,
        loader,
        sum as f64 / duration,
    );

    // BPF run time, unless the kernel refused to count it.
    let state = loader.bpf_stats.as_str();
    if state.starts_with("unavailable") {
        assert!(loader.bpf_run_ns.is_none(), "unknown, not 0: {loader:#?}");
        assert!(report
            .notes
            .iter()
            .any(|n| n.contains("run time is unknown")));
        return skip(
            test,
            &format!("the kernel counted no BPF run time: {state}"),
        );
    }
    assert!(
        ["enabled by memprof", "already on"].contains(&state),
        "bpf_stats: {state}"
    );
    assert!(held, "the tool held no bpf-stats descriptor while tracing");
    let run_ns = loader.bpf_run_ns.expect("bpf_run_ns");
    let programs = &loader.programs;
    let by_program: u64 = programs.iter().map(|p| p.run_ns).sum();
    assert!(run_ns > 0, "{loader:#?}");
    assert_eq!(run_ns, by_program, "the total is the programs' sum");
    assert_rate(
        "bpf_run_share",
        loader.bpf_run_share.unwrap_or(f64::NAN),
        loader,
        run_ns as f64 / (duration * 1e9),
    );
    // The sampler runs for every sample the tool received, and more (it
    // runs on every CPU for every process, and drops the others).
    let sampler = programs
        .iter()
        .find(|p| p.name == "mp_cpu_sample")
        .unwrap_or_else(|| panic!("no sampler program: {loader:#?}"));
    let runs = sampler.runs;
    assert!(
        runs >= sampled,
        "sampler ran {runs} times for {sampled} samples"
    );
    assert!(sampler.run_ns > 0);
    assert!(
        run.stdout.contains("BPF programs: ") && run.stdout.contains("ring records read: "),
        "summary:\n{}",
        run.stdout
    );
    // And off again. The switch only shows what was set through it (the
    // kernel keeps our descriptor's count apart), so this checks that the
    // tool left it as it was; the descriptor itself is closed at detach.
    assert_eq!(bpf_stats_sysctl(), before, "kernel.bpf_stats_enabled");
    let _ = target.child.kill();
    assert_no_programs_left();
}

/// Memory the test holds while the tool runs, far above the tool's own.
const PARENT_RSS: usize = 512 << 20;

/// The report's peak memory is the profiler's own, not its parent's: the
/// kernel's `ru_maxrss` survives `execve`, so a tool started by a process
/// holding 512 MiB reported at least that (a CI run's test harness made
/// the 100 k-mutex session's peak 159 MiB against its bound of 150; by
/// hand 85-131 MiB). The tool must report its own (a 3 s session: tens
/// of MiB).
#[test]
fn the_profilers_peak_memory_is_its_own_not_its_parents() {
    let test = "the_profilers_peak_memory_is_its_own_not_its_parents";
    if !require_root(test) {
        return;
    }
    // Touched, so resident when the tool is started from this process.
    let held = std::hint::black_box(vec![1u8; PARENT_RSS]);
    let mut target = start_spin(&["time", "1", "30"]);
    let pid = target.pid().to_string();
    let json = report_path("peak-rss");
    let run = attach_for_3s(&pid, &json, &["--alloc-mode", "off"]).finish(LIMIT);
    drop(held);
    let _ = target.child.kill();
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    let loader = read_typed(&json).loader;
    let peak = loader.peak_rss_bytes;
    assert!(
        peak >= 1 << 20 && peak < (PARENT_RSS / 2) as u64,
        "peak {} MiB with a parent of {} MiB: {loader:#?}",
        peak >> 20,
        PARENT_RSS >> 20
    );
    assert_no_programs_left();
}

/// The median of the `gaps PPM` lines `spin gaps` printed in `[from, to)`,
/// as a share; panics with fewer than `least` lines there.
fn gap_share(lines: &[(Instant, String)], from: Instant, to: Instant, least: usize) -> f64 {
    let mut ppm: Vec<f64> = lines
        .iter()
        .filter(|(at, _)| *at >= from && *at < to)
        .filter_map(|(_, l)| l.strip_prefix("gaps ")?.trim().parse().ok())
        .collect();
    assert!(
        ppm.len() >= least,
        "{} intervals of 100 ms in the window, wanted {least}: {lines:?}",
        ppm.len()
    );
    ppm.sort_by(f64::total_cmp);
    ppm[ppm.len() / 2] / 1e6
}

#[test]
fn the_samplers_cost_is_what_the_sampled_thread_loses() {
    let test = "the_samplers_cost_is_what_the_sampled_thread_loses";
    if !require_root(test) {
        return;
    }
    // A thread that reads the clock in a loop and says, every 100 ms,
    // which share of its time went in gaps between two reads: untraced
    // for 2 s, then sampled by the tool for 3 s at 4,999 Hz. What the sampler takes
    // from it (the ground truth) is the growth of that share; the report
    // predicts it from the interrupt it measured on its own thread (at
    // start-up, or kept from a session of the last hour on this boot:
    // this also checks that a kept measure still holds), plus its
    // program's run time per sample.
    let mut target = start_spin(&["gaps", "12"]);
    let lines = target.lines_in_background();
    let ready = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let pid = target.pid().to_string();
    let json = report_path("sampler-cost");
    let untraced_to = Instant::now();
    // At 4,999 Hz: five times what 999 Hz takes, well above the
    // measure's noise also where an interrupt costs 1-2 µs.
    let tool = attach_for_3s(&pid, &json, &["--sample-freq", "4999"]);
    let traced_from = Instant::now();
    let run = tool.finish(LIMIT);
    assert_eq!(run.code(), 0, "stderr: {}", run.stderr);
    let lines: Vec<(Instant, String)> = lines.try_iter().collect();
    let report = read_typed(&json);
    let s = &report.sampling;
    if s.source != SampleSource::CpuClock {
        return skip(
            test,
            &format!(
                "the sampler used {}: its interrupt is not measured",
                s.source
            ),
        );
    }
    let (Some(ns), Some(share)) = (s.interrupt_ns, s.interrupt_share) else {
        panic!(
            "cpu-clock sampling without its measured cost: {s:#?}\n{}",
            run.stderr
        );
    };
    assert!(
        (share - ns * s.frequency_hz as f64 / 1e9).abs() < 1e-9,
        "{s:#?}"
    );
    let program = report
        .loader
        .programs
        .iter()
        .find(|p| p.name == "mp_cpu_sample")
        .filter(|p| p.runs > 0)
        .map_or(0.0, |p| p.run_ns as f64 / p.runs as f64);
    let predicted = share + program * s.frequency_hz as f64 / 1e9;

    let before = gap_share(&lines, ready + Duration::from_millis(500), untraced_to, 10);
    let traced = Duration::from_millis(300);
    let during = gap_share(
        &lines,
        traced_from + traced,
        traced_from + Duration::from_millis(2700),
        15,
    );
    let lost = during - before;
    // Within a factor of two, or 0.3 points of the thread's time where it
    // is small (bare metal: an interrupt of 1-2 µs is 0.1-0.2%, near the
    // noise of the measure). On the project's 2-vCPU VMs an interrupt's
    // cost moves between 15 and 30 µs within seconds with the host's
    // load, and the start-up measure is 0.2 s of it: in 24 runs here
    // (2026-12-07) the thread lost 0.58-1.57 times the prediction (two
    // official CI runs: 1.53 and 1.57), and the prediction itself ranged
    // over 8.7-15.2%. A prediction that left out the interrupt (the
    // program alone: 1%) or took another rate is still far outside.
    let tolerance = if predicted > lost {
        predicted / 2.0
    } else {
        predicted
    }
    .max(0.003);
    let measure = run
        .stderr
        .lines()
        .find(|l| l.contains("sampler interrupt:"));
    eprintln!(
        "{test}: lost {:.3}% ({:.3}% -> {:.3}%), predicted {:.3}%; {}",
        lost * 100.0,
        before * 100.0,
        during * 100.0,
        predicted * 100.0,
        measure.unwrap_or("(no measure logged)")
    );
    assert!(
        (predicted - lost).abs() <= tolerance,
        "the sampled thread lost {:.2}% of its time ({:.2}% untraced, {:.2}% sampled); the report \
         predicted {:.2}% ({:.1} µs an interrupt + {:.1} µs of program, at {} Hz)\n{}",
        lost * 100.0,
        before * 100.0,
        during * 100.0,
        predicted * 100.0,
        ns / 1e3,
        program / 1e3,
        s.frequency_hz,
        run.stderr
    );
    assert!(
        run.stdout
            .contains(&format!("sampler interrupt: {:.1} µs", ns / 1e3)),
        "summary:\n{}",
        run.stdout
    );
    let _ = target.child.kill();
    assert_no_programs_left();
}
