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

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};
use memprof_common::sharing::{recipe, reg, AccessRecipe};

/// Bytes before the IP decoded to find the instruction before it.
pub const LOOK_BEHIND: u64 = 64;
/// Bytes after the IP decoded to find branches back to it (loop heads).
pub const LOOK_AHEAD: u64 = 192;
/// Instructions after a load searched for the store back to its operand.
const STORE_BACK_WINDOW: usize = 6;

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
    if !precise {
        if let Some(prev) = previous_instruction(code, code_ip, ip) {
            let usable = prev.flow_control() == FlowControl::Next
                && !is_branch_target(code, code_ip, prev.ip(), ip)
                && !writes_address_registers(&prev, &mut info);
            if let Some(r) = usable.then(|| operand(&prev, &mut info)).flatten() {
                let r = stored_back(code, code_ip, &prev, r, &mut info);
                return Decoded {
                    recipe: AccessRecipe {
                        flags: r.flags | recipe::PREVIOUS,
                        ..r
                    },
                    insn: prev.ip(),
                };
            }
        }
    }
    match operand(&at, &mut info) {
        Some(r) => Decoded {
            recipe: stored_back(code, code_ip, &at, r, &mut info),
            insn: ip,
        },
        None => Decoded::none(ip),
    }
}

/// Marks a read as a write too ([`recipe::STORED_BACK`]) when a store to
/// the very same operand follows within a few instructions, with no
/// branch and no change to the address registers between.
fn stored_back(
    code: &[u8],
    code_ip: u64,
    load: &Instruction,
    r: AccessRecipe,
    info: &mut InstructionInfoFactory,
) -> AccessRecipe {
    if r.flags != recipe::READ {
        return r;
    }
    // The decoder's addresses wrap at the top of the address space.
    let Some(bytes) = load
        .next_ip()
        .checked_sub(code_ip)
        .and_then(|start| code.get(usize::try_from(start).ok()?..))
    else {
        return r;
    };
    let mut d = Decoder::with_ip(64, bytes, load.next_ip(), DecoderOptions::NONE);
    for _ in 0..STORE_BACK_WINDOW {
        if !d.can_decode() {
            break;
        }
        let insn = d.decode();
        if insn.is_invalid() || insn.flow_control() != FlowControl::Next {
            break;
        }
        if let Some(other) = operand(&insn, info) {
            let same = (other.base, other.index, other.scale, other.disp)
                == (r.base, r.index, r.scale, r.disp)
                && insn.segment_prefix() == load.segment_prefix();
            if same && other.is_write() {
                return AccessRecipe {
                    flags: r.flags | recipe::WRITE | recipe::STORED_BACK,
                    ..r
                };
            }
        }
        if writes_registers(&insn, [load.memory_base(), load.memory_index()], info) {
            break;
        }
    }
    r
}

/// The instruction that ends exactly at `ip`, found by decoding from every
/// start in the look-behind window and taking the answer most chains agree
/// on (x86 decoding resynchronises within a few instructions).
fn previous_instruction(code: &[u8], code_ip: u64, ip: u64) -> Option<Instruction> {
    let end = usize::try_from(ip - code_ip).ok()?;
    let from = end.saturating_sub(LOOK_BEHIND as usize);
    let mut votes: Vec<(Instruction, u32)> = Vec::new();
    for start in from..end {
        let mut d = Decoder::with_ip(
            64,
            &code[start..end],
            code_ip + start as u64,
            DecoderOptions::NONE,
        );
        let mut last = None;
        while d.can_decode() {
            let insn = d.decode();
            if insn.is_invalid() {
                last = None;
                break;
            }
            last = Some(insn);
        }
        let Some(last) = last.filter(|i| i.next_ip() == ip) else {
            continue;
        };
        match votes.iter_mut().find(|(i, _)| i.ip() == last.ip()) {
            Some((_, n)) => *n += 1,
            None => votes.push((last, 1)),
        }
    }
    // Most votes; on a tie the longer instruction (its chain started
    // earlier in the window, the better-synchronised one).
    votes
        .into_iter()
        .max_by_key(|(i, n)| (*n, i.len()))
        .map(|(i, _)| i)
}

/// Whether a jump in the window (decoded on from `sync`, an instruction
/// boundary) lands on `ip`.
fn is_branch_target(code: &[u8], code_ip: u64, sync: u64, ip: u64) -> bool {
    let start = (sync - code_ip) as usize;
    let end = code
        .len()
        .min((ip - code_ip + LOOK_AHEAD) as usize)
        .max(start);
    let mut d = Decoder::with_ip(64, &code[start..end], sync, DecoderOptions::NONE);
    while d.can_decode() {
        let insn = d.decode();
        if insn.is_invalid() {
            // Lost sync: be conservative.
            return insn.ip() <= ip;
        }
        let jumps = matches!(
            insn.flow_control(),
            FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
        ) && matches!(insn.op0_kind(), OpKind::NearBranch64);
        if jumps && insn.near_branch_target() == ip {
            return true;
        }
    }
    false
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
    let size = insn.memory_size().size().clamp(1, 64) as u8;
    Some(AccessRecipe {
        disp,
        base,
        index,
        scale: insn.memory_index_scale() as u8,
        size,
        flags,
    })
}

/// Our number of a 64-bit general-purpose register (32-bit addressing
/// uses the low half of the same register).
fn gpr(r: Register) -> Option<u8> {
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
