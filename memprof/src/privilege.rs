//! Least privilege: once the probes are loaded and attached, the tool keeps
//! only the capabilities the rest of a session uses, and can never regain
//! any (`PR_SET_NO_NEW_PRIVS`, bounding set reduced).
//!
//! What the rest of a session does, and what it needs (found by running
//! sessions with each capability removed; see the closing note of the
//! issue that added this):
//! - reading the target's files (symbols, DWARF, code bytes) wherever they
//!   are: `CAP_DAC_READ_SEARCH` (read only). Without it a target whose
//!   binary sits in a directory of another user is not symbolized;
//! - reading `/proc/PID/mem` (anonymous code to decode) and re-reading
//!   `/proc/PID/maps` of a target of another user: `CAP_SYS_PTRACE`;
//! - re-attaching the windowed allocator and lock uprobes of the sampled
//!   modes: `CAP_BPF` + `CAP_PERFMON`, and `CAP_SYS_ADMIN`, which this
//!   kernel still demands for a uprobe perf event (`perf_event_open`
//!   fails with EACCES without it, measured). It is kept only while a
//!   sampled mode has windows to re-open; with `full` or `off` it goes;
//! - ending a launched command that runs as another user (`-u`):
//!   `CAP_KILL`;
//! - opening the code files of processes that appear or load libraries
//!   later through `/proc/PID/map_files` (see
//!   [`crate::process::objects`]): `CAP_CHECKPOINT_RESTORE` (Linux 5.9;
//!   older kernels ask for `CAP_SYS_ADMIN`, and the files are then
//!   reached through `/proc/PID/root` or their names).
//!
//! Not kept, among others: `CAP_DAC_OVERRIDE` (output files are opened
//! before the drop), `CAP_CHOWN`, `CAP_FOWNER`, `CAP_SETUID`/`CAP_SETGID`,
//! `CAP_SETPCAP`, `CAP_NET_*`, `CAP_SYS_MODULE`, `CAP_SYS_RAWIO`.
//!
//! Capabilities belong to threads. The drop is made on the session's thread;
//! every other thread the tool starts (keys, output capture) drops all of
//! its own when it starts ([`drop_all_in_this_thread`]), and threads started
//! later inherit the reduced set.

use caps::{CapSet, Capability, CapsHashSet};

/// What the rest of every session needs.
pub const KEPT: [Capability; 6] = [
    Capability::CAP_BPF,
    Capability::CAP_PERFMON,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_KILL,
    Capability::CAP_CHECKPOINT_RESTORE,
];

/// Kept besides [`KEPT`] while uprobes are re-attached in windows.
pub const FOR_UPROBE_WINDOWS: Capability = Capability::CAP_SYS_ADMIN;

/// The capabilities a session keeps after attaching.
pub fn kept(uprobe_windows: bool) -> Vec<Capability> {
    let mut kept = KEPT.to_vec();
    if uprobe_windows {
        kept.push(FOR_UPROBE_WINDOWS);
    }
    kept
}

/// The same as a bit mask (bit N for capability N, as in /proc's `Cap*:`).
pub fn mask(caps: &[Capability]) -> u64 {
    caps.iter().fold(0, |m, c| m | (1u64 << c.index()))
}

/// Reduces this thread's capabilities to [`kept`] (those of them it has)
/// and sets `PR_SET_NO_NEW_PRIVS`. Returns the names kept.
pub fn drop_after_attach(uprobe_windows: bool) -> Result<Vec<String>, String> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    let keep: CapsHashSet = kept(uprobe_windows)
        .into_iter()
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
    // Every step is tried, so that one that fails (e.g. the bounding set
    // without CAP_SETPCAP, under file capabilities) does not leave the
    // others undone; the errors are reported together.
    let mut errors = Vec::new();
    let effective_now = caps::read(None, CapSet::Effective).unwrap_or_default();
    // The bounding set first: changing it needs CAP_SETPCAP, dropped below.
    if effective_now.contains(&Capability::CAP_SETPCAP) {
        match caps::read(None, CapSet::Bounding) {
            Ok(bounding) => {
                for cap in bounding.difference(keep) {
                    if let Err(e) = caps::drop(None, CapSet::Bounding, *cap) {
                        errors.push(format!("dropping {cap} from the bounding set: {e}"));
                    }
                }
            }
            Err(e) => errors.push(format!("reading the bounding set: {e}")),
        }
    }
    for set in [CapSet::Ambient, CapSet::Inheritable] {
        if let Err(e) = caps::clear(None, set) {
            errors.push(format!("clearing {set:?}: {e}"));
        }
    }
    let effective: CapsHashSet = effective_now.intersection(keep).copied().collect();
    if let Err(e) = caps::set(None, CapSet::Effective, &effective) {
        errors.push(format!("reducing the effective set: {e}"));
    }
    match caps::read(None, CapSet::Permitted) {
        Ok(permitted) => {
            let permitted: CapsHashSet = permitted.intersection(keep).copied().collect();
            if let Err(e) = caps::set(None, CapSet::Permitted, &permitted) {
                errors.push(format!("reducing the permitted set: {e}"));
            }
        }
        Err(e) => errors.push(format!("reading the permitted set: {e}")),
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        errors.push(format!(
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        ));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sys_admin_only_for_uprobe_windows() {
        assert!(!kept(false).contains(&Capability::CAP_SYS_ADMIN));
        assert!(kept(true).contains(&Capability::CAP_SYS_ADMIN));
        for c in [
            Capability::CAP_DAC_OVERRIDE,
            Capability::CAP_SETUID,
            Capability::CAP_CHOWN,
        ] {
            assert!(!kept(true).contains(&c), "{c}");
        }
        // CAP_BPF is 39, CAP_PERFMON 38, CAP_SYS_PTRACE 19,
        // CAP_DAC_READ_SEARCH 2, CAP_KILL 5, CAP_CHECKPOINT_RESTORE 40.
        assert_eq!(
            mask(&kept(false)),
            (1 << 39) | (1 << 38) | (1 << 19) | (1 << 2) | (1 << 5) | (1 << 40)
        );
        assert_eq!(mask(&kept(true)), mask(&kept(false)) | (1 << 21));
    }
}
