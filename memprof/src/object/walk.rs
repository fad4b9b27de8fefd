//! Walking a copied user stack with the objects' call-frame information:
//! the call chains of lock waits and of sampled allocations.
//!
//! A program copies the thread's registers and the top of its stack; the
//! walk finds each caller's frame from the rule of the instruction it is
//! at, as far as the copied words go.

use super::unwind::{Base, Unwinder};
use crate::process::{
    maps::{call_of, Place},
    state::Process,
};

/// A thread's registers and the top of its stack, as a program copied
/// them.
#[derive(Debug, Clone, Copy)]
pub struct StackCopy<'a> {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// Stack words from `sp` up.
    pub words: &'a [u64],
    /// `ip` is a return address (the copy was taken as a call returned):
    /// it is the first frame, at its call.
    pub ip_returned: bool,
}

/// What the walk found.
#[derive(Debug, Default)]
pub struct Walk {
    /// The return addresses' places, innermost first, each at its call
    /// instruction (the return address is one byte further).
    pub frames: Vec<Place>,
    /// The return address of each frame.
    pub returns: Vec<u64>,
    /// Index of the first stack word above the last frame found (where a
    /// scan for return addresses may continue).
    pub scan_from: usize,
    /// Offsets from the stack pointer of the return addresses found in
    /// the stack (not the first frame of a copy whose `ip` returned).
    pub slots: Vec<u16>,
}

impl<'a> StackCopy<'a> {
    /// A copy taken where the thread was stopped: `ip` is the instruction
    /// about to run.
    pub fn sampled(ip: u64, sp: u64, bp: u64, words: &'a [u64]) -> Self {
        Self {
            ip,
            sp,
            bp,
            words,
            ip_returned: false,
        }
    }

    /// A copy taken as a call returned: `ip` is its return address.
    pub fn returned(ip: u64, sp: u64, bp: u64, words: &'a [u64]) -> Self {
        Self {
            ip,
            sp,
            bp,
            words,
            ip_returned: true,
        }
    }

    /// The copied word at address `addr`, if it was copied.
    fn word(&self, addr: u64) -> Option<u64> {
        let i = usize::try_from(addr.checked_sub(self.sp)? / 8).ok()?;
        (addr % 8 == self.sp % 8).then_some(())?;
        self.words.get(i).copied()
    }
}

/// Walks `copy` up to `max` frames.
pub fn walk(
    unwinder: &mut Unwinder,
    copy: &StackCopy<'_>,
    process: &mut Process,
    max: usize,
) -> Walk {
    let (mut ip, mut sp, mut bp) = (copy.ip, copy.sp, copy.bp);
    let mut walk = Walk::default();
    for depth in 0..max {
        // A return address is resolved at its call instruction.
        let returned = depth > 0 || copy.ip_returned;
        let at = if returned { call_of(ip) } else { ip };
        let Some(m) = process.find(at) else { break };
        if !m.executable || !m.is_file() {
            break;
        }
        let path = m.name.clone();
        let offset = at - m.start + m.offset;
        if returned {
            walk.frames.push(Place::File {
                path: path.clone(),
                file_offset: offset,
            });
            walk.returns.push(ip);
        }
        let Some(rule) = unwinder.rule(&mut process.files, &path, offset) else {
            break;
        };
        let base = match rule.base {
            Base::Sp => sp,
            Base::Bp => bp,
        };
        let cfa = base.wrapping_add_signed(rule.cfa_offset);
        let ra_at = cfa.wrapping_add_signed(rule.ra_offset);
        let Some(ra) = copy.word(ra_at).filter(|&a| a != 0) else {
            break;
        };
        if let Ok(slot) = u16::try_from(ra_at.wrapping_sub(copy.sp)) {
            walk.slots.push(slot);
        }
        if let Some(o) = rule.bp_offset {
            match copy.word(cfa.wrapping_add_signed(o)) {
                Some(saved) => bp = saved,
                None => break,
            }
        }
        (ip, sp) = (ra, cfa);
    }
    walk.frames.truncate(max);
    walk.returns.truncate(max);
    walk.scan_from = usize::try_from(sp.saturating_sub(copy.sp) / 8).unwrap_or(usize::MAX);
    walk
}
