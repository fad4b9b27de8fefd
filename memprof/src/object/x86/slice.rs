//! A small symbolic evaluation of straight-line x86 code: what each
//! register holds in terms of the registers at the start of the run and of
//! the memory it read, so that two address expressions can be compared and
//! an address whose base register was overwritten can be computed again.
//!
//! Two questions are answered with it ([`super::access`]):
//! - **The backward slice.** `mov -0x10(%rbp),%rax; mov 0x8(%rax),%rax`
//!   sampled after the second move: the address was `rax + 8` *before* the
//!   move overwrote `rax`; the evaluation says `rax` was the 8 bytes at
//!   `rbp - 0x10`, `rbp` still holds its value at the sample and the slot
//!   was not written since, so the address is `*(rbp - 0x10) + 8`: one
//!   user-memory read for the kernel.
//! - **The store back.** A load whose address the same straight-line code
//!   stores to later (`mov 0x18(%rax),%rdx ... mov -0x10(%rbp),%rax; mov
//!   %rdx,0x18(%rax)`, the base reloaded from the same stack slot in
//!   between) is a read-modify-write: timer samples land after the load,
//!   which takes the miss, and the store is the write that invalidates.
//!
//! Values are exact or unknown: a register becomes unknown on any write the
//! evaluation does not model (partial writes, arithmetic other than adding
//! a constant). Memory has versions: a store to a stack slot (`rbp`/`rsp`
//! plus a constant) gives that slot a new version, any other store gives
//! all other memory a new one; a load is equal to another only if it read
//! the same address in the same version. Stores through other pointers are
//! assumed not to reach stack slots (slots whose address escapes are rare
//! in the code this is for).

use std::{collections::HashMap, rc::Rc};

use iced_x86::{
    FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind, Register,
};
use memprof_common::sharing::{recipe, reg, AccessRecipe, MAX_LOADS};

use super::access::gpr;

/// What a value is built on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Root {
    /// A register's value at the start of the run.
    Reg(u8),
    /// 8 bytes read at an address, in a memory version.
    Load(Rc<Addr>, u32),
    /// Zero (a constant is `Zero` plus the constant).
    Zero,
    /// Anything else; each one is different from every other.
    Unknown(u32),
    /// A constant address plus a register's unknown multiple: an element
    /// of the global array at that address (`&g_chase[id]`), for naming
    /// its type only. Each one is different from every other, as
    /// `Unknown`.
    Element(u64, u32),
}

/// `root + add`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Value {
    pub root: Root,
    pub add: i64,
}

/// `base + index * scale + disp`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Addr {
    pub base: Option<Root>,
    pub index: Option<(Root, u8)>,
    pub disp: i64,
}

impl Addr {
    /// A stack slot: `rsp` or `rbp` at the start of the run plus a constant.
    fn stack_slot(&self) -> Option<(u8, i64)> {
        match (&self.base, &self.index) {
            (Some(Root::Reg(r)), None) if *r == reg::RSP || *r == reg::RBP => Some((*r, self.disp)),
            _ => None,
        }
    }
}

/// Memory versions.
#[derive(Debug, Default)]
struct Memory {
    /// Version of each stack slot stored to in the run.
    slots: HashMap<(u8, i64), u32>,
    /// Version of the stack slots not stored to.
    stack: u32,
    /// Version of all other memory.
    other: u32,
}

/// Register values and memory versions along a run of instructions.
pub struct Eval {
    /// None: the register's value at the start of the run.
    regs: [Option<Value>; reg::COUNT],
    memory: Memory,
    next: u32,
    info: InstructionInfoFactory,
}

impl Default for Eval {
    fn default() -> Self {
        Self::new()
    }
}

impl Eval {
    pub fn new() -> Self {
        Self {
            regs: std::array::from_fn(|_| None),
            memory: Memory::default(),
            next: 1,
            info: InstructionInfoFactory::new(),
        }
    }

    fn fresh(&mut self) -> u32 {
        self.next += 1;
        self.next
    }

    /// What register `r` ([`reg`] numbering) holds now.
    pub fn register(&self, r: u8) -> Value {
        self.reg(r)
    }

    /// The state after `run`, or None when the run leaves the straight
    /// line.
    pub fn through_run(run: &[Instruction]) -> Option<Self> {
        Self::through(run)
    }

    fn reg(&self, r: u8) -> Value {
        self.regs[r as usize].clone().unwrap_or(Value {
            root: Root::Reg(r),
            add: 0,
        })
    }

    fn value_of(&self, r: Register) -> Option<Value> {
        Some(self.reg(gpr(r)?))
    }

    /// The address of `insn`'s explicit memory operand, in the current
    /// state (None: no operand, or one we cannot follow: fs/gs, 32-bit
    /// addressing, a vector index).
    pub fn address(&self, insn: &Instruction) -> Option<Addr> {
        (0..insn.op_count()).find(|&i| insn.op_kind(i) == OpKind::Memory)?;
        if matches!(insn.segment_prefix(), Register::FS | Register::GS) {
            return None;
        }
        let mut disp = insn.memory_displacement64() as i64;
        let base = match insn.memory_base() {
            Register::None | Register::RIP => None,
            r if r.is_gpr64() => {
                let v = self.value_of(r)?;
                disp = disp.wrapping_add(v.add);
                (v.root != Root::Zero).then_some(v.root)
            }
            _ => return None,
        };
        let index = match insn.memory_index() {
            Register::None => None,
            r if r.is_gpr64() => {
                let v = self.value_of(r)?;
                let scale = insn.memory_index_scale() as u8;
                disp = disp.wrapping_add(v.add.wrapping_mul(i64::from(scale)));
                (v.root != Root::Zero).then_some((v.root, scale))
            }
            _ => return None,
        };
        Some(Addr { base, index, disp })
    }

    /// The version the memory at `a` has now.
    fn version(&self, a: &Addr) -> u32 {
        match a.stack_slot() {
            Some(slot) => *self.memory.slots.get(&slot).unwrap_or(&self.memory.stack),
            None => self.memory.other,
        }
    }

    /// What loading 8 bytes at `a` gives now.
    fn load(&self, a: Addr) -> Value {
        let version = self.version(&a);
        Value {
            root: Root::Load(Rc::new(a), version),
            add: 0,
        }
    }

    /// A store of `size` bytes at `a`: the memory it may reach gets a new
    /// version.
    fn store(&mut self, a: Option<&Addr>, size: i64) {
        let v = self.fresh();
        match a.and_then(Addr::stack_slot) {
            Some((r, d)) => {
                for (&(sr, sd), version) in self.memory.slots.iter_mut() {
                    // Overlapping slots, and any slot of the other stack
                    // register (rsp and rbp may address the same bytes).
                    if sr != r || (sd < d + size && d < sd + 8) {
                        *version = v;
                    }
                }
                self.memory.slots.insert((r, d), v);
            }
            None if a.is_some_and(|a| is_stack(&a.base)) => {
                // A stack address we cannot pin down: every slot.
                self.memory.slots.clear();
                self.memory.stack = v;
            }
            None => self.memory.other = v,
        }
    }

    /// Evaluates `insn`. Returns false when the run must stop before it:
    /// control leaves the straight line, or the stack pointer moves in a
    /// way the evaluation does not follow.
    pub fn step(&mut self, insn: &Instruction) -> bool {
        if insn.flow_control() != FlowControl::Next
            || matches!(
                insn.mnemonic(),
                Mnemonic::Push | Mnemonic::Pop | Mnemonic::Enter | Mnemonic::Leave
            )
        {
            return false;
        }
        let info = self.info.info(insn);
        let written: Vec<u8> = info
            .used_registers()
            .iter()
            .filter(|u| {
                matches!(
                    u.access(),
                    OpAccess::Write
                        | OpAccess::CondWrite
                        | OpAccess::ReadWrite
                        | OpAccess::ReadCondWrite
                )
            })
            .filter_map(|u| gpr(u.register()))
            .collect();
        let stores = info.used_memory().iter().any(|m| {
            !matches!(
                m.access(),
                OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess
            )
        });
        let modelled = self.modelled(insn);
        if written.contains(&reg::RSP) && modelled.is_none() {
            return false;
        }
        if stores {
            let a = self.address(insn);
            let size = insn.memory_size().size().max(1) as i64;
            self.store(a.as_ref(), size);
        }
        for r in written {
            let v = match &modelled {
                Some((target, v)) if *target == r => {
                    let mut v = v.clone();
                    if let Root::Element(_, id) = &mut v.root {
                        *id = self.fresh();
                    }
                    v
                }
                _ => {
                    let id = self.fresh();
                    Value {
                        root: Root::Unknown(id),
                        add: 0,
                    }
                }
            };
            self.regs[r as usize] = Some(v);
        }
        true
    }

    /// The value a modelled instruction gives its 64-bit destination
    /// register: copies, 8-byte loads, constants, `lea` without index and
    /// adding or subtracting a constant.
    fn modelled(&self, insn: &Instruction) -> Option<(u8, Value)> {
        if insn.op_count() != 2 || insn.op0_kind() != OpKind::Register {
            return None;
        }
        let dst = insn.op0_register();
        if !dst.is_gpr64() {
            return None;
        }
        let target = gpr(dst)?;
        let imm = || match insn.op1_kind() {
            OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate64 => {
                Some(insn.immediate64() as i64)
            }
            OpKind::Immediate8 | OpKind::Immediate32 => Some(insn.immediate32() as i32 as i64),
            _ => None,
        };
        let v = match (insn.mnemonic(), insn.op1_kind()) {
            (Mnemonic::Mov, OpKind::Register) if insn.op1_register().is_gpr64() => {
                self.value_of(insn.op1_register())?
            }
            (Mnemonic::Mov, OpKind::Memory) if insn.memory_size().size() == 8 => {
                self.load(self.address(insn)?)
            }
            (Mnemonic::Mov, _) => Value {
                root: Root::Zero,
                add: imm()?,
            },
            (Mnemonic::Lea, OpKind::Memory) => {
                let a = self.address(insn)?;
                match (a.base, a.index) {
                    (base, None) => Value {
                        root: base.unwrap_or(Root::Zero),
                        add: a.disp,
                    },
                    // `lea g(,%rax,16)`, or `lea (%r10,%rax,1)` with r10 `g`.
                    (None, Some(_)) => Self::element(a.disp)?,
                    (Some(_), Some(_)) => return None,
                }
            }
            // `add %rax,%r10` with r10 the address of a global.
            (Mnemonic::Add, OpKind::Register) if insn.op1_register().is_gpr64() => {
                let (a, b) = (self.value_of(dst)?, self.value_of(insn.op1_register())?);
                match (a.root, b.root) {
                    (Root::Zero, Root::Zero) => return None,
                    (Root::Zero, _) => Self::element(a.add)?,
                    (_, Root::Zero) => Self::element(b.add)?,
                    _ => return None,
                }
            }
            (Mnemonic::Add | Mnemonic::Sub, _) => {
                let mut v = self.value_of(dst)?;
                let k = imm()?;
                v.add = match insn.mnemonic() {
                    Mnemonic::Add => v.add.wrapping_add(k),
                    _ => v.add.wrapping_sub(k),
                };
                v
            }
            _ => return None,
        };
        Some((target, v))
    }

    /// An element of the global array at `at` (a constant that can be an
    /// address), each one new.
    fn element(at: i64) -> Option<Value> {
        (at > 0x1000).then_some(Value {
            // Numbered when it is kept ([`Self::step`]).
            root: Root::Element(at as u64, 0),
            add: 0,
        })
    }

    /// The register (and the constant to subtract from it) that holds
    /// `root` now.
    fn holding(&self, root: &Root) -> Option<(u8, i64)> {
        (0..reg::COUNT as u8)
            .filter_map(|r| {
                let v = self.reg(r);
                (v.root == *root).then_some((r, v.add))
            })
            .min_by_key(|&(r, add)| (add != 0, r))
    }

    /// `root` as the kernel can compute it now: a register, or a register
    /// plus a displacement read from memory once or twice (the memory
    /// unchanged since). Returns (register, displacements, constant to
    /// add after the reads).
    fn reach(&self, root: &Root, depth: usize) -> Option<(u8, Vec<i32>, i64)> {
        if let Some((r, add)) = self.holding(root) {
            return Some((r, Vec::new(), add.wrapping_neg()));
        }
        let Root::Load(addr, version) = root else {
            return None;
        };
        if depth == MAX_LOADS || self.version(addr) != *version || addr.index.is_some() {
            return None;
        }
        let (r, mut loads, add) = self.reach(addr.base.as_ref()?, depth + 1)?;
        let disp = i32::try_from(addr.disp.checked_add(add)?).ok()?;
        loads.push(disp);
        Some((r, loads, 0))
    }

    /// A recipe that computes `a` from the registers as they are now
    /// (after the evaluated instructions) and at most [`MAX_LOADS`] reads.
    pub fn recipe_for(&self, a: &Addr, size: u8, flags: u32) -> Option<AccessRecipe> {
        let mut disp = a.disp;
        let (base, loads) = match &a.base {
            None => (reg::NONE, Vec::new()),
            Some(root) => {
                let (r, loads, add) = self.reach(root, 0)?;
                disp = disp.wrapping_add(add);
                (r, loads)
            }
        };
        let (index, scale) = match &a.index {
            None => (reg::NONE, 1),
            Some((root, scale)) => {
                let (r, add) = self.holding(root)?;
                disp = disp.wrapping_sub(add.wrapping_mul(i64::from(*scale)));
                (r, *scale)
            }
        };
        let mut load_disp = [0; MAX_LOADS];
        load_disp[..loads.len()].copy_from_slice(&loads);
        Some(AccessRecipe {
            load_disp,
            loads: loads.len() as u8,
            ..AccessRecipe::plain(base, index, scale, disp, size, flags | recipe::SLICE)
        })
    }
}

/// Whether `root` is the stack pointer or frame pointer at the start.
fn is_stack(root: &Option<Root>) -> bool {
    matches!(root, Some(Root::Reg(r)) if *r == reg::RSP || *r == reg::RBP)
}

impl Eval {
    /// The state after `run`, or None when the run leaves the straight
    /// line.
    fn through(run: &[Instruction]) -> Option<Self> {
        let mut eval = Self::new();
        run.iter().all(|insn| eval.step(insn)).then_some(eval)
    }

    /// Whether `insn` surely writes its memory operand.
    fn writes_memory(&mut self, insn: &Instruction) -> bool {
        self.info
            .info(insn)
            .used_memory()
            .iter()
            .any(|m| matches!(m.access(), OpAccess::Write | OpAccess::ReadWrite))
    }
}

/// The recipe of the access `run[at]` for a sample taken right after it,
/// when it overwrote its own base or index register: its address computed
/// again from `run[..at]` (the straight-line code before it).
pub fn slice(run: &[Instruction], at: usize, size: u8, flags: u32) -> Option<AccessRecipe> {
    let mut eval = Eval::through(&run[..at])?;
    let addr = eval.address(&run[at])?;
    if !eval.step(&run[at]) {
        return None;
    }
    eval.recipe_for(&addr, size, flags)
}

/// Whether the load `run[at]` is stored back: a later instruction of the
/// straight-line run writes the same address (same base value, same
/// displacement, the base possibly reloaded from the same unchanged slot).
/// Thread-local (`fs`/`gs`) operands have no address here, so never match.
pub fn stored_back(run: &[Instruction], at: usize) -> bool {
    let Some(mut eval) = Eval::through(&run[..at]) else {
        return false;
    };
    let Some(addr) = eval.address(&run[at]) else {
        return false;
    };
    let size = run[at].memory_size().size();
    for insn in &run[at..] {
        if eval.writes_memory(insn)
            && insn.memory_size().size() == size
            && eval.address(insn).as_ref() == Some(&addr)
        {
            return true;
        }
        if !eval.step(insn) {
            return false;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use iced_x86::{Decoder, DecoderOptions};

    use super::*;

    fn run(bytes: &[u8]) -> Vec<Instruction> {
        let mut d = Decoder::with_ip(64, bytes, 0x1000, DecoderOptions::NONE);
        let mut v = Vec::new();
        while d.can_decode() {
            v.push(d.decode());
        }
        v
    }

    /// The -O0 linear-regression loop: `args` lives at -0x10(%rbp).
    ///   0 mov -0x10(%rbp),%rax   ; args
    ///   1 mov 0x18(%rax),%rdx    ; args->SX
    ///   2 mov -0x10(%rbp),%rax
    ///   3 mov 0x8(%rax),%rax     ; args->points (overwrites rax)
    ///   4 mov -0x4(%rbp),%ecx
    ///   5 add %rcx,%rax
    ///   6 movsbq (%rax),%rax
    ///   7 add %rax,%rdx
    ///   8 mov -0x10(%rbp),%rax
    ///   9 mov %rdx,0x18(%rax)    ; args->SX = ...
    const LINREG: [u8; 37] = [
        0x48, 0x8b, 0x45, 0xf0, // 0
        0x48, 0x8b, 0x50, 0x18, // 1
        0x48, 0x8b, 0x45, 0xf0, // 2
        0x48, 0x8b, 0x40, 0x08, // 3
        0x8b, 0x4d, 0xfc, // 4
        0x48, 0x01, 0xc8, // 5
        0x48, 0x0f, 0xbe, 0x00, // 6
        0x48, 0x01, 0xc2, // 7
        0x48, 0x8b, 0x45, 0xf0, // 8
        0x48, 0x89, 0x50, 0x18, // 9
    ];

    #[test]
    fn an_overwritten_base_is_read_back_from_its_stack_slot() {
        let code = run(&LINREG);
        assert_eq!(code.len(), 10);
        let r = slice(&code, 3, 8, recipe::READ).expect("a recipe");
        assert_eq!((r.base, r.loads, r.load_disp[0]), (reg::RBP, 1, -0x10));
        assert_eq!(
            (r.disp, r.index, r.flags),
            (8, reg::NONE, recipe::READ | recipe::SLICE)
        );
        let mut regs = [0u64; reg::COUNT];
        regs[reg::RBP as usize] = 0x7ff0;
        let memory = |a: u64| (a == 0x7fe0).then_some(0x5000);
        assert_eq!(r.address_with(&regs, memory), Some(0x5008));
    }

    #[test]
    fn a_load_stored_back_through_a_reloaded_base_is_a_write() {
        let code = run(&LINREG);
        assert!(stored_back(&code, 1), "args->SX is read, then written");
        assert!(!stored_back(&code, 3), "args->points is only read");
    }

    #[test]
    fn a_store_to_the_slot_in_between_breaks_the_match() {
        // mov -0x10(%rbp),%rax; mov 0x18(%rax),%rdx; mov %rsi,-0x10(%rbp);
        // mov -0x10(%rbp),%rax; mov %rdx,0x18(%rax)
        let code = run(&[
            0x48, 0x8b, 0x45, 0xf0, 0x48, 0x8b, 0x50, 0x18, 0x48, 0x89, 0x75, 0xf0, 0x48, 0x8b,
            0x45, 0xf0, 0x48, 0x89, 0x50, 0x18,
        ]);
        assert!(!stored_back(&code, 1));
    }

    #[test]
    fn copies_and_constant_adds_need_no_read() {
        // mov %rdi,%rbx; add $0x40,%rbx; mov 0x8(%rdi),%rdi
        let code = run(&[
            0x48, 0x89, 0xfb, 0x48, 0x83, 0xc3, 0x40, 0x48, 0x8b, 0x7f, 0x08,
        ]);
        let r = slice(&code, 2, 8, recipe::READ).expect("a recipe");
        assert_eq!((r.base, r.loads, r.disp), (reg::RBX, 0, 8 - 0x40));
    }

    #[test]
    fn two_reads_at_most_and_none_through_a_changed_slot() {
        // mov -0x8(%rbp),%rax; mov 0x10(%rax),%rax; mov 0x4(%rax),%eax
        let code = run(&[
            0x48, 0x8b, 0x45, 0xf8, 0x48, 0x8b, 0x40, 0x10, 0x8b, 0x40, 0x04,
        ]);
        let r = slice(&code, 2, 4, recipe::READ).expect("two reads");
        assert_eq!(
            (r.base, r.loads, r.load_disp, r.disp),
            (reg::RBP, 2, [-8, 0x10], 4)
        );
        // mov -0x8(%rbp),%rax; mov %rdx,-0x8(%rbp); mov 0x10(%rax),%rax
        let code = run(&[
            0x48, 0x8b, 0x45, 0xf8, 0x48, 0x89, 0x55, 0xf8, 0x48, 0x8b, 0x40, 0x10,
        ]);
        assert_eq!(
            slice(&code, 2, 8, recipe::READ),
            None,
            "the slot now holds rdx"
        );
    }

    #[test]
    fn unknown_values_give_no_recipe() {
        // imul $3,%rdi,%rax... : lea (%rdi,%rsi,2),%rax; mov (%rax),%rax
        let code = run(&[0x48, 0x8d, 0x04, 0x77, 0x48, 0x8b, 0x00]);
        assert_eq!(slice(&code, 1, 8, recipe::READ), None);
        // A call in the run stops it.
        let code = run(&[0xe8, 0, 0, 0, 0, 0x48, 0x8b, 0x00]);
        assert_eq!(slice(&code, 1, 8, recipe::READ), None);
    }
}
