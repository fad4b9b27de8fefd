//! From a sampled instruction to an operand recipe (timer sampling).
//!
//! Without a PMU the kernel gives us a sample's registers and IP, not the
//! data address. The IP's instruction is decoded once here (iced-x86) into
//! `base + index * scale + disp`, read/write and size; the kernel then
//! computes the address of every later sample at that IP by itself.
//!
//! Skid: a timer sample is taken when the interrupted instruction retires,
//! so a slow access shows up as a sample on the instruction *after* it
//! (85% on the platform's measured false-sharing loop). The recipe for an
//! IP therefore describes the previous instruction when that one accesses
//! memory, falls through to the IP, and did not overwrite its own address
//! registers (the sampled registers are those after it ran), and when the
//! IP is not a branch target (then the previous instruction in the file is
//! not necessarily the one that ran). Otherwise it describes the
//! instruction at the IP, whose registers are exactly as it will use them.

use std::collections::{HashMap, HashSet};

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};
use memprof_common::sharing::{recipe, reg, AccessRecipe};

use super::slice;

/// Bytes before the IP decoded to find the instructions before it.
pub const LOOK_BEHIND: u64 = 128;
/// Bytes after the IP decoded to find branches back to it (loop heads)
/// and the store back of a load.
pub const LOOK_AHEAD: u64 = 256;
/// Straight-line instructions before an access evaluated to find how its
/// base register got its value.
const RUN_BEHIND: usize = 24;
/// Instructions after a load searched for the store back to its address.
const RUN_AHEAD: usize = 48;
/// Start offsets tried at each end of the look-behind window.
const SYNC_STARTS: usize = 16;

/// A decoded recipe, with the address of the instruction it describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    pub recipe: AccessRecipe,
    /// The accessing instruction: the IP itself, or the one before it
    /// ([`recipe::PREVIOUS`]).
    pub insn: u64,
}

impl Decoded {
    fn none(ip: u64) -> Self {
        Self {
            recipe: AccessRecipe::none(),
            insn: ip,
        }
    }
}

/// Decodes the access for a sample at `ip`. `code` holds the bytes at
/// addresses `code_ip..code_ip + code.len()` and should reach
/// [`LOOK_BEHIND`] bytes before `ip` and [`LOOK_AHEAD`] after it (less at a
/// mapping's edge). With `precise`, the sample's IP is the accessing
/// instruction itself (PEBS, IBS) and no skid is assumed.
///
/// When the instruction before the IP overwrote its own base register
/// (`mov 0x8(%rax),%rax`), its address is computed again by a backward
/// slice through the straight-line code before it ([`mod@slice`]); a load
/// that the same code stores back to is a write too.
pub fn decode(code: &[u8], code_ip: u64, ip: u64, precise: bool) -> Decoded {
    let Some(at_off) = ip.checked_sub(code_ip).map(|o| o as usize) else {
        return Decoded::none(ip);
    };
    let Some(bytes) = code.get(at_off..) else {
        return Decoded::none(ip);
    };
    let at = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
    if at.is_invalid() {
        return Decoded::none(ip);
    }
    let mut info = InstructionInfoFactory::new();
    let mut run = run_before(code, code_ip, ip);
    if !precise {
        if let Some(r) = previous_access(code, code_ip, ip, &run, &mut info) {
            let prev = run.last().expect("a previous instruction");
            return Decoded {
                recipe: AccessRecipe {
                    flags: r.flags | recipe::PREVIOUS,
                    ..r
                },
                insn: prev.ip(),
            };
        }
    }
    match operand(&at, &mut info) {
        Some(r) => {
            run.push(at);
            Decoded {
                recipe: stored_back(code, code_ip, &run, r),
                insn: ip,
            }
        }
        None => Decoded::none(ip),
    }
}

/// The constant the access of a sample at `ip` stores, when its
/// instruction is a store of an immediate (`movl $1, flag(%rip)`): every
/// execution writes the same value. `code` and `precise` as for
/// [`decode`].
pub fn stored_constant(code: &[u8], code_ip: u64, ip: u64, precise: bool) -> Option<u64> {
    let insn = decode(code, code_ip, ip, precise).insn;
    let bytes = code.get(insn.checked_sub(code_ip)? as usize..)?;
    let at = Decoder::with_ip(64, bytes, insn, DecoderOptions::NONE).decode();
    let is_store = at.mnemonic() == Mnemonic::Mov
        && at.op_count() == 2
        && at.op0_kind() == OpKind::Memory
        && matches!(
            at.op1_kind(),
            OpKind::Immediate8
                | OpKind::Immediate16
                | OpKind::Immediate32
                | OpKind::Immediate32to64
                | OpKind::Immediate8to64
        );
    if !is_store {
        return None;
    }
    let bits = at.memory_size().size() * 8;
    let value = at.immediate(1);
    Some(if bits >= 64 {
        value
    } else {
        value & ((1u64 << bits) - 1)
    })
}

/// The recipe of the access right before `ip` (the last of `run`), when
/// it can be computed from the registers after it: directly, or through
/// a backward slice when it overwrote its base or index register.
fn previous_access(
    code: &[u8],
    code_ip: u64,
    ip: u64,
    run: &[Instruction],
    info: &mut InstructionInfoFactory,
) -> Option<AccessRecipe> {
    let prev = run.last()?;
    if prev.flow_control() != FlowControl::Next || is_branch_target(code, code_ip, prev.ip(), ip) {
        return None;
    }
    let r = operand(prev, info)?;
    let r = if writes_address_registers(prev, info) {
        slice::slice(run, run.len() - 1, r.size, r.flags)?
    } else {
        r
    };
    Some(stored_back(code, code_ip, run, r))
}

/// Marks a read as a write too ([`recipe::STORED_BACK`]) when the
/// straight-line code after it stores to the same address (compared
/// symbolically: the base may be reloaded from the same slot in
/// between). `run` ends with the load.
fn stored_back(code: &[u8], code_ip: u64, run: &[Instruction], r: AccessRecipe) -> AccessRecipe {
    if r.flags & (recipe::READ | recipe::WRITE) != recipe::READ {
        return r;
    }
    let Some(load) = run.last() else {
        return r;
    };
    let after = straight_after(code, code_ip, load.next_ip());
    // Only a store with the same displacement and size can be one.
    let candidate = after.iter().any(|i| {
        i.op0_kind() == OpKind::Memory
            && i.memory_displacement64() == load.memory_displacement64()
            && i.memory_size() == load.memory_size()
    });
    if !candidate {
        return r;
    }
    let mut all = run.to_vec();
    all.extend(after);
    if slice::stored_back(&all, run.len() - 1) {
        return AccessRecipe {
            flags: r.flags | recipe::WRITE | recipe::STORED_BACK,
            ..r
        };
    }
    r
}

/// Up to [`RUN_AHEAD`] instructions from `from` to the first that leaves
/// the straight line (included: the evaluation stops on it).
fn straight_after(code: &[u8], code_ip: u64, from: u64) -> Vec<Instruction> {
    // The decoder's addresses wrap at the top of the address space.
    let Some(bytes) = from
        .checked_sub(code_ip)
        .and_then(|start| code.get(usize::try_from(start).ok()?..))
    else {
        return Vec::new();
    };
    let mut d = Decoder::with_ip(64, bytes, from, DecoderOptions::NONE);
    let mut v = Vec::new();
    while d.can_decode() && v.len() < RUN_AHEAD {
        let insn = d.decode();
        if insn.is_invalid() {
            break;
        }
        let next = insn.flow_control() == FlowControl::Next;
        v.push(insn);
        if !next {
            break;
        }
    }
    v
}

/// The straight-line instructions that end exactly at `ip`, oldest first:
/// back to the first branch target or the instruction after a jump or
/// call, at most [`RUN_BEHIND`]. Instruction boundaries going backwards
/// are found by decoding from every start in the window and taking, at
/// each step, the predecessor most chains agree on (x86 decoding
/// resynchronises within a few instructions).
pub(super) fn run_before(code: &[u8], code_ip: u64, ip: u64) -> Vec<Instruction> {
    straight_tail(code, code_ip, ip, decoded_before(code, code_ip, ip))
}

/// The instructions in the [`LOOK_BEHIND`] window that end at `ip`,
/// jumps and join points included.
pub(super) fn decoded_before(code: &[u8], code_ip: u64, ip: u64) -> Vec<Instruction> {
    let Some(end) = ip
        .checked_sub(code_ip)
        .and_then(|e| usize::try_from(e).ok())
    else {
        return Vec::new();
    };
    if end > code.len() {
        return Vec::new();
    }
    let from = end.saturating_sub(LOOK_BEHIND as usize);
    // Votes for the instruction before each boundary, from chains started
    // at the window's first bytes (each covers the whole window once in
    // sync) and at its last ones (the instructions right before the IP
    // get votes even when the window starts in data).
    let starts = (from..end.min(from + SYNC_STARTS))
        .chain(end.saturating_sub(SYNC_STARTS).max(from + SYNC_STARTS)..end);
    let mut before: HashMap<u64, Vec<(Instruction, u32)>> = HashMap::new();
    for start in starts {
        let mut d = Decoder::with_ip(
            64,
            &code[start..end],
            code_ip + start as u64,
            DecoderOptions::NONE,
        );
        let mut chain = Vec::new();
        while d.can_decode() {
            let insn = d.decode();
            if insn.is_invalid() {
                chain.clear();
                break;
            }
            chain.push(insn);
        }
        if chain.last().is_none_or(|i| i.next_ip() != ip) {
            continue;
        }
        for insn in chain {
            let votes = before.entry(insn.next_ip()).or_default();
            match votes.iter_mut().find(|(i, _)| i.ip() == insn.ip()) {
                Some((_, n)) => *n += 1,
                None => votes.push((insn, 1)),
            }
        }
    }
    let mut run = Vec::new();
    let mut at = ip;
    // Most votes; on a tie the longer instruction (its chain started
    // earlier in the window, the better-synchronised one).
    while let Some((insn, _)) = before
        .get(&at)
        .and_then(|v| v.iter().max_by_key(|(i, n)| (*n, i.len())))
    {
        run.push(*insn);
        at = insn.ip();
    }
    run.reverse();
    run
}

/// The part of `run` after its last jump or call and from its last branch
/// target on (a join point: the values before it may come from elsewhere).
fn straight_tail(
    code: &[u8],
    code_ip: u64,
    ip: u64,
    mut run: Vec<Instruction>,
) -> Vec<Instruction> {
    if let Some(first) = run.first() {
        let targets = branch_targets(code, code_ip, first.ip(), ip);
        if let Some(i) = run.iter().rposition(|i| targets.contains(&i.ip())) {
            run.drain(..i);
        }
    }
    if let Some(i) = run[..run.len().saturating_sub(1)]
        .iter()
        .rposition(|i| i.flow_control() != FlowControl::Next)
    {
        run.drain(..=i);
    }
    let keep = run.len().saturating_sub(RUN_BEHIND);
    run.drain(..keep);
    run
}

/// Targets of the near jumps decoded from `sync` (an instruction boundary)
/// to the end of the window after `ip`, and where decoding lost sync.
fn jumps_from(code: &[u8], code_ip: u64, sync: u64, ip: u64) -> (HashSet<u64>, Option<u64>) {
    let start = (sync - code_ip) as usize;
    let end = code
        .len()
        .min((ip - code_ip + LOOK_AHEAD) as usize)
        .max(start);
    let mut d = Decoder::with_ip(64, &code[start..end], sync, DecoderOptions::NONE);
    let mut targets = HashSet::new();
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_invalid() {
            return (targets, Some(insn.ip()));
        }
        let jumps = matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && matches!(insn.op0_kind(), OpKind::NearBranch64);
        if jumps {
            targets.insert(insn.near_branch_target());
        }
    }
    (targets, None)
}

fn branch_targets(code: &[u8], code_ip: u64, sync: u64, ip: u64) -> HashSet<u64> {
    jumps_from(code, code_ip, sync, ip).0
}

/// Whether a jump in the window (decoded on from `sync`, an instruction
/// boundary) lands on `ip`; conservatively yes when decoding lost sync
/// before it.
fn is_branch_target(code: &[u8], code_ip: u64, sync: u64, ip: u64) -> bool {
    let (targets, lost) = jumps_from(code, code_ip, sync, ip);
    targets.contains(&ip) || lost.is_some_and(|at| at <= ip)
}

/// Whether `insn` writes a register its memory operand is computed from.
fn writes_address_registers(insn: &Instruction, info: &mut InstructionInfoFactory) -> bool {
    writes_registers(insn, [insn.memory_base(), insn.memory_index()], info)
}

/// Whether `insn` writes any of `regs` (or a part of one).
fn writes_registers(
    insn: &Instruction,
    address: [Register; 2],
    info: &mut InstructionInfoFactory,
) -> bool {
    info.info(insn).used_registers().iter().any(|u| {
        matches!(
            u.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        ) && address
            .iter()
            .any(|&a| a != Register::None && a.full_register() == u.register().full_register())
    })
}

/// The recipe of `insn`'s explicit memory operand, if it has a usable one.
fn operand(insn: &Instruction, info: &mut InstructionInfoFactory) -> Option<AccessRecipe> {
    (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory)?;
    if matches!(
        insn.mnemonic(),
        Mnemonic::Lea
            | Mnemonic::Nop
            | Mnemonic::Prefetch
            | Mnemonic::Prefetchnta
            | Mnemonic::Prefetcht0
            | Mnemonic::Prefetcht1
            | Mnemonic::Prefetcht2
            | Mnemonic::Prefetchw
            | Mnemonic::Clflush
            | Mnemonic::Clflushopt
    ) {
        return None;
    }
    // fs/gs: thread-local storage, whose base the sample does not carry.
    if matches!(insn.segment_prefix(), Register::FS | Register::GS) {
        return None;
    }
    let (base, disp) = match insn.memory_base() {
        Register::RIP | Register::EIP => (reg::NONE, insn.memory_displacement64() as i64),
        Register::None => (reg::NONE, insn.memory_displacement64() as i64),
        r => (gpr(r)?, insn.memory_displacement64() as i64),
    };
    let index = match insn.memory_index() {
        Register::None => reg::NONE,
        r => gpr(r)?,
    };
    let used = info.info(insn).used_memory().first().copied()?;
    let flags = match used.access() {
        OpAccess::Read | OpAccess::CondRead => recipe::READ,
        OpAccess::Write | OpAccess::CondWrite => recipe::WRITE,
        OpAccess::ReadWrite | OpAccess::ReadCondWrite => recipe::READ | recipe::WRITE,
        _ => return None,
    };
    let flags = match insn.flow_control() {
        FlowControl::IndirectBranch | FlowControl::IndirectCall => flags | recipe::BRANCH,
        _ => flags,
    };
    let size = insn.memory_size().size().clamp(1, 64) as u8;
    Some(AccessRecipe::plain(
        base,
        index,
        insn.memory_index_scale() as u8,
        disp,
        size,
        flags,
    ))
}

/// Our number of a 64-bit general-purpose register (32-bit addressing
/// uses the low half of the same register).
pub(super) fn gpr(r: Register) -> Option<u8> {
    let full = r.full_register();
    let n = match full {
        Register::RAX => reg::RAX,
        Register::RCX => reg::RCX,
        Register::RDX => reg::RDX,
        Register::RBX => reg::RBX,
        Register::RSP => reg::RSP,
        Register::RBP => reg::RBP,
        Register::RSI => reg::RSI,
        Register::RDI => reg::RDI,
        _ if (Register::R8..=Register::R15).contains(&full) => {
            reg::R8 + (full as u8 - Register::R8 as u8)
        }
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x40_1000;

    /// `addq $1,(%rdi); add $1,%rax; cmp %rdx,%rax; jg <loop>`.
    const LOOP: [u8; 13] = [
        0x48, 0x83, 0x07, 0x01, // 0: add qword [rdi], 1
        0x48, 0x83, 0xc0, 0x01, // 4: add rax, 1
        0x48, 0x39, 0xd0, // 8: cmp rax, rdx
        0x7f, 0xf3, // 11: jg 0
    ];

    /// Padding so that the window before the code decodes as something.
    fn with_padding(code: &[u8]) -> (Vec<u8>, u64) {
        let mut v = vec![0x90u8; 32];
        v.extend_from_slice(code);
        v.extend_from_slice(&[0xc3; 4]);
        (v, BASE - 32)
    }

    #[test]
    fn a_sample_after_a_store_describes_the_store() {
        let (code, at) = with_padding(&LOOP);
        let d = decode(&code, at, BASE + 4, false);
        assert_eq!(d.insn, BASE);
        assert_eq!(d.recipe.base, reg::RDI);
        assert_eq!(d.recipe.index, reg::NONE);
        assert_eq!(d.recipe.size, 8);
        assert_eq!(
            d.recipe.flags,
            recipe::READ | recipe::WRITE | recipe::PREVIOUS
        );
    }

    #[test]
    fn a_sample_on_a_loop_head_describes_the_instruction_itself() {
        let (code, at) = with_padding(&LOOP);
        let d = decode(&code, at, BASE, false);
        assert_eq!(d.insn, BASE, "the jg lands here: no skid assumed");
        assert_eq!(d.recipe.flags, recipe::READ | recipe::WRITE);
    }

    #[test]
    fn instructions_without_memory_operands_say_so() {
        let (code, at) = with_padding(&LOOP);
        let d = decode(&code, at, BASE + 8, false);
        assert_eq!(d.recipe.flags, recipe::NO_OPERAND);
        assert_eq!(d.recipe.address(&[0; reg::COUNT]), None);
    }

    #[test]
    fn a_previous_instruction_that_overwrote_its_base_is_not_used() {
        // mov rdi, [rdi]; mov [rsi+8], eax
        let (code, at) = with_padding(&[0x48, 0x8b, 0x3f, 0x89, 0x46, 0x08, 0xc3]);
        let d = decode(&code, at, BASE + 3, false);
        assert_eq!(d.insn, BASE + 3, "falls back to the instruction at the IP");
        assert_eq!((d.recipe.base, d.recipe.disp), (reg::RSI, 8));
        assert_eq!((d.recipe.flags, d.recipe.size), (recipe::WRITE, 4));
    }

    #[test]
    fn rip_relative_operands_become_absolute() {
        // mov eax, [rip+0x10]; nop
        let (code, at) = with_padding(&[0x8b, 0x05, 0x10, 0, 0, 0, 0x90]);
        let d = decode(&code, at, BASE + 6, false);
        assert_eq!(d.insn, BASE);
        assert_eq!(d.recipe.base, reg::NONE);
        assert_eq!(d.recipe.disp as u64, BASE + 6 + 0x10);
        assert_eq!(d.recipe.address(&[0; reg::COUNT]), Some(BASE + 0x16));
    }

    #[test]
    fn indexed_and_locked_operands() {
        // lock xadd [rdi], rax; mov [rdx+rcx*4], eax; nop
        let (code, at) = with_padding(&[0xf0, 0x48, 0x0f, 0xc1, 0x07, 0x89, 0x04, 0x8a, 0x90]);
        let d = decode(&code, at, BASE + 5, false);
        assert_eq!(d.insn, BASE, "xadd writes rax, not its address register");
        assert_eq!(
            d.recipe.flags,
            recipe::READ | recipe::WRITE | recipe::PREVIOUS
        );
        let d = decode(&code, at, BASE + 8, false);
        assert_eq!(d.insn, BASE + 5);
        assert_eq!(
            (d.recipe.base, d.recipe.index, d.recipe.scale),
            (reg::RDX, reg::RCX, 4)
        );
        let mut regs = [0; reg::COUNT];
        regs[reg::RDX as usize] = 0x1000;
        regs[reg::RCX as usize] = 3;
        assert_eq!(d.recipe.address(&regs), Some(0x100c));
    }

    #[test]
    fn tls_lea_and_calls_are_not_accesses_we_can_place() {
        // mov rax, fs:[0x28]; nop
        let (code, at) = with_padding(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0, 0x90]);
        assert_eq!(
            decode(&code, at, BASE + 9, false).recipe,
            AccessRecipe::none()
        );
        // lea rax, [rdi+8]; nop
        let (code, at) = with_padding(&[0x48, 0x8d, 0x47, 0x08, 0x90]);
        assert_eq!(
            decode(&code, at, BASE + 4, false).recipe,
            AccessRecipe::none()
        );
        // call [rax+8]; nop: the callee ran in between, registers are not
        // the call's; the nop has no operand.
        let (code, at) = with_padding(&[0xff, 0x50, 0x08, 0x90]);
        assert_eq!(
            decode(&code, at, BASE + 3, false).recipe,
            AccessRecipe::none()
        );
    }

    #[test]
    fn a_jump_through_memory_reads_a_code_pointer() {
        // jmp [rip+0x10] (a PLT stub), sampled on the jump itself.
        let (code, at) = with_padding(&[0xff, 0x25, 0x10, 0, 0, 0]);
        let d = decode(&code, at, BASE, false);
        assert_eq!(d.recipe.flags, recipe::READ | recipe::BRANCH);
        assert_eq!(d.recipe.address(&[0; reg::COUNT]), Some(BASE + 6 + 0x10));
        // A data load is not.
        let (code, at) = with_padding(&[0x8b, 0x05, 0x10, 0, 0, 0, 0x90]);
        assert_eq!(decode(&code, at, BASE, false).recipe.flags, recipe::READ);
    }

    #[test]
    fn stores_of_constants_give_their_value() {
        // movl $1, [rip+0x10]; nop: sampled after it (skid) and on it.
        let (code, at) = with_padding(&[0xc7, 0x05, 0x10, 0, 0, 0, 1, 0, 0, 0, 0x90]);
        assert_eq!(stored_constant(&code, at, BASE + 10, false), Some(1));
        assert_eq!(stored_constant(&code, at, BASE, false), Some(1));
        // movq $-1, [rdi] (sign-extended to 64 bits).
        let (code, at) = with_padding(&[0x48, 0xc7, 0x07, 0xff, 0xff, 0xff, 0xff, 0x90]);
        assert_eq!(stored_constant(&code, at, BASE + 7, false), Some(u64::MAX));
        // mov [rdi], rax: a register's value, not a constant.
        let (code, at) = with_padding(&[0x48, 0x89, 0x07, 0x90]);
        assert_eq!(stored_constant(&code, at, BASE + 3, false), None);
        // movl $1, [rip+0x10]; mov [rdi], rax: a precise sample of the
        // second store is that store, not the constant before it.
        let store = [0xc7, 0x05, 0x10, 0, 0, 0, 1, 0, 0, 0, 0x48, 0x89, 0x07];
        let (code, at) = with_padding(&store);
        assert_eq!(stored_constant(&code, at, BASE + 10, true), None);
        assert_eq!(stored_constant(&code, at, BASE + 10, false), Some(1));
    }

    #[test]
    fn a_load_stored_back_counts_as_a_write() {
        // mov rax, [rsi+rcx*8]; add rax, 1; mov [rsi+rcx*8], rax; sub edx, 1
        let rmw = [
            0x48, 0x8b, 0x04, 0xce, 0x48, 0x83, 0xc0, 0x01, 0x48, 0x89, 0x04, 0xce, 0x83, 0xea,
            0x01,
        ];
        let (code, at) = with_padding(&rmw);
        let d = decode(&code, at, BASE + 4, false);
        assert_eq!(d.insn, BASE);
        assert_eq!(
            d.recipe.flags,
            recipe::READ | recipe::WRITE | recipe::STORED_BACK | recipe::PREVIOUS
        );
        // The store itself, sampled after it.
        let d = decode(&code, at, BASE + 12, false);
        assert_eq!(d.insn, BASE + 8);
        assert_eq!(d.recipe.flags, recipe::WRITE | recipe::PREVIOUS);
        // A store elsewhere, or after the index changed, is not the same.
        let other = [
            0x48, 0x8b, 0x04, 0xce, 0x48, 0xff, 0xc1, 0x48, 0x89, 0x04, 0xce, 0x90,
        ]; // mov rax,[rsi+rcx*8]; inc rcx; mov [rsi+rcx*8], rax
        let (code, at) = with_padding(&other);
        let d = decode(&code, at, BASE + 4, false);
        assert_eq!(d.recipe.flags, recipe::READ | recipe::PREVIOUS);
    }

    #[test]
    fn precise_samples_describe_their_own_instruction() {
        let (code, at) = with_padding(&LOOP);
        let d = decode(&code, at, BASE + 4, true);
        assert_eq!(d.recipe, AccessRecipe::none(), "add rax, 1 has no operand");
        let d = decode(&code, at, BASE, true);
        assert_eq!(d.recipe.flags, recipe::READ | recipe::WRITE);
    }

    /// Found by fuzzing: a load in the last bytes of the address space
    /// (its next IP wraps to 0) made the store-back search underflow.
    #[test]
    fn code_at_the_top_of_the_address_space() {
        // mov rax, [rdi]
        let code = [0x48, 0x8b, 0x07];
        let at = u64::MAX - 2;
        let d = decode(&code, at, at, true);
        assert_eq!((d.recipe.base, d.recipe.flags), (reg::RDI, recipe::READ));
    }

    #[test]
    fn bad_input_gives_no_recipe() {
        assert_eq!(decode(&[], BASE, BASE, false).recipe, AccessRecipe::none());
        assert_eq!(
            decode(&[0x90], BASE, BASE - 1, false).recipe,
            AccessRecipe::none()
        );
        assert_eq!(
            decode(&[0xff, 0xff], BASE, BASE, false).recipe,
            AccessRecipe::none()
        );
    }
}
