//! Precise data-address sampling where the CPU has it: Intel PEBS
//! (`mem-loads` / `mem-stores` events) or AMD IBS (`ibs_op`). The sample
//! then carries the data address itself and the IP of the accessing
//! instruction, so no skid compensation is needed.
//!
//! aya's perf-event attach cannot ask for `precise_ip`, `config1` (the load
//! latency threshold) or `PERF_SAMPLE_ADDR`, so these events are opened
//! here with `perf_event_open(2)` and the sampler is attached to them with
//! `PERF_EVENT_IOC_SET_BPF`. Closing the event file descriptors detaches it.
//!
//! The machines this project is developed on have no PMU: this path is
//! covered by unit tests of the event parsing and attribute layout only.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use crate::error::Result;

/// `perf_event_attr` up to `PERF_ATTR_SIZE_VER5` (112 bytes): every field
/// we set is in it, and the kernel accepts older sizes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PerfEventAttr {
    pub type_: u32,
    pub size: u32,
    pub config: u64,
    pub sample_period: u64,
    pub sample_type: u64,
    pub read_format: u64,
    pub flags: u64,
    pub wakeup_events: u32,
    pub bp_type: u32,
    pub config1: u64,
    pub config2: u64,
    pub branch_sample_type: u64,
    pub sample_regs_user: u64,
    pub sample_stack_user: u32,
    pub clockid: i32,
    pub sample_regs_intr: u64,
    pub aux_watermark: u32,
    pub sample_max_stack: u16,
    pub reserved: u16,
}

const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 112);

const PERF_SAMPLE_IP: u64 = 1 << 0;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_ADDR: u64 = 1 << 3;
const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
const FLAG_EXCLUDE_HV: u64 = 1 << 6;
const PRECISE_IP_SHIFT: u64 = 15;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// `_IOW('$', 8, __u32)`.
const PERF_EVENT_IOC_SET_BPF: libc::c_ulong = 0x4004_2408;
/// `_IO('$', 0)`.
const PERF_EVENT_IOC_ENABLE: libc::c_ulong = 0x2400;

/// Sampling periods: one sample per this many events. Loads are far more
/// frequent than the cycles the timer stands for, so the periods are
/// large; odd, so they do not beat against loops.
const LOAD_PERIOD: u64 = 20_011;
const STORE_PERIOD: u64 = 20_011;
const IBS_PERIOD: u64 = 100_003;

/// The precise events of this CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreciseEvents {
    /// "pebs" or "ibs", for the report.
    pub name: &'static str,
    pub attrs: Vec<PerfEventAttr>,
}

/// Finds PEBS memory events or IBS under `root`'s sysfs; None without a
/// PMU (VMs, like the machines here).
pub fn detect(root: &Path) -> Option<PreciseEvents> {
    let devices = root.join("sys/bus/event_source/devices");
    for pmu in ["cpu", "cpu_core"] {
        let dir = devices.join(pmu);
        let (Ok(loads), Ok(stores)) = (
            std::fs::read_to_string(dir.join("events/mem-loads")),
            std::fs::read_to_string(dir.join("events/mem-stores")),
        ) else {
            continue;
        };
        let pmu_type: u32 = read_number(&dir.join("type"))?;
        let load = event_attr(&dir, pmu_type, &loads, LOAD_PERIOD)?;
        let store = event_attr(&dir, pmu_type, &stores, STORE_PERIOD)?;
        return Some(PreciseEvents {
            name: "pebs",
            attrs: vec![load, store],
        });
    }
    let ibs = devices.join("ibs_op");
    let pmu_type: u32 = read_number(&ibs.join("type"))?;
    let mut attr = base_attr(pmu_type, IBS_PERIOD);
    // IBS reports the sampled op's own IP: no skid, but `precise_ip`
    // stays 0 for the ibs_op PMU itself.
    attr.flags &= !(3 << PRECISE_IP_SHIFT);
    Some(PreciseEvents {
        name: "ibs",
        attrs: vec![attr],
    })
}

fn read_number<T: std::str::FromStr>(path: &Path) -> Option<T> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn base_attr(pmu_type: u32, period: u64) -> PerfEventAttr {
    PerfEventAttr {
        type_: pmu_type,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        sample_period: period,
        sample_type: PERF_SAMPLE_IP | PERF_SAMPLE_TID | PERF_SAMPLE_ADDR,
        flags: FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV | (2 << PRECISE_IP_SHIFT),
        ..PerfEventAttr::default()
    }
}

/// Builds the attribute of a sysfs event description such as
/// `event=0xcd,umask=0x1,ldlat=3`, placing each term where the PMU's
/// `format/TERM` file says (`config:0-7`, `config1:0-15`, ...).
pub fn event_attr(
    pmu_dir: &Path,
    pmu_type: u32,
    event: &str,
    period: u64,
) -> Option<PerfEventAttr> {
    let mut attr = base_attr(pmu_type, period);
    for term in event.trim().split(',').filter(|t| !t.is_empty()) {
        let (name, value) = term.split_once('=').unwrap_or((term, "1"));
        let value = parse_int(value)?;
        let format = std::fs::read_to_string(pmu_dir.join("format").join(name)).ok()?;
        let (field, bits) = format.trim().split_once(':')?;
        let (lo, hi) = match bits.split_once('-') {
            Some((lo, hi)) => (lo.parse::<u32>().ok()?, hi.parse::<u32>().ok()?),
            None => {
                let b = bits.parse::<u32>().ok()?;
                (b, b)
            }
        };
        let width = hi.checked_sub(lo)? + 1;
        let mask = if width >= 64 {
            u64::MAX
        } else {
            (1u64 << width) - 1
        };
        let placed = (value & mask) << lo;
        match field {
            "config" => attr.config |= placed,
            "config1" => attr.config1 |= placed,
            "config2" => attr.config2 |= placed,
            _ => return None,
        }
    }
    Some(attr)
}

fn parse_int(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Opens the perf event `attr` for thread or process `pid` (0: the
/// calling thread, -1: all) on `cpu` (-1: any), close-on-exec.
pub fn perf_event_open(
    attr: &PerfEventAttr,
    pid: libc::pid_t,
    cpu: libc::c_int,
) -> std::io::Result<OwnedFd> {
    // SAFETY: perf_event_open with a valid, fully initialised attribute of
    // the size it declares, no group leader.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            attr as *const PerfEventAttr,
            pid,
            cpu,
            -1 as libc::c_int,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Opens `events` on every CPU in `cpus` and attaches the program `prog_fd`
/// to each; the returned descriptors keep them attached.
pub fn attach(events: &PreciseEvents, cpus: &[u32], prog_fd: i32) -> Result<Vec<OwnedFd>> {
    let mut fds = Vec::new();
    for attr in &events.attrs {
        for &cpu in cpus {
            // pid -1 + cpu = all processes on that CPU (the program
            // filters the target).
            let fd = perf_event_open(attr, -1, cpu as libc::c_int).map_err(|e| {
                anyhow::Error::new(e)
                    .context(format!("opening {} events on CPU {cpu}", events.name))
            })?;
            for (request, arg) in [
                (PERF_EVENT_IOC_SET_BPF, prog_fd),
                (PERF_EVENT_IOC_ENABLE, 0),
            ] {
                // SAFETY: ioctl on our perf event descriptor with a request
                // that takes an int argument.
                if unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) } != 0 {
                    return Err(anyhow::Error::new(std::io::Error::last_os_error())
                        .context(format!("attaching the sampler to {} events", events.name))
                        .into());
                }
            }
            fds.push(fd);
        }
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pmu(root: &Path, name: &str, files: &[(&str, &str)]) {
        let dir = root.join("sys/bus/event_source/devices").join(name);
        for (file, text) in files {
            let path = dir.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
    }

    fn tempdir(name: &str) -> std::path::PathBuf {
        let dir =
            std::env::temp_dir().join(format!("memprof-precise-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn intel_memory_events_become_pebs_attributes() {
        let root = tempdir("intel");
        pmu(
            &root,
            "cpu",
            &[
                ("type", "4\n"),
                ("events/mem-loads", "event=0xcd,umask=0x1,ldlat=3\n"),
                ("events/mem-stores", "event=0xd0,umask=0x82\n"),
                ("format/event", "config:0-7\n"),
                ("format/umask", "config:8-15\n"),
                ("format/ldlat", "config1:0-15\n"),
            ],
        );
        let ev = detect(&root).expect("PEBS found");
        assert_eq!(ev.name, "pebs");
        let (load, store) = (ev.attrs[0], ev.attrs[1]);
        assert_eq!((load.type_, load.config, load.config1), (4, 0x01cd, 3));
        assert_eq!((store.config, store.config1), (0x82d0, 0));
        assert_eq!(load.size, 112);
        assert_eq!((load.flags >> PRECISE_IP_SHIFT) & 3, 2);
        assert_ne!(load.flags & FLAG_EXCLUDE_KERNEL, 0);
        assert_ne!(load.sample_type & PERF_SAMPLE_ADDR, 0);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn amd_ibs_is_found_and_a_vm_has_nothing() {
        let root = tempdir("amd");
        assert_eq!(detect(&root), None, "no PMU at all");
        pmu(&root, "cpu", &[("type", "4\n")]);
        assert_eq!(detect(&root), None, "a PMU without memory events");
        pmu(&root, "ibs_op", &[("type", "11\n")]);
        let ev = detect(&root).expect("IBS found");
        assert_eq!((ev.name, ev.attrs[0].type_), ("ibs", 11));
        assert_eq!((ev.attrs[0].flags >> PRECISE_IP_SHIFT) & 3, 0);
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn malformed_event_terms_are_refused() {
        let root = tempdir("bad");
        pmu(
            &root,
            "cpu",
            &[("format/event", "config:0-7\n"), ("format/odd", "weird\n")],
        );
        let dir = root.join("sys/bus/event_source/devices/cpu");
        assert!(event_attr(&dir, 4, "event=0x1", 1).is_some());
        assert!(event_attr(&dir, 4, "event=zz", 1).is_none());
        assert!(event_attr(&dir, 4, "nosuch=1", 1).is_none());
        assert!(event_attr(&dir, 4, "odd=1", 1).is_none());
        let _ = std::fs::remove_dir_all(&root);
    }
}
