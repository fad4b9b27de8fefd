//! Which pointer an access goes through: for the instruction of a sampled
//! access (or a call's argument register), where the pointer it adds its
//! displacement to was kept — a register, a stack slot or a global — so
//! the debug info's variable there can give the pointed-to type.
//!
//! `mov -0x18(%rbp),%rax; mov %rdx,0x10(%rax)` stores through the pointer
//! kept in the stack slot `rbp - 0x18`, 16 bytes into what it points to;
//! `mov %rdx,0x10(%rbx)` through the one in `rbx`. The straight-line code
//! before the instruction is evaluated ([`super::slice`]) to see through
//! register moves and reloads.

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, OpAccess,
};
use memprof_common::sharing::reg;

use super::{
    access::{decoded_before, gpr, run_before},
    slice::{Addr, Eval, Root, Value},
};

/// Where a pointer was kept when the straight-line run before the access
/// began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Home {
    /// A register ([`reg`] numbering).
    Reg(u8),
    /// The 8 bytes at a register (`rsp` or `rbp`) plus an offset.
    Slot(u8, i64),
    /// The 8 bytes at a fixed address (a global pointer).
    Global(u64),
    /// Not a place but the value: an address in the global array at this
    /// address, at an element the code computed (`&g_chase[id]`).
    Element(u64),
}

/// The pointer an access goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PointerUse {
    pub home: Home,
    /// Bytes from where the pointer points to the access.
    pub disp: i64,
    /// An index register is added too (`p[i].x`): `disp` is then the
    /// offset in the element only if the pointer points at element 0.
    pub indexed: bool,
    /// Address of the first instruction of the straight-line run (the
    /// home is the pointer's place there).
    pub run_start: u64,
    /// The pointer was read this many bytes into what the pointer kept at
    /// `home` points to (`w->st->hits`: `w`'s struct, its member at 8);
    /// None when `home` holds the pointer itself.
    pub member: Option<i64>,
}

/// The pointer the memory operand of the instruction at `insn` goes
/// through, as seen from each straight-line run that ends at it (longest
/// first: `mov %rsp,%rbp` at a run's start would hide the frame pointer a
/// shorter run sees). `code` holds the bytes at `code_ip..`, from
/// [`super::access::LOOK_BEHIND`] bytes before `insn` to past it.
pub fn of_access(code: &[u8], code_ip: u64, insn: u64) -> Vec<PointerUse> {
    let Some(at) = decode_at(code, code_ip, insn) else {
        return Vec::new();
    };
    candidates(code, code_ip, insn, |eval| {
        let Addr { base, index, disp } = eval.address(&at)?;
        Some((base?, disp, index.is_some()))
    })
}

/// The pointer register `arg` ([`reg`] numbering) holds when the call at
/// `insn` is made (`lea 0x28(%rbx),%rdi; call pthread_mutex_lock`: `rbx`,
/// 40 bytes on), as [`of_access`] sees it.
pub fn of_argument(code: &[u8], code_ip: u64, insn: u64, arg: u8) -> Vec<PointerUse> {
    candidates(code, code_ip, insn, |eval| {
        let Value { root, add } = eval.register(arg);
        Some((root, add, false))
    })
}

/// The pointer register `arg` holds at the call that returns to `ret`
/// (a return address of a call chain), and the call's address.
pub fn of_call_argument(code: &[u8], code_ip: u64, ret: u64, arg: u8) -> (Vec<PointerUse>, u64) {
    let run = run_before(code, code_ip, ret);
    match run.last() {
        Some(call) if call.flow_control() == FlowControl::Call && call.next_ip() == ret => {
            (of_argument(code, code_ip, call.ip(), arg), call.ip())
        }
        _ => (Vec::new(), ret),
    }
}

/// The distinct pointers `pointer` finds after each straight-line run
/// ending at `insn`, and after none; a register the longest run starts
/// with is followed to where it was set before the run.
fn candidates(
    code: &[u8],
    code_ip: u64,
    insn: u64,
    pointer: impl Fn(&Eval) -> Option<(Root, i64, bool)>,
) -> Vec<PointerUse> {
    let run = run_before(code, code_ip, insn);
    let mut found: Vec<PointerUse> = Vec::new();
    let add = |found: &mut Vec<PointerUse>, p: PointerUse| {
        if !found
            .iter()
            .any(|f| (f.home, f.disp, f.member) == (p.home, p.disp, p.member))
        {
            found.push(p);
        }
    };
    for (_, p) in tail_pointers(&run, insn, pointer) {
        add(&mut found, p);
    }
    // A register set before a loop the run starts in (`lea 0x30(%rdi),%r13`
    // hoisted out of it): what it was set from, seen at the setting; and
    // once more for a register that setting read (`mov 0x8(%r10),%rsi`
    // with r10 `&g_chase[id]`, set before an outer loop).
    let mut follow = found
        .iter()
        .find(|p| matches!(p.home, Home::Reg(_)))
        .copied();
    for _ in 0..2 {
        let Some(p) = follow.take() else {
            break;
        };
        let Home::Reg(r) = p.home else {
            break;
        };
        for q in set_before(code, code_ip, insn, p.run_start, r) {
            let composed = match (p.member, q.member) {
                // r + d, r set to X + e: X + e + d.
                (None, member) => PointerUse {
                    disp: q.disp.wrapping_add(p.disp),
                    member,
                    indexed: p.indexed,
                    ..q
                },
                // *(r + m) + d, r set to X + e: *(X + e + m) + d.
                (Some(m), None) => PointerUse {
                    member: Some(q.disp.wrapping_add(m)),
                    disp: p.disp,
                    indexed: p.indexed,
                    ..q
                },
                (Some(_), Some(_)) => continue,
            };
            if follow.is_none() && matches!(composed.home, Home::Reg(_)) {
                follow = Some(composed);
            }
            add(&mut found, composed);
        }
    }
    found
}

/// What register `r` was set to where it was last written before the
/// instruction at `start` (each pointer seen at the setting), unless a
/// call may have changed it since.
fn set_before(code: &[u8], code_ip: u64, insn: u64, start: u64, r: u8) -> Vec<PointerUse> {
    let all = decoded_before(code, code_ip, insn);
    let before = all
        .iter()
        .position(|i| i.ip() == start)
        .unwrap_or(all.len());
    let Some(set) = last_write(&all[..before], r) else {
        return Vec::new();
    };
    let next = all[set].next_ip();
    let setting = run_before(code, code_ip, next);
    let held = |eval: &Eval| {
        let Value { root, add } = eval.register(r);
        Some((root, add, false))
    };
    tail_pointers(&setting, next, held)
        .into_iter()
        .map(|(_, p)| p)
        .filter(|p| (p.home, p.member) != (Home::Reg(r), None))
        .collect()
}

/// What `pointer` finds after each straight-line suffix of `run` (which
/// ends at `end`), longest first, and after none: the suffix's index in
/// `run` and the pointer.
fn tail_pointers(
    run: &[Instruction],
    end: u64,
    pointer: impl Fn(&Eval) -> Option<(Root, i64, bool)>,
) -> Vec<(usize, PointerUse)> {
    let starts = (0..run.len()).map(|from| (from, run[from].ip()));
    starts
        .chain([(run.len(), end)])
        .filter_map(|(from, start)| {
            let eval = Eval::through_run(&run[from..])?;
            let (root, disp, indexed) = pointer(&eval)?;
            let (home, member) = home_of(&root)?;
            Some((
                from,
                PointerUse {
                    home,
                    disp,
                    indexed,
                    run_start: start,
                    member,
                },
            ))
        })
        .collect()
}

/// The index of the last instruction of `run` that writes register `r`,
/// when nothing after it may have changed `r` without saying: a call
/// clobbers the registers the callee need not keep.
fn last_write(run: &[Instruction], r: u8) -> Option<usize> {
    let mut info = InstructionInfoFactory::new();
    let kept = matches!(r, reg::RBX | reg::RBP | reg::RSP) || r >= reg::R8 + 4;
    for (i, insn) in run.iter().enumerate().rev() {
        if insn.flow_control() == FlowControl::Call && !kept {
            return None;
        }
        let writes = info.info(insn).used_registers().iter().any(|u| {
            gpr(u.register()) == Some(r)
                && !matches!(u.access(), OpAccess::Read | OpAccess::CondRead)
        });
        if writes {
            return Some(i);
        }
    }
    None
}

fn decode_at(code: &[u8], code_ip: u64, insn: u64) -> Option<Instruction> {
    let bytes = code.get(usize::try_from(insn.checked_sub(code_ip)?).ok()?..)?;
    let at = Decoder::with_ip(64, bytes, insn, DecoderOptions::NONE).decode();
    (!at.is_invalid()).then_some(at)
}

/// Where the pointer `root` is kept, or the member of a struct it was read
/// from and where that struct's pointer is kept (`w->st`, one level).
fn home_of(root: &Root) -> Option<(Home, Option<i64>)> {
    if let Some(home) = direct_home(root) {
        return Some((home, None));
    }
    let Root::Load(a, _) = root else {
        return None;
    };
    match (&a.base, &a.index) {
        // Read from an element of a global array: `g_ptrs[i]`.
        (None, Some(_)) => Some((Home::Element(a.disp as u64), Some(0))),
        (Some(base @ Root::Element(..)), _) | (Some(base), None) => {
            Some((direct_home(base)?, Some(a.disp)))
        }
        _ => None,
    }
}

fn direct_home(root: &Root) -> Option<Home> {
    match root {
        Root::Reg(r) => Some(Home::Reg(*r)),
        Root::Element(at, _) => Some(Home::Element(*at)),
        Root::Load(a, _) => match (&a.base, &a.index) {
            (Some(Root::Reg(r)), None) if *r == reg::RSP || *r == reg::RBP => {
                Some(Home::Slot(*r, a.disp))
            }
            (None, None) => Some(Home::Global(a.disp as u64)),
            _ => None,
        },
        _ => None,
    }
}

/// DWARF's number of a register ([`reg`] numbering): x86-64's psABI
/// orders them rax, rdx, rcx, rbx, rsi, rdi, rbp, rsp, r8-r15.
pub fn dwarf_register(r: u8) -> u16 {
    match r {
        reg::RAX => 0,
        reg::RDX => 1,
        reg::RCX => 2,
        reg::RBX => 3,
        reg::RSI => 4,
        reg::RDI => 5,
        reg::RBP => 6,
        reg::RSP => 7,
        r => u16::from(r),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assemble(bytes: &[u8]) -> (Vec<u8>, u64) {
        (bytes.to_vec(), 0x1000)
    }

    /// `mov -0x18(%rbp),%rax; mov %rdx,0x10(%rax)`: the pointer is in
    /// the slot at rbp - 0x18, 16 bytes on.
    #[test]
    fn a_reloaded_pointer_is_found_in_its_stack_slot() {
        let (code, ip) = assemble(&[0x48, 0x8b, 0x45, 0xe8, 0x48, 0x89, 0x50, 0x10]);
        let p = of_access(&code, ip, ip + 4);
        assert_eq!(p[0].home, Home::Slot(reg::RBP, -0x18));
        assert_eq!((p[0].disp, p[0].indexed, p[0].run_start), (0x10, false, ip));
        // Seen from the access alone: the register.
        assert_eq!(p[1].home, Home::Reg(reg::RAX));
    }

    /// `mov -0x18(%rbp),%rax; mov 0x8(%rax),%rax; mov %rdx,0x10(%rax)`:
    /// the pointer was read from 8 bytes into what the slot's points to.
    #[test]
    fn a_pointer_read_from_a_member_is_found_with_the_member() {
        let (code, ip) = assemble(&[
            0x48, 0x8b, 0x45, 0xe8, // mov -0x18(%rbp),%rax
            0x48, 0x8b, 0x40, 0x08, // mov 0x8(%rax),%rax
            0x48, 0x89, 0x50, 0x10, // mov %rdx,0x10(%rax)
        ]);
        let p = of_access(&code, ip, ip + 8);
        assert_eq!(
            (p[0].home, p[0].member, p[0].disp),
            (Home::Slot(reg::RBP, -0x18), Some(8), 0x10)
        );
        assert!(p
            .iter()
            .any(|p| (p.home, p.member) == (Home::Reg(reg::RAX), Some(8))));
        assert_eq!(
            p.last().map(|p| (p.home, p.member)),
            Some((Home::Reg(reg::RAX), None))
        );
    }

    /// `mov %rbx,%rax; mov %rdx,0x8(%rax,%rcx,8)`: rbx, indexed.
    #[test]
    fn a_moved_register_is_seen_through() {
        let (code, ip) = assemble(&[0x48, 0x89, 0xd8, 0x48, 0x89, 0x54, 0xc8, 0x08]);
        let p = of_access(&code, ip, ip + 3);
        assert_eq!(p[0].home, Home::Reg(reg::RBX));
        assert_eq!((p[0].disp, p[0].indexed), (8, true));
    }

    /// `lea 0x28(%rbx),%rdi; call ...`: the argument is rbx + 40.
    #[test]
    fn a_call_argument_is_its_base_plus_the_offset() {
        let (code, ip) = assemble(&[0x48, 0x8d, 0x7b, 0x28, 0xe8, 0, 0, 0, 0]);
        let p = of_argument(&code, ip, ip + 4, reg::RDI);
        assert_eq!((p[0].home, p[0].disp), (Home::Reg(reg::RBX), 0x28));
    }

    /// The same seen from the call's return address.
    #[test]
    fn a_call_is_found_from_its_return_address() {
        let (code, ip) = assemble(&[0x48, 0x8d, 0x7b, 0x28, 0xe8, 0, 0, 0, 0]);
        let (p, call) = of_call_argument(&code, ip, ip + 9, reg::RDI);
        assert_eq!(call, ip + 4);
        assert_eq!((p[0].home, p[0].disp), (Home::Reg(reg::RBX), 0x28));
        assert!(of_call_argument(&code, ip, ip + 4, reg::RDI).0.is_empty());
    }

    /// `lea 0x30(%rdi),%r13; jmp L; L: mov %r13,%rdi; call ...`: the
    /// address was set before the loop from rdi, 48 bytes on.
    #[test]
    fn a_register_set_before_a_loop_is_followed_to_its_setting() {
        let (code, ip) = assemble(&[
            0x4c, 0x8d, 0x6f, 0x30, // lea 0x30(%rdi),%r13
            0xeb, 0x00, // jmp to the next instruction
            0x4c, 0x89, 0xef, // mov %r13,%rdi
            0xe8, 0, 0, 0, 0, // call
        ]);
        let (p, _) = of_call_argument(&code, ip, ip + 14, reg::RDI);
        assert!(
            p.iter()
                .any(|p| p.home == Home::Reg(reg::RDI) && p.disp == 0x30),
            "{p:?}"
        );
        // A caller-saved register across a call is not followed.
        let (code, ip) = assemble(&[
            0x48, 0x8d, 0x47, 0x30, // lea 0x30(%rdi),%rax
            0xe8, 0, 0, 0, 0, // call
            0x48, 0x89, 0xc7, // mov %rax,%rdi
            0xe8, 0, 0, 0, 0, // call
        ]);
        let (p, _) = of_call_argument(&code, ip, ip + 17, reg::RDI);
        assert!(
            p.iter()
                .all(|p| (p.home, p.disp) != (Home::Reg(reg::RDI), 0x30)),
            "{p:?}"
        );
    }

    #[test]
    fn dwarf_numbers_follow_the_psabi() {
        assert_eq!(dwarf_register(reg::RDX), 1);
        assert_eq!(dwarf_register(reg::RBP), 6);
        assert_eq!(dwarf_register(reg::R8 + 4), 12);
    }
}
