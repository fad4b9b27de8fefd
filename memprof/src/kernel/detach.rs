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
