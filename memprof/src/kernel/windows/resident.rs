//! Resident operations: after the first window, those called so rarely
//! that tracing them costs a small part of the budget stay attached for
//! good, and only the hot ones go in windows.

use std::time::{Duration, Instant};

use super::{Links, Mode, Windowed, RESIDENT_SHARE_OF_BUDGET};
use crate::{
    error::Result,
    kernel::{loader::Probes, uprobes::ProbePoint},
};

impl Windowed {
    /// After the first window, operations called so rarely that tracing
    /// them costs a small part of the budget stay attached for good.
    pub(super) fn make_cold_ops_resident(&mut self, probes: &Probes, window: Duration) {
        let per_op = probes.op_calls(self.family);
        let now = Instant::now();
        let limit = self.settings.budget * RESIDENT_SHARE_OF_BUDGET;
        for p in &mut self.points {
            let calls = per_op.get(p.probe.op as usize).copied().unwrap_or(0);
            let rate = calls as f64 / window.as_secs_f64().max(1e-3);
            if rate * self.cycle.trap_cost() < limit {
                p.resident = Some(now);
            }
        }
    }

    /// Moves the links of resident operations out of `links` (kept
    /// attached); returns the rest.
    pub(super) fn without_resident(&mut self, links: Links) -> Links {
        let resident = self.resident_ops();
        let mut rest = Vec::with_capacity(links.len());
        for link in links {
            if link.ops.iter().all(|op| resident.contains(op)) {
                self.resident_links.push(link);
            } else {
                self.reattach_resident |= link.ops.iter().any(|op| resident.contains(op));
                rest.push(link);
            }
        }
        rest
    }

    /// Attaches the resident operations whose probes left with a window's
    /// link (see `reattach_resident`); they went untraced for at most a
    /// detach poll.
    pub(super) fn reattach_resident(&mut self, probes: &mut Probes) -> Result<()> {
        if !std::mem::take(&mut self.reattach_resident) {
            return Ok(());
        }
        let linked: Vec<u32> = self
            .resident_links
            .iter()
            .flat_map(|l| l.ops.clone())
            .collect();
        let points: Vec<ProbePoint> = self
            .points
            .iter()
            .filter(|p| p.resident.is_some() && !linked.contains(&p.probe.op))
            .map(|p| p.probe)
            .collect();
        if points.is_empty() {
            return Ok(());
        }
        let floor = self.settings.mode == Mode::Floor;
        let links = probes.attach_points(self.family, &self.path, &points, self.pid, floor)?;
        self.resident_links.extend(links);
        Ok(())
    }

    /// Operations attached for good (cold ones, in sampled mode).
    pub fn resident_ops(&self) -> Vec<u32> {
        self.points
            .iter()
            .filter(|p| p.resident.is_some())
            .map(|p| p.probe.op)
            .collect()
    }

    /// Operations whose probes all stay attached (resident), by code.
    pub(super) fn resident_by_op(&self) -> Vec<bool> {
        let mut resident = vec![true; self.family.counters().1 as usize];
        let mut probed = vec![false; resident.len()];
        for p in &self.points {
            if let Some(op) = usize::try_from(p.probe.op)
                .ok()
                .filter(|&op| op < resident.len())
            {
                probed[op] = true;
                resident[op] &= p.resident.is_some();
            }
        }
        resident.iter().zip(probed).map(|(r, p)| *r && p).collect()
    }

    /// Fraction of the session operation `op` was traced: 1 for resident
    /// operations (attached all the time), else that of the windows.
    pub fn op_fraction(&self, op: u32) -> f64 {
        let resident = self
            .points
            .iter()
            .any(|p| p.probe.op == op && p.resident.is_some());
        if resident {
            1.0
        } else {
            self.traced_fraction()
        }
    }
}
