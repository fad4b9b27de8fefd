//! The target's object files, read once each, and which offsets in them
//! are return addresses.
//!
//! A word on the stack that points into executable file-backed code right
//! after a call instruction is almost certainly a return address: that is
//! how the lock waits' call chains are found without frame pointers (libc
//! has none).

use std::{collections::HashMap, sync::Arc};

use super::x86::calls::ends_with_call;
use crate::process::files::FileCache;

/// Verdicts per (file, offset).
#[derive(Debug, Default)]
pub struct CodeCache {
    verdicts: HashMap<(Arc<str>, u64), bool>,
}

impl CodeCache {
    /// Whether the instruction ending right before `offset` in `path` is a
    /// call (so `offset` is where a call returns to).
    pub fn follows_call(&mut self, files: &mut FileCache, path: &Arc<str>, offset: u64) -> bool {
        if let Some(&v) = self.verdicts.get(&(path.clone(), offset)) {
            return v;
        }
        let verdict = files
            .get(path)
            .is_some_and(|b| ends_with_call(&b, offset as usize));
        self.verdicts.insert((path.clone(), offset), verdict);
        verdict
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_are_cached_and_missing_files_say_no() {
        let (mut cache, mut files) = (CodeCache::default(), FileCache::default());
        let missing: Arc<str> = Arc::from("/nonexistent/lib.so");
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert!(!cache.follows_call(&mut files, &missing, 100));
        assert_eq!(cache.verdicts.len(), 1);
    }
}
