//! What every feature needs to know about the target while it runs: its
//! memory map (re-read when an address is not in it, and kept from before
//! an `exec` for late records of the old image), its threads' names and
//! live count, the launch gate, and its object files' bytes.

use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

use memprof_common::{
    procs::SharedRange, SampleEvent, TaskEvent, TASK_EXEC, TASK_EXIT, TASK_NEW_THREAD,
};

use crate::kernel::windows::ktime_ns;

use super::{
    files::FileCache,
    group::View,
    maps::{call_of, Mapping, Place, ProcMaps},
    procfs,
    threads::{LiveThreads, ThreadEvent},
};

/// How often an unknown address may trigger a re-read of the memory map.
pub const MAPS_REFRESH_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Samples held while waiting for a launched command's `exec`.
const MAX_HELD_SAMPLES: usize = 100_000;

/// The target as the features see it: the main process, and the other
/// traced processes (`-p` pids, forked children), each with its own memory
/// map. While a record of another process is handed to the features, its
/// view is the current one ([`Process::enter`]); otherwise the main
/// process's is.
pub struct Process {
    pub(super) pid: u32,
    pub(super) maps: ProcMaps,
    /// When the map was last read (`CLOCK_MONOTONIC` ns, the clock of
    /// the records' times).
    pub(super) maps_read_at: Option<u64>,
    /// The memory map before the last `exec`, with the exec's time: records
    /// taken before it but drained after it belong to the old image.
    pub(super) before_exec: Option<(u64, ProcMaps)>,
    /// Code layout of the current view (`memprof_common::procs`).
    pub(super) layout: u32,
    /// Its `MAP_SHARED` mappings, as installed for the sampler.
    pub(super) shared: Vec<SharedRange>,
    /// The main process's pid and the other processes' views.
    pub(super) main: u32,
    pub(super) others: HashMap<u32, View>,
    /// Threads of the other processes alive over time.
    pub(super) others_live: LiveThreads,
    /// Process of each thread seen in another process than the main one.
    pub(super) tgid_of: HashMap<u32, u32>,
    /// Processes whose shared mappings or layout the kernel must learn.
    pub(super) kernel_dirty: HashSet<u32>,
    /// The other `-p` pids (not followed children).
    pub(super) listed: Vec<u32>,
    /// Processes that joined during the session: started in the traced
    /// cgroup (announced with no parent).
    pub(super) joined: Vec<u32>,
    /// Processes whose code layout the kernel must learn.
    pub(super) layout_dirty: Vec<(u32, u32)>,
    /// Layouts given out so far (0: the main process's).
    pub(super) layouts: u32,
    /// What each shared object is, by its key's object hash.
    pub(super) shared_names: HashMap<u64, String>,
    pub(super) names: HashMap<u32, String>,
    /// Thread ids in the target's pid namespace, where they differ.
    pub(super) ns_tids: HashMap<u32, Option<u32>>,
    /// Each traced process's command line, read when its first thread
    /// was named (it may be gone by the report).
    pub(super) commands: HashMap<u32, String>,
    /// For a launched command: samples held until its `exec`, because
    /// those taken before it are of our launch gate, not of the command.
    held: Option<Vec<SampleEvent>>,
    /// Time of that `exec`: records older than it, drained later, are the
    /// gate's too.
    launch_exec_ns: Option<u64>,
    /// Samples dropped because the hold buffer was full.
    pub dropped: u64,
    /// Threads alive over time.
    pub live: LiveThreads,
    /// Every thread seen: at attach or in a thread record.
    pub(super) known: HashSet<u32>,
    /// The object files' bytes, read once each.
    pub files: FileCache,
}

/// What a thread record changed, for the features.
pub enum TaskChange {
    /// A thread event to hand to every feature.
    Thread(ThreadEvent),
    /// The target called exec: hand the event to every feature, then the
    /// samples held until then (a launched command's first exec).
    Exec(ThreadEvent, Vec<SampleEvent>),
}

impl Process {
    /// Starts following `pid`: reads its memory map and its threads, which
    /// are returned as `Existing` thread events.
    pub fn new(pid: u32) -> (Self, Vec<ThreadEvent>) {
        let mut process = Self {
            pid,
            maps: ProcMaps::default(),
            maps_read_at: None,
            before_exec: None,
            layout: 0,
            shared: Vec::new(),
            main: pid,
            others: HashMap::new(),
            others_live: LiveThreads::default(),
            tgid_of: HashMap::new(),
            kernel_dirty: HashSet::new(),
            layout_dirty: Vec::new(),
            listed: Vec::new(),
            joined: Vec::new(),
            layouts: 1,
            shared_names: HashMap::new(),
            names: HashMap::new(),
            ns_tids: HashMap::new(),
            commands: HashMap::new(),
            held: None,
            launch_exec_ns: None,
            dropped: 0,
            live: LiveThreads::default(),
            known: HashSet::new(),
            files: FileCache::default(),
        };
        process.refresh_maps();
        let tids = procfs::list_threads(pid);
        process.live = LiveThreads::new(tids.len());
        let events = tids
            .into_iter()
            .map(|tid| {
                process.known.insert(tid);
                process.learn_name(tid);
                ThreadEvent::Existing { tid }
            })
            .collect();
        (process, events)
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Re-reads `/proc/PID/maps`; keeps the old snapshot if the process is
    /// gone, so late records still resolve. A change in the shared
    /// mappings is for the kernel to learn.
    pub fn refresh_maps(&mut self) {
        // Before the read: a mapping made while it runs may be missed.
        let read_at = ktime_ns();
        match ProcMaps::read(self.pid) {
            Ok(maps) if !maps.is_empty() => self.maps = maps,
            Ok(_) => {}
            Err(e) => tracing::debug!("re-reading maps of {}: {e}", self.pid),
        }
        self.maps_read_at = Some(read_at);
        let shared = super::group::shared_ranges(&self.maps, &mut self.shared_names);
        if shared != self.shared {
            self.shared = shared;
            self.kernel_dirty.insert(self.pid);
        }
    }

    /// Re-reads the map unless it was read less than `interval` ago.
    pub fn refresh_maps_within(&mut self, interval: Duration) -> bool {
        let interval = u64::try_from(interval.as_nanos()).unwrap_or(u64::MAX);
        let stale = self
            .maps_read_at
            .is_none_or(|t| ktime_ns().saturating_sub(t) >= interval);
        if stale {
            self.refresh_maps();
        }
        stale
    }

    /// Re-reads the memory map if the snapshot was taken before `time_ns`
    /// (a record's `CLOCK_MONOTONIC` time): what the record saw mapped is
    /// then in the map. Returns whether it re-read.
    pub fn refresh_maps_older_than(&mut self, time_ns: u64) -> bool {
        let stale = self.maps_read_at.is_none_or(|t| t < time_ns);
        if stale {
            self.refresh_maps();
        }
        stale
    }

    /// The memory map as last read.
    pub fn maps(&self) -> &ProcMaps {
        &self.maps
    }

    /// The mapping holding `addr`, in the map as last read.
    pub fn find(&self, addr: u64) -> Option<&Mapping> {
        self.maps.find(addr)
    }

    /// Where `addr` is, re-reading the map once if it is not in our
    /// snapshot (a library loaded since, or the first records after
    /// `exec`).
    pub fn place(&mut self, addr: u64) -> Place {
        let place = self.maps.place(addr);
        if !matches!(place, Place::Unmapped { .. }) {
            return place;
        }
        if self.refresh_maps_within(MAPS_REFRESH_MIN_INTERVAL) {
            return self.maps.place(addr);
        }
        place
    }

    /// Where the call that returns to `return_address` is.
    pub fn call_site(&mut self, return_address: u64) -> Place {
        self.place(call_of(return_address))
    }

    /// Where code address `addr`, run at `time_ns`, is. Code runs from
    /// an executable mapping: if our snapshot has none there and is older
    /// than the record, the map changed since (a library `dlopen`ed where
    /// the loader's `ld.so.cache` was mapped when we read it) and is read
    /// again.
    pub fn code_place(&mut self, addr: u64, time_ns: u64) -> Place {
        // Nothing mapped there is `place`'s case, re-read at most so often.
        if self.find(addr).is_some_and(|m| !m.executable) {
            self.refresh_maps_older_than(time_ns);
        }
        self.place(addr)
    }

    /// Where `ip`, sampled at `time_ns`, was: in the image before the last
    /// exec if the sample predates it.
    pub fn place_at(&mut self, time_ns: u64, ip: u64) -> Place {
        match &self.before_exec {
            Some((exec_ns, old)) if time_ns < *exec_ns => old.place(ip),
            _ => self.place(ip),
        }
    }

    /// Whether a record taken at `time_ns` is of the image before the last
    /// exec.
    pub fn of_old_image(&self, time_ns: u64) -> bool {
        self.before_exec
            .as_ref()
            .is_some_and(|(exec_ns, _)| time_ns < *exec_ns)
    }

    /// Counts only records from the next `exec` on (a launched command,
    /// whose process runs our gate until then).
    pub fn start_at_exec(&mut self) {
        self.held = Some(Vec::new());
    }

    /// Still waiting for the launched command's `exec` (it never ran).
    pub fn awaiting_exec(&self) -> bool {
        self.held.is_some()
    }

    /// Whether a record taken at `time_ns` is of our launch gate rather
    /// than of the command: before its exec, or while it is awaited.
    pub fn before_launch(&self, time_ns: u64) -> bool {
        self.held.is_some() || self.launch_exec_ns.is_some_and(|t| time_ns < t)
    }

    /// Keeps a sample until the launched command's exec; false when no
    /// exec is awaited.
    pub fn hold(&mut self, ev: &SampleEvent) -> bool {
        let Some(held) = &mut self.held else {
            return false;
        };
        if held.len() < MAX_HELD_SAMPLES {
            held.push(*ev);
        } else {
            self.dropped += 1;
        }
        true
    }

    /// Whether thread `tid` was seen: at attach or in a thread record read
    /// so far. A thread's records in other rings are written after its
    /// creation record, so one not seen yet means thread records wait.
    pub fn knows_thread(&self, tid: u32) -> bool {
        self.known.contains(&tid)
    }

    /// Reads a thread's name unless it is known. A thread already gone
    /// keeps an empty name (or the one it had), so its later records do not
    /// retry the read.
    pub fn know_thread(&mut self, tid: u32) {
        if !self.names.contains_key(&tid) {
            self.learn_name(tid);
        }
    }

    fn learn_name(&mut self, tid: u32) {
        let tgid = self.tgid(tid);
        // Read once per thread (None: the same as ours).
        self.ns_tids
            .entry(tid)
            .or_insert_with(|| procfs::namespace_tid(tgid, tid));
        if let std::collections::hash_map::Entry::Vacant(e) = self.commands.entry(tgid) {
            if let Some(command) = procfs::command_line(tgid) {
                e.insert(command);
            }
        }
        match procfs::thread_name(self.tgid(tid), tid) {
            Some(name) => {
                self.names.insert(tid, name);
            }
            None => {
                self.names.entry(tid).or_default();
            }
        }
    }

    /// Thread names, re-read for the threads in `alive` (names are often
    /// set after creation, e.g. with `pthread_setname_np`).
    pub fn thread_names(&mut self, alive: impl IntoIterator<Item = u32>) -> &HashMap<u32, String> {
        for tid in alive {
            self.learn_name(tid);
        }
        &self.names
    }

    /// Thread `tid`'s id in its pid namespace, when that differs (read
    /// with its name).
    pub fn ns_tid(&self, tid: u32) -> Option<u32> {
        self.ns_tids.get(&tid).copied().flatten()
    }

    /// Process `pid`'s command line, as read while it ran.
    pub fn command_of(&self, pid: u32) -> Option<&str> {
        self.commands.get(&pid).map(String::as_str)
    }

    /// Follows one thread record; returns what the features must hear.
    pub fn on_task(&mut self, ev: &TaskEvent) -> Option<TaskChange> {
        if ev.tgid != 0 && ev.tgid != self.main {
            return self.on_other_task(ev).map(TaskChange::Thread);
        }
        let event = match ev.kind {
            TASK_NEW_THREAD => {
                self.known.insert(ev.tid);
                self.live.change(ev.time_ns, 1);
                ThreadEvent::Created {
                    tid: ev.tid,
                    parent: ev.parent_tid,
                    time_ns: ev.time_ns,
                }
            }
            TASK_EXIT => {
                self.live.change(ev.time_ns, -1);
                // The kernel sends the final name: short-lived threads may
                // already be gone from /proc.
                let comm = ev.comm_str();
                if !comm.is_empty() {
                    self.names.insert(ev.tid, comm.to_string());
                }
                ThreadEvent::Exited {
                    tid: ev.tid,
                    time_ns: ev.time_ns,
                }
            }
            TASK_EXEC => {
                // A new program image: keep the old map for late records of
                // the old image; the thread has the new program's name, the
                // process a new command line.
                self.commands.remove(&ev.tgid);
                self.before_exec = Some((ev.time_ns, self.maps.clone()));
                self.refresh_maps();
                // Other threads are gone; their names stay for the report.
                self.known.insert(ev.tid);
                self.learn_name(ev.tid);
                let held = match self.held.take() {
                    Some(held) => {
                        self.launch_exec_ns = Some(ev.time_ns);
                        held
                    }
                    None => Vec::new(),
                };
                let exec = ThreadEvent::Exec {
                    tid: ev.tid,
                    time_ns: ev.time_ns,
                };
                return Some(TaskChange::Exec(exec, held));
            }
            other => {
                tracing::warn!("unknown task event kind {other}");
                return None;
            }
        };
        Some(TaskChange::Thread(event))
    }

    /// Replaces the map from before the last exec (tests).
    #[cfg(test)]
    pub fn set_before_exec(&mut self, exec_ns: u64, old: ProcMaps) {
        self.before_exec = Some((exec_ns, old));
    }

    /// The name known for `tid` (tests).
    #[cfg(test)]
    pub fn name(&self, tid: u32) -> Option<&str> {
        self.names.get(&tid).map(String::as_str)
    }

    /// The code bytes around `ip` that an instruction decoder needs
    /// ([`crate::object::x86::access::LOOK_BEHIND`] before it, `LOOK_AHEAD`
    /// after), and the address of the first: from the object file or, for
    /// anonymous code, from the process's memory. A service of the session
    /// any analysis may ask for.
    pub fn code_around(&mut self, ip: u64) -> Option<(Vec<u8>, u64)> {
        use crate::object::x86::access::{LOOK_AHEAD, LOOK_BEHIND};
        if self.find(ip).is_none() {
            self.place(ip); // re-reads the map
        }
        let m = self.find(ip)?.clone();
        let lo = ip.saturating_sub(LOOK_BEHIND).max(m.start);
        let hi = (ip + LOOK_AHEAD).min(m.end);
        if m.is_file() {
            let bytes = self.files.get(&m.name)?;
            let off = |a: u64| (a - m.start + m.offset) as usize;
            let code = bytes.get(off(lo)..off(hi).min(bytes.len()))?;
            return Some((code.to_vec(), lo));
        }
        let mut code = vec![0u8; (hi - lo) as usize];
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid())).ok()?;
        std::os::unix::fs::FileExt::read_exact_at(&mem, &mut code, lo).ok()?;
        Some((code, lo))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_process_keeps_an_empty_but_usable_state() {
        let (mut p, threads) = Process::new(u32::MAX - 1);
        assert!(threads.is_empty());
        assert!(matches!(p.place(0x1000), Place::Unmapped { .. }));
    }

    /// A fresh read-only anonymous page of ours, and its size (the
    /// caller unmaps it).
    fn read_only_page() -> (*mut libc::c_void, usize) {
        let page = 4096;
        // SAFETY: a fresh anonymous mapping, unmapped by the caller.
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                page,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(at, libc::MAP_FAILED);
        (at, page)
    }

    /// A record's code mapped after our snapshot is found: the map is
    /// re-read for a record newer than the snapshot, however recent the
    /// snapshot (a throttle let a lock chain stop at the return-probe
    /// trampoline), and not for older records.
    #[test]
    fn a_record_newer_than_the_snapshot_rereads_the_map() {
        let (mut p, _) = Process::new(std::process::id());
        let read = p.maps_read_at.expect("read at start");
        assert!(!p.refresh_maps_older_than(read), "same instant: current");
        let (at, page) = read_only_page();
        let mapped_ns = ktime_ns();
        assert!(p.find(at as u64).is_none(), "mapped after the snapshot");
        assert!(p.refresh_maps_older_than(mapped_ns));
        assert!(p.find(at as u64).is_some());
        assert!(!p.refresh_maps_older_than(mapped_ns), "now current");
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(at, page) };
    }

    /// A code address in a mapping that is not executable in our
    /// snapshot (data mapped there when we read it, code since) is placed
    /// from a map read again, once the record is newer than the snapshot.
    #[test]
    fn code_in_a_remapped_range_is_placed_from_a_fresh_map() {
        let (at, page) = read_only_page();
        let (mut p, _) = Process::new(std::process::id());
        assert!(!p.find(at as u64).unwrap().executable);
        // SAFETY: our own mapping, made executable (nothing runs there).
        let rc = unsafe { libc::mprotect(at, page, libc::PROT_READ | libc::PROT_EXEC) };
        assert_eq!(rc, 0);
        let ran_ns = ktime_ns();
        let read = p.maps_read_at.unwrap();
        assert!(matches!(
            p.code_place(at as u64, read),
            Place::Anonymous { .. }
        ));
        assert!(!p.find(at as u64).unwrap().executable, "not newer: kept");
        p.code_place(at as u64, ran_ns);
        assert!(p.find(at as u64).unwrap().executable, "re-read");
        // SAFETY: our own mapping, no longer used.
        unsafe { libc::munmap(at, page) };
    }

    #[test]
    fn the_launch_gate_holds_samples_until_exec() {
        let me = std::process::id();
        let (mut p, _) = Process::new(me);
        assert!(!p.before_launch(1));
        p.start_at_exec();
        assert!(p.before_launch(1));
        assert!(p.hold(&SampleEvent::default()));
        let exec = TaskEvent {
            time_ns: 10,
            kind: TASK_EXEC,
            tid: me,
            tgid: me,
            ..Default::default()
        };
        let Some(TaskChange::Exec(_, held)) = p.on_task(&exec) else {
            panic!("an exec")
        };
        assert_eq!(held.len(), 1);
        assert!(p.before_launch(9), "older than the exec: the gate's");
        assert!(!p.before_launch(11));
        assert!(!p.hold(&SampleEvent::default()));
    }
}
