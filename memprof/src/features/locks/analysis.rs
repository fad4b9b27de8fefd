//! Lock contention from the kernel's side: futex waits per futex word,
//! who waited where and for how long, who woke them, and kernel lock waits.
//!
//! Pure: the collector hands it waits, wakes and kernel lock waits
//! ([`LockProfile::add_waits`], [`LockProfile::add_wakes`],
//! [`LockProfile::add_kernel_waits`]) with their call chains already
//! resolved to places ([`Chain`]); which
//! frames belong to the lock implementation, what kind of lock a futex is
//! and what it is called are decided at report time, with symbols.

pub use super::durations::Durations;
pub use super::holds::{HoldStats, Holds, OtherLocks, Section, SectionSite};
use crate::features::FastMap;
use crate::process::maps::Place;

/// Return addresses found on the stack at the futex call, innermost first
/// (resolved at the call instruction), and the place of the syscall itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub ip: Place,
    pub frames: Vec<Place>,
}

/// Wakes at one site of one futex word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WakeSite {
    /// Wake calls, and threads they woke.
    pub calls: u64,
    pub woken: u64,
    /// The waits they ended (each waiter's whole wait), and how many.
    pub caused_ns: u64,
    pub caused_waits: u64,
}

/// Waits at one futex word.
#[derive(Debug, Clone, Default)]
pub struct FutexStats {
    pub waits: Durations,
    /// Waits per call chain: (count, ns).
    pub waiters: FastMap<Chain, (u64, u64)>,
    /// Wakes per call chain.
    pub wakers: FastMap<Chain, WakeSite>,
    /// Owner threads seen in sampled waits (glibc mutexes), with counts.
    pub owners: FastMap<u32, u64>,
    /// Threads that waited.
    pub threads: usize,
}

impl FutexStats {
    /// Contended waits seen.
    pub fn contentions(&self) -> u64 {
        self.waits.count()
    }
}

/// Kernel lock waits of one kind.
#[derive(Debug, Clone, Default)]
pub struct KernelStats {
    pub waits: Durations,
    /// Waits per user call chain: (count, ns).
    pub sites: FastMap<Chain, (u64, u64)>,
}

/// The lock profile of one session.
#[derive(Debug, Default)]
pub struct LockProfile {
    futexes: FastMap<u64, FutexStats>,
    kernel: FastMap<u32, KernelStats>,
    /// What the lock uprobes saw (bounded: see `holds`).
    holds: Holds,
}

impl LockProfile {
    pub fn new() -> Self {
        Self::default()
    }

    /// Forgets the contention aggregates, to be replaced by a newer
    /// snapshot of the kernel's (the uprobe sections stay).
    pub fn clear_contention(&mut self) {
        self.futexes.clear();
        self.kernel.clear();
    }

    /// Waits on futex word `uaddr` at one call chain.
    pub fn add_waits(&mut self, uaddr: u64, chain: Chain, waits: &Durations) {
        let f = self.futexes.entry(uaddr).or_default();
        f.waits.add(waits);
        let site = f.waiters.entry(chain).or_default();
        site.0 += waits.count();
        site.1 += waits.total_ns;
    }

    /// Wakes of futex word `uaddr` at one call chain.
    pub fn add_wakes(&mut self, uaddr: u64, chain: Chain, wakes: WakeSite) {
        let f = self.futexes.entry(uaddr).or_default();
        let site = f.wakers.entry(chain).or_default();
        site.calls += wakes.calls;
        site.woken += wakes.woken;
        site.caused_ns += wakes.caused_ns;
        site.caused_waits += wakes.caused_waits;
    }

    /// Who waited on futex word `uaddr`: the threads (counted by the
    /// kernel) and the owners read in sampled waits.
    pub fn set_waiters_seen(&mut self, uaddr: u64, threads: usize, owners: &FastMap<u32, u64>) {
        if let Some(f) = self.futexes.get_mut(&uaddr) {
            f.threads = threads;
            f.owners.clone_from(owners);
        }
    }

    /// Kernel lock waits of kind `flags` at one user call chain.
    pub fn add_kernel_waits(&mut self, flags: u32, chain: Chain, waits: &Durations) {
        let k = self.kernel.entry(flags).or_default();
        k.waits.add(waits);
        let site = k.sites.entry(chain).or_default();
        site.0 += waits.count();
        site.1 += waits.total_ns;
    }

    /// A critical section (or failed lock call) from the uprobes.
    pub fn add_section(&mut self, s: Section) {
        self.holds.add(&s);
    }

    pub fn knows_site(&self, site: u64) -> bool {
        self.holds.knows_site(site)
    }

    /// Whether another site can be placed (their table is bounded).
    pub fn can_place_site(&self) -> bool {
        self.holds.can_place_site()
    }

    pub fn set_site_place(&mut self, site: u64, place: Place) {
        self.holds.set_site_place(site, place);
    }

    /// The place of a site's call, once resolved.
    pub fn site_place(&self, site: u64) -> Option<&Place> {
        self.holds.site_place(site)
    }

    /// Locks the uprobes tracked one by one, most hold time first.
    pub fn holds(&self) -> Vec<(u64, &HoldStats)> {
        self.holds.ranked()
    }

    /// The uprobes' sections of the locks not tracked one by one, and the
    /// sections seen per operation.
    pub fn hold_table(&self) -> &Holds {
        &self.holds
    }

    /// Keeps the locks that matter one by one — the contended ones first,
    /// by wait time, then the most held — and aggregates the others (see
    /// [`Holds::prune`]).
    pub fn prune_holds(&mut self) {
        let futexes = &self.futexes;
        // A mutex's futex is its first word; an rwlock's are inside it.
        let wait_ns = |lock: u64| {
            [0, 4, 8, 12]
                .iter()
                .filter_map(|d| futexes.get(&(lock + d)))
                .map(|f| f.waits.total_ns)
                .sum()
        };
        self.holds.prune(wait_ns);
    }

    /// The traced lock a futex word belongs to: a glibc mutex's futex is
    /// its first word; an rwlock's readers and writers wait on words 4 and
    /// 8 bytes in.
    pub fn lock_of_futex(&self, uaddr: u64) -> Option<u64> {
        if self.holds.get(uaddr).is_some() {
            return Some(uaddr);
        }
        [4, 8, 12]
            .into_iter()
            .filter_map(|d| uaddr.checked_sub(d))
            .find(|a| self.holds.get(*a).is_some_and(HoldStats::is_rwlock))
    }

    /// Whether the lock uprobes saw mutex calls take `uaddr` itself: its
    /// futex word is then a mutex's, whatever its waiters' chains say.
    pub fn is_traced_mutex(&self, uaddr: u64) -> bool {
        self.holds.get(uaddr).is_some_and(|h| !h.is_rwlock())
    }

    /// Futex words with waits or wakes, most wait time first.
    pub fn futexes(&self) -> Vec<(u64, &FutexStats)> {
        let mut v: Vec<_> = self.futexes.iter().map(|(a, f)| (*a, f)).collect();
        v.sort_by(|a, b| {
            (b.1.waits.total_ns)
                .cmp(&a.1.waits.total_ns)
                .then(a.0.cmp(&b.0))
        });
        v
    }

    /// Kernel lock kinds waited for, most wait time first.
    pub fn kernel(&self) -> Vec<(u32, &KernelStats)> {
        let mut v: Vec<_> = self.kernel.iter().map(|(f, k)| (*f, k)).collect();
        v.sort_by(|a, b| {
            (b.1.waits.total_ns)
                .cmp(&a.1.waits.total_ns)
                .then(a.0.cmp(&b.0))
        });
        v
    }
}

/// `LCB_F_*` flags of `lock:contention_begin`, as a kind name.
pub fn kernel_lock_kind(flags: u32) -> &'static str {
    const SPIN: u32 = 1;
    const READ: u32 = 2;
    const WRITE: u32 = 4;
    const RT: u32 = 8;
    const PERCPU: u32 = 16;
    const MUTEX: u32 = 32;
    match flags {
        f if f & MUTEX != 0 => "kernel mutex",
        f if f & PERCPU != 0 => "kernel percpu rwsem",
        f if f & RT != 0 => "kernel rt-mutex",
        f if f & READ != 0 && f & SPIN != 0 => "kernel rwlock (read)",
        f if f & WRITE != 0 && f & SPIN != 0 => "kernel rwlock (write)",
        f if f & READ != 0 => "kernel rwsem (read)",
        f if f & WRITE != 0 => "kernel rwsem (write)",
        f if f & SPIN != 0 => "kernel spinlock",
        _ => "kernel lock",
    }
}

/// The kind of user lock a futex belongs to, from the names of the
/// functions around the futex call (innermost first). Besides locks:
/// "condvar", "barrier", "join" (a thread waiting for another to exit)
/// and "semaphore" waits, which are waits but not lock contention.
pub fn classify(functions: &[&str]) -> &'static str {
    for f in functions {
        let f = f.to_ascii_lowercase();
        let kind = if f.contains("cond") {
            "condvar"
        } else if f.contains("rwlock") {
            "rwlock"
        } else if f.contains("barrier") {
            "barrier"
        } else if f.contains("join") {
            "join"
        } else if f.contains("sem_wait") || f.contains("sem_timedwait") || f.contains("semaphore") {
            "semaphore"
        } else if f.contains("mutex") || f.contains("lll_lock") {
            "mutex"
        } else {
            continue;
        };
        return kind;
    }
    "futex"
}

/// Whether waiting on this kind of object is lock contention (a condvar,
/// barrier, join or semaphore wait is waiting for an event instead).
pub fn is_contention(kind: &str) -> bool {
    matches!(kind, "mutex" | "rwlock" | "futex" | "kernel")
}

/// Whether a frame is part of a lock implementation rather than the code
/// that took the lock: libc and the dynamic linker, and the standard
/// libraries' synchronization modules.
pub fn is_lock_implementation(module: &str, function: &str) -> bool {
    let module_is_libc = crate::process::maps::is_libc(module)
        || module.starts_with("libpthread")
        || module.starts_with("ld-linux");
    module_is_libc
        || ["std::sys", "std::sync", "core::", "parking_lot", "lock_api"]
            .iter()
            .any(|p| function.starts_with(p) || function.starts_with(&format!("<{p}")))
}

#[cfg(test)]
mod tests {
    use memprof_common::locks::{hold_flag, lock_op};

    use super::*;

    use crate::process::maps::prog_place as place;

    fn chain(frames: &[u64]) -> Chain {
        Chain {
            ip: place(1),
            frames: frames.iter().map(|&o| place(o)).collect(),
        }
    }

    fn durations(ns: &[u64]) -> Durations {
        let mut d = Durations::default();
        for &n in ns {
            d.record(n);
        }
        d
    }

    #[test]
    fn waits_and_wakes_gather_per_futex_word() {
        let mut p = LockProfile::new();
        p.add_waits(0x1000, chain(&[0x40]), &durations(&[1000, 2000]));
        p.add_waits(0x1000, chain(&[0x48]), &durations(&[5000]));
        p.add_waits(0x2000, chain(&[0x80]), &durations(&[100]));
        let wake = WakeSite {
            calls: 1,
            woken: 1,
            caused_ns: 5000,
            caused_waits: 1,
        };
        p.add_wakes(0x1000, chain(&[0x50]), wake);
        p.add_wakes(0x1000, chain(&[0x50]), wake);
        let owners = [(7, 3)].into_iter().collect();
        p.set_waiters_seen(0x1000, 2, &owners);
        let futexes = p.futexes();
        assert_eq!(futexes[0].0, 0x1000, "most wait time first");
        let f = futexes[0].1;
        assert_eq!((f.contentions(), f.waits.total_ns), (3, 8000));
        assert_eq!(f.waits.max_ns, 5000);
        assert_eq!(f.owners.get(&7), Some(&3));
        assert_eq!(f.threads, 2);
        assert_eq!(f.waiters.get(&chain(&[0x40])), Some(&(2, 3000)));
        let w = f.wakers.get(&chain(&[0x50])).unwrap();
        assert_eq!((w.calls, w.caused_ns, w.caused_waits), (2, 10_000, 2));
        assert_eq!(futexes[1].1.owners.len(), 0, "no owner word");
        // A newer snapshot replaces the aggregates; the sections stay.
        p.add_section(section(0x10, lock_op::MUTEX_LOCK, 0, 5, (1, 2)));
        p.clear_contention();
        assert!(p.futexes().is_empty() && p.kernel().is_empty());
        assert_eq!(p.holds().len(), 1);
    }

    #[test]
    fn kinds_come_from_the_functions_around_the_call() {
        assert_eq!(
            classify(&["__lll_lock_wait", "___pthread_mutex_lock"]),
            "mutex"
        );
        assert_eq!(
            classify(&["__futex_abstimed_wait_common", "___pthread_cond_wait"]),
            "condvar"
        );
        assert_eq!(
            classify(&[
                "__futex_abstimed_wait_common",
                "__pthread_rwlock_rdlock_full64"
            ]),
            "rwlock"
        );
        assert_eq!(
            classify(&["std::sys::sync::mutex::futex::Mutex::lock_contended"]),
            "mutex"
        );
        assert_eq!(classify(&["syscall", "main"]), "futex");
        assert_eq!(
            classify(&["__futex_abstimed_wait_common", "__pthread_clockjoin_ex"]),
            "join"
        );
        assert_eq!(classify(&["futex_wait", "pthread_barrier_wait"]), "barrier");
        assert!(is_contention("mutex") && is_contention("kernel"));
        assert!(!is_contention("condvar") && !is_contention("join"));
    }

    #[test]
    fn implementation_frames_are_libc_and_std_sync() {
        assert!(is_lock_implementation("libc.so.6", "__lll_lock_wait"));
        assert!(is_lock_implementation(
            "rustlock",
            "std::sys::sync::mutex::futex::Mutex::lock_contended"
        ));
        assert!(!is_lock_implementation("locks", "worker"));
        assert!(!is_lock_implementation("rustlock", "rustlock::contend"));
    }

    fn section(lock: u64, op: u32, flags: u32, hold_ns: u64, sites: (u64, u64)) -> Section {
        Section {
            lock,
            tid: 5,
            op,
            flags,
            acquire_ns: 40,
            hold_ns,
            lock_site: sites.0,
            unlock_site: sites.1,
        }
    }

    #[test]
    fn sections_count_acquisitions_holds_and_sites() {
        let mut p = LockProfile::new();
        for hold in [100, 300, 200] {
            p.add_section(section(0x10, lock_op::MUTEX_LOCK, 0, hold, (0xa, 0xb)));
        }
        // A condvar wait ends one section and its return begins another:
        // hold times, but not acquisitions.
        p.add_section(section(
            0x10,
            lock_op::MUTEX_LOCK,
            hold_flag::COND_RELEASE,
            50,
            (0xa, 0xc),
        ));
        p.add_section(section(
            0x10,
            lock_op::COND_WAIT,
            hold_flag::REACQUIRED,
            70,
            (0xc, 0xb),
        ));
        p.add_section(section(
            0x10,
            lock_op::MUTEX_TRYLOCK,
            hold_flag::FAILED,
            0,
            (0xd, 0),
        ));
        let holds = p.holds();
        let h = holds[0].1;
        assert_eq!(h.acquisitions(), 4);
        assert_eq!(h.failed, 1);
        assert_eq!((h.hold.total_ns, h.hold.max_ns), (720, 300));
        assert_eq!(h.hold.count(), 5);
        assert_eq!(
            h.sections.get(&(0xa, 0xb)),
            Some(&SectionSite {
                count: 3,
                hold_ns: 600,
                hold_max_ns: 300
            })
        );
        assert!(!h.is_rwlock());
        assert_eq!(p.lock_of_futex(0x10), Some(0x10));
        assert_eq!(
            p.lock_of_futex(0x14),
            None,
            "a mutex's futex is its first word"
        );
    }

    #[test]
    fn an_rwlock_owns_its_inner_futex_words() {
        let mut p = LockProfile::new();
        p.add_section(section(0x100, lock_op::RW_RDLOCK, 0, 10, (1, 2)));
        assert!(p.holds()[0].1.is_rwlock());
        assert_eq!(p.lock_of_futex(0x108), Some(0x100));
        assert_eq!(p.lock_of_futex(0x104), Some(0x100));
        assert_eq!(p.lock_of_futex(0x120), None);
    }

    #[test]
    fn kernel_waits_gather_per_kind() {
        let mut p = LockProfile::new();
        p.add_kernel_waits(2, chain(&[9]), &durations(&[300]));
        p.add_kernel_waits(2, chain(&[9]), &durations(&[700]));
        p.add_kernel_waits(2, chain(&[10]), &durations(&[1]));
        let k = p.kernel();
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].1.waits.total_ns, 1001);
        assert_eq!(k[0].1.sites.get(&chain(&[9])), Some(&(2, 1000)));
        assert_eq!(kernel_lock_kind(k[0].0), "kernel rwsem (read)");
        assert_eq!(kernel_lock_kind(32), "kernel mutex");
    }
}
