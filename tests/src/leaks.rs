//! What the tool must not leave behind when it exits: BPF programs and
//! helper processes.
//!
//! The tool waits, before it exits, until the kernel has freed its
//! programs (a link's last reference goes a grace period after it is
//! closed) and until its helper is killed and reaped, so after it exits
//! one of ours still there is one it left behind: checked at once.
//!
//! `cargo xtask test` may run other suites beside this one
//! ([`SIDE_BY_SIDE`] says so). Their tools' programs and helpers are
//! theirs: a program held open by another live tool, and a helper whose
//! parent is a live tool, are not ours. A program nobody holds may be one
//! that another suite's tool has just closed and the kernel is freeing;
//! only then, and only side by side, the check waits up to [`FREEING`]
//! for it to go.

use std::{
    collections::HashSet,
    process::Command,
    time::{Duration, Instant},
};

use crate::PROGRAM_NAMES;

/// Set (to the number of lanes, above 1) by `cargo xtask test` when it
/// runs suites side by side.
pub const SIDE_BY_SIDE: &str = "MEMPROF_TESTS_LANES";

/// How long a program nobody holds may take to be freed when another
/// suite's tool may have just closed it: the tool's own wait for the same
/// thing takes well under a second here.
const FREEING: Duration = Duration::from_secs(3);

/// The variable the tool's allocator-timing helper runs with (the tool's
/// own binary in another role; `features::alloc::untraced::LOOP_ENV`).
const HELPER_ENV: &[u8] = b"MEMPROF_UNTRACED_LOOP=";

/// The tool's process name.
const TOOL_COMM: &str = "memprof-ebpf";

fn side_by_side() -> bool {
    std::env::var(SIDE_BY_SIDE)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|lanes| lanes > 1)
}

/// IDs and names of the BPF programs loaded in the kernel now.
pub fn loaded_programs() -> Vec<(u32, String)> {
    let out = Command::new("bpftool")
        .args(["-j", "prog", "show"])
        .output()
        .expect("bpftool is installed by `cargo xtask setup`");
    assert!(out.status.success(), "bpftool prog show failed");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
    v.as_array()
        .map(|progs| {
            progs
                .iter()
                .filter_map(|p| {
                    let id = u32::try_from(p["id"].as_u64()?).ok()?;
                    Some((id, p["name"].as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts that none of our programs is still loaded, and that no helper
/// process the tool started (the allocator's untraced timing loop) is
/// still running.
pub fn assert_no_programs_left() {
    let sharing = side_by_side();
    let deadline = Instant::now() + FREEING;
    loop {
        let tools = if sharing { live_tools() } else { vec![] };
        let left = programs_left(&tools);
        let helpers = helpers_left(&tools);
        // Only a program nobody holds can be another tool's on its way
        // out; a helper left running never is.
        if sharing && helpers.is_empty() && !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        }
        assert!(left.is_empty(), "programs left loaded after exit: {left:?}");
        assert!(
            helpers.is_empty(),
            "helper processes left running: {helpers:?}"
        );
        return;
    }
}

/// Our programs that none of `tools` holds open.
fn programs_left(tools: &[u32]) -> Vec<String> {
    let held: HashSet<u32> = tools.iter().flat_map(|&pid| held_programs(pid)).collect();
    loaded_programs()
        .into_iter()
        .filter(|(id, name)| PROGRAM_NAMES.contains(&name.as_str()) && !held.contains(id))
        .map(|(id, name)| format!("{name} (id {id})"))
        .collect()
}

/// Helpers whose parent is none of `tools`.
fn helpers_left(tools: &[u32]) -> Vec<u32> {
    helper_processes()
        .into_iter()
        .filter(|pid| parent(*pid).is_none_or(|ppid| !tools.contains(&ppid)))
        .collect()
}

fn pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
}

fn is_helper(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| {
        env.split(|&b| b == 0)
            .any(|var| var.starts_with(HELPER_ENV))
    })
}

/// Pids of processes running as the tool's helper.
fn helper_processes() -> Vec<u32> {
    pids().filter(|&pid| is_helper(pid)).collect()
}

/// Pids of running tools (other suites' while side by side).
fn live_tools() -> Vec<u32> {
    pids()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim_end() == TOOL_COMM)
        })
        .filter(|&pid| !is_helper(pid))
        .collect()
}

fn parent(pid: u32) -> Option<u32> {
    memprof::process::procfs::stat_fields(pid)?
        .get(1)?
        .parse()
        .ok()
}

/// IDs of the programs `pid` holds open: its program and link descriptors
/// name them in their fdinfo (what bpftool reads without its own BPF
/// iterator).
fn held_programs(pid: u32) -> Vec<u32> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return vec![];
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_to_string(fd.path()).ok())
        .filter_map(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("prog_id:"))
                .and_then(|id| id.trim().parse().ok())
        })
        .collect()
}
