//! The report's false-sharing section: which object each shared line is,
//! which code touches it, and what to change.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use memprof_common::{
    procs::{is_shared_key, split_shared_key},
    sharing::{LineState, LineWords, LINE_BYTES, WORD_BYTES},
};

use super::{
    cost::{CodeSamples, LineCost},
    typing::{line_type, LineType},
};
use crate::{
    features::sharing::analysis::{self, Dismissal, LineFinding, SharingProfile},
    heap::{Heap, HeapBlock},
    object::symbolize::dwarf::Layout,
    process::{
        holders,
        maps::{Place, ProcMaps},
    },
    report::{
        model::{
            Dependences, DismissReason, DismissedLine, ObjectKind, PredictedGain, ProcessThreads,
            SharedObject, SharingCode, SharingEntry, SharingKind, WordEntry,
        },
        names::{callers, global_name, Names},
    },
};

impl From<analysis::SharingKind> for SharingKind {
    fn from(kind: analysis::SharingKind) -> Self {
        match kind {
            analysis::SharingKind::False => SharingKind::False,
            analysis::SharingKind::True => SharingKind::True,
            analysis::SharingKind::Mixed => SharingKind::Mixed,
        }
    }
}

impl From<Dismissal> for DismissReason {
    fn from(why: Dismissal) -> Self {
        match why {
            Dismissal::OneThread => DismissReason::OneThread,
            Dismissal::NoWrites => DismissReason::NoWrites,
            Dismissal::NotInTable => DismissReason::NotInTable,
            Dismissal::FewInvalidations => DismissReason::FewInvalidations,
            Dismissal::ReadMostly => DismissReason::ReadMostly,
            Dismissal::LowCost => DismissReason::LowCost,
            Dismissal::NothingWrittenShared => DismissReason::NothingWrittenShared,
        }
    }
}

/// Code sites kept per line.
const CODE_SITES: usize = 8;
/// Lines reported at most.
const MAX_LINES: usize = 20;
/// Busiest lines examined for the list of lines not reported.
const DISMISSED_LINES: usize = 8;
/// The name of a heap block whose allocation the tracker did not see.
const UNSEEN_BLOCK: &str =
    "heap block allocated before tracing (or while the allocator was not traced)";
/// The same, with its size from glibc's chunk header (which records the
/// usable size, not the size asked for).
const CHUNK_BLOCK: &str = "heap block allocated before tracing (usable size from its malloc chunk)";

/// The kernel's view of the candidate lines, read while the programs are
/// loaded (and kept once they are gone).
#[derive(Debug, Clone, Default)]
pub struct KernelLines {
    pub lines: Vec<(u64, Option<LineState>, Option<LineWords>)>,
}

/// What the section reads of a session: the sampled accesses, the memory
/// map, the session's heap, and the heap blocks found under shared
/// lines while they were live.
pub struct Inputs<'a> {
    pub sharing: &'a SharingProfile,
    pub maps: &'a ProcMaps,
    pub heap: Option<&'a dyn Heap>,
    pub line_block: Box<dyn Fn(u64) -> Option<HeapBlock> + 'a>,
    /// Where in the target's globals a word points into the block
    /// allocated before tracing that starts here.
    pub block_holder: Box<dyn Fn(u64) -> Option<u64> + 'a>,
    /// Samples per instruction and thread: each line's cost.
    pub code: &'a CodeSamples,
    /// Several processes: the traced processes, for the threads of other
    /// processes than the main one, and the names of shared objects.
    pub procs: Option<Procs<'a>>,
}

/// What the section needs to know of the traced processes.
pub struct Procs<'a> {
    pub main: u32,
    /// The process of a thread.
    pub pid_of: Box<dyn Fn(u32) -> u32 + 'a>,
    /// What a shared-memory key's object is.
    pub shared_name: Box<dyn Fn(u64) -> Option<String> + 'a>,
}

impl Procs<'_> {
    /// The threads by process, when some are not the main process's.
    fn group(&self, threads: &[u32]) -> Vec<ProcessThreads> {
        let mut by_pid: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for &t in threads {
            by_pid.entry((self.pid_of)(t)).or_default().push(t);
        }
        if by_pid.keys().all(|&p| p == self.main) {
            return Vec::new();
        }
        by_pid
            .into_iter()
            .map(|(pid, threads)| ProcessThreads { pid, threads })
            .collect()
    }
}

/// The entries for the lines the kernel's table holds, most costly first
/// ([`MAX_LINES`] at most).
pub fn findings(
    inputs: &Inputs<'_>,
    kernel: &KernelLines,
    total_samples: u64,
    names: &mut dyn Names,
) -> Vec<SharingEntry> {
    let mut findings: Vec<(LineFinding, LineCost)> = kernel
        .lines
        .iter()
        .filter_map(|(line, state, words)| {
            inputs
                .sharing
                .analyse(*line, state.as_ref(), words.as_ref(), total_samples)
        })
        .map(|mut f| {
            // All the samples of the instructions on the line, placed or not.
            let cost = inputs.code.line_cost(&f, total_samples);
            f.cost_share = f.cost_share.max(cost.share);
            (f, cost)
        })
        .collect();
    findings.sort_by(|(a, _), (b, _)| {
        b.cost_share
            .total_cmp(&a.cost_share)
            .then(b.invalidations.cmp(&a.invalidations))
            .then(a.line.cmp(&b.line))
    });
    findings.truncate(MAX_LINES);
    findings
        .into_iter()
        .map(|(f, cost)| {
            let (object, layout) = object_of(inputs, f.first_addr, f.line, names);
            let mut e = entry(f, object, layout, inputs, names);
            e.cost_samples = (cost.samples.round() as u64).max(e.samples);
            e.predicted_gain = cost.gain.map(|g| PredictedGain {
                low: g.low,
                high: g.high,
                basis: format!(
                    "samples of the line's accesses in excess of the neighbouring \
                     instructions' ({:.0}% of the threads' {} samples)",
                    g.excess_share * 100.0,
                    g.thread_samples
                ),
            });
            e
        })
        .collect()
}

/// The busiest lines ([`DISMISSED_LINES`] at most) that are not
/// findings, with the reason: the evidence that a quiet answer comes from
/// looking, not from missing the line.
pub fn dismissals(
    inputs: &Inputs<'_>,
    kernel: &KernelLines,
    total_samples: u64,
    names: &mut dyn Names,
) -> Vec<DismissedLine> {
    inputs
        .sharing
        .busiest(DISMISSED_LINES)
        .into_iter()
        .filter_map(|l| {
            let why = if l.writes == 0 {
                Dismissal::NoWrites
            } else if l.shared {
                let (state, words) = kernel
                    .lines
                    .iter()
                    .find(|(line, _, _)| *line == l.line)
                    .map(|(_, s, w)| (s.as_ref(), w.as_ref()))
                    .unwrap_or((None, None));
                inputs
                    .sharing
                    .judge(l.line, state, words, total_samples)
                    .err()?
            } else {
                Dismissal::OneThread
            };
            let (object, _) = object_of(inputs, l.first_addr, l.line, names);
            Some(DismissedLine {
                line: format!("{:#x}", l.line),
                object: object.label(),
                object_kind: object.kind,
                samples: l.samples,
                writes: l.writes,
                shared: l.shared,
                reason: why.into(),
            })
        })
        .collect()
}

/// The report's entry for a finding about `object`.
fn entry(
    f: LineFinding,
    mut object: SharedObject,
    layout: Option<Layout>,
    inputs: &Inputs<'_>,
    names: &mut dyn Names,
) -> SharingEntry {
    let typed = type_object(&f, &mut object, layout.as_ref(), inputs, names);
    // The field at a byte of the line: a global's from its debug info,
    // other memory's from the types the code accessed it as.
    let field = |offset: u32| match layout.as_ref() {
        Some(layout) => {
            let at = object.offset + i64::from(offset);
            layout.field_at(&object.name, u64::try_from(at).ok()?)
        }
        // Only inside the object when its extent is known: a neighbouring
        // block on the line is not of its type.
        None => {
            let at = object.offset + i64::from(offset);
            let inside = object.size.is_none_or(|n| (0..n as i64).contains(&at));
            typed.as_ref().filter(|_| inside)?.field(f.line, offset)
        }
    };
    SharingEntry {
        line: format!("{:#x}", f.line),
        kind: f.kind.into(),
        invalidations: f.invalidations,
        invalidation_rate: f.invalidation_rate,
        samples: f.samples,
        cost_share: f.cost_share,
        cost_samples: f.samples,
        predicted_gain: None,
        threads: f.threads.clone(),
        processes: inputs
            .procs
            .as_ref()
            .map_or(Vec::new(), |p| p.group(&f.threads)),
        advice: advice(&f, &object, layout.as_ref(), &field),
        words: f
            .words
            .iter()
            .map(|w| WordEntry {
                offset: w.offset,
                reads: w.reads,
                writes: w.writes,
                threads: w.threads().into_iter().filter(|&t| t != 0).collect(),
                field: field(w.offset),
            })
            .collect(),
        object,
        code: code_sites(&f, inputs, names),
        dependences: Dependences {
            read_after_write: f.raw,
            write_after_write: f.waw,
            write_after_read: f.war,
        },
    }
}

/// Gives `object` its type: a global's from its layout, other memory's
/// from the pointers the sampled code went through (returned, to name
/// the words), named into a heap block's name.
fn type_object(
    f: &LineFinding,
    object: &mut SharedObject,
    layout: Option<&Layout>,
    inputs: &Inputs<'_>,
    names: &mut dyn Names,
) -> Option<LineType> {
    if let Some(l) = layout {
        object.type_name = match (&l.type_name, l.element, object.size) {
            (Some(t), Some(e), Some(n)) if e > 0 && n > e => Some(format!("{t}[{}]", n / e)),
            (t, _, _) => t.clone(),
        };
        return None;
    }
    // A shared-memory key is not an address: no element arithmetic.
    if object.kind == ObjectKind::Shared {
        return None;
    }
    let typed = line_type(f, inputs.maps, names)?;
    let label = typed.type_name.clone();
    if object.kind == ObjectKind::Heap {
        object.name = match object.name.strip_prefix(UNSEEN_BLOCK) {
            Some(rest) => format!("{label} in a {UNSEEN_BLOCK}{rest}"),
            None if object.name.contains(CHUNK_BLOCK) => object.name.replacen(
                "heap block allocated",
                &format!("heap block of {label} allocated"),
                1,
            ),
            None => {
                object
                    .name
                    .replacen("heap block from", &format!("heap block of {label} from"), 1)
            }
        };
    }
    object.type_name = Some(label);
    Some(typed)
}

/// The code touching the line, one entry per source line (instructions
/// of one line merged), most accesses first.
fn code_sites(f: &LineFinding, inputs: &Inputs<'_>, names: &mut dyn Names) -> Vec<SharingCode> {
    let mut code: BTreeMap<(String, Option<String>, Option<u32>, String), SharingCode> =
        BTreeMap::new();
    for c in &f.code {
        let chain = names.code_inlined(&inputs.maps.place(c.insn));
        let inlined_into = callers(&chain);
        let frame = chain.frame;
        let key = (
            frame.function.clone(),
            frame.file.clone(),
            frame.line,
            frame.module.clone(),
        );
        let e = code.entry(key).or_insert_with(|| SharingCode {
            function: frame.function,
            file: frame.file,
            line: frame.line,
            inlined_into,
            module: frame.module,
            reads: 0,
            writes: 0,
            threads: Vec::new(),
            offset: c.offset,
        });
        e.reads += c.reads;
        e.writes += c.writes;
        e.offset = e.offset.min(c.offset);
        let threads: BTreeSet<u32> = e.threads.iter().chain(&c.threads).copied().collect();
        e.threads = threads.into_iter().collect();
    }
    let mut code: Vec<SharingCode> = code.into_values().collect();
    code.sort_by_key(|c| std::cmp::Reverse(c.reads + c.writes));
    code.truncate(CODE_SITES);
    code
}

/// Names what lies on the line: a global (ELF symbol, with its DWARF
/// layout when there is debug info), a heap block (its allocation site), a
/// stack, or a mapping.
fn object_of(
    inputs: &Inputs<'_>,
    addr: u64,
    line: u64,
    names: &mut dyn Names,
) -> (SharedObject, Option<Layout>) {
    if is_shared_key(line) {
        // Keyed by object and offset: the offset is the line's in the
        // object (a file or a shared memory segment).
        let name = inputs.procs.as_ref().and_then(|p| (p.shared_name)(line));
        let object = SharedObject {
            kind: ObjectKind::Shared,
            name: name.unwrap_or_else(|| "shared memory".to_string()),
            offset: split_shared_key(line).1 as i64,
            size: None,
            alloc_site: None,
            type_name: None,
        };
        return (object, None);
    }
    let (maps, block, heap) = (inputs.maps, (inputs.line_block)(line), inputs.heap);
    if let Some((path, base)) = maps.data_owner(addr) {
        return global_object(&path, base, addr, line, names);
    }
    match (block, heap) {
        (Some(b), _) if b.site == HeapBlock::UNSEEN => {
            let global = (inputs.block_holder)(b.start).and_then(|w| global_name(maps, names, w));
            return (chunk_object(b, line, global), None);
        }
        (Some(b), Some(heap)) => return (heap_object(b, heap, line, names), None),
        _ => {}
    }
    let (kind, name) = match maps.place(addr) {
        Place::Region { name, .. } if &*name == "[heap]" => {
            (ObjectKind::Heap, UNSEEN_BLOCK.to_string())
        }
        Place::Region { name, .. } if name.starts_with("[stack") => {
            (ObjectKind::Stack, name.to_string())
        }
        Place::Region { name, .. } => (ObjectKind::Mapped, name.to_string()),
        Place::File { path, .. } => (ObjectKind::Mapped, path.to_string()),
        Place::Anonymous { .. } if heap.is_some_and(|h| h.maps_address(addr)) => {
            (ObjectKind::Heap, UNSEEN_BLOCK.to_string())
        }
        Place::Anonymous { .. } if maps.in_thread_stack(addr) => {
            (ObjectKind::Stack, "a thread's stack".to_string())
        }
        Place::Anonymous { .. } => (ObjectKind::Mapped, "anonymous memory".to_string()),
        Place::Unmapped { .. } => (ObjectKind::Unknown, "unmapped at the end".to_string()),
    };
    let object = SharedObject {
        kind,
        name,
        offset: 0,
        size: None,
        alloc_site: None,
        type_name: None,
    };
    (object, None)
}

/// The global at `addr` in the data of object file `path` (mapped with
/// file offset 0 at `base`), and its layout when there is debug info.
fn global_object(
    path: &Arc<str>,
    base: u64,
    addr: u64,
    line: u64,
    names: &mut dyn Names,
) -> (SharedObject, Option<Layout>) {
    let (name, offset, size, layout) = match names.data(path, base, addr) {
        Some(sym) => {
            let layout = names.data_layout(path, &sym.name);
            let offset = line as i64 - (addr - sym.offset) as i64;
            (sym.name, offset, sym.size, layout)
        }
        // Stripped: the object file and the address in it are all there
        // is; past the file's last segment, the address itself.
        None => (
            names
                .file_address(path, base, addr)
                .unwrap_or_else(|| format!("{addr:#x}")),
            0,
            None,
            None,
        ),
    };
    let object = SharedObject {
        kind: ObjectKind::Global,
        name,
        offset,
        size,
        alloc_site: None,
        type_name: None,
    };
    (object, layout)
}

/// A heap block the tracker did not see allocated, found from glibc's
/// chunk header: its start and usable size are known, its site is not.
fn chunk_object(b: HeapBlock, line: u64, global: Option<String>) -> SharedObject {
    SharedObject {
        kind: ObjectKind::Heap,
        name: holders::pointed_to_by(format!("{}-byte {CHUNK_BLOCK}", b.size), global),
        offset: line as i64 - b.start as i64,
        size: Some(b.size),
        alloc_site: None,
        type_name: None,
    }
}

/// The heap block under the line, named by its allocation site.
fn heap_object(b: HeapBlock, heap: &dyn Heap, line: u64, names: &mut dyn Names) -> SharedObject {
    // The first call outside the allocation wrappers, inlined or not.
    let site = heap.site_name(b.site, names);
    SharedObject {
        kind: ObjectKind::Heap,
        name: format!("{}-byte heap block from {}", b.size, site.label()),
        offset: line as i64 - b.start as i64,
        size: Some(b.size),
        alloc_site: Some(site.code_ref()),
        type_name: None,
    }
}

/// What to change, in words.
fn advice(
    f: &LineFinding,
    object: &SharedObject,
    layout: Option<&Layout>,
    field: &dyn Fn(u32) -> Option<String>,
) -> String {
    let parts: Vec<String> = f
        .parts
        .iter()
        .map(|&(tid, a, b)| {
            let mut names: Vec<String> = (a..b)
                .step_by(WORD_BYTES as usize)
                .filter_map(field)
                .collect();
            names.dedup();
            match names.is_empty() {
                true => format!("thread {tid} bytes {a}-{}", b - 1),
                false => format!("thread {tid} {}", names.join(", ")),
            }
        })
        .collect();
    // An array of structs whose size is not a multiple of the line.
    let element = layout.and_then(|l| {
        let size = l.element?;
        (size % LINE_BYTES != 0).then(|| {
            let ty = l.type_name.clone().unwrap_or_else(|| "the element".into());
            format!(
                " {ty} is {size} bytes, so neighbouring elements share lines: pad it to {} \
                 bytes or align it to {LINE_BYTES}.",
                size.div_ceil(LINE_BYTES) * LINE_BYTES
            )
        })
    });
    // CPUs whose prefetcher fetches lines in pairs share pairs of lines.
    let pair = 2 * LINE_BYTES;
    let layout_fix = format!(
        "Threads write different parts of this line ({}). Give each thread's part its own \
         cache line: align the per-thread element to {LINE_BYTES} bytes \
         (alignas({LINE_BYTES}) / __attribute__((aligned({LINE_BYTES}))), or \
         #[repr(align({LINE_BYTES}))] in Rust) or pad it to a multiple of {LINE_BYTES}; use \
         {pair} on CPUs whose prefetcher fetches lines in pairs (recent Intel).{}",
        parts.join(", "),
        element.unwrap_or_default()
    );
    let mut shared: Vec<String> = f
        .words
        .iter()
        .filter(|w| !w.writers.is_empty() && w.threads().len() >= 2)
        .map(|w| field(w.offset).unwrap_or_else(|| format!("byte {}", w.offset)))
        .collect();
    shared.dedup();
    let data = format!(
        "Several threads use the same written word ({}): the data itself is shared, \
         and padding cannot help. Give each thread its own copy and combine them at the \
         end, or update the shared value less often.",
        shared.join(", ")
    );
    let what = match object.kind {
        ObjectKind::Global | ObjectKind::Heap => format!(" ({})", object.name),
        _ => String::new(),
    };
    match f.kind {
        analysis::SharingKind::False => format!("{layout_fix}{what}"),
        analysis::SharingKind::True => format!("{data}{what}"),
        analysis::SharingKind::Mixed => format!("{layout_fix} {data}{what}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        features::sharing::analysis::Access,
        heap::fixture::FakeHeap,
        object::symbolize::{dwarf::Member, typed::AccessType},
        report::{
            fixtures::{program_maps, TableNames},
            model::CodeRef,
        },
    };

    /// `g_args`: four 24-byte `struct thread_arg` in the program's data.
    const G_ARGS: u64 = 0x5555_5555_8040;
    /// A line of the heap.
    const HEAP_LINE: u64 = 0x5555_5555_a100;
    /// A line of anonymous memory.
    const ANON_LINE: u64 = 0x7f00_0000_0100;
    /// The program's code.
    const CODE: u64 = 0x5555_5555_4000;

    /// `worker` at lines 10 (two instructions) and 20, `make_queue` at
    /// line 30; the layout of `g_args`.
    fn names() -> TableNames {
        let member = |name: &str, offset| Member {
            name: name.into(),
            offset,
        };
        TableNames::new()
            .function(0x10, "worker", 10)
            .function(0x11, "worker", 10)
            .function(0x20, "worker", 20)
            .function(0x30, "make_queue", 30)
            .global(G_ARGS, 96, "g_args")
            .layout(
                "g_args",
                Layout {
                    element: Some(24),
                    type_name: Some("struct thread_arg".into()),
                    struct_size: Some(24),
                    members: vec![member("sum", 0), member("count", 8), member("pad", 16)],
                },
            )
    }

    /// An 8-byte access by `tid` to `addr` from the instruction at `insn`
    /// in the program's code.
    fn access(tid: u32, insn: u64, addr: u64, write: bool) -> Access {
        Access {
            tid,
            insn: CODE + insn,
            addr,
            size: 8,
            read: !write,
            write,
            time_ns: 0,
            serial: false,
        }
    }

    /// Sampled accesses, the kernel's table of the lines in it, and the
    /// sample program's memory map.
    struct Session {
        sharing: SharingProfile,
        kernel: KernelLines,
        samples: u64,
        maps: ProcMaps,
        code: CodeSamples,
    }

    impl Session {
        fn new() -> Self {
            Self {
                code: CodeSamples::default(),
                sharing: SharingProfile::new(),
                kernel: KernelLines::default(),
                samples: 0,
                maps: program_maps(),
            }
        }

        /// Samples `accesses` (all on one line); with `in_table`, the
        /// kernel's line table holds the line too.
        fn line(mut self, accesses: &[Access], in_table: bool) -> Self {
            let mut state = LineState::default();
            for (i, &a) in accesses.iter().enumerate() {
                self.sharing.on_access(a);
                state.record(a.tid, a.write, i as u64 + 1);
            }
            self.samples += accesses.len() as u64;
            if in_table {
                let line = accesses[0].addr & !(LINE_BYTES - 1);
                self.kernel.lines.push((line, Some(state), None));
            }
            self
        }

        fn inputs<'a>(
            &'a self,
            heap: Option<&'a FakeHeap>,
            block: Option<HeapBlock>,
        ) -> Inputs<'a> {
            Inputs {
                sharing: &self.sharing,
                maps: &self.maps,
                heap: heap.map(|h| h as &dyn Heap),
                line_block: Box::new(move |_| block),
                block_holder: Box::new(|_| None),
                code: &self.code,
                procs: None,
            }
        }
    }

    /// `n` writes alternating between thread 1 at `a` and thread 2 at `b`.
    fn ping_pong(n: usize, a: (u64, u64), b: (u64, u64)) -> Vec<Access> {
        (0..n)
            .map(|i| match i % 2 {
                0 => access(1, a.0, a.1, true),
                _ => access(2, b.0, b.1, true),
            })
            .collect()
    }

    /// Thread 1 writes `g_args[0].sum` (from two instructions of line 10),
    /// thread 2 writes `g_args[1].sum` (line 20).
    fn false_sharing() -> Vec<Access> {
        let mut accesses = ping_pong(100, (0x10, G_ARGS), (0x20, G_ARGS + 24));
        for a in accesses.iter_mut().step_by(4) {
            a.insn = CODE + 0x11;
        }
        accesses
    }

    #[test]
    fn a_global_finding_names_its_fields_code_and_fix() {
        let s = Session::new().line(&false_sharing(), true);
        let entries = findings(
            &s.inputs(None, None),
            &s.kernel,
            2 * s.samples,
            &mut names(),
        );
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!(
            (e.line.as_str(), e.kind),
            ("0x555555558040", SharingKind::False)
        );
        assert_eq!((e.samples, e.threads.as_slice()), (100, [1, 2].as_slice()));
        assert!((e.cost_share - 0.5).abs() < 1e-9);
        assert_eq!(
            e.object,
            SharedObject {
                kind: ObjectKind::Global,
                name: "g_args".into(),
                offset: 0,
                size: Some(96),
                alloc_site: None,
                type_name: Some("struct thread_arg[4]".into()),
            }
        );
        let words: Vec<_> = e
            .words
            .iter()
            .map(|w| (w.offset, w.writes, w.threads.clone(), w.field.as_deref()))
            .collect();
        let sum0 = Some("g_args[0].sum");
        let sum1 = Some("g_args[1].sum");
        assert_eq!(
            words,
            [
                (0, 50, vec![1], sum0),
                (4, 50, vec![1], sum0),
                (24, 50, vec![2], sum1),
                (28, 50, vec![2], sum1),
            ]
        );
        // Two instructions of line 10 are one code site.
        let code: Vec<_> = e
            .code
            .iter()
            .map(|c| {
                (
                    c.function.as_str(),
                    c.line,
                    c.writes,
                    c.threads.clone(),
                    c.offset,
                )
            })
            .collect();
        assert_eq!(
            code,
            [
                ("worker", Some(10), 50, vec![1], 0),
                ("worker", Some(20), 50, vec![2], 24)
            ]
        );
        assert!(
            e.advice.starts_with(
                "Threads write different parts of this line (thread 1 g_args[0].sum, \
                 thread 2 g_args[1].sum)."
            ),
            "{}",
            e.advice
        );
        assert!(e.advice.contains(
            "Give each thread's part its own cache line: align the per-thread element to 64 \
             bytes (alignas(64) / __attribute__((aligned(64))), or #[repr(align(64))] in Rust) \
             or pad it to a multiple of 64; use 128 on CPUs whose prefetcher fetches lines in \
             pairs (recent Intel)."
        ));
        assert!(e.advice.contains(
            "struct thread_arg is 24 bytes, so neighbouring elements share lines: pad it to 64 \
             bytes or align it to 64."
        ));
        assert!(e.advice.ends_with(" (g_args)"), "{}", e.advice);
        assert_eq!(e.dependences.write_after_write, 99);
    }

    /// An allocation made in a helper inlined into its caller is named at
    /// the helper's line, and says where it was inlined.
    #[test]
    fn an_inlined_allocation_site_carries_its_inline_chain() {
        let s = Session::new().line(
            &ping_pong(100, (0x10, HEAP_LINE + 32), (0x20, HEAP_LINE + 32)),
            true,
        );
        let heap = FakeHeap::default().site(0x30, crate::report::fixtures::code_at(0x30));
        let block = HeapBlock {
            start: HEAP_LINE + 32,
            size: 64,
            site: 0x30,
        };
        let mut names = names()
            .inlined_into(0x30, "setup", 40)
            .inlined_into(0x30, "main", 50);
        let entries = findings(
            &s.inputs(Some(&heap), Some(block)),
            &s.kernel,
            s.samples,
            &mut names,
        );
        let object = &entries[0].object;
        assert_eq!(object.name, "64-byte heap block from prog.c:30");
        let site = object.alloc_site.as_ref().unwrap();
        assert_eq!(
            (site.function.as_str(), site.line),
            ("make_queue", Some(30))
        );
        let chain: Vec<_> = site
            .inlined_into
            .iter()
            .map(|c| (c.function.as_str(), c.line))
            .collect();
        assert_eq!(chain, [("setup", Some(40)), ("main", Some(50))]);
    }

    #[test]
    fn a_heap_line_is_named_by_its_allocation_site() {
        // Both threads write the same word, 32 bytes into the line, where
        // a block starts.
        let s = Session::new().line(
            &ping_pong(100, (0x10, HEAP_LINE + 32), (0x20, HEAP_LINE + 32)),
            true,
        );
        let heap = FakeHeap::default().site(0x30, crate::report::fixtures::code_at(0x30));
        let block = HeapBlock {
            start: HEAP_LINE + 32,
            size: 64,
            site: 0x30,
        };
        let entries = findings(
            &s.inputs(Some(&heap), Some(block)),
            &s.kernel,
            s.samples,
            &mut names(),
        );
        let e = &entries[0];
        assert_eq!(e.kind, SharingKind::True);
        assert_eq!(
            e.object,
            SharedObject {
                kind: ObjectKind::Heap,
                name: "64-byte heap block from prog.c:30".into(),
                offset: -32,
                size: Some(64),
                alloc_site: Some(CodeRef {
                    function: "make_queue".into(),
                    file: Some("/src/prog.c".into()),
                    line: Some(30),
                    inlined_into: vec![],
                    via: None,
                }),
                type_name: None,
            }
        );
        assert!(
            e.advice
                .starts_with("Several threads use the same written word (byte 32, byte 36)"),
            "{}",
            e.advice
        );
        assert!(e.advice.ends_with(" (64-byte heap block from prog.c:30)"));
    }

    /// A block the tracker never saw, found from its chunk header (no
    /// heap at all): sized and placed, no site claimed.
    #[test]
    fn a_block_from_its_chunk_header_is_sized_without_a_site() {
        let s = Session::new().line(
            &ping_pong(100, (0x10, HEAP_LINE + 32), (0x20, HEAP_LINE + 40)),
            true,
        );
        let block = HeapBlock {
            start: HEAP_LINE + 32,
            size: 56,
            site: HeapBlock::UNSEEN,
        };
        let entries = findings(
            &s.inputs(None, Some(block)),
            &s.kernel,
            s.samples,
            &mut names(),
        );
        let o = &entries[0].object;
        assert_eq!(
            (
                o.kind,
                o.name.as_str(),
                o.offset,
                o.size,
                o.alloc_site.is_none()
            ),
            (
                ObjectKind::Heap,
                "56-byte heap block allocated before tracing (usable size from its malloc chunk)",
                -32,
                Some(56),
                true
            )
        );
    }

    /// Two threads write `hits` of their own `struct counters` (8 bytes)
    /// in one 16-byte block, through pointers the debug info types: the
    /// object and its words are named by the type, the bytes outside the
    /// block by nothing.
    #[test]
    fn a_heap_line_is_typed_from_the_code_s_pointers() {
        let start = HEAP_LINE + 32;
        let s = Session::new().line(&ping_pong(100, (0x10, start), (0x20, start + 8)), true);
        let heap = FakeHeap::default().site(0x30, crate::report::fixtures::code_at(0x30));
        let block = HeapBlock {
            start,
            size: 16,
            site: 0x30,
        };
        let member = |name: &str, offset| Member {
            name: name.into(),
            offset,
        };
        let counters = AccessType {
            layout: Layout {
                element: None,
                type_name: Some("struct counters".into()),
                struct_size: Some(8),
                members: vec![member("hits", 0), member("misses", 4)],
            },
            disp: 0,
            indexed: false,
            variable: "c".into(),
        };
        let mut names = names()
            .access_type(0x10, counters.clone())
            .access_type(0x20, counters);
        let entries = findings(
            &s.inputs(Some(&heap), Some(block)),
            &s.kernel,
            s.samples,
            &mut names,
        );
        let e = &entries[0];
        assert_eq!(e.kind, SharingKind::False);
        assert_eq!(e.object.type_name.as_deref(), Some("struct counters"));
        assert_eq!(
            e.object.name,
            "16-byte heap block of struct counters from prog.c:30"
        );
        let fields: Vec<(u32, Option<&str>)> = e
            .words
            .iter()
            .map(|w| (w.offset, w.field.as_deref()))
            .collect();
        // The fixture's accesses are 8 bytes: each covers a `misses` too.
        let expected = [
            (32, Some("hits")),
            (36, Some("misses")),
            (40, Some("hits")),
            (44, Some("misses")),
        ];
        assert_eq!(fields, expected, "{e:#?}");
        assert!(e.advice.contains("hits"), "{}", e.advice);
        // Untyped code: no type, no field.
        let entries = findings(
            &s.inputs(Some(&heap), Some(block)),
            &s.kernel,
            s.samples,
            &mut super::tests::names(),
        );
        assert_eq!(entries[0].object.type_name, None);
        assert!(entries[0].words.iter().all(|w| w.field.is_none()));
    }

    #[test]
    fn findings_rank_by_cost_and_leave_out_the_rest() {
        let s = Session::new()
            .line(&false_sharing(), true)
            .line(
                &ping_pong(300, (0x10, ANON_LINE), (0x20, ANON_LINE + 8)),
                true,
            )
            // Shared and written, but the kernel's table dropped it.
            .line(
                &ping_pong(400, (0x10, HEAP_LINE), (0x20, HEAP_LINE + 8)),
                false,
            );
        let entries = findings(&s.inputs(None, None), &s.kernel, s.samples, &mut names());
        let lines: Vec<&str> = entries.iter().map(|e| e.line.as_str()).collect();
        assert_eq!(lines, ["0x7f0000000100", "0x555555558040"]);
        assert_eq!(entries[0].object.kind, ObjectKind::Mapped);
        assert_eq!(entries[0].object.name, "anonymous memory");
        assert!(!entries[0].advice.contains("(anonymous memory)"));
    }

    #[test]
    fn the_busiest_lines_not_reported_say_why() {
        let reads = [
            access(1, 0x10, HEAP_LINE, false),
            access(2, 0x20, HEAP_LINE, false),
        ];
        let alone = vec![access(1, 0x10, ANON_LINE, true); 30];
        // The busiest line is a finding: not in the list.
        let s = Session::new()
            .line(&false_sharing(), true)
            .line(&reads.repeat(20), true)
            .line(&alone, true)
            .line(
                &ping_pong(20, (0x10, G_ARGS + 64), (0x20, G_ARGS + 72)),
                false,
            )
            .line(
                &ping_pong(4, (0x10, ANON_LINE + 64), (0x20, ANON_LINE + 72)),
                true,
            );
        let dismissed = dismissals(&s.inputs(None, None), &s.kernel, s.samples, &mut names());
        let why: Vec<_> = dismissed
            .iter()
            .map(|d| {
                (
                    d.line.as_str(),
                    d.object.as_str(),
                    d.object_kind,
                    d.samples,
                    d.writes,
                    d.shared,
                    d.reason,
                )
            })
            .collect();
        assert_eq!(
            why,
            [
                (
                    "0x55555555a100",
                    UNSEEN_BLOCK,
                    ObjectKind::Heap,
                    40,
                    0,
                    true,
                    DismissReason::NoWrites
                ),
                (
                    "0x7f0000000100",
                    "anonymous memory",
                    ObjectKind::Mapped,
                    30,
                    30,
                    false,
                    DismissReason::OneThread
                ),
                // g_args+64, evicted from the kernel's table, is judged
                // on its samples: a finding, not in this list.
                (
                    "0x7f0000000140",
                    "anonymous memory",
                    ObjectKind::Mapped,
                    4,
                    4,
                    true,
                    DismissReason::FewInvalidations
                ),
            ]
        );
    }

    #[test]
    fn what_lies_on_a_line_without_a_symbol_or_block() {
        let sharing = SharingProfile::new();
        // The allocator mmapped 64 KiB.
        let heap = FakeHeap::default().mapped(0x7f00_0001_0000, 0x1_0000);
        let inputs = Inputs {
            sharing: &sharing,
            maps: &program_maps(),
            heap: Some(&heap),
            line_block: Box::new(|_| None),
            block_holder: Box::new(|_| None),
            code: &CodeSamples::default(),
            procs: None,
        };
        let mut names = TableNames::new();
        let mut object = |addr: u64| {
            let (o, layout) = object_of(&inputs, addr, addr & !(LINE_BYTES - 1), &mut names);
            assert_eq!(layout, None);
            (o.kind, o.name, o.offset)
        };
        assert_eq!(
            object(G_ARGS),
            (ObjectKind::Global, "prog+0x4040".into(), 0),
            "stripped"
        );
        assert_eq!(
            object(HEAP_LINE),
            (ObjectKind::Heap, UNSEEN_BLOCK.into(), 0)
        );
        assert_eq!(
            object(0x7f00_0001_0040),
            (ObjectKind::Heap, UNSEEN_BLOCK.into(), 0),
            "mapped by the allocator"
        );
        assert_eq!(
            object(ANON_LINE),
            (ObjectKind::Mapped, "anonymous memory".into(), 0)
        );
        assert_eq!(
            object(0x7fff_ffff_0000),
            (ObjectKind::Stack, "[stack]".into(), 0)
        );
        assert_eq!(
            object(0x1000),
            (ObjectKind::Unknown, "unmapped at the end".into(), 0)
        );
        // Past the file's last segment the file holds nothing: the name
        // is the address, not an offset that `nm` would not know.
        let mut names = TableNames::new().file_ends_at(0x4040);
        let (o, _) = object_of(&inputs, G_ARGS, G_ARGS, &mut names);
        assert_eq!(o.name, format!("{G_ARGS:#x}"));
    }

    /// The report's names are the analysis's.
    #[test]
    fn report_names_are_the_analysis_names() {
        use analysis::SharingKind as Kind;
        for k in [Kind::False, Kind::True, Kind::Mixed] {
            assert_eq!(SharingKind::from(k).name(), k.name());
        }
        for d in [
            Dismissal::OneThread,
            Dismissal::NoWrites,
            Dismissal::NotInTable,
            Dismissal::FewInvalidations,
            Dismissal::ReadMostly,
            Dismissal::LowCost,
            Dismissal::NothingWrittenShared,
        ] {
            assert_eq!(DismissReason::from(d).name(), d.reason());
        }
    }
}
