//! Lock contention from the kernel's side: futex waits per futex word,
//! who waited where and for how long, who woke them, and kernel lock waits.
//!
//! Pure: the collector turns records into [`FutexWait`], [`FutexWake`] and
//! [`KernelWait`] with their call chains already resolved to places; which
//! frames belong to the lock implementation, what kind of lock a futex is
//! and what it is called are decided at report time, with symbols.

use hdrhistogram::Histogram;

use super::{FastMap, FastSet};
use crate::collect::procmaps::Place;

/// Return addresses found on the stack at the futex call, innermost first
/// (resolved at the call instruction), and the place of the syscall itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Chain {
    pub ip: Place,
    pub frames: Vec<Place>,
}

/// A thread blocked (or tried to) in a futex wait.
#[derive(Debug, Clone, PartialEq)]
pub struct FutexWait {
    pub uaddr: u64,
    pub tid: u32,
    /// The word 8 bytes after the futex: a glibc mutex's owner thread.
    pub owner: u32,
    pub duration_ns: u64,
    pub chain: Chain,
}

/// A thread woke waiters of a futex (usually a lock's release).
#[derive(Debug, Clone, PartialEq)]
pub struct FutexWake {
    pub uaddr: u64,
    pub tid: u32,
    /// Threads woken (the call's return value).
    pub woken: u64,
    pub chain: Chain,
}

/// A wait for a kernel lock (`lock:contention_begin/end`).
#[derive(Debug, Clone, PartialEq)]
pub struct KernelWait {
    /// `LCB_F_*` flags: the kind of kernel lock.
    pub flags: u32,
    pub duration_ns: u64,
    /// Where the thread was in user space (the call that led there).
    pub ip: Place,
}

/// Waits at one futex word.
#[derive(Debug, Clone)]
pub struct FutexStats {
    pub waits: Histogram<u64>,
    pub total_ns: u64,
    /// Longest wait, exact (the histogram rounds to 3 digits).
    pub max_ns: u64,
    /// Waits per call chain: (count, ns).
    pub waiters: FastMap<Chain, (u64, u64)>,
    /// Wakes per call chain: (calls, threads woken).
    pub wakers: FastMap<Chain, (u64, u64)>,
    /// Owner thread ids seen at wait time (glibc mutexes), with counts.
    pub owners: FastMap<u32, u64>,
    /// Threads that waited.
    pub threads: FastSet<u32>,
}

impl FutexStats {
    fn new() -> Self {
        Self {
            waits: Histogram::new_with_bounds(1, 1 << 40, 3).expect("static bounds are valid"),
            total_ns: 0,
            max_ns: 0,
            waiters: FastMap::default(),
            wakers: FastMap::default(),
            owners: FastMap::default(),
            threads: FastSet::default(),
        }
    }

    /// Contended waits seen.
    pub fn contentions(&self) -> u64 {
        self.waits.len()
    }
}

/// Kernel lock waits of one kind.
#[derive(Debug, Clone)]
pub struct KernelStats {
    pub waits: Histogram<u64>,
    pub total_ns: u64,
    /// Longest wait, exact.
    pub max_ns: u64,
    /// Waits per user place: (count, ns).
    pub sites: FastMap<Place, (u64, u64)>,
}

/// The lock profile of one session.
#[derive(Debug, Default)]
pub struct LockProfile {
    futexes: FastMap<u64, FutexStats>,
    kernel: FastMap<u32, KernelStats>,
}

impl LockProfile {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_wait(&mut self, w: FutexWait) {
        let f = self.futexes.entry(w.uaddr).or_insert_with(FutexStats::new);
        let _ = f.waits.record(w.duration_ns.clamp(1, 1 << 40));
        f.total_ns += w.duration_ns;
        f.max_ns = f.max_ns.max(w.duration_ns);
        if w.owner != 0 && w.owner != w.tid {
            *f.owners.entry(w.owner).or_default() += 1;
        }
        f.threads.insert(w.tid);
        let site = f.waiters.entry(w.chain).or_default();
        site.0 += 1;
        site.1 += w.duration_ns;
    }

    pub fn add_wake(&mut self, w: FutexWake) {
        let f = self.futexes.entry(w.uaddr).or_insert_with(FutexStats::new);
        let site = f.wakers.entry(w.chain).or_default();
        site.0 += 1;
        site.1 += w.woken;
    }

    pub fn add_kernel_wait(&mut self, w: KernelWait) {
        let k = self.kernel.entry(w.flags).or_insert_with(|| KernelStats {
            waits: Histogram::new_with_bounds(1, 1 << 40, 3).expect("static bounds are valid"),
            total_ns: 0,
            max_ns: 0,
            sites: FastMap::default(),
        });
        let _ = k.waits.record(w.duration_ns.clamp(1, 1 << 40));
        k.total_ns += w.duration_ns;
        k.max_ns = k.max_ns.max(w.duration_ns);
        let site = k.sites.entry(w.ip).or_default();
        site.0 += 1;
        site.1 += w.duration_ns;
    }

    /// Futex words with waits or wakes, most wait time first.
    pub fn futexes(&self) -> Vec<(u64, &FutexStats)> {
        let mut v: Vec<_> = self.futexes.iter().map(|(a, f)| (*a, f)).collect();
        v.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
        v
    }

    /// Kernel lock kinds waited for, most wait time first.
    pub fn kernel(&self) -> Vec<(u32, &KernelStats)> {
        let mut v: Vec<_> = self.kernel.iter().map(|(f, k)| (*f, k)).collect();
        v.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(&b.0)));
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
    let module_is_libc = module.starts_with("libc.so")
        || module.starts_with("libc-")
        || module.starts_with("libpthread")
        || module.starts_with("ld-linux");
    module_is_libc
        || ["std::sys", "std::sync", "core::", "parking_lot", "lock_api"]
            .iter()
            .any(|p| function.starts_with(p) || function.starts_with(&format!("<{p}")))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn place(offset: u64) -> Place {
        Place::File {
            path: Arc::from("/bin/prog"),
            file_offset: offset,
        }
    }

    fn chain(frames: &[u64]) -> Chain {
        Chain {
            ip: place(1),
            frames: frames.iter().map(|&o| place(o)).collect(),
        }
    }

    #[test]
    fn waits_and_wakes_gather_per_futex_word() {
        let mut p = LockProfile::new();
        for (tid, ns) in [(2, 1000), (3, 5000), (2, 2000)] {
            p.add_wait(FutexWait {
                uaddr: 0x1000,
                tid,
                owner: 7,
                duration_ns: ns,
                chain: chain(&[0x40]),
            });
        }
        p.add_wait(FutexWait {
            uaddr: 0x2000,
            tid: 2,
            owner: 0,
            duration_ns: 100,
            chain: chain(&[0x80]),
        });
        p.add_wake(FutexWake {
            uaddr: 0x1000,
            tid: 7,
            woken: 1,
            chain: chain(&[0x50]),
        });
        let futexes = p.futexes();
        assert_eq!(futexes[0].0, 0x1000, "most wait time first");
        let f = futexes[0].1;
        assert_eq!((f.contentions(), f.total_ns), (3, 8000));
        assert_eq!(f.max_ns, 5000);
        assert_eq!(f.owners.get(&7), Some(&3));
        assert_eq!(f.threads.len(), 2);
        assert_eq!(f.waiters.get(&chain(&[0x40])), Some(&(3, 8000)));
        assert_eq!(f.wakers.get(&chain(&[0x50])), Some(&(1, 1)));
        assert_eq!(futexes[1].1.owners.len(), 0, "no owner word");
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

    #[test]
    fn kernel_waits_gather_per_kind() {
        let mut p = LockProfile::new();
        p.add_kernel_wait(KernelWait {
            flags: 2,
            duration_ns: 300,
            ip: place(9),
        });
        p.add_kernel_wait(KernelWait {
            flags: 2,
            duration_ns: 700,
            ip: place(9),
        });
        let k = p.kernel();
        assert_eq!(k.len(), 1);
        assert_eq!(k[0].1.total_ns, 1000);
        assert_eq!(kernel_lock_kind(k[0].0), "kernel rwsem (read)");
        assert_eq!(kernel_lock_kind(32), "kernel mutex");
    }
}
