//! Checks made before anything is loaded, so each missing piece becomes a
//! clear error with its own exit code instead of a verifier or `EPERM` dump.
//!
//! The functions take the filesystem root as a parameter so the checks can
//! be unit-tested against a fake tree.

use std::path::Path;

use crate::error::{Error, Result};

/// `CAP_SYS_ADMIN`, `CAP_PERFMON`, `CAP_BPF` from `<linux/capability.h>`.
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Whether a set of effective capabilities can load and attach our programs.
pub fn capabilities_suffice(cap_eff: u64) -> bool {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// Parses `CapEff:` from the text of `/proc/self/status`.
pub fn parse_cap_eff(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

/// Fails with [`Error::Privilege`] unless we may load BPF programs.
pub fn check_privilege(root: &Path) -> Result<()> {
    let status = std::fs::read_to_string(root.join("proc/self/status")).unwrap_or_default();
    match parse_cap_eff(&status) {
        Some(caps) if capabilities_suffice(caps) => Ok(()),
        _ => Err(Error::Privilege(
            "loading eBPF programs needs root (or CAP_BPF and CAP_PERFMON); \
             run it with sudo"
                .into(),
        )),
    }
}

/// Fails with [`Error::KernelFeature`] when the kernel has no BTF.
pub fn check_btf(root: &Path) -> Result<()> {
    if root.join("sys/kernel/btf/vmlinux").exists() {
        Ok(())
    } else {
        Err(Error::KernelFeature {
            feature: "BTF type information",
            hint: "/sys/kernel/btf/vmlinux is missing; use a kernel built with \
                   CONFIG_DEBUG_INFO_BTF=y (most distribution kernels since 2021)"
                .into(),
        })
    }
}

/// Fails with [`Error::KernelFeature`] when perf events are unavailable.
pub fn check_perf_events(root: &Path) -> Result<()> {
    if root.join("proc/sys/kernel/perf_event_paranoid").exists() {
        Ok(())
    } else {
        Err(Error::KernelFeature {
            feature: "perf events",
            hint: "/proc/sys/kernel/perf_event_paranoid is missing; the kernel \
                   needs CONFIG_PERF_EVENTS=y"
                .into(),
        })
    }
}

/// Whether a PMU with hardware counters exists (`cycles` sampling, and later
/// PEBS/IBS data-address sampling).
pub fn has_hardware_pmu(root: &Path) -> bool {
    let devices = root.join("sys/bus/event_source/devices");
    ["cpu", "cpu_core", "cpu_atom"]
        .iter()
        .any(|d| devices.join(d).exists())
}

/// The kernel's sampling-rate ceiling, `kernel.perf_event_max_sample_rate`.
pub fn max_sample_rate(root: &Path) -> Option<u64> {
    std::fs::read_to_string(root.join("proc/sys/kernel/perf_event_max_sample_rate"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Checks that `pid` is a live user process (or one of its threads) and
/// returns the process id (thread-group id) to trace.
pub fn check_pid(root: &Path, pid: u32) -> Result<u32> {
    let dir = root.join(format!("proc/{pid}"));
    let status = match std::fs::read_to_string(dir.join("status")) {
        Ok(s) if pid != 0 => s,
        _ => return Err(Error::NoSuchProcess { pid }),
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
    };
    // A zombie has exited already; only its exit status is left. (A
    // process whose main thread called pthread_exit shows its leader as a
    // zombie while its other threads run: that one is alive.)
    let zombie = matches!(
        field("State:").and_then(|s| s.chars().next()),
        Some('Z' | 'X')
    );
    let other_threads = std::fs::read_dir(dir.join("task"))
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name() != *pid.to_string())
                .count()
        })
        .unwrap_or(0);
    if zombie && other_threads == 0 {
        return Err(Error::NoSuchProcess { pid });
    }
    // Kernel threads have no user address space (and say Kthread: 1).
    let has_user_memory = zombie
        || std::fs::read_to_string(dir.join("maps"))
            .map(|m| !m.is_empty())
            .unwrap_or(true);
    if field("Kthread:") == Some("1") || !has_user_memory {
        return Err(Error::Usage(format!(
            "process {pid} is a kernel thread; memprof-ebpf traces user processes"
        )));
    }
    Ok(field("Tgid:").and_then(|t| t.parse().ok()).unwrap_or(pid))
}

/// Lifts the locked-memory limit for map memory. On kernels that charge
/// maps to the memory cgroup (5.11+) this is not needed, and without
/// CAP_SYS_RESOURCE it fails: then we only log and go on.
pub fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass by pointer, nothing else.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
    if ret != 0 {
        tracing::info!(
            "could not raise RLIMIT_MEMLOCK ({}); continuing, map memory is charged \
             to the memory cgroup on kernels ≥ 5.11",
            std::io::Error::last_os_error()
        );
    }
}

/// The checks that need no target, in the order a user fixes them; then
/// tracefs mounted and the memlock limit raised. Returns where tracefs is.
/// `frequency_hz` is `--sample-freq`'s, if given (a rate the tool picks is
/// never above the default).
pub fn check_system(root: &Path, frequency_hz: Option<u64>) -> Result<std::path::PathBuf> {
    let frequency_hz = frequency_hz.unwrap_or(crate::cli::DEFAULT_SAMPLE_FREQ);
    check_privilege(root)?;
    check_perf_events(root)?;
    check_btf(root)?;
    if let Some(max) = max_sample_rate(root) {
        if frequency_hz > max {
            return Err(Error::Usage(format!(
                "--sample-freq {frequency_hz} is above the kernel's limit of {max} Hz \
                 (kernel.perf_event_max_sample_rate)"
            )));
        }
    }
    let tracefs_dir = super::tracefs::ensure_mounted(root)?;
    raise_memlock_limit();
    Ok(tracefs_dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_root(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn capabilities() {
        assert!(capabilities_suffice(1 << CAP_SYS_ADMIN));
        assert!(capabilities_suffice((1 << CAP_BPF) | (1 << CAP_PERFMON)));
        assert!(!capabilities_suffice(1 << CAP_BPF));
        assert!(!capabilities_suffice(0));
        assert_eq!(
            parse_cap_eff("Name:\tx\nCapEff:\t000001fffeffffff\n"),
            Some(0x1fffeffffff)
        );
        assert_eq!(parse_cap_eff("Name:\tx\n"), None);
    }

    #[test]
    fn unprivileged_status_is_refused_with_its_exit_code() {
        let root = fake_root(&[("proc/self/status", "CapEff:\t0000000000000000\n")]);
        let err = check_privilege(root.path()).unwrap_err();
        assert_eq!(err.exit_code(), crate::error::exit_code::PRIVILEGE);
        assert!(err.to_string().contains("sudo"));
    }

    #[test]
    fn missing_btf_is_a_kernel_feature_error() {
        let root = fake_root(&[]);
        let err = check_btf(root.path()).unwrap_err();
        assert_eq!(err.exit_code(), crate::error::exit_code::KERNEL_FEATURE);
        assert!(err.to_string().contains("CONFIG_DEBUG_INFO_BTF"));
        let root = fake_root(&[("sys/kernel/btf/vmlinux", "")]);
        assert!(check_btf(root.path()).is_ok());
    }

    #[test]
    fn pids() {
        const MAPS: &str = "00400000-00401000 r-xp 0 0:0 0 /bin/x\n";
        let root = fake_root(&[
            ("proc/7/maps", MAPS),
            ("proc/7/status", "Name:\tx\nState:\tR (running)\nTgid:\t7\n"),
            ("proc/8/maps", MAPS),
            (
                "proc/8/status",
                "Name:\tx\nState:\tS (sleeping)\nTgid:\t7\n",
            ),
            ("proc/9/status", "Name:\tx\nState:\tZ (zombie)\nTgid:\t9\n"),
            ("proc/9/task/9/stat", ""),
            // Leader exited with pthread_exit; thread 12 still runs.
            ("proc/11/maps", MAPS),
            (
                "proc/11/status",
                "Name:\tx\nState:\tZ (zombie)\nTgid:\t11\n",
            ),
            ("proc/11/task/11/stat", ""),
            ("proc/11/task/12/stat", ""),
            ("proc/2/maps", ""),
            (
                "proc/2/status",
                "Name:\tkthreadd\nState:\tS\nTgid:\t2\nKthread:\t1\n",
            ),
        ]);
        let code = |pid| check_pid(root.path(), pid).unwrap_err().exit_code();
        assert_eq!(check_pid(root.path(), 7).unwrap(), 7);
        assert_eq!(
            check_pid(root.path(), 8).unwrap(),
            7,
            "a thread resolves to its process"
        );
        assert_eq!(code(9), crate::error::exit_code::NO_SUCH_PROCESS, "zombie");
        assert_eq!(
            check_pid(root.path(), 11).unwrap(),
            11,
            "zombie leader, live threads"
        );
        assert_eq!(code(10), crate::error::exit_code::NO_SUCH_PROCESS);
        assert_eq!(code(0), crate::error::exit_code::NO_SUCH_PROCESS);
        assert_eq!(code(2), crate::error::exit_code::USAGE);
    }

    #[test]
    fn pmu_and_rate() {
        let root = fake_root(&[("proc/sys/kernel/perf_event_max_sample_rate", "100000\n")]);
        assert!(!has_hardware_pmu(root.path()));
        assert_eq!(max_sample_rate(root.path()), Some(100_000));
        let root = fake_root(&[("sys/bus/event_source/devices/cpu/type", "4")]);
        assert!(has_hardware_pmu(root.path()));
        assert_eq!(max_sample_rate(root.path()), None);
    }
}
