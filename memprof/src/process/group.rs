//! Several traced processes: the other `-p` pids and the children the
//! traced processes fork. Each has its own memory map (an unrelated process
//! maps other code at the same addresses) and code layout (recipes are
//! keyed by it), and its `MAP_SHARED` mappings, which the sampler and the
//! analysis key by object and offset so that processes meet on them.
//!
//! The features see one [`Process`]; while a record of another process is
//! handed to them, that process's view is swapped in ([`Process::enter`]).

use std::sync::Arc;

use memprof_common::{
    procs::{split_shared_key, translate, SharedRange, LAYOUT_UNKNOWN, SHARED_RANGES_PER_PROCESS},
    TaskEvent, TASK_EXEC, TASK_EXIT, TASK_NEW_PROCESS, TASK_NEW_THREAD,
};

use super::{maps::ProcMaps, procfs, state::Process, threads::ThreadEvent};

/// One process's own part of [`Process`] while another's is current.
pub(super) struct View {
    pid: u32,
    maps: ProcMaps,
    maps_read_at: Option<u64>,
    before_exec: Option<(u64, ProcMaps)>,
    layout: u32,
    shared: Vec<SharedRange>,
}

/// What the kernel must learn of the traced processes.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KernelUpdates {
    /// New code layouts (a process added, or a child's exec).
    pub layouts: Vec<(u32, u32)>,
    /// Each changed process's shared mappings (all of them).
    pub shared: Vec<(u32, Vec<SharedRange>)>,
}

impl KernelUpdates {
    pub fn is_empty(&self) -> bool {
        self.layouts.is_empty() && self.shared.is_empty()
    }
}

impl Process {
    /// The main process (the launched command, or the first `-p` pid).
    pub fn main_pid(&self) -> u32 {
        self.main
    }

    /// Threads of all the traced processes running at `time_ns`.
    pub fn threads_at(&self, time_ns: u64) -> i64 {
        self.live.count_at(time_ns) + self.others_live.count_at(time_ns)
    }

    /// The current view's code layout.
    pub fn layout(&self) -> u32 {
        self.layout
    }

    /// The process of thread `tid` (the main one unless seen in another).
    pub fn tgid(&self, tid: u32) -> u32 {
        self.tgid_of.get(&tid).copied().unwrap_or(self.main)
    }

    /// Thread `tid` was sampled in process `tgid` (0: unknown).
    pub fn saw_thread(&mut self, tid: u32, tgid: u32) {
        if tgid != 0 && tgid != self.main {
            self.tgid_of.entry(tid).or_insert(tgid);
        }
    }

    /// Every traced process seen, main first.
    pub fn pids(&self) -> Vec<u32> {
        let mut others: Vec<u32> = self.others.keys().copied().collect();
        if self.pid != self.main {
            others.push(self.pid);
        }
        others.retain(|&p| p != self.main);
        others.sort_unstable();
        std::iter::once(self.main).chain(others).collect()
    }

    /// What the report says of the forked children followed, if any.
    pub fn children_note(&self) -> Option<String> {
        let (joined, forked): (Vec<u32>, Vec<u32>) = self
            .pids()
            .into_iter()
            .filter(|p| !self.listed.contains(p) && *p != self.main)
            .partition(|p| self.joined.contains(p));
        let list = |pids: &[u32]| {
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let what = match (forked.is_empty(), joined.is_empty()) {
            (true, true) => return None,
            (false, true) => format!(
                "followed {} forked child process(es) (pid {})",
                forked.len(),
                list(&forked)
            ),
            (true, false) => format!(
                "traced {} process(es) that joined the cgroup (pid {})",
                joined.len(),
                list(&joined)
            ),
            (false, false) => format!(
                "followed {} forked child process(es) (pid {}) and {} that joined the cgroup \
                 (pid {})",
                forked.len(),
                list(&forked),
                joined.len(),
                list(&joined)
            ),
        };
        Some(format!(
            "{what}: CPU sampling and false sharing cover them; the allocator and lock probes \
             follow pid {} only",
            self.main
        ))
    }

    /// Also traces process `pid` (another `-p` pid); its threads are
    /// returned as `Existing` thread events. It shares the layout of a
    /// process already traced whose code is mapped at the same places.
    pub fn add_process(&mut self, pid: u32) -> Vec<ThreadEvent> {
        let signature = |maps: &ProcMaps| exec_signature(maps);
        let mut known: Vec<(Vec<_>, u32)> = self
            .others
            .values()
            .map(|v| (signature(&v.maps), v.layout))
            .collect();
        known.push((signature(&self.maps), self.layout));
        self.listed.push(pid);
        self.enter(pid);
        let mine = signature(&self.maps);
        self.layout = match known.iter().find(|(s, _)| *s == mine) {
            Some((_, layout)) => *layout,
            None => self.new_layout(),
        };
        self.layout_dirty.push((pid, self.layout));
        self.leave();
        let tids = procfs::list_threads(pid);
        self.others_live.add_initial(tids.len());
        tids.into_iter()
            .map(|tid| {
                self.tgid_of.insert(tid, pid);
                self.known.insert(tid);
                self.know_thread(tid);
                ThreadEvent::Existing { tid }
            })
            .collect()
    }

    /// Process `pid`, added with [`Self::add_process`], joined the traced
    /// cgroup during the session (it was not listed by the user).
    pub fn mark_joined(&mut self, pid: u32) {
        self.listed.retain(|&p| p != pid);
        if !self.joined.contains(&pid) {
            self.joined.push(pid);
        }
    }

    fn new_layout(&mut self) -> u32 {
        if self.layouts >= LAYOUT_UNKNOWN {
            return LAYOUT_UNKNOWN; // out of layouts: no addresses for it
        }
        self.layouts += 1;
        self.layouts - 1
    }

    /// Makes process `tgid`'s view the current one (0: the main
    /// process). A process not seen yet gets a view with its map read now
    /// and an unknown layout.
    pub fn enter(&mut self, tgid: u32) {
        let tgid = if tgid == 0 { self.main } else { tgid };
        if tgid == self.pid {
            return;
        }
        let (view, fresh) = match self.others.remove(&tgid) {
            Some(view) => (view, false),
            None => (View::empty(tgid), true),
        };
        let old = self.swap_view(view);
        self.others.insert(old.pid, old);
        if fresh {
            // Its ranges are installed even when it has none: the
            // kernel's slots may be a former process's of that pid.
            self.kernel_dirty.insert(tgid);
            self.refresh_maps();
        }
    }

    /// Back to the main process's view.
    pub fn leave(&mut self) {
        self.enter(self.main);
    }

    fn swap_view(&mut self, mut view: View) -> View {
        std::mem::swap(&mut self.pid, &mut view.pid);
        std::mem::swap(&mut self.maps, &mut view.maps);
        std::mem::swap(&mut self.maps_read_at, &mut view.maps_read_at);
        std::mem::swap(&mut self.before_exec, &mut view.before_exec);
        std::mem::swap(&mut self.layout, &mut view.layout);
        std::mem::swap(&mut self.shared, &mut view.shared);
        view
    }

    /// The line-table key of data address `addr` in the current process:
    /// its shared-memory key if a shared mapping holds it, else itself.
    pub fn shared_key(&self, addr: u64) -> u64 {
        translate(&self.shared, addr)
    }

    /// What a shared-memory key's object is (`/dev/shm/NAME`, a file path,
    /// `[anon shared]`).
    pub fn shared_name(&self, key: u64) -> Option<&str> {
        self.shared_names
            .get(&split_shared_key(key).0)
            .map(String::as_str)
    }

    /// What changed for the kernel since the last call.
    pub fn take_kernel_updates(&mut self) -> KernelUpdates {
        let layouts = std::mem::take(&mut self.layout_dirty);
        let shared = std::mem::take(&mut self.kernel_dirty)
            .into_iter()
            .map(|pid| {
                let ranges = if pid == self.pid {
                    self.shared.clone()
                } else {
                    self.others
                        .get(&pid)
                        .map_or(Vec::new(), |v| v.shared.clone())
                };
                (pid, ranges)
            })
            .collect();
        KernelUpdates { layouts, shared }
    }

    /// A thread record of another process than the main one.
    pub(super) fn on_other_task(&mut self, ev: &TaskEvent) -> Option<ThreadEvent> {
        match ev.kind {
            TASK_NEW_PROCESS | TASK_NEW_THREAD => {
                if ev.kind == TASK_NEW_PROCESS
                    && ev.parent_tid == 0
                    && !self.joined.contains(&ev.tgid)
                {
                    // Started in the traced cgroup: its exec follows.
                    self.joined.push(ev.tgid);
                }
                if ev.kind == TASK_NEW_PROCESS {
                    // A fork: the child's code is its parent's. A view
                    // left by an earlier process of that pid is stale.
                    let parent = self.tgid(ev.parent_tid);
                    let layout = self.layout_of(parent);
                    self.others.remove(&ev.tgid);
                    self.enter(ev.tgid);
                    self.layout = layout;
                    self.leave();
                }
                self.tgid_of.insert(ev.tid, ev.tgid);
                self.known.insert(ev.tid);
                self.others_live.change(ev.time_ns, 1);
                Some(ThreadEvent::Created {
                    tid: ev.tid,
                    parent: ev.parent_tid,
                    time_ns: ev.time_ns,
                })
            }
            TASK_EXIT => {
                self.others_live.change(ev.time_ns, -1);
                let comm = ev.comm_str();
                if !comm.is_empty() {
                    self.names.insert(ev.tid, comm.to_string());
                }
                Some(ThreadEvent::Exited {
                    tid: ev.tid,
                    time_ns: ev.time_ns,
                })
            }
            TASK_EXEC => {
                // Its own new image: a layout of its own (the kernel gave
                // it none meanwhile), the old map kept for late records.
                self.commands.remove(&ev.tgid);
                self.enter(ev.tgid);
                self.before_exec = Some((ev.time_ns, self.maps.clone()));
                self.refresh_maps();
                self.layout = self.new_layout();
                self.layout_dirty.push((ev.tgid, self.layout));
                self.leave();
                self.tgid_of.insert(ev.tid, ev.tgid);
                self.know_thread(ev.tid);
                None
            }
            other => {
                tracing::warn!("unknown task event kind {other}");
                None
            }
        }
    }

    fn layout_of(&self, pid: u32) -> u32 {
        if pid == self.pid {
            return self.layout;
        }
        self.others.get(&pid).map_or(LAYOUT_UNKNOWN, |v| v.layout)
    }
}

impl View {
    fn empty(pid: u32) -> Self {
        Self {
            pid,
            maps: ProcMaps::default(),
            maps_read_at: None,
            before_exec: None,
            layout: LAYOUT_UNKNOWN,
            shared: Vec::new(),
        }
    }
}

/// Where the code is: the executable file mappings. Two processes with the
/// same have the same instructions at the same addresses.
fn exec_signature(maps: &ProcMaps) -> Vec<(u64, u64, u64, Arc<str>)> {
    maps.mappings()
        .iter()
        .filter(|m| m.executable)
        .map(|m| (m.start, m.end, m.offset, m.name.clone()))
        .collect()
}

/// The writable `MAP_SHARED` mappings of `maps` backed by an object (a
/// file, a `/dev/shm` or SysV segment, shared anonymous memory), the
/// first [`SHARED_RANGES_PER_PROCESS`]; their objects' names go to
/// `names`.
pub fn shared_ranges(
    maps: &ProcMaps,
    names: &mut std::collections::HashMap<u64, String>,
) -> Vec<SharedRange> {
    maps.mappings()
        .iter()
        .filter(|m| m.shared && m.writable && m.inode != 0)
        .take(SHARED_RANGES_PER_PROCESS as usize)
        .map(|m| {
            let range = SharedRange::new(m.start, m.end, m.dev, m.inode, m.offset);
            names
                .entry(split_shared_key(range.key_base).0)
                .or_insert_with(|| shared_object_name(&m.name));
            range
        })
        .collect()
}

/// How the report names a shared object: its path, except for shared
/// anonymous memory (`/dev/zero`, deleted) and SysV segments.
pub fn shared_object_name(name: &str) -> String {
    if name == "/dev/zero" || name.is_empty() {
        "[anon shared]".to_string()
    } else if let Some(key) = name.strip_prefix("/SYSV") {
        format!("[SysV shm key 0x{key}]")
    } else {
        name.to_string()
    }
}

/// [`untraced_children_note`] for the children `main` has now.
pub fn children_left_out(main: u32, traced: &[u32], follow_children: bool) -> Option<String> {
    let children = super::procfs::child_processes(main);
    untraced_children_note(main, traced, &children, follow_children)
}

/// What the report says when the attached process `main` has child
/// processes that were running before tracing began and are not among
/// the other `traced` pids: only the children it forks later are
/// followed (with `follow_children`), so a parent that hands its work to
/// workers (as `stress-ng` does) shows an idle process. `children`: (pid,
/// name).
pub fn untraced_children_note(
    main: u32,
    traced: &[u32],
    children: &[(u32, String)],
    follow_children: bool,
) -> Option<String> {
    let left: Vec<&(u32, String)> = children
        .iter()
        .filter(|(p, _)| !traced.contains(p))
        .collect();
    let first = left.first()?;
    const SHOWN: usize = 4;
    let mut list: Vec<String> = left
        .iter()
        .take(SHOWN)
        .map(|(p, name)| format!("{p} {name}"))
        .collect();
    if left.len() > SHOWN {
        list.push(format!("and {} more", left.len() - SHOWN));
    }
    let all: Vec<String> = std::iter::once(main)
        .chain(traced.iter().copied())
        .chain(left.iter().map(|(p, _)| *p))
        .map(|p| p.to_string())
        .collect();
    Some(format!(
        "pid {main} has {} child process(es) started before tracing ({}): they are not \
         traced{}; their own work needs -p {} (the allocator and lock probes follow the first \
         pid) or -p {} for CPU sampling and false sharing in all",
        left.len(),
        list.join(", "),
        if follow_children {
            " (only children it forks while traced are)"
        } else {
            ""
        },
        first.0,
        all.join(",")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_running_before_tracing_are_named_unless_traced() {
        let kids = [
            (11, "stress-ng-mutex".to_string()),
            (12, "stress-ng-mutex".to_string()),
        ];
        let note = untraced_children_note(10, &[], &kids, true).expect("a note");
        assert!(
            note.contains("2 child process(es)")
                && note.contains("11 stress-ng-mutex, 12 stress-ng-mutex")
                && note.contains("while traced are")
                && note.contains("-p 11 ")
                && note.contains("-p 10,11,12 "),
            "{note}"
        );
        // Pids listed already stay in the list suggested.
        let note = untraced_children_note(10, &[11, 30], &kids, false).expect("one left");
        assert!(
            note.contains("1 child process(es) started before tracing (12 ")
                && note.contains("-p 12 ")
                && note.contains("-p 10,11,30,12 ")
                && !note.contains("while traced"),
            "{note}"
        );
        assert_eq!(untraced_children_note(10, &[11, 12], &kids, true), None);
        assert_eq!(untraced_children_note(10, &[], &[], true), None);
    }

    const MAPS: &str = "\
55d0c8a01000-55d0c8a02000 r-xp 00001000 fe:01 123 /tmp/prog
7f0000000000-7f0000001000 rw-s 00000000 00:01 2048 /dev/zero (deleted)
7f0000001000-7f0000003000 rw-s 00001000 00:19 77 /dev/shm/box
7f0000003000-7f0000004000 r--s 00000000 fe:01 99 /usr/share/ro
7f0000004000-7f0000005000 rw-s 00000000 00:01 5 /SYSV0000abcd (deleted)
7f0000005000-7f0000006000 rw-p 00000000 00:00 0 
";

    #[test]
    fn writable_shared_mappings_are_translated_and_named() {
        let maps = ProcMaps::parse(MAPS);
        let mut names = std::collections::HashMap::new();
        let ranges = shared_ranges(&maps, &mut names);
        assert_eq!(ranges.len(), 3, "read-only and private ones are left out");
        let anon = translate(&ranges, 0x7f00_0000_0048);
        assert!(memprof_common::procs::is_shared_key(anon));
        assert_eq!(names[&split_shared_key(anon).0], "[anon shared]");
        let shm = translate(&ranges, 0x7f00_0000_1010);
        assert_eq!(split_shared_key(shm).1, 0x1010, "file offset 0x1000 + 0x10");
        assert_eq!(names[&split_shared_key(shm).0], "/dev/shm/box");
        let sysv = translate(&ranges, 0x7f00_0000_4000);
        assert_eq!(
            names[&split_shared_key(sysv).0],
            "[SysV shm key 0x0000abcd]"
        );
        assert_eq!(translate(&ranges, 0x7f00_0000_5000), 0x7f00_0000_5000);
    }

    #[test]
    fn views_swap_and_threads_find_their_process() {
        let me = std::process::id();
        let (mut p, _) = Process::new(me);
        let main_maps = p.maps().mappings().len();
        // A child of ours: this test process's own pid stands for it with
        // another number; use a gone pid, whose view stays empty.
        let child = u32::MAX - 3;
        let fork = TaskEvent {
            time_ns: 1,
            kind: TASK_NEW_PROCESS,
            tid: child,
            tgid: child,
            parent_tid: me,
            ..Default::default()
        };
        assert!(matches!(
            p.on_task(&fork),
            Some(super::super::state::TaskChange::Thread(
                ThreadEvent::Created { .. }
            ))
        ));
        assert_eq!(p.tgid(child), child);
        assert_eq!(p.tgid(me), me);
        assert_eq!(p.pids(), vec![me, child]);
        p.enter(child);
        assert_eq!(
            (p.pid(), p.layout()),
            (child, 0),
            "a fork keeps its parent's layout"
        );
        assert!(p.maps().is_empty());
        p.leave();
        assert_eq!((p.pid(), p.maps().mappings().len()), (me, main_maps));
        // Its exec: a layout of its own, for the kernel to learn.
        let exec = TaskEvent {
            kind: TASK_EXEC,
            ..fork
        };
        assert!(p.on_task(&exec).is_none(), "not the main process's exec");
        let updates = p.take_kernel_updates();
        assert_eq!(updates.layouts, vec![(child, 1)]);
        assert!(
            updates
                .shared
                .iter()
                .any(|(pid, r)| *pid == child && r.is_empty()),
            "a new process's slots are emptied: {updates:?}"
        );
        let note = p.children_note().expect("a note on the child");
        assert!(note.contains(&format!("pid {child}")), "{note}");
    }

    /// A process the kernel adopted in the traced cgroup (announced with
    /// no parent, then its exec) is traced with a layout of its own and
    /// named as started in the cgroup, not as a forked child.
    #[test]
    fn a_process_started_in_the_cgroup_is_not_a_forked_child() {
        let me = std::process::id();
        let (mut p, _) = Process::new(me);
        let (joined, forked) = (u32::MAX - 5, u32::MAX - 6);
        let start = |pid, parent| TaskEvent {
            time_ns: 1,
            kind: TASK_NEW_PROCESS,
            tid: pid,
            tgid: pid,
            parent_tid: parent,
            ..Default::default()
        };
        p.on_task(&start(joined, 0));
        p.on_task(&TaskEvent {
            kind: TASK_EXEC,
            ..start(joined, 0)
        });
        assert_eq!(p.pids(), vec![me, joined]);
        assert_eq!(p.take_kernel_updates().layouts, vec![(joined, 1)]);
        let note = p.children_note().expect("a note");
        assert!(
            note.contains(&format!(
                "1 process(es) that joined the cgroup (pid {joined})"
            )) && !note.contains("forked"),
            "{note}"
        );
        p.on_task(&start(forked, me));
        let note = p.children_note().expect("a note");
        assert!(
            note.contains(&format!("1 forked child process(es) (pid {forked})"))
                && note.contains(&format!("joined the cgroup (pid {joined})")),
            "{note}"
        );
    }

    #[test]
    fn another_pid_with_the_same_code_shares_the_layout() {
        let me = std::process::id();
        let (mut p, _) = Process::new(me);
        // This very process again under another name would be the same
        // code; an unrelated one (pid 1) is not.
        let threads = p.add_process(1);
        assert!(!threads.is_empty(), "pid 1's threads");
        let updates = p.take_kernel_updates();
        assert_eq!(updates.layouts, vec![(1, 1)], "other code: its own layout");
        assert_eq!(p.tgid(1), 1);
        assert_eq!(p.children_note(), None, "a listed pid is no forked child");
    }
}
