//! Where in a function to put its uprobe.
//!
//! On x86-64 the kernel *emulates* a probed `push` (and jumps, calls and
//! nops), but single-steps every other instruction out of line, which takes
//! a second trap: about 3.3 µs more per call here (measured: glibc `free`
//! starts with `test %rdi,%rdi` and cost 4.9 µs probed at its entry, 0.84 µs
//! probed at its first `push`, 9 bytes in). So we decode the first few
//! instructions and move the probe to the first `push` when everything
//! before it is harmless:
//!
//! - it writes no memory, and no register our programs read at entry (the
//!   stack pointer, whose top is the return address, and the argument
//!   registers);
//! - it does not transfer control, except a conditional branch to a bare
//!   `ret` (an early exit such as `free(NULL)`, where nothing is allocated
//!   or freed and missing the call loses nothing).
//!
//! Otherwise the probe stays at the entry.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

/// How many instructions to look at before giving up.
const MAX_INSTRUCTIONS: usize = 8;

/// Registers a probe at entry reads: the stack pointer and the integer
/// argument registers of the System V ABI.
const ENTRY_REGISTERS: [Register; 7] = [
    Register::RSP,
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::R8,
    Register::R9,
];

/// The offset from the function start at which to probe it, given the
/// function's first bytes `code` (from its file offset; reading past the
/// function's end is harmless, decoding stops earlier).
pub fn probe_offset(code: &[u8]) -> u64 {
    probe_site(code).0
}

/// As [`probe_offset`], and whether the kernel emulates the instruction
/// there (one trap per hit instead of two).
pub fn probe_site(code: &[u8]) -> (u64, bool) {
    const IP: u64 = 0x1000; // any base: only differences matter
    let mut decoder = Decoder::with_ip(64, code, IP, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        if is_register_push(&insn) {
            return (insn.ip() - IP, true);
        }
        match insn.flow_control() {
            FlowControl::Next => {}
            FlowControl::ConditionalBranch
                if branches_to_ret(code, IP, insn.near_branch_target()) => {}
            _ => break,
        }
        if insn.mnemonic() == Mnemonic::Endbr64 || insn.mnemonic() == Mnemonic::Nop {
            continue;
        }
        let used = info.info(&insn);
        let writes_memory = used
            .used_memory()
            .iter()
            .any(|m| m.access() != OpAccess::Read && m.access() != OpAccess::NoMemAccess);
        let writes_entry_register = used.used_registers().iter().any(|r| {
            matches!(
                r.access(),
                OpAccess::Write
                    | OpAccess::CondWrite
                    | OpAccess::ReadWrite
                    | OpAccess::ReadCondWrite
            ) && ENTRY_REGISTERS.contains(&r.register().full_register())
        });
        if writes_memory || writes_entry_register {
            break;
        }
    }
    (0, false)
}

/// `push reg` (what the kernel emulates), not `push imm` or `push [mem]`.
fn is_register_push(insn: &Instruction) -> bool {
    insn.mnemonic() == Mnemonic::Push
        && insn.op_count() == 1
        && insn.op0_kind() == OpKind::Register
        && matches!(insn.code(), Code::Push_r64 | Code::Push_r16)
}

/// Whether the instruction at `target` is a plain `ret`.
fn branches_to_ret(code: &[u8], base: u64, target: u64) -> bool {
    let Some(at) = target
        .checked_sub(base)
        .and_then(|o| usize::try_from(o).ok())
    else {
        return false;
    };
    let Some(bytes) = code.get(at..) else {
        return false;
    };
    let mut decoder = Decoder::with_ip(64, bytes, target, DecoderOptions::NONE);
    decoder.can_decode() && decoder.decode().flow_control() == FlowControl::Return
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leading_push_is_probed_in_place() {
        // push %r12; mov %rdi,%rbx
        assert_eq!(probe_offset(&[0x41, 0x54, 0x48, 0x89, 0xfb]), 0);
    }

    #[test]
    fn glibc_free_is_probed_at_its_first_push() {
        // test %rdi,%rdi; je +N (→ ret); push %rbp; lea -0x10(%rdi),%rsi
        let mut code = vec![0x48, 0x85, 0xff, 0x0f, 0x84, 0x0b, 0, 0, 0, 0x55];
        code.extend([
            0x48, 0x8d, 0x77, 0xf0, 0x53, 0x90, 0x90, 0x90, 0x90, 0x90, 0xc3,
        ]);
        // The je at offset 3 is 6 bytes long: target = 9 + 0x0b = 20 (ret).
        assert_eq!(code[20], 0xc3);
        assert_eq!(probe_offset(&code), 9);
    }

    #[test]
    fn a_branch_to_real_work_keeps_the_probe_at_entry() {
        // test %rdi,%rdi; je → mov (not ret); push %rbp
        let code = [0x48, 0x85, 0xff, 0x74, 0x01, 0x55, 0x48, 0x89, 0xc0, 0xc3];
        assert_eq!(probe_offset(&code), 0);
    }

    #[test]
    fn clobbering_an_argument_or_the_stack_keeps_the_probe_at_entry() {
        // mov %rsi,%rdi; push %rbp
        assert_eq!(probe_offset(&[0x48, 0x89, 0xf7, 0x55]), 0);
        // sub $8,%rsp; push %rbp
        assert_eq!(probe_offset(&[0x48, 0x83, 0xec, 0x08, 0x55]), 0);
        // mov %rdi,(%rax); push %rbp (a memory write)
        assert_eq!(probe_offset(&[0x48, 0x89, 0x38, 0x55]), 0);
    }

    #[test]
    fn harmless_moves_are_skipped() {
        // mov 0x10(%rip),%rax; test %rax,%rax; push %rbx
        let code = [0x48, 0x8b, 0x05, 0x10, 0, 0, 0, 0x48, 0x85, 0xc0, 0x53];
        assert_eq!(probe_offset(&code), 10);
    }

    #[test]
    fn no_push_means_entry() {
        // jemalloc-style fast path: cmp $0x1000,%rdi; ja ...; lea ...
        let code = [0x48, 0x81, 0xff, 0, 0x10, 0, 0, 0x77, 0x10, 0x90, 0x90];
        assert_eq!(probe_offset(&code), 0);
        assert_eq!(probe_offset(&[]), 0);
        assert_eq!(probe_offset(&[0x0f, 0x0b]), 0); // ud2
    }
}
