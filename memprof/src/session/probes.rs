//! Loading, attaching and detaching the kernel programs.
//!
//! [`Probes`] owns the loaded object; dropping it detaches every program and
//! closes every map, so no probe outlives the session.

use std::path::Path;

use aya::{
    maps::{MapData, PerCpuArray, RingBuf, StackTraceMap},
    programs::{
        perf_event::{HardwareEvent, PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        PerfEvent, ProgramError, TracePoint,
    },
    Ebpf, EbpfLoader,
};
use memprof_common::{counter, globals, maps, programs};

use super::tracefs;
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
}

impl SamplingSource {
    pub fn name(self) -> &'static str {
        match self {
            SamplingSource::Cycles => "cycles",
            SamplingSource::CpuClock => "cpu-clock",
        }
    }
}

/// Totals of the per-CPU counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub samples_seen: u64,
    pub samples_lost: u64,
    pub task_events_lost: u64,
    pub stack_errors: u64,
}

impl Counters {
    pub fn lost(&self) -> u64 {
        self.samples_lost + self.task_events_lost
    }
}

/// The loaded and attached programs.
pub struct Probes {
    ebpf: Ebpf,
    /// Forwards the programs' `aya_log` messages to our logs.
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    pub source: SamplingSource,
}

impl Probes {
    /// Loads the object for process `tgid` and attaches all programs.
    pub fn attach(
        tgid: u32,
        tracefs_dir: &Path,
        frequency_hz: u64,
        try_hardware: bool,
    ) -> Result<Self> {
        let pid_off = tracefs::field_offset(tracefs_dir, "task", "task_newtask", "pid", 4)?;
        let flags_off =
            tracefs::field_offset(tracefs_dir, "task", "task_newtask", "clone_flags", 8)?;
        let mut ebpf = EbpfLoader::new()
            .override_global(globals::TARGET_TGID, &tgid, true)
            .override_global(globals::NEWTASK_PID_OFFSET, &pid_off, true)
            .override_global(globals::NEWTASK_FLAGS_OFFSET, &flags_off, true)
            .load(OBJECT)
            .map_err(|e| classify(anyhow::Error::new(e).context("loading the eBPF object")))?;
        // Must exist before the programs load (they reference its map).
        let logger = match aya_log::EbpfLogger::init(&mut ebpf) {
            Ok(logger) => Some(logger),
            Err(e) => {
                tracing::warn!("eBPF-side logging unavailable: {e}");
                None
            }
        };

        attach_tracepoint(&mut ebpf, programs::TASK_NEW, "task", "task_newtask")?;
        attach_tracepoint(
            &mut ebpf,
            programs::TASK_EXIT,
            "sched",
            "sched_process_exit",
        )?;
        attach_tracepoint(
            &mut ebpf,
            programs::TASK_EXEC,
            "sched",
            "sched_process_exec",
        )?;
        let source = attach_sampler(&mut ebpf, frequency_hz, try_hardware)?;
        Ok(Self {
            ebpf,
            logger,
            source,
        })
    }

    /// Moves messages the programs logged into our log.
    pub fn flush_logs(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Takes a ring buffer out of the object (to be polled by the session).
    pub fn take_ring(&mut self, name: &str) -> Result<RingBuf<MapData>> {
        let map = self
            .ebpf
            .take_map(name)
            .ok_or_else(|| anyhow::anyhow!("map {name} missing from the eBPF object"))?;
        Ok(RingBuf::try_from(map).map_err(anyhow::Error::new)?)
    }

    /// Current totals of the kernel-side counters.
    pub fn counters(&self) -> Counters {
        let Some(map) = self.ebpf.map(maps::COUNTERS) else {
            return Counters::default();
        };
        let Ok(array) = PerCpuArray::<_, u64>::try_from(map) else {
            return Counters::default();
        };
        let sum = |i: u32| array.get(&i, 0).map(|v| v.iter().sum()).unwrap_or(0);
        Counters {
            samples_seen: sum(counter::SAMPLES_SEEN),
            samples_lost: sum(counter::SAMPLES_LOST),
            task_events_lost: sum(counter::TASK_EVENTS_LOST),
            stack_errors: sum(counter::STACK_ERRORS),
        }
    }

    /// The user stack recorded under `id` (innermost frame first).
    pub fn stack(&self, id: u32) -> Option<Vec<u64>> {
        let map = StackTraceMap::try_from(self.ebpf.map(maps::STACKS)?).ok()?;
        let trace = map.get(&id, 0).ok()?;
        Some(trace.frames().iter().map(|f| f.ip).collect())
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow::anyhow!("program {name} missing from the eBPF object"))?;
    Ok(prog.try_into().map_err(anyhow::Error::new)?)
}

fn attach_tracepoint(ebpf: &mut Ebpf, name: &str, category: &str, event: &str) -> Result<()> {
    let prog: &mut TracePoint = program(ebpf, name)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context(format!("loading {name}"))))?;
    prog.attach(category, event).map_err(|e| {
        let err =
            anyhow::Error::new(e).context(format!("attaching to tracepoint {category}:{event}"));
        match classify(err) {
            Error::Internal(err) => Error::KernelFeature {
                feature: "a needed tracepoint",
                hint: format!("{err:#}"),
            },
            other => other,
        }
    })?;
    Ok(())
}

/// Attaches the sampler on every online CPU: hardware cycles when asked and
/// available, else the `cpu-clock` software timer.
fn attach_sampler(
    ebpf: &mut Ebpf,
    frequency_hz: u64,
    try_hardware: bool,
) -> Result<SamplingSource> {
    let cpus =
        aya::util::online_cpus().map_err(|(what, e)| anyhow::anyhow!("reading {what}: {e}"))?;
    let prog: &mut PerfEvent = program(ebpf, programs::CPU_SAMPLE)?;
    prog.load()
        .map_err(|e| classify(anyhow::Error::new(e).context("loading the CPU sampler")))?;

    let mut attach_all = |config: PerfEventConfig| -> std::result::Result<(), ProgramError> {
        let mut links = Vec::with_capacity(cpus.len());
        for &cpu in &cpus {
            match prog.attach(
                config,
                PerfEventScope::AllProcessesOneCpu { cpu },
                SamplePolicy::Frequency(frequency_hz),
                false,
            ) {
                Ok(link) => links.push(link),
                Err(e) => {
                    for link in links {
                        let _ = prog.detach(link);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    };
    if try_hardware {
        match attach_all(PerfEventConfig::Hardware(HardwareEvent::CpuCycles)) {
            Ok(()) => return Ok(SamplingSource::Cycles),
            Err(e) => tracing::info!("hardware cycle sampling unavailable ({e}); using cpu-clock"),
        }
    }
    attach_all(PerfEventConfig::Software(SoftwareEvent::CpuClock)).map_err(|e| {
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
fn classify(err: anyhow::Error) -> Error {
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

    #[test]
    fn counters_sum_losses() {
        let c = Counters {
            samples_lost: 2,
            task_events_lost: 3,
            ..Default::default()
        };
        assert_eq!(c.lost(), 5);
        assert_eq!(SamplingSource::CpuClock.name(), "cpu-clock");
    }
}
