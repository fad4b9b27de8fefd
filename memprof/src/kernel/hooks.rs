//! How the tool hooks the kernel for lock contention and the
//! allocator's syscalls: the scheduler's raw tracepoints for futex waits
//! (the default) or the futex syscall tracepoints (the fallback), and
//! the raw syscall tracepoints the allocator attaches with its windows.

use aya::{programs::raw_trace_point::RawTracePointLink, Ebpf};
use memprof_common::programs;

use super::{
    detach::OwnedLinks,
    loader::{attach_loaded_raw, attach_raw, attach_tracepoint, attach_tracepoint_to, Probes},
};
use crate::error::Result;

/// How futex waits are hooked in this session, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FutexHooks {
    /// `"sched"`: the scheduler's raw tracepoints see each wait as the
    /// sleep it is; `"syscalls"`: the futex syscall tracepoints, the
    /// fallback.
    pub kind: &'static str,
    /// Why the fallback is used, if it is.
    pub why: Option<String>,
}

/// Kernel lock contention (optional: newer kernels) and futex waits
/// (required: every contended user lock ends in one): by the scheduler's
/// raw tracepoints where the kernel passes `sched_switch` the sleeping
/// task's state (5.18+), else (or when `syscalls_asked`) by the futex
/// syscall tracepoints.
pub(super) fn attach_lock_tracepoints(
    ebpf: &mut Ebpf,
    links: &mut OwnedLinks,
    windowed: &mut ContentionHooks,
    syscalls_asked: bool,
) -> Result<FutexHooks> {
    for (prog, event) in KLOCK_HOOKS {
        match attach_raw(ebpf, prog, event) {
            Ok(link) => windowed.push(prog, event, link),
            Err(e) => tracing::info!("lock:{event} unavailable, left out: {e}"),
        }
    }
    let why = if syscalls_asked {
        "MEMPROF_FUTEX_HOOKS=syscalls".to_string()
    } else if !sched_hooks_kernel() {
        "the kernel is older than 5.18 (sched_switch has no task state)".into()
    } else {
        let mut sched = Vec::new();
        let attached = SCHED_HOOKS.into_iter().try_for_each(|(prog, event)| {
            attach_raw(ebpf, prog, event).map(|link| sched.push((prog, event, link)))
        });
        match attached {
            Ok(()) => {
                for (prog, event, link) in sched {
                    windowed.push(prog, event, link);
                }
                return Ok(FutexHooks {
                    kind: "sched",
                    why: None,
                });
            }
            Err(e) => {
                tracing::info!("sched raw tracepoints unavailable, futex syscalls instead: {e}");
                format!("the sched raw tracepoints could not be attached: {e}")
            }
        }
    };
    attach_futex_syscalls(ebpf, links)?;
    Ok(FutexHooks {
        kind: "syscalls",
        why: Some(why),
    })
}

/// Kernel lock waits (optional: newer kernels).
const KLOCK_HOOKS: [(&str, &str); 2] = [
    (programs::KLOCK_BEGIN, "contention_begin"),
    (programs::KLOCK_END, "contention_end"),
];

/// Futex waits seen as the sleeps they are.
const SCHED_HOOKS: [(&str, &str); 2] = [
    (programs::FUTEX_SWITCH, "sched_switch"),
    (programs::FUTEX_WAKING, "sched_waking"),
];

/// The always-on contention hooks that can go in windows (the sched
/// hooks and the kernel lock waits' raw tracepoints): what was attached,
/// to attach it again.
#[derive(Default)]
pub struct ContentionHooks {
    /// (program, raw tracepoint) of each hook attached at start-up.
    hooks: Vec<(&'static str, &'static str)>,
    links: Vec<RawTracePointLink>,
}

impl ContentionHooks {
    fn push(&mut self, prog: &'static str, event: &'static str, link: RawTracePointLink) {
        self.hooks.push((prog, event));
        self.links.push(link);
    }

    /// Whether they are attached.
    fn attached(&self) -> bool {
        !self.links.is_empty()
    }
}

/// Whether the kernel passes the sleeping task's state to `sched_switch`
/// (5.18 added it as the tracepoint's last argument).
fn sched_hooks_kernel() -> bool {
    aya::util::KernelVersion::current().is_ok_and(|v| v >= aya::util::KernelVersion::new(5, 18, 0))
}

/// Futex calls at their syscalls (required on this path), and the futex2
/// calls (optional: newer kernels).
fn attach_futex_syscalls(ebpf: &mut Ebpf, links: &mut OwnedLinks) -> Result<()> {
    links.push(attach_tracepoint(
        ebpf,
        programs::FUTEX_ENTER,
        "syscalls",
        "sys_enter_futex",
    )?);
    links.push(attach_tracepoint(
        ebpf,
        programs::FUTEX_EXIT,
        "syscalls",
        "sys_exit_futex",
    )?);
    let optional: [(&str, &str, &[&str]); 3] = [
        (
            programs::FUTEX_WAIT_ENTER,
            "syscalls",
            &["sys_enter_futex_wait"],
        ),
        (
            programs::FUTEX_WAKE_ENTER,
            "syscalls",
            &["sys_enter_futex_wake"],
        ),
        (
            programs::FUTEX2_EXIT,
            "syscalls",
            &["sys_exit_futex_wait", "sys_exit_futex_wake"],
        ),
    ];
    for (prog, category, events) in optional {
        if let Err(e) = attach_tracepoint_to(ebpf, links, prog, category, events) {
            tracing::info!("{category}:{events:?} unavailable, left out: {e}");
        }
    }
    Ok(())
}

impl Probes {
    /// Detaches the contention hooks (at once: raw tracepoint links wait
    /// for no grace period). Waits in progress are dropped when they end
    /// in a later window ([`Probes::open_contention_window`]).
    pub fn close_contention_window(&mut self) {
        self.contention.links.clear();
    }

    /// Attaches the contention hooks again, after telling the programs
    /// when this window opens (waits that began before are dropped).
    pub fn open_contention_window(&mut self) -> Result<()> {
        if self.contention.attached() {
            return Ok(());
        }
        self.set_futex_window_start(super::windows::ktime_ns());
        for i in 0..self.contention.hooks.len() {
            let (name, event) = self.contention.hooks[i];
            let link = attach_loaded_raw(&mut self.ebpf, name, event)?;
            self.contention.links.push(link);
        }
        Ok(())
    }

    /// Attaches the allocator's syscall programs to the raw `sys_enter`
    /// and `sys_exit` tracepoints; dropping the links detaches them (at
    /// once: raw tracepoint links wait for no grace period).
    pub fn attach_alloc_syscalls(&mut self) -> Result<Vec<RawTracePointLink>> {
        let mut links = Vec::with_capacity(2);
        for (name, event) in [
            (programs::SYSCALL_EXIT, "sys_exit"),
            (programs::SYSCALL_ENTER, "sys_enter"),
        ] {
            links.push(attach_loaded_raw(&mut self.ebpf, name, event)?);
        }
        Ok(links)
    }
}
