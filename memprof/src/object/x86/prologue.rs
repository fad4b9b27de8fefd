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
//! A function without an early `push` (jemalloc's fast paths: `cmp
//! $0x1000,%rdi; ja slow`) is probed at its first conditional branch to
//! real work instead, which the kernel emulates too, when nothing else in
//! the function branches there: every call passes it exactly once, with
//! its arguments and stack untouched. What a traced call costs the
//! program, single-stepped against emulated, calibrated side by side at
//! start: 8.4-9.0 µs against 3.7-4.0 (jemalloc), 7.8 against 3.5
//! (tcmalloc); jemalloc's `malloc`, `free`, `sdallocx` and `operator new`
//! and tcmalloc's `malloc` were all single-stepped before.
//!
//! Otherwise the probe stays at the entry.

use iced_x86::{
    Code, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic,
    OpAccess, OpKind, Register,
};

/// How many instructions to look at before giving up (jemalloc's `free`
/// reaches its first branch at the tenth).
const MAX_INSTRUCTIONS: usize = 12;

/// The offset from the function start at which to probe a function that
/// reads only `reads` at entry, given its first bytes `code` (from its
/// file offset; reading past the function's end is harmless, decoding
/// stops earlier), and whether the kernel emulates the instruction there
/// (one trap per hit instead of two).
pub fn probe_site(code: &[u8], reads: &[Register]) -> (u64, bool) {
    let (sites, emulated) = scan(code, reads, false);
    (sites.first().copied().unwrap_or(0), emulated)
}

/// Where to probe a function that reads only `reads` at entry, allowing
/// several sites: a conditional branch early in the function to a tail
/// jump (glibc's `pthread_mutex_lock` sends other mutex kinds to
/// `__pthread_mutex_lock_full` before its first `push`) is probed at that
/// jump, the fall-through path further on. Each call passes exactly one
/// of the sites, with the stack pointer still at the return address.
/// Returns the sites (offsets from the function start) and whether the
/// kernel emulates all of them; `([0], false)` when no better site exists.
pub fn probe_sites(code: &[u8], reads: &[Register]) -> (Vec<u64>, bool) {
    scan(code, reads, true)
}

fn scan(code: &[u8], reads: &[Register], side_exits: bool) -> (Vec<u64>, bool) {
    const IP: u64 = 0x1000; // any base: only differences matter
    let mut decoder = Decoder::with_ip(64, code, IP, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut insn = Instruction::default();
    let mut sites = Vec::new();
    for _ in 0..MAX_INSTRUCTIONS {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut insn);
        if insn.is_invalid() {
            break;
        }
        if is_register_push(&insn) || is_near_jump(&insn) {
            sites.push(insn.ip() - IP);
            return (sites, true);
        }
        match insn.flow_control() {
            FlowControl::Next => {}
            FlowControl::ConditionalBranch
                if branches_to_ret(code, IP, insn.near_branch_target()) => {}
            FlowControl::ConditionalBranch if side_exits => {
                let target = insn.near_branch_target();
                if !is_lone_tail_jump(code, IP, target, insn.ip()) {
                    break;
                }
                sites.push(target - IP);
            }
            // Both ways are real work: probe the branch itself.
            FlowControl::ConditionalBranch if !branched_to(code, IP, insn.ip(), None) => {
                return (vec![insn.ip() - IP], true);
            }
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
            ) && reads.contains(&r.register().full_register())
        });
        if writes_memory || writes_entry_register {
            break;
        }
    }
    (vec![0], false)
}

/// `jmp rel` (emulated by the kernel).
fn is_near_jump(insn: &Instruction) -> bool {
    matches!(insn.code(), Code::Jmp_rel32_64 | Code::Jmp_rel8_64)
}

/// Whether the instruction at `target` is a `jmp rel` that no instruction
/// of the function other than the one at `from` branches to (decoding
/// linearly through `code`): probed there, it sees only the calls that
/// took that branch.
fn is_lone_tail_jump(code: &[u8], base: u64, target: u64, from: u64) -> bool {
    if !decode_at(code, base, target).is_some_and(|i| is_near_jump(&i)) {
        return false;
    }
    if branched_to(code, base, target, Some(from)) {
        return false;
    }
    let mut reached = false;
    for insn in Decoder::with_ip(64, code, base, DecoderOptions::NONE) {
        if insn.ip() == target {
            reached = true; // the linear decode stays in step with it
        }
        // Falling through into the jump also reaches it (but not from
        // padding, which follows a jump or return).
        if insn.next_ip() == target
            && insn.flow_control() == FlowControl::Next
            && insn.mnemonic() != Mnemonic::Nop
        {
            return false;
        }
    }
    reached
}

/// Whether an instruction of `code` (decoded linearly from `base`) other
/// than the one at `except` jumps or branches to `target`.
fn branched_to(code: &[u8], base: u64, target: u64, except: Option<u64>) -> bool {
    Decoder::with_ip(64, code, base, DecoderOptions::NONE)
        .into_iter()
        .any(|insn| {
            let branch = matches!(
                insn.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            );
            branch && Some(insn.ip()) != except && insn.near_branch_target() == target
        })
}

/// How many bytes of a function are read to place its probes: enough for
/// the instructions scanned and the side exits followed.
pub const CODE_BYTES: usize = 1024;

/// Up to [`CODE_BYTES`] of a function's code at `offset` in the object
/// file `path` (fewer at the end of the file): what the probe sites are
/// decided from.
pub fn read_code(path: &str, offset: u64) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(crate::process::objects::open_path(path))?;
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0; CODE_BYTES];
    let n = file.read(&mut buf)?;
    buf.truncate(n);
    Ok(buf)
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
    decode_at(code, base, target).is_some_and(|i| i.flow_control() == FlowControl::Return)
}

/// The instruction at address `target` of `code` (which starts at `base`).
fn decode_at(code: &[u8], base: u64, target: u64) -> Option<Instruction> {
    let at = usize::try_from(target.checked_sub(base)?).ok()?;
    let mut decoder = Decoder::with_ip(64, code.get(at..)?, target, DecoderOptions::NONE);
    decoder.can_decode().then(|| decoder.decode())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the allocator's malloc probe reads: the stack, its frame
    /// pointer and the size.
    const MALLOC_READS: [Register; 3] = [Register::RSP, Register::RBP, Register::RDI];

    fn probe_offset(code: &[u8]) -> u64 {
        probe_site(code, &MALLOC_READS).0
    }

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
    fn a_branch_to_real_work_comes_before_the_push() {
        // test %rdi,%rdi; je → mov (not ret); push %rbp: both ways lead to
        // work, and every call passes the branch.
        let code = [0x48, 0x85, 0xff, 0x74, 0x01, 0x55, 0x48, 0x89, 0xc0, 0xc3];
        assert_eq!(probe_site(&code, &MALLOC_READS), (3, true));
    }

    #[test]
    fn clobbering_an_argument_or_the_stack_keeps_the_probe_at_entry() {
        // mov %rsi,%rdi; push %rbp
        assert_eq!(probe_offset(&[0x48, 0x89, 0xf7, 0x55]), 0);
        // mov %rdi,%rbp; push %rbx (the frame pointer, which the walk reads)
        assert_eq!(probe_offset(&[0x48, 0x89, 0xfd, 0x53]), 0);
        // mov %rdi,%rsi; push %rbx: fine for malloc, not for realloc.
        let code = [0x48, 0x89, 0xfe, 0x53];
        assert_eq!(probe_offset(&code), 3);
        let realloc = [Register::RSP, Register::RBP, Register::RDI, Register::RSI];
        assert_eq!(probe_site(&code, &realloc), (0, false));
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

    const LOCK_READS: [Register; 2] = [Register::RSP, Register::RDI];

    #[test]
    fn glibc_mutex_lock_gets_its_tail_jump_and_first_push() {
        // mov 0x10(%rdi),%eax; mov %eax,%edx; and $0x7c,%eax;
        // jne +N (→ jmp elsewhere); push %rbx; ...; ret; jmp rel32
        let mut code = vec![0x8b, 0x47, 0x10, 0x89, 0xc2, 0x83, 0xe0, 0x7c];
        code.extend([0x75, 0x02]); // jne +2 → offset 12
        code.extend([0x53, 0xc3]); // push %rbx (10); ret (11)
        code.extend([0xe9, 0, 1, 0, 0]); // jmp rel32 (12)
        assert_eq!(probe_sites(&code, &LOCK_READS), (vec![12, 10], true));
        // The allocator's rule (no side exits) probes the branch itself.
        assert_eq!(probe_site(&code, &MALLOC_READS), (8, true));
    }

    #[test]
    fn a_tail_jump_reached_from_elsewhere_is_not_a_site() {
        // jne +3 → 13; push %rbx (10); jmp -5 → 7?; ... both jump to 13
        let mut code = vec![0x8b, 0x47, 0x10, 0x89, 0xc2, 0x83, 0xe0, 0x7c];
        code.extend([0x75, 0x03]); // jne → 13
        code.extend([0x53, 0xeb, 0x00]); // push %rbx (10); jmp +0 → 13
        code.extend([0xe9, 0, 1, 0, 0]); // jmp rel32 (13)
        assert_eq!(probe_sites(&code, &LOCK_READS), (vec![0], false));
    }

    #[test]
    fn a_wrapper_is_probed_at_its_jump() {
        // glibc pthread_mutex_unlock: mov $1,%esi; jmp rel32
        let code = [0xbe, 1, 0, 0, 0, 0xe9, 0, 1, 0, 0];
        assert_eq!(probe_sites(&code, &LOCK_READS), (vec![5], true));
        // Reading %rsi at entry (a condvar wait's mutex) keeps it at 0.
        let reads = [Register::RSP, Register::RDI, Register::RSI];
        assert_eq!(probe_sites(&code, &reads), (vec![0], false));
    }

    #[test]
    fn a_fast_path_without_push_is_probed_at_its_branch() {
        // jemalloc's malloc: cmp $0x1000,%rdi; ja ...; lea ...
        let code = [0x48, 0x81, 0xff, 0, 0x10, 0, 0, 0x77, 0x10, 0x90, 0x90];
        assert_eq!(probe_site(&code, &MALLOC_READS), (7, true));
        // The same branch, also the target of a loop further on: at entry.
        let mut looped = code.to_vec();
        looped.extend([0x75, 0xfa]); // jne -6: from 13 back to 7
        assert_eq!(probe_site(&looped, &MALLOC_READS), (0, false));
    }

    #[test]
    fn a_tail_jump_at_entry_is_emulated() {
        // jemalloc's operator delete: jmp free@plt
        assert_eq!(
            probe_site(&[0xe9, 0xeb, 0xaf, 0xf5, 0xff], &MALLOC_READS),
            (0, true)
        );
    }

    #[test]
    fn nothing_to_stand_on_means_entry() {
        assert_eq!(probe_offset(&[]), 0);
        assert_eq!(probe_offset(&[0x0f, 0x0b]), 0); // ud2
                                                    // cmp; jmp *%rax (an indirect jump is not emulated)
        assert_eq!(probe_offset(&[0x48, 0x39, 0xc7, 0xff, 0xe0]), 0);
    }
}
