//! Attaching uprobes at chosen instructions of a file, for one process:
//! the hot families (allocator, locks) the features attach in windows.

use std::{num::NonZeroU32, os::fd::OwnedFd};

use aya::programs::uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeLink, UProbeScope};
use memprof_common::{counter, locks::lock_op, programs};

use super::loader::{classify, loaded_uprobe, Probes};
use crate::error::Result;

/// The families of hot uprobes, attached in windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The allocator's entry points (`memprof_common::alloc_op`).
    Alloc,
    /// pthread lock, unlock and condvar-wait functions
    /// (`memprof_common::locks::lock_op`).
    Locks,
}

impl Family {
    /// The first per-operation call counter, and how many there are.
    pub(super) fn counters(self) -> (u32, u32) {
        match self {
            Family::Alloc => (counter::ALLOC_OP_CALLS, memprof_common::alloc_op::COUNT),
            Family::Locks => (counter::LOCK_OP_CALLS, lock_op::COUNT),
        }
    }
}

/// One function to probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbePoint {
    /// Operation code of the family (the attach cookie).
    pub op: u32,
    /// File offset of the probed instruction: the function's entry, or an
    /// instruction where the stack pointer still points at the return
    /// address (see `object::x86::prologue`). Return probes go there too.
    pub file_offset: u64,
}

/// One attached link: a single probe, or (`uprobe_multi`) all of one
/// program's points in a file.
pub enum Link {
    Single(UProbeLink),
    Multi(OwnedFd),
}

/// An attached link and the operations it probes. Dropping it detaches
/// it, which blocks for a kernel grace period (see `kernel::windows`).
pub struct HotLink {
    pub ops: Vec<u32>,
    pub link: Link,
}

/// How the hot probes are linked in this session, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMode {
    /// `"uprobe_multi"` (one link per program) or `"single"` (one per
    /// probe point).
    pub kind: &'static str,
    /// Why single links are used, if they are.
    pub why: Option<String>,
}

impl Probes {
    /// Attaches a family's probes at `points` of `path`, for process `pid`
    /// only. The caller owns the links: dropping one detaches it, which
    /// blocks for a while (see `kernel::windows`). With `floor`, programs
    /// that do nothing are attached instead (the benchmark's measure of the
    /// trap cost alone; allocator only).
    pub fn attach_points(
        &mut self,
        family: Family,
        path: &str,
        points: &[ProbePoint],
        pid: u32,
        floor: bool,
    ) -> Result<Vec<HotLink>> {
        // Return probes first: a return without a recorded entry is
        // ignored, but entries recorded before their return probe exists
        // would wait for returns that never come.
        let plan: Vec<(&str, Vec<ProbePoint>)> = match family {
            Family::Alloc if floor => vec![
                (programs::ALLOC_FLOOR_EXIT, points.to_vec()),
                (programs::ALLOC_FLOOR_ENTER, points.to_vec()),
            ],
            Family::Alloc => vec![
                (programs::ALLOC_EXIT, points.to_vec()),
                (programs::ALLOC_ENTER, points.to_vec()),
            ],
            Family::Locks => {
                let (unlocks, calls): (Vec<ProbePoint>, Vec<ProbePoint>) =
                    points.iter().partition(|p| lock_op::is_unlock(p.op));
                vec![
                    (programs::LOCK_EXIT, calls.clone()),
                    (programs::LOCK_ENTER, calls),
                    (programs::UNLOCK, unlocks),
                ]
            }
        };
        let pid = NonZeroU32::new(pid).ok_or_else(|| anyhow::anyhow!("pid 0 cannot be probed"))?;
        if self.multi.is_some() {
            match self.attach_multi(path, &plan, pid.get()) {
                Ok(links) => return Ok(links),
                // The process is gone: single links could not do better,
                // and no later window would find it either.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    return Err(anyhow::anyhow!("process {pid} exited: {e}").into());
                }
                Err(e) => {
                    tracing::warn!("uprobe_multi links failed, using single links: {e}");
                    if let Some(multi) = self.multi.take() {
                        self.retired.extend(multi.ids());
                    }
                    self.link_mode = LinkMode {
                        kind: "single",
                        why: Some(format!("uprobe_multi link refused: {e}")),
                    };
                }
            }
        }
        let scope = UProbeScope::OneProcess(pid);
        // The file the target maps, which our namespace may name otherwise.
        let file = crate::process::objects::open_path(path);
        let mut links = Vec::with_capacity(points.len() * 2);
        for (name, points) in plan {
            let prog = loaded_uprobe(&mut self.ebpf, name)?;
            for point in points {
                let at = UProbeAttachPoint {
                    location: UProbeAttachLocation::AbsoluteOffset(point.file_offset),
                    cookie: Some(u64::from(point.op)),
                };
                let id = prog.attach(at, &file, scope).map_err(|e| {
                    classify(anyhow::Error::new(e).context(format!(
                        "attaching {name} to {path} at {:#x}",
                        point.file_offset
                    )))
                })?;
                links.push(HotLink {
                    ops: vec![point.op],
                    link: Link::Single(prog.take_link(id).map_err(anyhow::Error::new)?),
                });
            }
        }
        Ok(links)
    }

    /// One `uprobe_multi` link per program of `plan`, in its order.
    fn attach_multi(
        &self,
        path: &str,
        plan: &[(&str, Vec<ProbePoint>)],
        pid: u32,
    ) -> std::io::Result<Vec<HotLink>> {
        let Some(multi) = &self.multi else {
            return Ok(Vec::new());
        };
        let mut links = Vec::with_capacity(plan.len());
        for (name, points) in plan.iter().filter(|(_, p)| !p.is_empty()) {
            let offsets: Vec<u64> = points.iter().map(|p| p.file_offset).collect();
            let cookies: Vec<u64> = points.iter().map(|p| u64::from(p.op)).collect();
            let fd = multi.attach(name, path, &offsets, &cookies, pid)?;
            links.push(HotLink {
                ops: points.iter().map(|p| p.op).collect(),
                link: Link::Multi(fd),
            });
        }
        Ok(links)
    }
}
