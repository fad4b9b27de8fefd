//! Loading, attaching and detaching the kernel programs.
//!
//! [`Probes`] owns the loaded object; dropping it detaches every program and
//! closes every map, so no probe outlives the session.

use std::path::Path;

use aya::{
    maps::{Array, RingBuf},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, SoftwareEvent},
        raw_trace_point::RawTracePointLink,
        trace_point::TracePointLink,
        PerfEvent, ProgramError, RawTracePoint, TracePoint, UProbe,
    },
    Ebpf, EbpfLoader,
};
use memprof_common::{globals, maps, programs};

use super::{
    detach::{Detaching, OwnedLinks},
    multi::MultiPrograms,
    precise,
    rings::{windowed_sizes, RingCounts, RingMap},
    sampler::Sampling,
    tracefs,
    uprobes::LinkMode,
};
use crate::error::{Error, Result};

/// The eBPF object built by `build.rs`.
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/memprof-ebpf"));

/// Which event drives CPU sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SamplingSource {
    /// Hardware cycle counter (machines with a PMU).
    Cycles,
    /// Software timer (works everywhere, including VMs without a PMU).
    CpuClock,
    /// The kernel's scheduler tick ([`super::sampler::Tick`]).
    Tick,
}

impl SamplingSource {
    pub fn name(self) -> &'static str {
        match self {
            SamplingSource::Cycles => "cycles",
            SamplingSource::CpuClock => "cpu-clock",
            SamplingSource::Tick => "tick",
        }
    }
}

/// What the allocator programs need to know at load time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocLoad {
    /// The allocator keeps glibc chunk headers.
    pub glibc_header: bool,
}

/// The loaded and attached programs.
pub struct Probes {
    pub(super) ebpf: Ebpf,
    /// Forwards the programs' `aya_log` messages to our logs.
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    pub source: SamplingSource,
    /// The precise memory events ("pebs", "ibs") giving data addresses,
    /// when the CPU has them; their descriptors keep them attached.
    pub precise: Option<&'static str>,
    precise_fds: Vec<std::os::fd::OwnedFd>,
    /// Why precise events were not used although the CPU has them.
    pub precise_error: Option<String>,
    /// Records read from the rings taken out of the object.
    pub rings: RingCounts,
    /// The hot programs loaded again for `uprobe_multi` links (None: single
    /// links, see `link_mode`).
    pub(super) multi: Option<MultiPrograms>,
    /// The ids of `multi`'s programs once it is given up for single links:
    /// links from earlier windows may still hold them, and the tool must
    /// wait for them too before it exits.
    pub(super) retired: Vec<u32>,
    /// How the hot uprobes are linked.
    pub link_mode: LinkMode,
    /// How futex waits are hooked.
    pub futex_hooks: super::hooks::FutexHooks,
    /// The contention hooks, which the governor may attach in windows.
    pub(super) contention: super::hooks::ContentionHooks,
    /// The tracepoint and perf-event links, taken out of the object so
    /// that they are dropped in parallel (see `Drop`).
    links: OwnedLinks,
}

impl Drop for Probes {
    /// Each link's removal waits for a grace period: one after the other
    /// (as dropping the object would) they took 1.9 s here; in parallel,
    /// their waits overlap.
    fn drop(&mut self) {
        std::mem::take(&mut self.links).drop_all();
    }
}

impl Probes {
    /// Loads the object for process `tgid` and attaches all programs the
    /// session and `load` ask for. The allocator's syscall and kernel
    /// tracepoints are attached here; its uprobes and the lock uprobes are
    /// only loaded: the features attach them, in windows, with
    /// [`Probes::attach_points`].
    pub fn attach(tgid: u32, tracefs_dir: &Path, sampling: &Sampling, load: &Load) -> Result<Self> {
        let (mut ebpf, logger, (multi, link_mode)) =
            load_object(tgid, tracefs_dir, load, sampling.tick)?;
        // The main process is traced from the first program on, with
        // layout 0; other processes are added by the session (or, forked
        // children, by the kernel).
        super::maps::trace_process(&mut ebpf, tgid, 0)?;
        let mut links = OwnedLinks::default();
        let mut contention = super::hooks::ContentionHooks::default();
        let futex_hooks = attach_programs(
            &mut ebpf,
            &mut links,
            &mut contention,
            load,
            multi.is_none(),
        )?;
        let source = attach_sampler(&mut ebpf, &mut links, sampling)?;
        tracing::info!("CPU sampling {}", sampling.scope.name());
        let mut probes = Self {
            ebpf,
            logger,
            source,
            precise: None,
            precise_fds: Vec::new(),
            precise_error: None,
            rings: RingCounts::default(),
            multi,
            retired: Vec::new(),
            link_mode,
            futex_hooks,
            contention,
            links,
        };
        if let Some(events) = sampling
            .try_hardware
            .then(|| precise::detect(Path::new("/")))
            .flatten()
        {
            if let Err(e) = probes.attach_precise(&events) {
                tracing::warn!("{} memory events unavailable: {e}", events.name);
                probes.precise_error =
                    Some(format!("{} events could not be opened ({e})", events.name));
                probes.precise_fds.clear();
            }
        }
        Ok(probes)
    }

    /// Attaches the memory-event program to the CPU's precise events and
    /// tells the timer sampler to leave addresses to it.
    fn attach_precise(&mut self, events: &precise::PreciseEvents) -> Result<()> {
        let cpus =
            aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
        let prog: &mut PerfEvent = program(&mut self.ebpf, programs::MEM_SAMPLE)?;
        prog.load()
            .map_err(|e| classify(anyhow::Error::new(e).context("loading the memory sampler")))?;
        let fd = {
            use std::os::fd::{AsFd, AsRawFd};
            prog.fd().map_err(anyhow::Error::new)?.as_fd().as_raw_fd()
        };
        self.precise_fds = precise::attach(events, &cpus, fd)?;
        let mut ctl = self
            .ebpf
            .map_mut(maps::SAMPLER_CTL)
            .and_then(|m| Array::<_, u32>::try_from(m).ok())
            .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::SAMPLER_CTL))?;
        ctl.set(0, 1, 0).map_err(anyhow::Error::new)?;
        self.precise = Some(events.name);
        Ok(())
    }

    /// Starts removing the tracepoint and perf-event links (the session is
    /// over): the kernel takes a grace period for each, one after the
    /// other under its `event_mutex`, about 40 ms here, so this overlaps
    /// with the last drain and the report. The process waits for them
    /// before it exits.
    pub fn start_detaching(&mut self) -> Detaching {
        Detaching::new(std::mem::take(&mut self.links).detach())
    }

    /// The kernel's ids of the programs loaded (to check they are gone
    /// before the tool exits: [`super::detach::wait_unloaded`]).
    pub fn program_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .ebpf
            .programs()
            .filter_map(|(_, p)| p.info().ok().map(|i| i.id()))
            .collect();
        ids.extend(
            self.multi
                .as_ref()
                .map(MultiPrograms::ids)
                .unwrap_or_default(),
        );
        ids.extend(&self.retired);
        ids
    }

    /// Moves messages the programs logged into our log.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Takes a map out of the object (for a feature to keep).
    pub fn take_map(&mut self, name: &str) -> Result<aya::maps::Map> {
        Ok(self
            .ebpf
            .take_map(name)
            .ok_or_else(|| anyhow::anyhow!("map {name} missing from the eBPF object"))?)
    }

    /// Takes a ring buffer out of the object (to be polled by the session),
    /// counting the records read from it.
    pub fn take_ring(&mut self, name: &str) -> Result<RingMap> {
        let map = self.take_map(name)?;
        let buf = RingBuf::try_from(map).map_err(anyhow::Error::new)?;
        Ok(self.rings.counted(name, buf))
    }
}

pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow::anyhow!("program {name} missing from the eBPF object"))?;
    Ok(prog.try_into().map_err(anyhow::Error::new)?)
}

/// What the features ask to load besides the programs every session runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Load {
    /// The allocator programs, and what they need to know.
    pub alloc: Option<AllocLoad>,
    /// The pthread lock uprobes.
    pub lock_uprobes: bool,
    /// The allocator's and the lock uprobes' records come only in windows
    /// (their `sampled` modes): their rings are sized for a window
    /// ([`super::rings::windowed_sizes`]), not for tracing every call.
    pub alloc_windowed: bool,
    pub lock_windowed: bool,
    /// Trace the children the traced processes fork.
    pub follow_children: bool,
    /// One link per probe point, as on kernels before 6.6, which have no
    /// `uprobe_multi` links (`MEMPROF_UPROBE_LINKS=single`).
    pub single_links: bool,
    /// Futex waits at the futex syscalls (the fallback path) instead of at
    /// the sleeps (`MEMPROF_FUTEX_HOOKS=syscalls`).
    pub syscall_futex_hooks: bool,
}

type Logger = Option<aya_log::EbpfLogger<&'static dyn log::Log>>;

/// Loads the object with the load-time settings for `tgid` and this
/// kernel's tracepoint layouts, and the hot programs for `uprobe_multi`.
fn load_object(
    tgid: u32,
    tracefs_dir: &Path,
    load: &Load,
    tick: Option<super::sampler::Tick>,
) -> Result<(Ebpf, Logger, (Option<MultiPrograms>, LinkMode))> {
    let pid_off = tracefs::field_offset(tracefs_dir, "task", "task_newtask", "pid", 4)?;
    let flags_off = tracefs::field_offset(tracefs_dir, "task", "task_newtask", "clone_flags", 8)?;
    let glibc_header = u32::from(load.alloc.is_some_and(|a| a.glibc_header));
    let follow = u32::from(load.follow_children);
    let group_dead_off =
        tracefs::field_offset(tracefs_dir, "sched", "sched_process_exit", "group_dead", 1)
            .unwrap_or(u32::MAX);
    // The allocator's and the futex syscalls' arguments.
    let args_off = tracefs::field_offset(tracefs_dir, "syscalls", "sys_enter_mmap", "addr", 8)?;
    let ret_off = tracefs::field_offset(tracefs_dir, "syscalls", "sys_exit_mmap", "ret", 8)?;
    let mut loader = EbpfLoader::new();
    loader
        .override_global(globals::TARGET_TGID, &tgid, true)
        .override_global(globals::NEWTASK_PID_OFFSET, &pid_off, true)
        .override_global(globals::NEWTASK_FLAGS_OFFSET, &flags_off, true)
        .override_global(globals::FOLLOW_CHILDREN, &follow, true)
        .override_global(globals::EXIT_GROUP_DEAD_OFFSET, &group_dead_off, true)
        .override_global(globals::ALLOC_GLIBC_HEADER, &glibc_header, true)
        .override_global(globals::SYSCALL_ARGS_OFFSET, &args_off, true)
        .override_global(globals::SYSCALL_RET_OFFSET, &ret_off, true);
    let tick_fn = tick.map_or(0, |t| t.function);
    let tick_off = match tick {
        Some(_) => {
            tracefs::field_offset(tracefs_dir, "timer", "hrtimer_expire_entry", "function", 8)?
        }
        None => 0,
    };
    loader
        .override_global(globals::TICK_FUNCTION, &tick_fn, true)
        .override_global(globals::TICK_FUNCTION_OFFSET, &tick_off, true);
    for (ring, bytes) in windowed_sizes(load.alloc_windowed, load.lock_windowed) {
        loader.map_max_entries(ring, bytes);
    }
    let mut ebpf = loader
        .load(OBJECT)
        .map_err(|e| classify(anyhow::Error::new(e).context("loading the eBPF object")))?;
    // Before the logger takes its map out of the object.
    let multi = load_multi(&ebpf, load);
    // Must exist before the programs load (they reference its map).
    let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
        Ok(logger) => Some(logger),
        Err(e) => {
            tracing::warn!("eBPF-side logging unavailable: {e}");
            None
        }
    };

    Ok((ebpf, logger, multi))
}

/// The hot programs `load` asks for, loaded for `uprobe_multi` links; or
/// why the session uses single links.
fn load_multi(ebpf: &Ebpf, load: &Load) -> (Option<MultiPrograms>, LinkMode) {
    let mut names = Vec::new();
    if load.alloc.is_some() {
        names.extend([
            programs::ALLOC_ENTER,
            programs::ALLOC_EXIT,
            programs::ALLOC_FLOOR_ENTER,
            programs::ALLOC_FLOOR_EXIT,
        ]);
    }
    if load.lock_uprobes {
        names.extend([programs::LOCK_ENTER, programs::LOCK_EXIT, programs::UNLOCK]);
    }
    let single = |why: String| {
        let mode = LinkMode {
            kind: "single",
            why: Some(why),
        };
        (None, mode)
    };
    if names.is_empty() {
        let mode = LinkMode {
            kind: "none",
            why: None,
        };
        return (None, mode);
    }
    if load.single_links {
        return single("MEMPROF_UPROBE_LINKS=single".into());
    }
    match MultiPrograms::load(OBJECT, ebpf, &names) {
        Ok(multi) => {
            let mode = LinkMode {
                kind: "uprobe_multi",
                why: None,
            };
            (Some(multi), mode)
        }
        Err(e) => {
            tracing::info!("uprobe_multi unavailable, one link per probe: {e:#}");
            single(format!(
                "uprobe_multi unavailable (kernel before 6.6?): {e:#}"
            ))
        }
    }
}

/// Attaches the thread, allocator-syscall and lock tracepoints, and, with
/// `single_links`, loads the uprobe programs the features attach later
/// (with `uprobe_multi` links they are loaded only if those fail: the
/// verifier spends 0.14 s of CPU on the three lock programs, a quarter of
/// the loader's start-up). Returns how futex waits are hooked.
fn attach_programs(
    ebpf: &mut Ebpf,
    links: &mut OwnedLinks,
    contention: &mut super::hooks::ContentionHooks,
    load: &Load,
    single_links: bool,
) -> Result<super::hooks::FutexHooks> {
    links.push(attach_tracepoint(
        ebpf,
        programs::TASK_NEW,
        "task",
        "task_newtask",
    )?);
    links.push(attach_tracepoint(
        ebpf,
        programs::TASK_EXIT,
        "sched",
        "sched_process_exit",
    )?);
    links.push(attach_raw(ebpf, programs::TASK_EXEC, "sched_process_exec")?);
    if load.alloc.is_some() {
        attach_alloc_tracepoints(ebpf, links)?;
        if single_links {
            for name in [
                programs::ALLOC_ENTER,
                programs::ALLOC_EXIT,
                programs::ALLOC_FLOOR_ENTER,
                programs::ALLOC_FLOOR_EXIT,
            ] {
                loaded_uprobe(ebpf, name)?;
            }
        }
    }
    let hooks =
        super::hooks::attach_lock_tracepoints(ebpf, links, contention, load.syscall_futex_hooks)?;
    if load.lock_uprobes && single_links {
        for name in [programs::LOCK_ENTER, programs::LOCK_EXIT, programs::UNLOCK] {
            loaded_uprobe(ebpf, name)?;
        }
    }
    Ok(hooks)
}

/// The uprobe program `name` for single links, loaded if it is not yet.
pub(super) fn loaded_uprobe<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut UProbe> {
    let prog: &mut UProbe = program(ebpf, name)?;
    if prog.fd().is_err() {
        prog.load()
            .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    }
    Ok(prog)
}

/// Loads `name` and attaches it to `category:event`; the caller owns the
/// link.
pub(super) fn attach_tracepoint(
    ebpf: &mut Ebpf,
    name: &str,
    category: &str,
    event: &str,
) -> Result<TracePointLink> {
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    let id = prog
        .attach(category, event)
        .map_err(|e| attach_error(e, &format!("tracepoint {category}:{event}")))?;
    Ok(prog.take_link(id).map_err(anyhow::Error::new)?)
}

/// Loads `name` and attaches it to the raw tracepoint `event`. Raw
/// tracepoint links go in an instant: a perf-event tracepoint's removal
/// waits for a grace period under a global mutex (`event_mutex`), so 26 of
/// them took 1 s at exit, one after the other. Used for the programs that
/// read no tracepoint field, or only the tracepoint's arguments.
pub(super) fn attach_raw(ebpf: &mut Ebpf, name: &str, event: &str) -> Result<RawTracePointLink> {
    let prog: &mut RawTracePoint = program(ebpf, name)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    attach_loaded_raw(ebpf, name, event)
}

/// Attaches the loaded raw tracepoint program `name` to `event` (again:
/// the windowed hooks); the caller owns the link.
pub(super) fn attach_loaded_raw(
    ebpf: &mut Ebpf,
    name: &str,
    event: &str,
) -> Result<RawTracePointLink> {
    let prog: &mut RawTracePoint = program(ebpf, name)?;
    let id = prog
        .attach(event)
        .map_err(|e| attach_error(e, &format!("raw tracepoint {event}")))?;
    Ok(prog.take_link(id).map_err(anyhow::Error::new)?)
}

/// A tracepoint that could not be attached: a missing kernel feature
/// unless the error says otherwise.
pub(super) fn attach_error(e: ProgramError, what: &str) -> Error {
    match classify(anyhow::Error::new(e).context(format!("attaching to {what}"))) {
        Error::Internal(err) => Error::KernelFeature {
            feature: "a needed tracepoint",
            hint: format!("{err:#}"),
        },
        other => other,
    }
}

/// Loads `name` once and attaches it to each of `events`.
pub(super) fn attach_tracepoint_to(
    ebpf: &mut Ebpf,
    links: &mut OwnedLinks,
    name: &str,
    category: &str,
    events: &[&str],
) -> Result<()> {
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    for event in events {
        let id = prog
            .attach(category, event)
            .map_err(|e| anyhow::anyhow!("attaching {name} to {category}:{event}: {e}"))?;
        links.push(prog.take_link(id).map_err(anyhow::Error::new)?);
    }
    Ok(())
}

/// Loads the allocator's syscall programs (the feature attaches them, in
/// windows: [`Probes::attach_alloc_syscalls`]) and attaches page faults
/// and `mmap_lock` (optional: not every kernel has these tracepoints).
fn attach_alloc_tracepoints(ebpf: &mut Ebpf, links: &mut OwnedLinks) -> Result<()> {
    for name in [programs::SYSCALL_ENTER, programs::SYSCALL_EXIT] {
        let prog: &mut RawTracePoint = program(ebpf, name)?;
        prog.load()
            .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    }
    for (prog, category, event) in [
        (programs::PAGE_FAULT, "exceptions", "page_fault_user"),
        (
            programs::MMAP_LOCK_START,
            "mmap_lock",
            "mmap_lock_start_locking",
        ),
        (
            programs::MMAP_LOCK_DONE,
            "mmap_lock",
            "mmap_lock_acquire_returned",
        ),
    ] {
        match attach_raw(ebpf, prog, event) {
            Ok(link) => links.push(link),
            Err(e) => {
                tracing::warn!("{category}:{event} unavailable, its statistics are left out: {e}")
            }
        }
    }
    Ok(())
}

/// Attaches the sampler to `scope`'s events: hardware cycles when asked
/// and available, else the `cpu-clock` software timer.
fn attach_sampler(
    ebpf: &mut Ebpf,
    owned: &mut OwnedLinks,
    sampling: &Sampling,
) -> Result<SamplingSource> {
    if sampling.tick.is_some() {
        return super::sampler::attach_tick(ebpf, owned);
    }
    let (scope, frequency_hz) = (&sampling.scope, sampling.frequency_hz);
    let prog: &mut PerfEvent = program(ebpf, programs::CPU_SAMPLE)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context("loading the CPU sampler")))?;
    if sampling.try_hardware {
        let cycles = PerfEventConfig::Hardware(HardwareEvent::CpuCycles);
        match scope.attach(prog, cycles, frequency_hz, owned) {
            Ok(()) => return Ok(SamplingSource::Cycles),
            Err(e) => tracing::info!("hardware cycle sampling unavailable ({e}); using cpu-clock"),
        }
    }
    let clock = PerfEventConfig::Software(SoftwareEvent::CpuClock);
    scope
        .attach(prog, clock, frequency_hz, owned)
        .map_err(|e| {
            match classify(anyhow::Error::new(e).context("opening cpu-clock perf events")) {
                Error::Internal(err) => Error::KernelFeature {
                    feature: "perf event sampling",
                    hint: format!("{err:#}"),
                },
                other => other,
            }
        })?;
    Ok(SamplingSource::CpuClock)
}

/// Turns a load/attach failure into a privilege error when the kernel said
/// EPERM/EACCES anywhere in the chain, and an internal error otherwise.
pub(super) fn classify(err: anyhow::Error) -> Error {
    let denied = err.chain().any(|e| {
        let io = e
            .downcast_ref::<std::io::Error>()
            .or_else(|| match e.downcast_ref::<ProgramError>() {
                Some(ProgramError::IOError(io)) => Some(io),
                _ => None,
            })
            .or_else(|| match e.downcast_ref::<aya::maps::MapError>() {
                Some(aya::maps::MapError::IoError(io)) => Some(io),
                _ => None,
            });
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    });
    if denied {
        Error::Privilege(format!(
            "the kernel refused ({err:#}); run as root, or with CAP_BPF and CAP_PERFMON"
        ))
    } else {
        Error::Internal(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permission_errors_are_classified() {
        let denied =
            anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EPERM)).context("loading");
        assert_eq!(
            classify(denied).exit_code(),
            crate::error::exit_code::PRIVILEGE
        );
        let other =
            anyhow::Error::new(std::io::Error::from_raw_os_error(libc::EINVAL)).context("loading");
        assert_eq!(
            classify(other).exit_code(),
            crate::error::exit_code::INTERNAL
        );
    }

    #[test]
    fn the_embedded_object_is_an_ebpf_elf() {
        assert_eq!(&OBJECT[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([OBJECT[18], OBJECT[19]]), 247, "EM_BPF");
    }
}
