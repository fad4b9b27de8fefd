//! The target's object files' bytes, read once each and shared by the
//! readers of code (return-address checks, the unwinder, the decoder).

use std::{collections::HashMap, sync::Arc};

/// Files larger than this are not read (no lock implementation is).
pub const MAX_FILE: u64 = 512 << 20;

/// The bytes of the object files seen, read once each and shared by the
/// return-address checks and the unwinder.
#[derive(Debug, Default)]
pub struct FileCache {
    files: HashMap<Arc<str>, Option<Arc<[u8]>>>,
}

impl FileCache {
    /// The whole file, or None if it cannot be read or is too large.
    pub fn get(&mut self, path: &Arc<str>) -> Option<Arc<[u8]>> {
        self.files
            .entry(path.clone())
            .or_insert_with(|| {
                let at = super::objects::open_path(path);
                let too_big = std::fs::metadata(&at).map_or(true, |m| m.len() > MAX_FILE);
                (!too_big)
                    .then(|| std::fs::read(&at).ok())
                    .flatten()
                    .map(Arc::from)
            })
            .clone()
    }
}
