//! Allocation wrappers: whether a function returns what a call it made
//! returned (`xmalloc`, `zmalloc`, `g_malloc`, `operator new`, a
//! constructor function), read from the code after the call.
//!
//! From the return address on, every path is followed (both sides of a
//! branch, a bounded number of instructions) while the registers and
//! frame slots that hold the call's result are tracked: copies and
//! `lea` offsets of it hold it too, writes and calls (for the registers
//! a call may change) clear it. A path that reaches `ret` with it in
//! `rax` returns it. A branch taken because the result is null (`test
//! rax, rax; je`) leaves nothing held: returning null on failure does not
//! make a function a wrapper.

use iced_x86::{
    Code, ConditionCode, Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory,
    Mnemonic, OpAccess, OpKind, Register,
};

/// Instructions followed in all, and along one path.
const MAX_STEPS: usize = 512;
const MAX_PATH: usize = 96;
/// Jumps further than this leave the function (a tail call).
const MAX_JUMP: u64 = 64 << 10;

/// Registers a call leaves as they were (System V).
const CALLEE_SAVED: [Register; 6] = [
    Register::RBX,
    Register::RBP,
    Register::R12,
    Register::R13,
    Register::R14,
    Register::R15,
];

/// What holds the result on one path.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
struct Held {
    regs: Vec<Register>,
    /// Frame slots: (base register, displacement).
    slots: Vec<(Register, i64)>,
}

impl Held {
    fn has(&self, r: Register) -> bool {
        self.regs.contains(&r.full_register())
    }

    fn set(&mut self, r: Register, held: bool) {
        let r = r.full_register();
        self.regs.retain(|&x| x != r);
        if held {
            self.regs.push(r);
        }
    }

    fn set_slot(&mut self, slot: (Register, i64), held: bool) {
        self.slots.retain(|&s| s != slot);
        if held {
            self.slots.push(slot);
        }
    }

    fn is_empty(&self) -> bool {
        self.regs.is_empty() && self.slots.is_empty()
    }
}

/// Whether the function containing `code[at]`, `at` the return address
/// of a call, can return that call's result.
pub fn returns_result(code: &[u8], at: usize) -> bool {
    let Some(tail) = code.get(at..) else {
        return false;
    };
    let base = at as u64;
    let mut info = InstructionInfoFactory::new();
    let start = Held {
        regs: vec![Register::RAX],
        slots: Vec::new(),
    };
    let mut paths = vec![(base, start)];
    let mut seen = std::collections::HashSet::new();
    let mut steps = 0;
    while let Some((mut ip, mut held)) = paths.pop() {
        // The last `test`/`cmp` of a held register with zero: a branch on
        // it tells whether the result was null.
        let mut tested = false;
        for _ in 0..MAX_PATH {
            steps += 1;
            if steps > MAX_STEPS || held.is_empty() || !seen.insert((ip, held.clone())) {
                break;
            }
            let Some(bytes) = ip.checked_sub(base).and_then(|o| tail.get(o as usize..)) else {
                break;
            };
            let insn = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE).decode();
            if insn.is_invalid() {
                break;
            }
            let next = insn.next_ip();
            match insn.flow_control() {
                FlowControl::Return => {
                    if held.has(Register::RAX) {
                        return true;
                    }
                    break;
                }
                FlowControl::UnconditionalBranch if insn.op0_kind() != OpKind::Register => {
                    let target = insn.near_branch_target();
                    if target.abs_diff(ip) > MAX_JUMP || target < base {
                        break;
                    }
                    ip = target;
                    continue;
                }
                FlowControl::ConditionalBranch => {
                    let target = insn.near_branch_target();
                    let (taken, fallthrough) = on_branch(&insn, &held, tested);
                    if target >= base && target.abs_diff(ip) <= MAX_JUMP {
                        paths.push((target, taken));
                    }
                    held = fallthrough;
                    ip = next;
                    tested = false;
                    continue;
                }
                FlowControl::Call | FlowControl::IndirectCall => {
                    held.regs.retain(|r| CALLEE_SAVED.contains(r));
                }
                FlowControl::Next => step(&insn, &mut held, &mut info),
                _ => break,
            }
            tested = is_null_test(&insn, &held);
            ip = next;
        }
    }
    false
}

/// What is held on the taken and the fall-through side of a branch:
/// nothing on the side where a tested result is null.
fn on_branch(insn: &Instruction, held: &Held, tested: bool) -> (Held, Held) {
    match (tested, insn.condition_code()) {
        (true, ConditionCode::e) => (Held::default(), held.clone()),
        (true, ConditionCode::ne) => (held.clone(), Held::default()),
        _ => (held.clone(), held.clone()),
    }
}

/// `test r, r` or `cmp r, 0` on a held register.
fn is_null_test(insn: &Instruction, held: &Held) -> bool {
    let reg0 = insn.op0_kind() == OpKind::Register && held.has(insn.op0_register());
    match insn.mnemonic() {
        Mnemonic::Test => {
            reg0 && insn.op1_kind() == OpKind::Register
                && insn.op1_register() == insn.op0_register()
        }
        Mnemonic::Cmp => reg0 && insn.op1_kind() != OpKind::Register && insn.immediate(1) == 0,
        _ => false,
    }
}

/// A frame slot `[rsp/rbp + disp]` operand, if the instruction's memory
/// operand is one.
fn frame_slot(insn: &Instruction) -> Option<(Register, i64)> {
    let base = insn.memory_base();
    (matches!(base, Register::RSP | Register::RBP) && insn.memory_index() == Register::None)
        .then(|| (base, insn.memory_displacement64() as i64))
}

/// What one straight-line instruction does to what is held.
fn step(insn: &Instruction, held: &mut Held, info: &mut InstructionInfoFactory) {
    match insn.code() {
        // 64-bit register and frame-slot copies.
        Code::Mov_r64_rm64 | Code::Mov_rm64_r64 => {
            let (dst, src) = (insn.op0_kind(), insn.op1_kind());
            match (dst, src) {
                (OpKind::Register, OpKind::Register) => {
                    let h = held.has(insn.op1_register());
                    held.set(insn.op0_register(), h);
                }
                (OpKind::Memory, OpKind::Register) => {
                    if let Some(slot) = frame_slot(insn) {
                        held.set_slot(slot, held.has(insn.op1_register()));
                    }
                }
                (OpKind::Register, OpKind::Memory) => {
                    let h = frame_slot(insn).is_some_and(|s| held.slots.contains(&s));
                    held.set(insn.op0_register(), h);
                }
                _ => {}
            }
            return;
        }
        // The result plus a header's size, in place (`add rax, 64`): the
        // register still points into the block.
        Code::Add_rm64_imm8 | Code::Add_rm64_imm32 | Code::Add_RAX_imm32
            if insn.op0_kind() == OpKind::Register =>
        {
            return;
        }
        // The result plus a header's size (`return p + PREFIX`).
        Code::Lea_r64_m if insn.memory_index() == Register::None => {
            let h = held.has(insn.memory_base()) && insn.memory_base() != Register::RIP;
            held.set(insn.op0_register(), h);
            return;
        }
        _ => {}
    }
    for used in info.info(insn).used_registers() {
        let writes = matches!(
            used.access(),
            OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
        );
        if writes {
            held.set(used.register(), false);
        }
    }
    for used in info.info(insn).used_memory() {
        if used.access() != OpAccess::Read && used.access() != OpAccess::NoMemAccess {
            let base = used.base();
            if matches!(base, Register::RSP | Register::RBP) && used.index() == Register::None {
                held.set_slot((base, used.displacement() as i64), false);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `code` with the call's return address at 0.
    fn returns(code: &[u8]) -> bool {
        returns_result(code, 0)
    }

    #[test]
    fn a_function_that_returns_the_block_is_a_wrapper() {
        // test rax,rax; je +5 (to the call); add rsp,8; ret; call oom
        let xmalloc = [
            0x48, 0x85, 0xc0, 0x74, 0x05, 0x48, 0x83, 0xc4, 0x08, 0xc3, 0xe8, 0, 0, 0, 0,
        ];
        assert!(returns(&xmalloc));
        // mov rbx,rax; mov rdi,rax; call usable_size; mov rax,rbx; pop rbx; ret
        let zmalloc = [
            0x48, 0x89, 0xc3, 0x48, 0x89, 0xc7, 0xe8, 0, 0, 0, 0, 0x48, 0x89, 0xd8, 0x5b, 0xc3,
        ];
        assert!(returns(&zmalloc));
        // lea rax,[rax+16]; ret: a block behind a header
        assert!(returns(&[0x48, 0x8d, 0x40, 0x10, 0xc3]));
        // add rax,0x40; ret: the same, in place (gcc -O1)
        assert!(returns(&[0x48, 0x83, 0xc0, 0x40, 0xc3]));
        // add rax,0x1000; ret
        assert!(returns(&[0x48, 0x05, 0, 0x10, 0, 0, 0xc3]));
        // -O0: mov [rbp-8],rax; mov rax,[rbp-8]; leave; ret
        let o0 = [0x48, 0x89, 0x45, 0xf8, 0x48, 0x8b, 0x45, 0xf8, 0xc9, 0xc3];
        assert!(returns(&o0));
    }

    #[test]
    fn a_function_that_keeps_the_block_is_not() {
        // mov [rip+x],rax; xor eax,eax; ret: stores it, returns 0
        let store = [0x48, 0x89, 0x05, 1, 0, 0, 0, 0x31, 0xc0, 0xc3];
        assert!(!returns(&store));
        // mov rdi,rax; call use; mov eax,1; ret: the call clobbers rax
        let use_it = [0x48, 0x89, 0xc7, 0xe8, 0, 0, 0, 0, 0xb8, 1, 0, 0, 0, 0xc3];
        assert!(!returns(&use_it));
        // test rax,rax; je +1; int3; ret: returns only the null result
        assert!(!returns(&[0x48, 0x85, 0xc0, 0x74, 0x01, 0xcc, 0xc3]));
        // mov rax,[rax]: loads through it
        assert!(!returns(&[0x48, 0x8b, 0x00, 0xc3]));
        assert!(!returns(&[]));
        assert!(!returns_result(&[0xc3], 5), "outside the code");
    }

    #[test]
    fn loops_and_far_jumps_end() {
        // jmp -2 (itself)
        assert!(!returns(&[0xeb, 0xfe]));
        // jmp far away (a tail call)
        assert!(!returns(&[0xe9, 0, 0, 2, 0]));
    }
}
