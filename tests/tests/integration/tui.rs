//! The live dashboard, driven in a real terminal through tmux.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use memprof_tests::*;

const SESSION: &str = "memprof-tui-test";

fn tmux(args: &[&str]) -> String {
    let out = Command::new("tmux")
        .args(args)
        .output()
        .expect("tmux is installed by `cargo xtask setup`");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn screen() -> String {
    tmux(&["capture-pane", "-p", "-t", SESSION])
}

/// Polls the screen until `pred` holds, failing after `limit`.
fn wait_for(what: &str, limit: Duration, pred: impl Fn(&str) -> bool) -> String {
    let start = Instant::now();
    loop {
        let text = screen();
        if pred(&text) {
            return text;
        }
        assert!(
            start.elapsed() < limit,
            "timed out waiting for {what}; screen:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills the tmux session even when the test fails.
struct Session;
impl Drop for Session {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .args(["kill-session", "-t", SESSION])
            .output();
    }
}

#[test]
fn dashboard_shows_live_numbers_switches_tabs_and_quits_cleanly() {
    if !require_root("dashboard_shows_live_numbers_switches_tabs_and_quits_cleanly") {
        return;
    }
    let mut target = start_spin(&["time", "2", "60"]);
    let _ = Command::new("tmux")
        .args(["kill-session", "-t", SESSION])
        .output();
    // In an empty directory of its own, with info logs: no file may appear
    // there (logs stay in memory while the dashboard is shown).
    let dir = workload_dir().join("tui-test-cwd");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The shell prints the exit status (tmux 3.3 does not report it).
    let cmd = format!(
        "cd {} && {} -v -p {}; echo memprof-exit-status=$?",
        dir.display(),
        tool().display(),
        target.pid(),
    );
    let _session = Session;
    let started = Command::new("tmux")
        .args(["new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40"])
        .args(["-e", "TERM=xterm-256color"])
        .arg(&cmd)
        .status()
        .unwrap();
    assert!(started.success(), "tmux new-session failed");
    // Keep the pane after the tool exits, to read what it printed then.
    tmux(&["set-option", "-t", SESSION, "remain-on-exit", "on"]);

    let text = wait_for("the Overview with samples", Duration::from_secs(20), |s| {
        s.contains("Overview") && s.contains("spin_worker")
    });
    for tab in [
        "False sharing",
        "Allocator",
        "Locks",
        "Hot functions",
        "Threads",
        "profiler",
    ] {
        assert!(text.contains(tab), "missing {tab}:\n{text}");
    }
    // The profiler's own cost, live (after the first second): its BPF
    // programs' run time (or why it is unknown) and the ring records.
    wait_for("the profiler's kernel cost", Duration::from_secs(10), |s| {
        s.contains("ring records ") && (s.contains(" runs/s") || s.contains("run time unknown"))
    });
    // Live numbers: the sample count grows between refreshes.
    let count = |s: &str| -> u64 {
        let line = s
            .lines()
            .find(|l| l.contains("samples ") && l.contains(" Hz"))
            .unwrap_or("");
        let after = line.split("samples ").nth(1).unwrap_or("");
        after
            .split_whitespace()
            .next()
            .unwrap_or("0")
            .replace(',', "")
            .parse()
            .unwrap_or(0)
    };
    // The newest log line is shown at the bottom, not written to a file.
    wait_for("the log line", Duration::from_secs(10), |s| {
        s.contains("│ log (")
    });
    let first = count(&text);
    let later = wait_for("the sample count to grow", Duration::from_secs(10), |s| {
        count(s) > first
    });
    assert!(count(&later) > first);
    assert!(later.contains("spin.c:"), "source line shown:\n{later}");

    tmux(&["send-keys", "-t", SESSION, "2"]);
    // spin's threads share nothing: the tab says so, and that addresses
    // are being sampled.
    wait_for("the False sharing tab", Duration::from_secs(5), |s| {
        s.contains("no contended cache line found yet")
            && s.contains("user samples yielded a data address")
    });
    tmux(&["send-keys", "-t", SESSION, "1"]);
    wait_for("the Overview again", Duration::from_secs(5), |s| {
        s.contains("Hot functions")
    });

    tmux(&["send-keys", "-t", SESSION, "q"]);
    let start = Instant::now();
    while tmux(&["display-message", "-p", "-t", SESSION, "#{pane_dead}"]).trim() != "1" {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the tool did not exit after q"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Terminal restored (alternate screen left) and the summary printed.
    let after = tmux(&["capture-pane", "-p", "-S", "-200", "-t", SESSION]);
    assert!(
        after.contains("memprof-exit-status=0"),
        "exit status after q:\n{after}"
    );
    assert!(
        after.contains("memprof-ebpf summary"),
        "summary after quitting:\n{after}"
    );
    assert!(after.contains("spin_worker"));
    assert!(
        after.contains("capabilities kept after attach"),
        "the logs held during the dashboard are printed after it:\n{after}"
    );
    assert_dir_empty(&dir);
    assert!(
        target.child.try_wait().unwrap().is_none(),
        "quitting must not stop the target"
    );
    assert_no_programs_left();
}
