//! Sampled memory accesses and the per-cache-line table (false sharing).
//!
//! For each user-mode sample the sampler looks its IP up in [`RECIPES`].
//! No recipe yet: the sample goes to the loader flagged for decoding. A
//! recipe: the data address is computed from the sampled registers (timer
//! sampling) or taken from the sample (precise memory events), and the
//! line's entry in [`LINES`] is updated in place, with word-level detail
//! in [`WORDS`] once the line has been written a few times. The rule
//! itself is `memprof_common::sharing`, shared with the unit tests.

use aya_ebpf::{
    bindings::pt_regs,
    bindings::BPF_NOEXIST,
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap, LruHashMap},
};
use memprof_common::{
    counter,
    procs::{shared_slot, SharedRange, SHARED_RANGES_CAPACITY, SHARED_RANGES_PER_PROCESS},
    sharing::{
        reg, AccessRecipe, LineState, LineWords, LINES_CAPACITY, LINE_BYTES, RECIPES_CAPACITY,
        WORDS_CAPACITY, WORD_DETAIL_WRITES,
    },
    SAMPLE_FLAG_ADDR, SAMPLE_FLAG_NO_RECIPE,
};

use crate::maps::{count, current_ids};

/// `[0]`: 1 once the loader attached precise memory events (PEBS/IBS):
/// their program records the accesses and the timer sampler stops
/// computing addresses. A map, not a load-time global, because whether
/// the events can be opened is only known after loading.
#[map(name = "SAMPLER_CTL")]
static SAMPLER_CTL: Array<u32> = Array::with_max_entries(1, 0);

/// Whether precise memory events feed the line table.
#[inline(always)]
pub fn precise_mode() -> bool {
    SAMPLER_CTL.get(0).is_some_and(|v| *v != 0)
}

#[map(name = "RECIPES")]
static RECIPES: HashMap<u64, AccessRecipe> = HashMap::with_max_entries(RECIPES_CAPACITY, 0);

#[map(name = "LINES")]
static LINES: LruHashMap<u64, LineState> = LruHashMap::with_max_entries(LINES_CAPACITY, 0);

#[map(name = "WORDS")]
static WORDS: LruHashMap<u64, LineWords> = LruHashMap::with_max_entries(WORDS_CAPACITY, 0);

/// The `MAP_SHARED` mappings of each traced process, written by the
/// loader: accesses to them are keyed by object and offset, so that
/// processes mapping the same memory at different addresses meet.
#[map(name = "SHARED_RANGES")]
static SHARED_RANGES: HashMap<u64, SharedRange> =
    HashMap::with_max_entries(SHARED_RANGES_CAPACITY, 0);

/// A zeroed [`LineWords`] to insert from: at 320 bytes it does not fit on
/// the BPF stack beside the rest. Never written.
#[map(name = "ZERO_WORDS")]
static ZERO_WORDS: Array<LineWords> = Array::with_max_entries(1, 0);

/// What a sample says about memory: `SAMPLE_FLAG_*` bits to add, and the
/// address, recipe bits and size when it yielded an address.
#[derive(Default)]
pub struct Access {
    pub flags: u32,
    pub addr: u64,
    pub bits: u32,
    pub size: u32,
}

/// Computes the sampled access of a user-mode sample of `tid` at `ip`,
/// interrupted with user registers `regs`, and records it in the line
/// table. `precise`: the address a precise memory event's sample
/// carries (None for a timer sample: computed from `regs`).
#[inline(always)]
pub fn sample_access(
    regs: &pt_regs,
    precise: Option<u64>,
    ip: u64,
    tid: u32,
    now_ns: u64,
) -> Access {
    count(counter::USER_SAMPLES);
    // SAFETY: a map lookup; the value is plain data and only read.
    let Some(recipe) = (unsafe { RECIPES.get(ip) }) else {
        count(counter::NO_RECIPE);
        return Access {
            flags: SAMPLE_FLAG_NO_RECIPE,
            ..Access::default()
        };
    };
    let recipe = *recipe;
    let addr = match precise {
        Some(addr) => (addr != 0
            && recipe.flags & memprof_common::sharing::recipe::NO_OPERAND == 0)
            .then_some(addr),
        None => recipe.address_with(&registers(regs), read_user_u64),
    };
    let Some(addr) = addr else {
        count(if recipe.loads > 0 {
            counter::SLICE_FAULTS
        } else {
            counter::NO_OPERAND
        });
        return Access::default();
    };
    count(counter::ADDRESSES);
    if recipe.loads > 0 {
        count(counter::ADDRESSES_LOADED);
    }
    record_line(addr, &recipe, tid, now_ns);
    Access {
        flags: SAMPLE_FLAG_ADDR,
        addr,
        bits: recipe.flags,
        size: recipe.size as u32,
    }
}

/// The sampled user registers, in x86 encoding order ([`reg`]).
#[inline(always)]
fn registers(r: &pt_regs) -> [u64; reg::COUNT] {
    [
        r.rax, r.rcx, r.rdx, r.rbx, r.rsp, r.rbp, r.rsi, r.rdi, r.r8, r.r9, r.r10, r.r11, r.r12,
        r.r13, r.r14, r.r15,
    ]
}

/// 8 bytes of the interrupted thread's memory at `addr` (a recipe's
/// slice reads its base back from a stack slot): None when unmapped or
/// paged out (the helper does not fault pages in).
#[inline(always)]
fn read_user_u64(addr: u64) -> Option<u64> {
    // SAFETY: `bpf_probe_read_user` checks the address itself and fails
    // on any it cannot read; nothing is dereferenced here.
    unsafe { bpf_probe_read_user(addr as *const u64) }.ok()
}

/// The key of `addr` in the line table for the current process: its
/// canonical key in a shared mapping ([`memprof_common::procs`]), else the
/// address. The loader keys the samples by the same rule.
#[inline(always)]
fn line_key(addr: u64) -> u64 {
    let (tgid, _) = current_ids();
    for slot in 0..SHARED_RANGES_PER_PROCESS {
        // SAFETY: a map lookup; the value is plain data, only read.
        let Some(range) = (unsafe { SHARED_RANGES.get(shared_slot(tgid, slot)) }) else {
            break; // slots are filled from 0 on
        };
        if let Some(key) = range.key(addr) {
            return key;
        }
    }
    addr
}

#[inline(always)]
fn record_line(addr: u64, recipe: &AccessRecipe, tid: u32, now_ns: u64) {
    let addr = line_key(addr);
    let line = addr & !(LINE_BYTES - 1);
    let write = recipe.is_write();
    let Some(state) = line_entry(line) else {
        count(counter::LINE_ERRORS);
        return;
    };
    // SAFETY: the pointer comes from the map lookup and stays valid for
    // the program's run. Another CPU may update the same entry at the same
    // time (tracing programs cannot take a bpf_spin_lock); a lost update
    // of a sampled statistic is acceptable.
    let state = unsafe { &mut *state };
    state.record(tid, write, now_ns);
    if state.writes < WORD_DETAIL_WRITES {
        return;
    }
    let Some(words) = words_entry(line) else {
        count(counter::LINE_ERRORS);
        return;
    };
    // SAFETY: as above, a map value pointer valid for this run.
    let words = unsafe { &mut *words };
    words.record((addr - line) as u32, recipe.size as u32, tid, write);
}

#[inline(always)]
fn line_entry(line: u64) -> Option<*mut LineState> {
    if let Some(p) = LINES.get_ptr_mut(line) {
        return Some(p);
    }
    if LINES
        .insert(line, LineState::default(), BPF_NOEXIST as u64)
        .is_ok()
    {
        count(counter::LINES_NEW);
    }
    LINES.get_ptr_mut(line)
}

#[inline(always)]
fn words_entry(line: u64) -> Option<*mut LineWords> {
    if let Some(p) = WORDS.get_ptr_mut(line) {
        return Some(p);
    }
    let zero = ZERO_WORDS.get(0)?;
    if WORDS.insert(line, zero, BPF_NOEXIST as u64).is_ok() {
        count(counter::WORDS_NEW);
    }
    WORDS.get_ptr_mut(line)
}
