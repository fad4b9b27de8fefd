//! Reading and writing the programs' maps: counters, per-thread kernel
//! statistics, the operand recipes, the cache-line tables and the stacks.

use aya::maps::{Array, HashMap as BpfHashMap, PerCpuArray, StackTraceMap};
use memprof_common::{
    counter,
    locks::LOCK_CTL_GENERATION,
    maps,
    procs::{shared_slot, SharedRange, SHARED_RANGES_PER_PROCESS},
    sharing::{AccessRecipe, LineState, LineWords},
    KernelStats, ALLOC_CTL_GENERATION,
};

use super::{loader::Probes, uprobes::Family};

/// Totals of the per-CPU counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub samples_seen: u64,
    pub samples_lost: u64,
    pub task_events_lost: u64,
    pub stack_errors: u64,
    pub alloc_events_lost: u64,
    pub alloc_state_errors: u64,
    /// Allocator calls that hit an entry probe.
    pub alloc_calls: u64,
    pub lock_events_lost: u64,
    /// Critical sections lost (ring full), unlocks of locks not seen
    /// taken, locks taken beyond the held-locks table, state not stored.
    pub hold_events_lost: u64,
    pub unmatched_unlocks: u64,
    pub held_overflow: u64,
    pub lock_state_errors: u64,
    /// User-mode samples, and of those: no recipe yet (sent to decode),
    /// no usable memory operand, and an address computed.
    pub user_samples: u64,
    pub no_recipe: u64,
    pub no_operand: u64,
    pub addresses: u64,
    /// Line and word-table entries created, and lines lost to errors.
    pub lines_new: u64,
    pub words_new: u64,
    pub line_errors: u64,
    pub addresses_loaded: u64,
    pub slice_faults: u64,
    /// Futex calls and kernel lock waits aggregated by site only (lock
    /// table full), not aggregated at all, and stack samples sent.
    pub contention_overflow: u64,
    pub contention_dropped: u64,
    /// Futex waits lost to a slot of the sched hooks' table held by
    /// another thread's wait.
    pub futex_slot_collisions: u64,
    /// Futex waits the governor's stride skipped, and those traced.
    pub futex_waits_skipped: u64,
    pub futex_waits_traced: u64,
    /// Nanoseconds the contention programs spent on traced waits.
    pub futex_hit_ns: u64,
    /// Wait spans sent to the unnecessary-contention analysis, and lost.
    pub wait_spans: u64,
    pub wait_spans_lost: u64,
    /// Syscalls of the target seen while the allocator's syscall hooks
    /// were attached.
    pub syscalls_seen: u64,
    pub lock_samples: u64,
    /// Allocation call chains sent, and held back by the per-second cap.
    pub alloc_stacks: u64,
    pub alloc_stacks_capped: u64,
}

impl Counters {
    pub fn lost(&self) -> u64 {
        self.samples_lost + self.task_events_lost
    }
}

impl Probes {
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
            alloc_events_lost: sum(counter::ALLOC_EVENTS_LOST),
            alloc_state_errors: sum(counter::ALLOC_STATE_ERRORS),
            alloc_calls: (0..memprof_common::alloc_op::COUNT)
                .map(|op| sum(counter::ALLOC_OP_CALLS + op))
                .sum(),
            hold_events_lost: sum(counter::HOLD_EVENTS_LOST),
            unmatched_unlocks: sum(counter::UNMATCHED_UNLOCKS),
            held_overflow: sum(counter::HELD_OVERFLOW),
            lock_state_errors: sum(counter::LOCK_STATE_ERRORS),
            lock_events_lost: sum(counter::LOCK_EVENTS_LOST),
            user_samples: sum(counter::USER_SAMPLES),
            no_recipe: sum(counter::NO_RECIPE),
            no_operand: sum(counter::NO_OPERAND),
            addresses: sum(counter::ADDRESSES),
            lines_new: sum(counter::LINES_NEW),
            words_new: sum(counter::WORDS_NEW),
            line_errors: sum(counter::LINE_ERRORS),
            addresses_loaded: sum(counter::ADDRESSES_LOADED),
            slice_faults: sum(counter::SLICE_FAULTS),
            contention_overflow: sum(counter::CONTENTION_OVERFLOW),
            contention_dropped: sum(counter::CONTENTION_DROPPED),
            futex_slot_collisions: sum(counter::FUTEX_SLOT_COLLISIONS),
            futex_waits_skipped: sum(counter::FUTEX_WAITS_SKIPPED),
            futex_waits_traced: sum(counter::FUTEX_WAITS_TRACED),
            futex_hit_ns: sum(counter::FUTEX_HIT_NS),
            wait_spans: sum(counter::WAIT_SPANS),
            wait_spans_lost: sum(counter::WAIT_SPANS_LOST),
            syscalls_seen: sum(counter::SYSCALLS_SEEN),
            lock_samples: sum(counter::LOCK_SAMPLES),
            alloc_stacks: sum(counter::ALLOC_STACKS),
            alloc_stacks_capped: sum(counter::ALLOC_STACKS_CAPPED),
        }
    }

    /// Calls seen so far by a family's entry probes, per operation code.
    pub fn op_calls(&self, family: Family) -> Vec<u64> {
        let Some(array) = self
            .ebpf
            .map(maps::COUNTERS)
            .and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok())
        else {
            return Vec::new();
        };
        let (first, count) = family.counters();
        (0..count)
            .map(|op| {
                array
                    .get(&(first + op), 0)
                    .map(|v| v.iter().sum())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Calls seen so far by a family's entry probes.
    pub fn calls(&self, family: Family) -> u64 {
        self.op_calls(family).iter().sum()
    }

    /// Starts a new tracing window of a family: per-thread state left from
    /// the previous one (a return probe detached mid-call, an unlock
    /// missed) becomes stale.
    pub fn set_generation(&mut self, family: Family, generation: u64) {
        let (name, index) = match family {
            Family::Alloc => (maps::ALLOC_CTL, ALLOC_CTL_GENERATION),
            Family::Locks => (maps::LOCK_CTL, LOCK_CTL_GENERATION),
        };
        let Some(map) = self.ebpf.map_mut(name) else {
            return;
        };
        if let Ok(mut array) = Array::<_, u64>::try_from(map) {
            if let Err(e) = array.set(index, generation, 0) {
                tracing::warn!("cannot start a {family:?} window: {e}");
            }
        }
    }

    /// Sets the futex hooks' stride: each wait traced with probability
    /// `1 / stride`.
    pub fn set_futex_stride(&mut self, stride: u64) {
        self.set_futex_ctl(
            memprof_common::futex_ctl::STRIDE,
            stride,
            "the futex stride",
        );
    }

    /// Tells the contention programs when their window opened.
    pub(super) fn set_futex_window_start(&mut self, ns: u64) {
        self.set_futex_ctl(
            memprof_common::futex_ctl::WINDOW_START,
            ns,
            "the futex window start",
        );
    }

    /// Asks the sched hooks for the traced waits' spans (or no more).
    pub fn send_wait_spans(&mut self, on: bool) {
        self.set_futex_ctl(memprof_common::futex_ctl::SPANS, on.into(), "wait spans");
    }

    fn set_futex_ctl(&mut self, index: u32, value: u64, what: &str) {
        let Some(map) = self.ebpf.map_mut(maps::FUTEX_CTL) else {
            return;
        };
        if let Ok(mut array) = Array::<_, u64>::try_from(map) {
            if let Err(e) = array.set(index, value, 0) {
                tracing::warn!("cannot set {what}: {e}");
            }
        }
    }

    /// Writes the byte gaps between sampled allocations (until then the
    /// programs sample none).
    pub fn set_alloc_sample_gaps(&mut self, gaps: &[u32]) {
        let Some(map) = self.ebpf.map_mut(maps::ALLOC_SAMPLE_GAPS) else {
            return;
        };
        let Ok(mut array) = Array::<_, u32>::try_from(map) else {
            return;
        };
        for (i, &gap) in (0u32..).zip(gaps) {
            if let Err(e) = array.set(i, gap, 0) {
                tracing::warn!("cannot write the allocation sampling gaps: {e}");
                return;
            }
        }
    }

    /// Page faults and `mmap_lock` waits per thread of the target.
    pub fn kernel_stats(&self) -> Vec<(u32, KernelStats)> {
        let Some(map) = self.ebpf.map(maps::KERNEL_STATS) else {
            return Vec::new();
        };
        let Ok(stats) = BpfHashMap::<_, u32, KernelStats>::try_from(map) else {
            return Vec::new();
        };
        stats.iter().filter_map(|r| r.ok()).collect()
    }

    /// Installs decoded operand recipes for the sampler; returns how many
    /// did not fit (the map is full: those IPs stay undecoded).
    pub fn install_recipes(&mut self, recipes: &[(u64, AccessRecipe)]) -> usize {
        let Some(mut map) = self
            .ebpf
            .map_mut(maps::RECIPES)
            .and_then(|m| BpfHashMap::<_, u64, AccessRecipe>::try_from(m).ok())
        else {
            return recipes.len();
        };
        recipes
            .iter()
            .filter(|(ip, r)| map.insert(ip, r, 0).is_err())
            .count()
    }

    /// Drops every recipe (the target's program image changed).
    pub fn clear_recipes(&mut self) {
        let Some(mut map) = self
            .ebpf
            .map_mut(maps::RECIPES)
            .and_then(|m| BpfHashMap::<_, u64, AccessRecipe>::try_from(m).ok())
        else {
            return;
        };
        let keys: Vec<u64> = map.keys().filter_map(|k| k.ok()).collect();
        for ip in keys {
            let _ = map.remove(&ip);
        }
    }

    /// Traces process `tgid` (its samples), with code layout `layout`.
    pub fn trace(&mut self, tgid: u32, layout: u32) -> crate::error::Result<()> {
        trace_process(&mut self.ebpf, tgid, layout)
    }

    /// Sets the cgroups whose newcomers are traced (`--cgroup`: the one and
    /// those below it, by id), adding the new ones and removing the gone.
    pub fn set_traced_cgroups(&mut self, ids: &[u64]) -> crate::error::Result<()> {
        let mut map = self
            .ebpf
            .map_mut(maps::TRACED_CGROUPS)
            .and_then(|m| BpfHashMap::<_, u64, u8>::try_from(m).ok())
            .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::TRACED_CGROUPS))?;
        let old: Vec<u64> = map.keys().filter_map(|k| k.ok()).collect();
        for id in old.iter().filter(|id| !ids.contains(id)) {
            let _ = map.remove(id);
        }
        for &id in ids.iter().filter(|id| !old.contains(id)) {
            map.insert(id, 1, 0)
                .map_err(|e| anyhow::anyhow!("tracing cgroup {id}: {e}"))?;
        }
        Ok(())
    }

    /// Sets the shared mappings of process `tgid` the sampler translates
    /// (slots from 0 on; the rest emptied).
    pub fn set_shared_ranges(&mut self, tgid: u32, ranges: &[SharedRange]) {
        let Some(mut map) = self
            .ebpf
            .map_mut(maps::SHARED_RANGES)
            .and_then(|m| BpfHashMap::<_, u64, SharedRange>::try_from(m).ok())
        else {
            return;
        };
        for slot in 0..SHARED_RANGES_PER_PROCESS {
            let key = shared_slot(tgid, slot);
            let result = match ranges.get(slot as usize) {
                Some(r) => map.insert(key, r, 0),
                None => map.remove(&key),
            };
            if let Err(e) = result.filter_not_found() {
                tracing::debug!("shared range {slot} of {tgid}: {e}");
            }
        }
    }

    /// The kernel's state of `line`, if it is still in the table.
    pub fn line_state(&self, line: u64) -> Option<LineState> {
        let map = BpfHashMap::<_, u64, LineState>::try_from(self.ebpf.map(maps::LINES)?).ok()?;
        map.get(&line, 0).ok()
    }

    /// The kernel's word detail of `line`, if it has any.
    pub fn line_words(&self, line: u64) -> Option<LineWords> {
        let map = BpfHashMap::<_, u64, LineWords>::try_from(self.ebpf.map(maps::WORDS)?).ok()?;
        map.get(&line, 0).ok()
    }

    /// Lines in the kernel's table now (walks the keys: call it once).
    pub fn lines_tracked(&self) -> u64 {
        self.ebpf
            .map(maps::LINES)
            .and_then(|m| BpfHashMap::<_, u64, LineState>::try_from(m).ok())
            .map_or(0, |map| map.keys().filter(|k| k.is_ok()).count() as u64)
    }

    /// The user stack recorded under `id` (innermost frame first).
    pub fn stack(&self, id: u32) -> Option<Vec<u64>> {
        let map = StackTraceMap::try_from(self.ebpf.map(maps::STACKS)?).ok()?;
        let trace = map.get(&id, 0).ok()?;
        Some(trace.frames().iter().map(|f| f.ip).collect())
    }
}

/// Adds process `tgid` to the sampler's set with code layout `layout`.
pub(super) fn trace_process(
    ebpf: &mut aya::Ebpf,
    tgid: u32,
    layout: u32,
) -> crate::error::Result<()> {
    let mut map = ebpf
        .map_mut(maps::TRACED)
        .and_then(|m| BpfHashMap::<_, u32, u32>::try_from(m).ok())
        .ok_or_else(|| anyhow::anyhow!("map {} missing", maps::TRACED))?;
    map.insert(tgid, layout, 0)
        .map_err(|e| anyhow::anyhow!("tracing process {tgid}: {e}"))?;
    Ok(())
}

/// Removing a key that is not there is not an error here.
trait NotFound {
    fn filter_not_found(self) -> Result<(), aya::maps::MapError>;
}

impl NotFound for Result<(), aya::maps::MapError> {
    fn filter_not_found(self) -> Result<(), aya::maps::MapError> {
        match self {
            Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::loader::SamplingSource;

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
