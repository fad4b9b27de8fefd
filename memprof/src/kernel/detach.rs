//! Links on their way out: each drop blocks for a kernel grace period, so
//! they are dropped on threads of their own, and the session waits for
//! them only before the process ends.

use std::thread::JoinHandle;

use super::uprobes::HotLink;

/// Probes being removed by the kernel (about 0.2 s each, one after the
/// other: the kernel serialises their grace periods). The process must not
/// end before they are gone, but the report need not wait for them.
#[derive(Default)]
pub struct Detaching(Vec<JoinHandle<()>>);

impl Detaching {
    pub fn new(handles: Vec<JoinHandle<()>>) -> Self {
        Self(handles)
    }

    /// Links still being detached.
    pub fn len(&self) -> usize {
        self.0.iter().filter(|h| !h.is_finished()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds another family's detaches.
    pub fn extend(&mut self, other: Detaching) {
        self.0.extend(other.0);
    }

    /// Waits until all are gone.
    pub fn wait(self) {
        for h in self.0 {
            let _ = h.join();
        }
    }
}

/// The ids of the programs the session loaded, recorded when it stops.
static LOADED: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Records the session's programs (see [`wait_unloaded`]).
pub fn remember_programs(ids: Vec<u32>) {
    LOADED.lock().unwrap_or_else(|e| e.into_inner()).extend(ids);
}

/// Waits, at most `limit`, until the kernel has freed the programs the
/// session loaded, once the tool has closed everything that held them:
/// a link's last reference goes after a grace period that follows its
/// close (an RCU tasks-trace one for uprobes and syscall tracepoints),
/// so a program can outlive our exit by a few milliseconds, and no probe
/// may (`bpftool prog` right after the tool exits lists none). Returns
/// the ids still loaded.
///
/// Listing the kernel's programs needs `CAP_SYS_ADMIN`, which a session
/// without uprobe windows has dropped: then it cannot look, and waits
/// [`BLIND_WAIT`] instead, several times the grace periods measured here.
pub fn wait_unloaded(limit: std::time::Duration) -> Vec<u32> {
    let ours = std::mem::take(&mut *LOADED.lock().unwrap_or_else(|e| e.into_inner()));
    let start = std::time::Instant::now();
    loop {
        let mut listed = false;
        let left: Vec<u32> = aya::programs::loaded_programs()
            .filter_map(|p| {
                listed |= p.is_ok();
                p.ok()
            })
            .map(|p| p.id())
            .filter(|id| ours.contains(id))
            .collect();
        if !listed && !ours.is_empty() {
            tracing::debug!("cannot list the kernel's programs; waiting {BLIND_WAIT:?}");
            std::thread::sleep(BLIND_WAIT.min(limit));
            return Vec::new();
        }
        if left.is_empty() || start.elapsed() >= limit {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// How long to wait for the programs to be freed when the kernel's list
/// cannot be read (without `CAP_SYS_ADMIN`): the last ones were seen
/// freed within 50 ms of the tool's exit here.
pub const BLIND_WAIT: std::time::Duration = std::time::Duration::from_millis(250);

/// Drops links on threads of their own: each drop blocks for a grace
/// period, and in parallel they overlap.
pub fn detach(links: Vec<HotLink>) -> Vec<JoinHandle<()>> {
    links
        .into_iter()
        .map(|link| {
            std::thread::spawn(move || {
                let t = std::time::Instant::now();
                let n = link.ops.len();
                drop(link);
                tracing::debug!("link of {n} ops detached in {:?}", t.elapsed());
            })
        })
        .collect()
}

/// Links the session owns besides the hot uprobes (tracepoints, perf
/// events), dropped together at the end.
#[derive(Default)]
pub struct OwnedLinks(Vec<Box<dyn Send>>);

impl OwnedLinks {
    pub fn push<L: Send + 'static>(&mut self, link: L) {
        self.0.push(Box::new(link));
    }

    /// Drops every link, each on a thread of its own (the kernel may
    /// overlap their grace periods); the caller waits for the threads.
    pub fn detach(self) -> Vec<JoinHandle<()>> {
        self.0
            .into_iter()
            .map(|link| std::thread::spawn(move || drop(link)))
            .collect()
    }

    /// As [`Self::detach`], waiting until all are gone.
    pub fn drop_all(self) {
        Detaching::new(self.detach()).wait();
    }
}
