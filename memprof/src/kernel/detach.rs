//! Links on their way out: each drop blocks for a kernel grace period, so
//! they are dropped on threads of their own, and the session waits for
//! them only before the process ends.

use std::thread::JoinHandle;

use aya::programs::uprobe::UProbeLink;

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
pub fn detach(links: Vec<(u32, UProbeLink)>) -> Vec<JoinHandle<()>> {
    links
        .into_iter()
        .map(|(_, link)| std::thread::spawn(move || drop(link)))
        .collect()
}
