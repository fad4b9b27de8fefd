//! Least privilege: once the probes are loaded and attached, the tool keeps
//! only the capabilities the rest of a session uses, and can never regain
//! any (`PR_SET_NO_NEW_PRIVS`, bounding set reduced).
//!
//! What the rest of a session does, and what it needs (found by running the
//! integration tests with each one removed):
//! - re-attaching the windowed allocator and lock uprobes:
//!   `CAP_BPF` + `CAP_PERFMON` (`perf_event_open` on the uprobe PMU and
//!   `BPF_LINK_CREATE`);
//! - reading the target's memory (`/proc/PID/mem`: code bytes to decode),
//!   memory map and files through `/proc/PID/root`: `CAP_SYS_PTRACE` (a
//!   target of another user) and `CAP_DAC_READ_SEARCH` (its files, read
//!   only); `/proc/PID/map_files`: `CAP_CHECKPOINT_RESTORE`;
//! - ending a launched command that runs as another user (`-u`):
//!   `CAP_KILL`.
//!
//! Not kept, among others: `CAP_SYS_ADMIN`, `CAP_DAC_OVERRIDE` (output files
//! are opened before the drop), `CAP_CHOWN`, `CAP_SETUID`/`CAP_SETGID`,
//! `CAP_NET_*`, `CAP_SYS_MODULE`.
//!
//! Capabilities belong to threads. The drop is made on the session's thread;
//! every other thread the tool starts (keys, output capture) drops all of
//! its own when it starts ([`drop_all_in_this_thread`]), and threads started
//! later inherit the reduced set.

use caps::{CapSet, Capability, CapsHashSet};

/// What the rest of a session needs.
pub const KEPT: [Capability; 6] = [
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_CHECKPOINT_RESTORE,
    Capability::CAP_KILL,
];

/// Reduces this thread's capabilities to [`KEPT`] (those of them it has)
/// and sets `PR_SET_NO_NEW_PRIVS`. Returns the names kept.
pub fn drop_after_attach() -> Result<Vec<String>, String> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    let keep: CapsHashSet = KEPT
        .iter()
        .copied()
        .filter(|c| permitted.contains(c))
        .collect();
    reduce_to(&keep)?;
    let mut names: Vec<String> = keep.iter().map(|c| c.to_string()).collect();
    names.sort();
    Ok(names)
}

/// Drops every capability of the calling thread (for helper threads that
/// only read keys or pipes).
pub fn drop_all_in_this_thread() {
    if let Err(e) = reduce_to(&CapsHashSet::new()) {
        tracing::debug!("dropping a helper thread's capabilities: {e}");
    }
}

fn reduce_to(keep: &CapsHashSet) -> Result<(), String> {
    // The bounding set first: changing it needs CAP_SETPCAP, still ours.
    let bounding = caps::read(None, CapSet::Bounding).map_err(|e| e.to_string())?;
    for cap in bounding.difference(keep) {
        caps::drop(None, CapSet::Bounding, *cap)
            .map_err(|e| format!("dropping {cap} from the bounding set: {e}"))?;
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| e.to_string())?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| e.to_string())?;
    let effective = caps::read(None, CapSet::Effective).map_err(|e| e.to_string())?;
    let effective: CapsHashSet = effective.intersection(keep).copied().collect();
    caps::set(None, CapSet::Effective, &effective).map_err(|e| e.to_string())?;
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    let permitted: CapsHashSet = permitted.intersection(keep).copied().collect();
    caps::set(None, CapSet::Permitted, &permitted).map_err(|e| e.to_string())?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Threads of this process whose effective capabilities go beyond
/// [`KEPT`], by thread id (read from `/proc/self/task/*/status`).
pub fn threads_beyond_kept() -> Vec<u32> {
    let kept = KEPT.iter().fold(0u64, |mask, c| mask | (1u64 << c.index()));
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let tid: u32 = t.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let eff = crate::session::preflight::parse_cap_eff(&status)?;
            (eff & !kept != 0).then_some(tid)
        })
        .collect()
}
